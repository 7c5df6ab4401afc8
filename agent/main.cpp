// gpu-agent: reads a node's GPU functions from sysfs and publishes its GPUNode (DESIGN §4.1).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <fstream>
#include <iterator>
#include <optional>
#include <iostream>
#include <string>
#include <vector>

#include "agent/nvidia_procfs.h"
#include "agent/output.h"
#include "agent/pod_phases.h"
#include "agent/status_builder.h"
#include "agent/units_tracker.h"
#include "podresources/client.h"
#include "sysfs/attributes.h"
#include "sysfs/scanner.h"

#ifndef COZY_VERSION
#define COZY_VERSION "0.0.0"
#endif

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitBadInput = 2;

struct ScanCommand {
  std::string sysfsRoot = "/";
  std::string nodeName;
  std::string output = "json";
  std::string pciIds;
  std::vector<std::string> gpuVendors;
  std::string podResources{cozy::podresources::kDefaultEndpoint};
  std::string podResourcesTimeout = "5s";
  std::string podPhases;
};

// "5s", "300ms", "1m", or plain seconds.
std::optional<std::chrono::milliseconds> ParseDuration(const std::string& text) {
  size_t end = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &end);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  const std::string unit = text.substr(end);
  if (value < 0) {
    return std::nullopt;
  }
  if (unit == "ms") {
    return std::chrono::milliseconds(value);
  }
  if (unit == "s" || unit.empty()) {
    return std::chrono::milliseconds(value * 1000);
  }
  if (unit == "m") {
    return std::chrono::milliseconds(value * 60 * 1000);
  }
  return std::nullopt;
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

int BadInput(const std::string& reason) {
  std::fprintf(stderr, "gpu-agent: %s\n", reason.c_str());
  return kExitBadInput;
}

int RunScan(const ScanCommand& command) {
  cozy::sysfs::ScanOptions options;
  options.root = command.sysfsRoot;
  if (!command.pciIds.empty()) {
    if (!std::ifstream(command.pciIds).good()) {
      return BadInput("--pci-ids " + command.pciIds + ": cannot read the file");
    }
    options.pciIdsPath = command.pciIds;
  }
  for (const std::string& vendor : command.gpuVendors) {
    const auto parsed = cozy::sysfs::ParseHexAttribute(
        vendor.rfind("0x", 0) == 0 ? vendor : "0x" + vendor, 4);
    if (!parsed) {
      return BadInput("--gpu-vendor " + vendor + ": not a 4-digit hex PCI vendor ID");
    }
    options.extraGpuVendors.push_back(static_cast<uint16_t>(*parsed));
  }
  const auto timeout = ParseDuration(command.podResourcesTimeout);
  if (!timeout || timeout->count() == 0) {
    return BadInput("--pod-resources-timeout " + command.podResourcesTimeout +
                    ": not a duration such as 5s or 500ms");
  }
  if (!cozy::podresources::UnixSocketPath(command.podResources)) {
    return BadInput("--pod-resources " + command.podResources +
                    ": not a unix:// endpoint or socket path");
  }
  cozy::agent::PodPhases podPhases;
  if (!command.podPhases.empty()) {
    std::ifstream in(command.podPhases);
    if (!in) {
      return BadInput("--pod-phases " + command.podPhases + ": cannot read the file");
    }
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    try {
      podPhases = cozy::agent::ParsePodPhases(text);
    } catch (const std::exception& error) {
      return BadInput("--pod-phases " + command.podPhases + ": " + error.what());
    }
  }
  cozy::sysfs::HostScan scan;
  try {
    scan = cozy::sysfs::ScanHost(options);
  } catch (const cozy::sysfs::RootError& error) {
    return BadInput(error.what());
  }
  const cozy::agent::NvidiaGpuUuids nvidia = cozy::agent::ReadNvidiaGpuUuids(command.sysfsRoot);
  for (const std::string& problem : nvidia.problems) {
    std::fprintf(stderr, "gpu-agent: warning: %s\n", problem.c_str());
  }
  cozy::podresources::ClientOptions clientOptions;
  clientOptions.endpoint = command.podResources;
  clientOptions.callTimeout = *timeout;
  cozy::podresources::Client client(clientOptions);
  cozy::agent::UnitsTracker tracker;
  tracker.Update(client.Fetch());
  if (!tracker.known()) {
    std::fprintf(stderr, "gpu-agent: warning: pod-resources %s: %s; units unknown\n",
                 std::string(cozy::podresources::ToString(tracker.lastState())).c_str(),
                 tracker.lastMessage().c_str());
  }
  const auto units = tracker.Count(scan, podPhases, nvidia.gpus);
  // Each problem once, on stderr, so the output stays a clean document.
  for (const auto& problem : scan.problems) {
    std::fprintf(stderr, "gpu-agent: warning: %s: %s\n", problem.path.c_str(),
                 problem.message.c_str());
  }
  for (const auto& function : scan.functions) {
    for (const auto& problem : function.problems) {
      std::fprintf(stderr, "gpu-agent: warning: %s\n", problem.c_str());
    }
  }
  const nlohmann::json object = cozy::agent::BuildGpuNode(
      command.nodeName.empty() ? DefaultNodeName() : command.nodeName,
      cozy::agent::BuildStatus(scan, units ? &*units : nullptr));
  std::string rendered;
  if (command.output == "json") {
    rendered = cozy::agent::RenderJson(object);
  } else if (command.output == "yaml") {
    rendered = cozy::agent::RenderYaml(object);
  } else {
    rendered = cozy::agent::RenderTable(object);
  }
  std::fwrite(rendered.data(), 1, rendered.size(), stdout);
  return std::fflush(stdout) == 0 ? kExitOk : kExitFailure;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gpu-agent: publishes a node's GPU functions and their device-plugin units as a "
               "GPUNode"};
  app.set_version_flag("--version", std::string("gpu-agent ") + COZY_VERSION);
  app.require_subcommand(1);

  ScanCommand scan;
  CLI::App* scanCommand = app.add_subcommand(
      "scan", "One discovery pass: print the GPUNode this node would publish (no API writes)");
  scanCommand->add_option("--sysfs-root", scan.sysfsRoot,
                          "Directory that holds sys/ (a fixture tree stands in for the host)")
      ->capture_default_str();
  scanCommand->add_option("--node-name", scan.nodeName,
                          "metadata.name of the GPUNode (default: $NODE_NAME, else the hostname)");
  scanCommand->add_option("-o,--output", scan.output, "Output format")
      ->check(CLI::IsMember({"json", "yaml", "table"}))
      ->capture_default_str();
  scanCommand->add_option("--pci-ids", scan.pciIds,
                          "pci.ids file for names (default: libpci's, Debian's pci.ids)");
  scanCommand->add_option("--gpu-vendor", scan.gpuVendors,
                          "Also treat class 0x03 functions of this PCI vendor (hex) as GPUs")
      ->take_all();
  scanCommand->add_option("--pod-resources", scan.podResources,
                          "kubelet's pod-resources endpoint; when nobody answers there, units "
                          "are reported as unknown")
      ->capture_default_str();
  scanCommand->add_option("--pod-resources-timeout", scan.podResourcesTimeout,
                          "Deadline of each pod-resources call")
      ->capture_default_str();
  scanCommand->add_option("--pod-phases", scan.podPhases,
                          "Pod phases as JSON ({\"ns/name\": \"Running\"} or a kubectl PodList); "
                          "without it every pod kubelet lists counts as active");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) {
      return app.exit(error);  // --help, --version
    }
    return BadInput(error.what());
  }
  if (scanCommand->parsed()) {
    return RunScan(scan);
  }
  return kExitBadInput;
}
