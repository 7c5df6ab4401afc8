// Shared by the tests on real captured hosts: `gpu-agent scan` on a sysfs root as a hoster runs
// it, lspci on the same tree, and the check that the report agrees with lspci, field by field.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

#include "sysfs/scanner.h"
#include "test/support/fixture_host.h"
#include "test/support/lspci.h"

namespace cozy::captures {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::Field;
using testing::LspciRecord;
using testing::RunCommand;
using testing::ShellQuote;

constexpr const char* kCaptures = "real-sysfs/";

inline std::string Slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

inline std::string Trimmed(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) {
    text.pop_back();
  }
  return text;
}

struct Report {
  json object;
  std::string warnings;  // stderr
  std::map<std::string, json> devices;
};

// `gpu-agent scan` on `root` with the fixture pci.ids (names that do not change with Debian's).
inline Report ScanWithAgent(const fs::path& root, const std::string& extra = "") {
  const auto result = RunCommand(ShellQuote(testing::GpuAgentBinary().string()) +
                                 " scan --sysfs-root " + ShellQuote(root.string()) + " --pci-ids " +
                                 ShellQuote(testing::FixturePciIds().string()) +
                                 " --node-name captured -o json " + extra);
  if (result.exitCode != 0) {
    throw std::runtime_error("gpu-agent scan exited " + std::to_string(result.exitCode) + ": " +
                             result.err);
  }
  Report report;
  report.object = json::parse(result.out);
  report.warnings = result.err;
  for (const auto& device : report.object["status"]["devices"]) {
    report.devices[device["pciAddress"].get<std::string>()] = device;
  }
  return report;
}

// The report's warnings about the tree: all but the one that says no kubelet answered.
inline std::string SysfsWarnings(const Report& report) {
  std::istringstream lines(report.warnings);
  std::string kept;
  std::string line;
  while (std::getline(lines, line)) {
    if (line.find("warning: pod-resources ") == std::string::npos) {
      kept += line + "\n";
    }
  }
  return kept;
}

// lspci's view of the tree: IDs (-n) and names (fixture pci.ids) per slot.
struct LspciView {
  std::map<std::string, LspciRecord> ids;
  std::map<std::string, LspciRecord> names;
};

inline LspciView RunLspci(const fs::path& root) {
  const std::string base =
      "lspci -A linux-sysfs -O sysfs.path=" + ShellQuote((root / "sys/bus/pci").string()) + " -i " +
      ShellQuote(testing::FixturePciIds().string()) + " -D -k -vmm";
  const auto ids = RunCommand(base + " -n");
  const auto names = RunCommand(base);
  if (ids.exitCode != 0 || names.exitCode != 0) {
    throw std::runtime_error("lspci: " + ids.err + names.err);
  }
  return {testing::ParseLspciMachineReadable(ids.out),
          testing::ParseLspciMachineReadable(names.out)};
}

// What lspci says the GPUs are: the agent's filter applied to lspci's vendor and class.
inline std::set<std::string> LspciGpus(const LspciView& lspci) {
  std::set<std::string> gpus;
  for (const auto& [slot, record] : lspci.ids) {
    const auto vendor = static_cast<uint16_t>(std::stoul(record.at("Vendor"), nullptr, 16));
    const auto classCode = static_cast<uint32_t>(std::stoul(record.at("Class"), nullptr, 16));
    if (sysfs::IsGpuFunction(vendor, classCode << 8, {})) {
      gpus.insert(slot);
    }
  }
  return gpus;
}

// Every device of the report agrees with lspci on the same tree, field by field.
inline void ExpectReportAgreesWithLspci(const Report& report, const LspciView& lspci) {
  std::set<std::string> reported;
  for (const auto& [address, device] : report.devices) {
    reported.insert(address);
    SCOPED_TRACE(address);
    ASSERT_EQ(lspci.ids.count(address), 1U);
    const LspciRecord& ids = lspci.ids.at(address);
    const LspciRecord& names = lspci.names.at(address);
    EXPECT_EQ(device["vendorID"], Field(ids, "Vendor"));
    EXPECT_EQ(device["deviceID"], Field(ids, "Device"));
    const std::string progIf = Field(ids, "ProgIf").empty() ? "00" : Field(ids, "ProgIf");
    EXPECT_EQ(device["classCode"], Field(ids, "Class") + progIf);
    EXPECT_EQ(device.value("subsystemVendorID", ""), Field(ids, "SVendor"));
    EXPECT_EQ(device.value("subsystemDeviceID", ""), Field(ids, "SDevice"));
    EXPECT_EQ(device.value("vendor", ""), Field(names, "Vendor"));
    EXPECT_EQ(device.value("model", ""), Field(names, "Device"));
    EXPECT_EQ(device.value("driver", ""), Field(ids, "Driver"));
    EXPECT_EQ(device.contains("numaNode") ? std::to_string(device["numaNode"].get<int>()) : "",
              Field(ids, "NUMANode"));
    const std::string group = Field(ids, "IOMMUGroup");
    if (!group.empty()) {
      EXPECT_EQ(std::to_string(device["iommuGroup"].get<int>()), group);
      // DESIGN §4.2 from lspci's groups and drivers: every other member of the group is on a
      // vfio driver, pci-stub or no driver, bridges aside.
      bool viable = true;
      for (const auto& [slot, other] : lspci.ids) {
        const std::string driver = Field(other, "Driver");
        if (slot != address && Field(other, "IOMMUGroup") == group &&
            Field(other, "Class") != "0604" && !driver.empty() && driver != "pci-stub" &&
            driver.find("vfio") == std::string::npos) {
          viable = false;
        }
      }
      EXPECT_EQ(device["iommuGroupViable"], viable);
    }
  }
  EXPECT_EQ(reported, LspciGpus(lspci));
}

}  // namespace cozy::captures
