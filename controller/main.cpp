// gpu-controller: the GPU catalog's controller. `run` is the daemon (leader election, caches,
// the GPU reconciler, and with --enable-gpu the binder and the admission webhooks); `simulate`
// runs the shared model offline on a snapshot file.
#include <CLI/CLI.hpp>
#include <cmath>
#include <iostream>

#include "controller/daemon/daemon.h"
#include "controller/simulate.h"
#include "controller/snapshot_json.h"
#include "runtime/duration.h"
#include "runtime/log.h"

namespace {

constexpr int kExitBadInput = 2;

struct BadFlag {
  std::string message;
};

std::chrono::milliseconds PositiveDuration(const std::string& flag, const std::string& text) {
  const auto duration = cozy::runtime::ParseDuration(text);
  if (!duration || duration->count() <= 0) {
    throw BadFlag{flag + " " + text + ": must be a positive duration such as 90s, 2m or 500ms"};
  }
  return *duration;
}

std::chrono::milliseconds NonNegativeDuration(const std::string& flag, const std::string& text) {
  const auto duration = cozy::runtime::ParseDuration(text);
  if (!duration || duration->count() < 0) {
    throw BadFlag{flag + " " + text + ": must be a duration such as 0s, 90s or 5m"};
  }
  return *duration;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gpu-controller: GPU catalog controller for KubeVirt VMs"};
  app.set_version_flag("--version", std::string(COZY_VERSION));
  app.require_subcommand(1);

  CLI::App* simulate = app.add_subcommand(
      "simulate", "Print the model's view of a cluster snapshot (a Kubernetes List as JSON)");
  std::string snapshotPath;
  std::string output = "json";
  simulate->add_option("--snapshot", snapshotPath, "The snapshot file")->required();
  std::string device;
  simulate->add_option("--device", device,
                       "Only why this GPUDevice (namespace/name) stands as it does, as "
                       "`kubectl gpu why` says it on a live cluster");
  simulate->add_option("-o,--output", output, "Output format")
      ->check(CLI::IsMember({"json", "table"}));

  CLI::App* run = app.add_subcommand(
      "run",
      "Run the controller: leader election, caches and the GPU reconciler (docs/controller.md)");
  cozy::controller::RunOptions options;
  std::string resourceNames;
  std::string rawNames = "allow";
  std::string grace = "2m", leaseDuration = "15s", renewDeadline = "10s", retryPeriod = "2s";
  std::string resync = "30s", discoveryInterval = "30s", bindWait = "8s", notReadyGrace = "5m";
  std::string logFormat = "text";
  int verbosity = 0;
  run->add_option("--kubeconfig", options.kubeconfig, "kubeconfig file (default: in-cluster)");
  run->add_option("--namespace", options.namespaceName,
                  "Home of the Lease gpu-controller and the settings ConfigMap")
      ->capture_default_str();
  run->add_option("--identity", options.identity, "Lease holder identity (default: hostname)");
  run->add_flag("--enable-gpu", options.enableGpu,
                "GPUs for VMs: placement, webhooks and the KubeVirt watches");
  run->add_option("--gpu-resource-names", resourceNames,
                  "The hoster's GPU resource names, comma separated");
  run->add_option("--raw-gpu-names", rawNames,
                  "Whether VMs and pods may request GPU resource names directly")
      ->check(CLI::IsMember({"allow", "forbid"}))
      ->capture_default_str();
  run->add_option("--attachment-grace", grace,
                  "How long an attachment waits for its VMI to appear (positive)")
      ->capture_default_str();
  run->add_option("--lease-duration", leaseDuration)->capture_default_str();
  run->add_option("--renew-deadline", renewDeadline)->capture_default_str();
  run->add_option("--retry-period", retryPeriod)->capture_default_str();
  run->add_option("--health-addr", options.healthAddress,
                  "/healthz, /readyz and /metrics: host:port, :port or off")
      ->capture_default_str();
  run->add_option("--qps", options.qps, "API requests per second (0: no limit)")
      ->capture_default_str();
  run->add_option("--burst", options.burst, "API request burst")->capture_default_str();
  run->add_option("--resync", resync, "A reconciler pass at least this often")
      ->capture_default_str();
  run->add_option("--discovery-interval", discoveryInterval,
                  "How often to ask which optional kinds (KubeVirt, usage records) are served")
      ->capture_default_str();
  run->add_option("--webhook-addr", options.webhookAddress,
                  "Admission webhooks (with --enable-gpu): HTTPS on host:port, [v6]:port or :port")
      ->capture_default_str();
  run->add_option("--webhook-cert-dir", options.webhookCertDir,
                  "Directory holding tls.crt and tls.key, re-read when they change")
      ->capture_default_str();
  run->add_option("--webhook-client-ca", options.webhookClientCa,
                  "PEM CA bundle: only callers with a client certificate it signs (the API "
                  "server's admission kubeconfig) may call the webhooks; re-read when it changes. "
                  "Required with --enable-gpu unless --webhook-allow-unauthenticated-callers");
  run->add_option("--kubevirt-controller-user", options.kubevirtControllerUser,
                  "The user KubeVirt's controller creates virt-launcher pods as: the pod webhook "
                  "pins and tolerates only its pods")
      ->capture_default_str();
  run->add_flag("--webhook-allow-unauthenticated-callers", options.webhookAllowUnauthenticated,
                "Serve the webhooks to any TLS client without --webhook-client-ca (warned, and "
                "shown by the gauge gpu_controller_webhook_callers_authenticated and kubectl gpu)");
  run->add_option("--bind-wait", bindWait,
                  "How long a VM start waits for the binder to place its GPUs (positive)")
      ->capture_default_str();
  run->add_option("--not-ready-grace", notReadyGrace,
                  "How long GPUs held for a VM that is off wait on a node that is not Ready (or "
                  "under a condition taint) before they move; 0s: at once")
      ->capture_default_str();
  run->add_option("--log-format", logFormat)->check(CLI::IsMember({"text", "json"}));
  run->add_flag("-v,--verbose", verbosity, "Debug logs");

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& success) {
    return app.exit(success);
  } catch (const CLI::ParseError& error) {
    app.exit(error);
    return kExitBadInput;  // bad input, like a malformed snapshot
  }
  if (simulate->parsed()) {
    return cozy::controller::RunSimulate(snapshotPath,
                                         output == "table" ? cozy::controller::OutputFormat::kTable
                                                           : cozy::controller::OutputFormat::kJson,
                                         std::cout, std::cerr, device);
  }
  if (run->parsed()) {
    try {
      options.gpuResourceNames = cozy::controller::SplitResourceNames(resourceNames);
      options.rawNamesForbidden = rawNames == "forbid";
      options.attachmentGrace = PositiveDuration("--attachment-grace", grace);
      options.leaseDuration = PositiveDuration("--lease-duration", leaseDuration);
      options.renewDeadline = PositiveDuration("--renew-deadline", renewDeadline);
      options.retryPeriod = PositiveDuration("--retry-period", retryPeriod);
      options.resync = PositiveDuration("--resync", resync);
      options.discoveryInterval = PositiveDuration("--discovery-interval", discoveryInterval);
      options.bindWait = PositiveDuration("--bind-wait", bindWait);
      options.notReadyGrace = NonNegativeDuration("--not-ready-grace", notReadyGrace);
      if (!std::isfinite(options.qps) || options.qps < 0 || options.burst < 1) {
        throw BadFlag{"--qps must be 0 or more and --burst at least 1"};
      }
    } catch (const BadFlag& bad) {
      std::cerr << "gpu-controller run: " << bad.message << "\n";
      return kExitBadInput;
    }
    cozy::runtime::Logger::Get().Configure(
        logFormat == "json" ? cozy::runtime::LogFormat::kJson : cozy::runtime::LogFormat::kText,
        verbosity);
    try {
      return cozy::controller::RunController(options);
    } catch (const std::invalid_argument& error) {
      std::cerr << "gpu-controller run: " << error.what() << "\n";
      return kExitBadInput;
    } catch (const std::exception& error) {
      std::cerr << "gpu-controller run: " << error.what() << "\n";
      return 1;
    }
  }
  return kExitBadInput;
}
