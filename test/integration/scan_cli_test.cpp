// `gpu-agent scan` as a user runs it (DESIGN §4.1): output formats, exit codes, warnings.
// A1: the GPUNode a node would publish lists each GPU function found in sysfs.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

#include "test/support/fixture_host.h"

namespace cozy {
namespace {

using testing::FixtureHost;
using testing::GpuAgentBinary;
using testing::RunCommand;
using testing::ShellQuote;

std::string Scan(const std::string& arguments) {
  return ShellQuote(GpuAgentBinary().string()) + " scan " + arguments;
}

std::string OnFixture(const FixtureHost& host) {
  return "--sysfs-root " + ShellQuote(host.root().string()) + " --pci-ids " +
         ShellQuote(testing::FixturePciIds().string()) + " --node-name gpu-node-1" +
         " --pod-resources unix:///nonexistent/kubelet.sock";
}

// The one warning a scan without kubelet prints (units unknown, not zero).
constexpr char kNoKubelet[] = "gpu-agent: warning: pod-resources socketAbsent: ";

TEST(ScanCli, JsonIsTheWholeGpuNodeObject) {
  const FixtureHost host("a100-vfio");
  const auto result = RunCommand(Scan(OnFixture(host) + " -o json"));
  ASSERT_EQ(result.exitCode, 0) << result.err;
  EXPECT_EQ(result.err.rfind(kNoKubelet, 0), 0U) << result.err;
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1);
  const auto object = nlohmann::json::parse(result.out);
  EXPECT_EQ(object["apiVersion"], "gpu.cozystack.io/v1alpha1");
  EXPECT_EQ(object["kind"], "GPUNode");
  EXPECT_EQ(object["metadata"]["name"], "gpu-node-1");
  const auto& devices = object["status"]["devices"];
  ASSERT_EQ(devices.size(), 2U);
  const nlohmann::json expected = {{"pciAddress", "0000:3b:00.0"},
                                   {"vendorID", "10de"},
                                   {"deviceID", "20f1"},
                                   {"subsystemVendorID", "10de"},
                                   {"subsystemDeviceID", "145f"},
                                   {"classCode", "030200"},
                                   {"vendor", "NVIDIA Corporation"},
                                   {"model", "GA100 [A100 PCIe 40GB]"},
                                   {"driver", "vfio-pci"},
                                   {"iommuGroup", 40},
                                   {"iommuGroupViable", true},
                                   {"numaNode", 0},
                                   {"sriov", {{"totalVFs", 16}, {"numVFs", 0}}}};
  EXPECT_EQ(devices[0], expected);
  EXPECT_EQ(devices[1]["pciAddress"], "0000:af:00.0");
  EXPECT_EQ(devices[1]["numaNode"], 1);
}

TEST(ScanCli, WithoutPodResourcesUnitsAreLeftOutNotZero) {
  const FixtureHost host("t4-mdev");
  const auto result = RunCommand(Scan(OnFixture(host)));
  ASSERT_EQ(result.exitCode, 0) << result.err;
  const auto object = nlohmann::json::parse(result.out);
  EXPECT_FALSE(object["status"].contains("resourceNames"));
  EXPECT_FALSE(object["status"].contains("unplaced"));
  for (const auto& device : object["status"]["devices"]) {
    for (const char* unknown : {"resources", "allocatable", "allocated", "health"}) {
      EXPECT_FALSE(device.contains(unknown)) << unknown;
    }
  }
  const auto& t4 = object["status"]["devices"][0];
  EXPECT_EQ(t4["mdevTypes"][1], (nlohmann::json{{"type", "nvidia-231"},
                                                {"name", "GRID T4-2Q"},
                                                {"availableInstances", 6},
                                                {"maxInstances", 8}}));
  EXPECT_EQ(t4["mdevs"][0], (nlohmann::json{{"uuid", "aaaaaaaa-0000-4000-8000-000000000001"},
                                            {"type", "nvidia-231"}}));
}

TEST(ScanCli, VendorSpecificVgpuAndVfFields) {
  const FixtureHost host("l40s-vendor-vfio");
  const auto result = RunCommand(Scan(OnFixture(host)));
  ASSERT_EQ(result.exitCode, 0) << result.err;
  const auto devices = nlohmann::json::parse(result.out)["status"]["devices"];
  ASSERT_EQ(devices.size(), 5U);
  EXPECT_EQ(devices[0]["sriov"], (nlohmann::json{{"totalVFs", 32}, {"numVFs", 4}}));
  EXPECT_FALSE(devices[0].contains("vgpu"));
  EXPECT_EQ(devices[1]["physicalFunction"], "0000:41:00.0");
  EXPECT_FALSE(devices[1]["vgpu"].contains("currentType"));  // reads 0
  EXPECT_EQ(devices[2]["vgpu"],
            (nlohmann::json{{"currentType", "1150"},
                            {"creatableTypes", {{{"id", "1150"}, {"name", "NVIDIA L40S-4Q"}}}}}));
}

TEST(ScanCli, YamlReadsBackAsTheSameObject) {
  const FixtureHost host("l40s-sriov-mdev");
  const auto json = RunCommand(Scan(OnFixture(host) + " -o json"));
  const auto yaml = RunCommand(Scan(OnFixture(host) + " -o yaml"));
  ASSERT_EQ(yaml.exitCode, 0) << yaml.err;
  const YAML::Node root = YAML::Load(yaml.out);
  const auto expected = nlohmann::json::parse(json.out);
  EXPECT_EQ(root["kind"].as<std::string>(), "GPUNode");
  const YAML::Node devices = root["status"]["devices"];
  ASSERT_EQ(devices.size(), expected["status"]["devices"].size());
  for (size_t i = 0; i < devices.size(); ++i) {
    const auto& device = expected["status"]["devices"][i];
    // Strings that look like numbers are quoted, so they read back as the same strings.
    EXPECT_EQ(devices[i]["classCode"].Tag(), "!");
    EXPECT_EQ(devices[i]["classCode"].as<std::string>(), device["classCode"]);
    EXPECT_EQ(devices[i]["pciAddress"].as<std::string>(), device["pciAddress"]);
    EXPECT_EQ(devices[i]["deviceID"].as<std::string>(), device["deviceID"]);
    EXPECT_EQ(devices[i]["iommuGroup"].as<int>(), device["iommuGroup"].get<int>());
  }
  EXPECT_EQ(root["status"]["devices"][2]["mdevs"][0]["uuid"].as<std::string>(),
            "bbbbbbbb-0000-4000-8000-000000000001");
}

TEST(ScanCli, TableShowsOneLinePerGpuForPeople) {
  const FixtureHost host("hgx-h100");
  const auto result = RunCommand(Scan(OnFixture(host) + " -o table"));
  ASSERT_EQ(result.exitCode, 0) << result.err;
  std::vector<std::string> lines;
  std::istringstream stream(result.out);
  for (std::string line; std::getline(stream, line);) {
    lines.push_back(line);
  }
  ASSERT_EQ(lines.size(), 9U);  // header + 8 H100, no NVSwitch, no ASPEED
  EXPECT_EQ(lines[0].rfind("ADDRESS", 0), 0U);
  EXPECT_NE(lines[0].find("MODEL"), std::string::npos);
  EXPECT_NE(lines[0].find("NUMA"), std::string::npos);
  EXPECT_NE(lines[1].find("0000:19:00.0  10de:2330  GH100 [H100 SXM5 80GB]  nvidia"),
            std::string::npos);
  EXPECT_EQ(result.out.find("NVSwitch"), std::string::npos);
}

TEST(ScanCli, MissingRootIsExitTwoWithOneLine) {
  const auto result = RunCommand(Scan("--sysfs-root /nonexistent/root"));
  EXPECT_EQ(result.exitCode, 2);
  EXPECT_EQ(result.out, "");
  EXPECT_EQ(result.err,
            "gpu-agent: sysfs root /nonexistent/root does not exist or is not a "
            "directory\n");
}

TEST(ScanCli, RootWithoutBusPciIsExitTwo) {
  testing::TempDir empty;
  const auto result = RunCommand(Scan("--sysfs-root " + ShellQuote(empty.path().string())));
  EXPECT_EQ(result.exitCode, 2);
  EXPECT_NE(result.err.find("holds no sys/bus/pci/devices"), std::string::npos);
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1);
}

TEST(ScanCli, BadArgumentsAreExitTwo) {
  const FixtureHost host("a100-vfio");
  EXPECT_EQ(RunCommand(Scan(OnFixture(host) + " -o xml")).exitCode, 2);
  EXPECT_EQ(RunCommand(Scan(OnFixture(host) + " --pci-ids /nonexistent/pci.ids")).exitCode, 2);
  EXPECT_EQ(RunCommand(Scan(OnFixture(host) + " --gpu-vendor xyz")).exitCode, 2);
  EXPECT_EQ(RunCommand(ShellQuote(GpuAgentBinary().string()) + " frobnicate").exitCode, 2);
}

TEST(ScanCli, BrokenHostWarnsOnStderrAndStillPrintsTheGoodGpus) {
  const FixtureHost host("broken");
  const auto result = RunCommand(Scan(OnFixture(host)));
  ASSERT_EQ(result.exitCode, 0) << result.err;
  const auto devices = nlohmann::json::parse(result.out)["status"]["devices"];
  std::vector<std::string> addresses;
  for (const auto& device : devices) {
    addresses.push_back(device["pciAddress"]);
  }
  EXPECT_EQ(addresses, (std::vector<std::string>{"0000:3b:00.0", "0000:62:00.0", "0000:63:00.0",
                                                 "0000:64:00.0"}));
  for (const char* expected :
       {"warning: sys/bus/pci/devices/0000:60:00.0/vendor: not hex: \"0xzz\"; skipped",
        "warning: sys/bus/pci/devices/0000:61:00.0/class: cannot read: missing; skipped",
        "warning: sys/bus/pci/devices/garbage: entry is not a PCI address; skipped",
        "/0000:62:00.0/driver: link target ../../../bus/pci/drivers/ghost is missing",
        "/0000:63:00.0/numa_node: Is a directory",
        "/0000:64:00.0/sriov_totalvfs: not an unsigned number: \"sixteen\""}) {
    EXPECT_NE(result.err.find(expected), std::string::npos) << expected << "\n" << result.err;
  }
  // Each problem once, and the absent kubelet.
  EXPECT_NE(result.err.find(kNoKubelet), std::string::npos);
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 7);
}

TEST(ScanCli, DebianPciIdsLeavesUnknownModelsEmpty) {
  // Debian bookworm's pci.ids (2023) lacks the H200; the default names come from it.
  const FixtureHost host("h200-vfio");
  const auto result = RunCommand(Scan("--sysfs-root " + ShellQuote(host.root().string()) +
                                      " --pod-resources unix:///nonexistent/kubelet.sock"));
  ASSERT_EQ(result.exitCode, 0) << result.err;
  const auto device = nlohmann::json::parse(result.out)["status"]["devices"][0];
  EXPECT_EQ(device["deviceID"], "2335");
  EXPECT_FALSE(device.contains("model"));
  EXPECT_EQ(device["vendor"], "NVIDIA Corporation");
}

TEST(ScanCli, VersionFlag) {
  const auto result = RunCommand(ShellQuote(GpuAgentBinary().string()) + " --version");
  EXPECT_EQ(result.exitCode, 0);
  EXPECT_EQ(result.out.rfind("gpu-agent ", 0), 0U);
}

}  // namespace
}  // namespace cozy
