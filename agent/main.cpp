// gpu-agent: reads a node's GPU functions from sysfs and publishes its GPUNode (DESIGN §4.1).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "agent/output.h"
#include "agent/status_builder.h"
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
};

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
  cozy::sysfs::HostScan scan;
  try {
    scan = cozy::sysfs::ScanHost(options);
  } catch (const cozy::sysfs::RootError& error) {
    return BadInput(error.what());
  }
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
      cozy::agent::BuildStatus(scan));
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
