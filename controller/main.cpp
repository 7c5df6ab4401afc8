// gpu-controller: the GPU catalog's controller. `run` is the daemon (leader election, caches,
// the GPU reconciler, and with --enable-gpu the binder and the admission webhooks); `simulate`
// runs the shared model offline on a snapshot file.
#include <CLI/CLI.hpp>
#include <cmath>
#include <iostream>
#include <limits>

#include "controller/daemon/daemon.h"
#include "controller/simulate.h"
#include "controller/snapshot_json.h"
#include "runtime/duration_flag.h"
#include "runtime/log.h"

namespace {

using cozy::runtime::AddDurationFlag;
using cozy::runtime::DurationRule;

constexpr int kExitBadInput = 2;

struct SimulateFlags {
  std::string snapshotPath;
  std::string output = "json";
  std::string device;
};

CLI::App* AddSimulate(CLI::App& app, SimulateFlags& flags) {
  CLI::App* simulate = app.add_subcommand(
      "simulate", "Print the model's view of a cluster snapshot (a Kubernetes List as JSON)");
  simulate->add_option("--snapshot", flags.snapshotPath, "The snapshot file")->required();
  simulate->add_option("--device", flags.device,
                       "Only why this GPUDevice (namespace/name) stands as it does, as "
                       "`kubectl gpu why` says it on a live cluster");
  simulate->add_option("-o,--output", flags.output, "Output format")
      ->check(CLI::IsMember({"json", "table"}));
  return simulate;
}

// `run`'s flags: each binds straight into RunOptions, whose declarations hold the defaults
// (controller/daemon/daemon.h); the few that are not options of the daemon are here.
struct RunFlags {
  cozy::controller::RunOptions options;
  std::string resourceNames;
  std::string rawNames = "allow";
  std::string logFormat = "text";
  int verbosity = 0;
};

void AddTimingFlags(CLI::App* run, cozy::controller::RunOptions& options) {
  AddDurationFlag(run, "--attachment-grace", options.attachmentGrace,
                  "How long an attachment waits for its VMI to appear (positive)");
  AddDurationFlag(run, "--lease-duration", options.leaseDuration, "The Lease's duration");
  AddDurationFlag(run, "--renew-deadline", options.renewDeadline,
                  "How long the leader tries to renew before it steps down");
  AddDurationFlag(run, "--retry-period", options.retryPeriod, "Between tries at the Lease");
  AddDurationFlag(run, "--resync", options.resync, "A reconciler pass at least this often");
  AddDurationFlag(run, "--discovery-interval", options.discoveryInterval,
                  "How often to ask which optional kinds (KubeVirt, usage records) are served");
  AddDurationFlag(run, "--bind-wait", options.bindWait,
                  "How long a VM start waits for the binder to place its GPUs (positive)");
  AddDurationFlag(run, "--shutdown-delay", options.shutdownDelay,
                  "With --enable-gpu, after SIGTERM: how long the webhooks keep serving, unready "
                  "and closing each connection after its answer, before new connections are "
                  "refused; 0s: none",
                  DurationRule::kNonNegative);
  AddDurationFlag(run, "--not-ready-grace", options.notReadyGrace,
                  "How long GPUs held for a VM that is off wait on a node that is not Ready (or "
                  "under a condition taint) before they move; 0s: at once",
                  DurationRule::kNonNegative);
}

void AddWebhookFlags(CLI::App* run, cozy::controller::RunOptions& options) {
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
}

CLI::App* AddRun(CLI::App& app, RunFlags& flags) {
  CLI::App* run = app.add_subcommand(
      "run",
      "Run the controller: leader election, caches and the GPU reconciler (docs/controller.md)");
  cozy::controller::RunOptions& options = flags.options;
  run->add_option("--kubeconfig", options.kubeconfig, "kubeconfig file (default: in-cluster)");
  run->add_option("--namespace", options.namespaceName,
                  "Home of the Lease gpu-controller and the settings ConfigMap")
      ->capture_default_str();
  run->add_option("--identity", options.identity, "Lease holder identity (default: hostname)");
  run->add_flag("--enable-gpu", options.enableGpu,
                "GPUs for VMs: placement, webhooks and the KubeVirt watches");
  run->add_option("--gpu-resource-names", flags.resourceNames,
                  "The hoster's GPU resource names, comma separated");
  run->add_option("--raw-gpu-names", flags.rawNames,
                  "Whether VMs and pods may request GPU resource names directly")
      ->check(CLI::IsMember({"allow", "forbid"}))
      ->capture_default_str();
  run->add_option("--health-addr", options.healthAddress,
                  "/healthz, /readyz and /metrics: host:port, :port or off")
      ->capture_default_str();
  run->add_option("--qps", options.qps, "API requests per second (0: no limit)")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            double qps = 0;
            const bool number = CLI::detail::lexical_cast(text, qps);
            return number && std::isfinite(qps) && qps >= 0 ? "" : "must be 0 or more";
          },
          "0 or more", "qps"))
      ->capture_default_str();
  run->add_option("--burst", options.burst, "API request burst")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            int burst = 0;
            const bool number = CLI::detail::lexical_cast(text, burst);
            return number && burst >= 1 ? "" : "must be at least 1";
          },
          "at least 1", "burst"))
      ->capture_default_str();
  run->add_option("--catalog-tenant-series", options.catalogTenantSeries,
                  "With --enable-gpu: the namespaces holding the most GPU units that get a "
                  "gpu_catalog_tenant_units_held series of their own, the rest summed as "
                  "namespace \"_other\"; 0: no per-tenant series")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  AddTimingFlags(run, options);
  AddWebhookFlags(run, options);
  run->add_option("--log-format", flags.logFormat)->check(CLI::IsMember({"text", "json"}));
  run->add_flag("-v,--verbose", flags.verbosity, "Debug logs");
  return run;
}

int Run(RunFlags& flags) {
  cozy::controller::RunOptions& options = flags.options;
  options.gpuResourceNames = cozy::controller::SplitResourceNames(flags.resourceNames);
  options.rawNamesForbidden = flags.rawNames == "forbid";
  cozy::runtime::Logger::Get().Configure(
      flags.logFormat == "json" ? cozy::runtime::LogFormat::kJson : cozy::runtime::LogFormat::kText,
      flags.verbosity);
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gpu-controller: GPU catalog controller for KubeVirt VMs"};
  app.set_version_flag("--version", std::string(COZY_VERSION));
  app.require_subcommand(1);
  SimulateFlags simulateFlags;
  CLI::App* simulate = AddSimulate(app, simulateFlags);
  RunFlags runFlags;
  CLI::App* run = AddRun(app, runFlags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& success) {
    return app.exit(success);
  } catch (const CLI::ParseError& error) {
    app.exit(error);
    return kExitBadInput;  // bad input, like a malformed snapshot
  }
  if (simulate->parsed()) {
    return cozy::controller::RunSimulate(simulateFlags.snapshotPath,
                                         simulateFlags.output == "table"
                                             ? cozy::controller::OutputFormat::kTable
                                             : cozy::controller::OutputFormat::kJson,
                                         std::cout, std::cerr, simulateFlags.device);
  }
  if (run->parsed()) return Run(runFlags);
  return kExitBadInput;
}
