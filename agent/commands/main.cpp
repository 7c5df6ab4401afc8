// gpu-agent: reads a node's GPU functions from sysfs and publishes its GPUNode (DESIGN §4.1).
//
// Built twice from this file. `gpu-agent-full` does everything. `gpu-agent`
// (COZY_AGENT_LIGHT) links only sysfs discovery and the status builder, answers `scan` itself
// when there is no kubelet socket and no kubeconfig, and otherwise (`run`, or a scan that needs
// gRPC or the API) replaces itself with gpu-agent-full through execv, same PID and arguments:
// an offline scan then loads 20 shared libraries instead of 95 (docs/benchmarks.md).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "agent/status/output.h"
#include "agent/status/pod_phases.h"
#include "agent/status/scan_pass.h"
#include "agent/status/status_builder.h"
#include "agent/status/units_tracker.h"
#include "podresources/fetch.h"
#include "runtime/duration.h"
#include "sysfs/attributes.h"
#include "sysfs/scanner.h"

#ifndef COZY_AGENT_LIGHT
#include "agent/daemon.h"
#include "agent/sources/gpunode_publisher.h"
#include "agent/sources/pod_watch.h"
#include "agent/sources/slice_publisher.h"
#include "kube/client.h"
#include "kube/config.h"
#include "podresources/client.h"
#include "runtime/health_server.h"
#include "runtime/log.h"
#endif

#ifndef COZY_VERSION
#define COZY_VERSION "0.0.0"
#endif

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitBadInput = 2;

// Options `scan` and `run` share: where to read the node from.
struct SourceFlags {
  std::string sysfsRoot = "/";
  std::string nodeName;
  std::string pciIds;
  std::vector<std::string> gpuVendors;
  std::string podResources{cozy::podresources::kDefaultEndpoint};
  std::string podResourcesTimeout = "5s";
  std::string podPhases;
  bool nodeNameGiven = false;  // --node-name appeared, even as an empty word
};

struct ScanFlags {
  SourceFlags source;
  std::string output = "json";
  std::string kubeconfig;
};

struct RunFlags {
  SourceFlags source;
  std::string kubeconfig;
  std::string resyncInterval = "10m";
  std::string podResourcesInterval = "10s";
  std::string debounce = "50ms";
  std::string staleAfter = "1m";
  std::string udevSource = "auto";
  std::string logFormat = "text";
  std::string healthAddress = "127.0.0.1:8080";
  std::string dbus = "off";
  std::string resourceSlices = "off";  // on: the DRA driver: the node's ResourceSlice and
                                       // kubelet's plugin (docs/dra.md)
  std::string kubeletDir = "/var/lib/kubelet";
  std::string cdiDir = "/var/run/cdi";
  double qps = 5.0;  // the API client's rate limit (client-go's defaults)
  int burst = 10;
  int verbosity = 0;
};

// What the shared flags make once checked.
struct Sources {
  cozy::sysfs::ScanOptions scan;
  cozy::podresources::ClientOptions podResources;
  std::optional<cozy::agent::PodPhases> podPhases;
  std::string nodeName;
};

struct BadInputError {
  std::string reason;
};

#ifdef COZY_AGENT_LIGHT
// Where gpu-agent-full lies, relative to this binary's directory: beside it in the build tree,
// under libexec when installed (COZY_FULL_AGENT_INSTALLED, from CMake).
#ifndef COZY_FULL_AGENT_INSTALLED
#define COZY_FULL_AGENT_INSTALLED "../libexec/gpu-agent/gpu-agent-full"
#endif

// Replaces this process with gpu-agent-full and the same arguments; returns only on failure.
[[noreturn]] void ExecFullAgent(char** argv) {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  const std::filesystem::path directory = error ? std::filesystem::path(".") : self.parent_path();
  const std::filesystem::path candidates[] = {directory / "gpu-agent-full",
                                              directory / COZY_FULL_AGENT_INSTALLED};
  for (const auto& candidate : candidates) {
    if (::access(candidate.c_str(), X_OK) == 0) {
      ::execv(candidate.c_str(), argv);
      std::fprintf(stderr, "gpu-agent: cannot start %s: %s\n", candidate.c_str(),
                   std::strerror(errno));
      std::exit(kExitFailure);
    }
  }
  std::fprintf(stderr,
               "gpu-agent: gpu-agent-full (the daemon and the kubelet/API clients) is not "
               "installed: looked for %s and %s\n",
               candidates[0].c_str(), candidates[1].c_str());
  std::exit(kExitFailure);
}
#endif

std::chrono::milliseconds RequireDuration(const std::string& flag, const std::string& text) {
  const auto duration = cozy::runtime::ParseDuration(text);
  if (!duration || duration->count() == 0) {
    throw BadInputError{flag + " " + text + ": not a duration such as 5s, 500ms or 10m"};
  }
  return *duration;
}

std::string DefaultNodeName() {
  if (const char* fromEnvironment = std::getenv("NODE_NAME"); fromEnvironment && *fromEnvironment) {
    return fromEnvironment;
  }
  std::array<char, 256> host{};
  if (::gethostname(host.data(), host.size() - 1) == 0 && host[0] != '\0') {
    return host.data();
  }
  return "localhost";
}

// A DNS-1123 subdomain, what Kubernetes accepts as a Node's name (the daemon checks it).
[[maybe_unused]] bool IsDnsSubdomain(const std::string& name) {
  if (name.empty() || name.size() > 253) {
    return false;
  }
  size_t labelStart = 0;
  for (size_t i = 0; i <= name.size(); ++i) {
    if (i == name.size() || name[i] == '.') {
      const size_t length = i - labelStart;
      if (length == 0 || length > 63 || name[labelStart] == '-' || name[i - 1] == '-') {
        return false;
      }
      labelStart = i + 1;
      continue;
    }
    const char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) {
      return false;
    }
  }
  return true;
}

void AddSourceFlags(CLI::App* command, SourceFlags& flags) {
  command
      ->add_option("--sysfs-root", flags.sysfsRoot,
                   "Directory that holds sys/ (a fixture tree stands in for the host)")
      ->capture_default_str();
  command->add_option("--node-name", flags.nodeName,
                      "metadata.name of the GPUNode (default: $NODE_NAME, else the hostname)");
  command->add_option("--pci-ids", flags.pciIds,
                      "pci.ids file for names (default: libpci's, Debian's pci.ids)");
  command
      ->add_option("--gpu-vendor", flags.gpuVendors,
                   "Also treat class 0x03 functions of this PCI vendor (hex) as GPUs")
      ->take_all();
  command
      ->add_option("--pod-resources", flags.podResources,
                   "kubelet's pod-resources endpoint; when nobody answers there, units are "
                   "reported as unknown")
      ->capture_default_str();
  command
      ->add_option("--pod-resources-timeout", flags.podResourcesTimeout,
                   "Deadline of each pod-resources call")
      ->capture_default_str();
  command->add_option("--pod-phases", flags.podPhases,
                      "Pod phases as JSON ({\"ns/name\": \"Running\"} or a kubectl PodList), for "
                      "tests; without it `scan` counts every pod kubelet lists as active");
}

Sources CheckSources(const SourceFlags& flags) {
  Sources sources;
  sources.scan.root = flags.sysfsRoot;
  if (!flags.pciIds.empty()) {
    if (!std::ifstream(flags.pciIds).good()) {
      throw BadInputError{"--pci-ids " + flags.pciIds + ": cannot read the file"};
    }
    sources.scan.pciIdsPath = flags.pciIds;
  }
  for (const std::string& vendor : flags.gpuVendors) {
    const auto parsed =
        cozy::sysfs::ParseHexAttribute(vendor.rfind("0x", 0) == 0 ? vendor : "0x" + vendor, 4);
    if (!parsed) {
      throw BadInputError{"--gpu-vendor " + vendor + ": not a 4-digit hex PCI vendor ID"};
    }
    sources.scan.extraGpuVendors.push_back(static_cast<uint16_t>(*parsed));
  }
  sources.podResources.callTimeout =
      RequireDuration("--pod-resources-timeout", flags.podResourcesTimeout);
  if (!cozy::podresources::UnixSocketPath(flags.podResources)) {
    throw BadInputError{"--pod-resources " + flags.podResources +
                        ": not a unix:// endpoint or socket path"};
  }
  sources.podResources.endpoint = flags.podResources;
  if (!flags.podPhases.empty()) {
    std::ifstream in(flags.podPhases);
    if (!in) {
      throw BadInputError{"--pod-phases " + flags.podPhases + ": cannot read the file"};
    }
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    try {
      sources.podPhases = cozy::agent::ParsePodPhases(text);
    } catch (const std::exception& error) {
      throw BadInputError{"--pod-phases " + flags.podPhases + ": " + error.what()};
    }
  }
  sources.nodeName = flags.nodeName.empty() ? DefaultNodeName() : flags.nodeName;
  return sources;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define COZY_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define COZY_SANITIZED 1
#endif
#endif

// Ends `scan` once its output is out, without freeing what it built: the kernel takes the
// process's memory back in one piece, where freeing the scan's tens of thousands of allocations
// one by one took 0.7 ms, a twentieth of the command (docs/benchmarks.md). Sanitizer builds
// return instead, so that LeakSanitizer still checks the scan path.
int EndScan(int code) {
#ifdef COZY_SANITIZED
  return code;
#else
  std::fflush(stderr);
  std::_Exit(code);
#endif
}

int RunScan(const ScanFlags& flags, [[maybe_unused]] char** argv) {
  const Sources sources = CheckSources(flags.source);
#ifdef COZY_AGENT_LIGHT
  // Talking to kubelet (gRPC) or the API server (libcurl) is gpu-agent-full's job.
  const std::optional<cozy::podresources::FetchResult> noKubelet =
      cozy::podresources::SocketAbsent(sources.podResources);
  if (!noKubelet || !flags.kubeconfig.empty()) {
    ExecFullAgent(argv);
  }
#endif
  // The host first: a root that holds no sysfs is bad input, whatever kubelet would say.
  cozy::agent::HostReading host;
  try {
    host = cozy::agent::ReadHost(sources.scan);
  } catch (const cozy::sysfs::RootError& error) {
    throw BadInputError{error.what()};
  }
  cozy::agent::PodPhases phases = sources.podPhases.value_or(cozy::agent::PodPhases{});
  cozy::agent::UnitsTracker tracker;
#ifdef COZY_AGENT_LIGHT
  tracker.Update(*noKubelet);
#else
  if (!flags.kubeconfig.empty() && !sources.podPhases) {
    // The node's pods, listed once, so a finished pod kubelet still lists holds no unit.
    try {
      cozy::kube::Client api(cozy::kube::LoadKubeconfig(flags.kubeconfig));
      cozy::kube::ListOptions list;
      list.fieldSelector = "spec.nodeName=" + sources.nodeName;
      const auto pods = api.List(cozy::kube::ResourcePath("", "v1", "pods", "", "", ""), list);
      phases = cozy::agent::ParsePodPhases(pods.dump());
    } catch (const cozy::kube::ConfigError& error) {
      throw BadInputError{"--kubeconfig " + flags.kubeconfig + ": " + error.what()};
    } catch (const std::exception& error) {
      std::fprintf(stderr,
                   "gpu-agent: warning: cannot list the node's pods: %s; every pod "
                   "kubelet lists counts as active\n",
                   error.what());
    }
  }
  cozy::podresources::Client client(sources.podResources);
  tracker.Update(client.Fetch());
#endif
  if (!tracker.known()) {
    std::fprintf(stderr, "gpu-agent: warning: pod-resources %s: %s; units unknown\n",
                 std::string(cozy::podresources::ToString(tracker.lastState())).c_str(),
                 tracker.lastMessage().c_str());
  }
  // JSON is printed as it is written, with no document in between (docs/benchmarks.md).
  cozy::agent::PassOptions options;
  options.document = flags.output != "json";
  cozy::agent::PassResult pass = cozy::agent::BuildPass(host, tracker, phases, options);
  // Each problem once, on stderr, so the output stays a clean document.
  for (const std::string& problem : pass.problems) {
    std::fprintf(stderr, "gpu-agent: warning: %s\n", problem.c_str());
  }
  if (flags.output == "json") {
    // Printed in pieces as it is written: one 64 KiB buffer, not the whole document.
    cozy::agent::PrintGpuNodeJson(
        [](std::string_view piece) { std::fwrite(piece.data(), 1, piece.size(), stdout); },
        sources.nodeName, host.scan, pass.units ? &*pass.units : nullptr,
        pass.stale ? &*pass.stale : nullptr);
    return EndScan(std::fflush(stdout) == 0 && std::ferror(stdout) == 0 ? kExitOk : kExitFailure);
  }
  const nlohmann::json object = cozy::agent::BuildGpuNode(sources.nodeName, std::move(pass.status));
  const std::string rendered =
      flags.output == "yaml" ? cozy::agent::RenderYaml(object) : cozy::agent::RenderTable(object);
  std::fwrite(rendered.data(), 1, rendered.size(), stdout);
  return EndScan(std::fflush(stdout) == 0 && std::ferror(stdout) == 0 ? kExitOk : kExitFailure);
}

#ifndef COZY_AGENT_LIGHT
int RunDaemon(const RunFlags& flags) {
  const Sources sources = CheckSources(flags.source);
  // The agent writes only its own node's GPUNode: its name is never guessed. The unit passes
  // `--node-name ${NODE_NAME}` from /etc/default/gpu-agent, which ships `NODE_NAME=`: an empty
  // word there is a setup left undone, not a request for the hostname.
  const char* fromEnvironment = std::getenv("NODE_NAME");
  if (flags.source.nodeNameGiven && flags.source.nodeName.empty()) {
    throw BadInputError{
        "--node-name is empty: set NODE_NAME in /etc/default/gpu-agent (the unit passes "
        "--node-name ${NODE_NAME}) or pass the Kubernetes node name"};
  }
  if (!flags.source.nodeNameGiven) {
    if (fromEnvironment == nullptr) {
      throw BadInputError{
          "--node-name (or NODE_NAME) is required: the agent writes only its own "
          "node's GPUNode"};
    }
    if (*fromEnvironment == '\0') {
      throw BadInputError{"NODE_NAME is set but empty: set it to this node's Kubernetes name"};
    }
  }
  if (!IsDnsSubdomain(sources.nodeName)) {
    throw BadInputError{"node name \"" + sources.nodeName +
                        "\" is not a Kubernetes node name (lower-case letters, digits, '-' "
                        "and '.', at most 253 characters)"};
  }
  // Checked once here so a typo fails at start; later the daemon rides out a vanished root.
  std::error_code ignored;
  // Joined as paths: "/" + "/sys/..." would read "//sys/...", which LD_PRELOAD path redirectors
  // such as umockdev's do not recognise as /sys.
  if (!std::filesystem::is_directory(
          std::filesystem::path(sources.scan.root) / "sys/bus/pci/devices", ignored)) {
    throw BadInputError{"sysfs root " + sources.scan.root + " holds no sys/bus/pci/devices"};
  }
  cozy::runtime::Logger::Get().Configure(
      flags.logFormat == "json" ? cozy::runtime::LogFormat::kJson : cozy::runtime::LogFormat::kText,
      flags.verbosity);
  cozy::agent::DaemonOptions options;
  options.nodeName = sources.nodeName;
  options.scan = sources.scan;
  options.podResources = sources.podResources;
  options.podResourcesSchedule.interval =
      RequireDuration("--pod-resources-interval", flags.podResourcesInterval);
  options.resync = RequireDuration("--resync-interval", flags.resyncInterval);
  options.debounce = RequireDuration("--debounce", flags.debounce);
  options.staleAfter = RequireDuration("--stale-after", flags.staleAfter);
  options.udevSource = flags.udevSource;
  options.fixedPodPhases = sources.podPhases;
  options.healthAddress = flags.healthAddress;
  options.dbus = flags.dbus;
  options.version = COZY_VERSION;
  if (flags.healthAddress != "off" &&
      cozy::runtime::ParseListenAddress(flags.healthAddress).second < 0) {
    throw BadInputError{"--health-addr " + flags.healthAddress + ": not host:port, :port or off"};
  }
  // The API server: a kubeconfig on a bare-metal host, else in-cluster config in a pod. Without
  // either the agent still runs (discovery, health, metrics) and publishes nothing.
  cozy::kube::ClientOptions clientOptions = cozy::agent::LoopClientOptions();
  try {
    cozy::kube::SetRateLimit(clientOptions, flags.qps, flags.burst);
  } catch (const std::invalid_argument& error) {
    throw BadInputError{error.what()};
  }
  std::unique_ptr<cozy::kube::Client> api;
  try {
    if (!flags.kubeconfig.empty()) {
      api = std::make_unique<cozy::kube::Client>(cozy::kube::LoadKubeconfig(flags.kubeconfig),
                                                 clientOptions);
    } else if (std::getenv("KUBERNETES_SERVICE_HOST") != nullptr) {
      api = std::make_unique<cozy::kube::Client>(cozy::kube::LoadInClusterConfig(), clientOptions);
    }
  } catch (const cozy::kube::ConfigError& error) {
    throw BadInputError{std::string("API config: ") + error.what()};
  }
  std::unique_ptr<cozy::agent::StatusPublisher> publisher;
  std::unique_ptr<cozy::agent::PodWatch> podWatch;
  cozy::agent::SliceOutput slices;
  if (api) {
    publisher = std::make_unique<cozy::agent::ApiStatusPublisher>(*api, sources.nodeName);
    if (!sources.podPhases) {
      podWatch = std::make_unique<cozy::agent::ApiPodWatch>(*api, sources.nodeName);
    }
    if (flags.resourceSlices == "on") {
      slices.publisher = std::make_unique<cozy::agent::SlicePublisher>(*api, sources.nodeName);
      slices.watch =
          std::make_unique<cozy::agent::SliceWatch>(*api, sources.nodeName, *slices.publisher);
      slices.plugin = std::make_unique<cozy::agent::KubeletPlugin>(
          *api, cozy::agent::KubeletPluginOptions{.nodeName = sources.nodeName,
                                                  .kubeletDir = flags.kubeletDir,
                                                  .cdiDir = flags.cdiDir});
    }
  }
  if (!api) {
    cozy::runtime::LogWarning(
        "no API server configured (no --kubeconfig, not in a pod): "
        "discovering and serving health, publishing nothing");
  }
  cozy::agent::Daemon daemon(std::move(options), std::move(publisher), std::move(podWatch),
                             std::move(slices));
  return daemon.Run();
}
#endif

// The `run` command's flags, into `run`.
void AddRunFlags(CLI::App* runCommand, RunFlags& run) {
  AddSourceFlags(runCommand, run.source);
  runCommand->add_option("--kubeconfig", run.kubeconfig,
                         "kubeconfig for a bare-metal host (default: in-cluster config)");
  runCommand
      ->add_option("--resync-interval", run.resyncInterval,
                   "Full rescan and pod-resources read however quiet the node is")
      ->capture_default_str();
  runCommand
      ->add_option("--pod-resources-interval", run.podResourcesInterval,
                   "How often kubelet's pod-resources is read (it has no watch)")
      ->capture_default_str();
  runCommand
      ->add_option("--debounce", run.debounce, "Device events within this window make one rescan")
      ->capture_default_str();
  runCommand
      ->add_option("--stale-after", run.staleAfter,
                   "kubelet silent this long: the status says since when its counts are "
                   "(status.staleUnits)")
      ->capture_default_str();
  runCommand
      ->add_option("--udev-source", run.udevSource,
                   "auto: udev when /run/udev/control exists, else kernel; off: none")
      ->check(CLI::IsMember({"auto", "udev", "kernel", "off"}))
      ->capture_default_str();
  runCommand->add_option("--log-format", run.logFormat, "Log lines as text or JSON")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  runCommand
      ->add_option(
          "--health-addr", run.healthAddress,
          "Where /healthz, /readyz and /metrics are served: host:port, :port (every address) "
          "or off; loopback by default (the chart passes the pod's host IP)")
      ->capture_default_str();
  // The last one wins, so GPU_AGENT_ARGS can say --dbus off after the unit's --dbus system.
  runCommand
      ->add_option("--dbus", run.dbus,
                   "Serve io.cozystack.GPUAgent1 on this bus (system, session or off); the "
                   "address is sd-bus's: $DBUS_SYSTEM_BUS_ADDRESS or $DBUS_SESSION_BUS_ADDRESS "
                   "when set")
      ->check(CLI::IsMember({"system", "session", "off"}))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->capture_default_str();
  runCommand
      ->add_option("--resource-slices", run.resourceSlices,
                   "on: also be DRA driver gpu.cozystack.io: publish this node's vfio-bound GPUs "
                   "as a ResourceSlice and serve kubelet's plugin API (Kubernetes 1.34+, device "
                   "taints on)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  runCommand
      ->add_option("--kubelet-dir", run.kubeletDir,
                   "kubelet's --root-dir: the DRA plugin registers in its plugins_registry/")
      ->capture_default_str();
  runCommand
      ->add_option("--cdi-dir", run.cdiDir,
                   "Where the container runtime reads CDI specs: the DRA plugin writes one per "
                   "prepared claim")
      ->capture_default_str();
  runCommand
      ->add_option("--qps", run.qps,
                   "Requests a second to the API server, on average (0: no limit)")
      ->capture_default_str();
  runCommand->add_option("--burst", run.burst, "Requests to the API server at once, at most")
      ->capture_default_str();
  runCommand->add_option("-v", run.verbosity, "Verbosity: 1 logs every device event")
      ->capture_default_str();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "gpu-agent: publishes a node's GPU functions and their device-plugin units as a "
      "GPUNode"};
  app.set_version_flag("--version", std::string("gpu-agent ") + COZY_VERSION);
  app.require_subcommand(1);

  ScanFlags scan;
  CLI::App* scanCommand = app.add_subcommand(
      "scan", "One discovery pass: print the GPUNode this node would publish (no API writes)");
  AddSourceFlags(scanCommand, scan.source);
  scanCommand->add_option("-o,--output", scan.output, "Output format")
      ->check(CLI::IsMember({"json", "yaml", "table"}))
      ->capture_default_str();
  scanCommand->add_option("--kubeconfig", scan.kubeconfig,
                          "List the node's pods once through this kubeconfig, for their phases");

  RunFlags run;
  CLI::App* runCommand = app.add_subcommand(
      "run", "The daemon: keep this node's GPUNode true, reacting to device events");
  AddRunFlags(runCommand, run);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) {
      return app.exit(error);  // --help, --version
    }
    std::fprintf(stderr, "gpu-agent: %s\n", error.what());
    return kExitBadInput;
  }
  run.source.nodeNameGiven = runCommand->get_option("--node-name")->count() > 0;
  try {
    if (scanCommand->parsed()) {
      return RunScan(scan, argv);
    }
    if (runCommand->parsed()) {
#ifdef COZY_AGENT_LIGHT
      ExecFullAgent(argv);
#else
      return RunDaemon(run);
#endif
    }
  } catch (const BadInputError& error) {
    std::fprintf(stderr, "gpu-agent: %s\n", error.reason.c_str());
    return kExitBadInput;
  }
  return kExitBadInput;
}
