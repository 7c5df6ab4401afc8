// Real hosts as fixtures: sysfs captured on real machines by other projects (ghw snapshots,
// harvester's per-VF files; shared/real-sysfs/README.md), read where they stand and unpacked to
// a temporary root per test. `gpu-agent scan --sysfs-root` runs on each as a hoster runs it, and
// lspci on the same tree is the oracle for every GPU it reports and for the GPU set itself
// (the BMC and virtio-gpu are not GPUs). Without shared/ beside the checkout these skip.
// A1: the agent's view of a node's GPU functions comes from sysfs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "test/integration/capture_report.h"

namespace cozy {
namespace {

using namespace captures;  // NOLINT: the helpers this file is about

// A captured tarball unpacked into a temporary root.
class Capture {
 public:
  explicit Capture(const std::string& tarball) {
    const auto result =
        RunCommand("tar -xzf " + ShellQuote((testing::SharedDir() / kCaptures / tarball).string()) +
                   " -C " + ShellQuote(directory_.path().string()));
    if (result.exitCode != 0) {
      throw std::runtime_error("tar: " + result.err);
    }
  }
  const fs::path& root() const { return directory_.path(); }

 private:
  testing::TempDir directory_;
};

class RealCapture : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string missing = testing::MissingSharedFile(std::string(kCaptures) + "README.md");
    if (!missing.empty()) {
      GTEST_SKIP() << missing;
    }
  }
};

TEST_F(RealCapture, A1_HpeTeslaT4NextToItsMatroxBmc) {
  const Capture capture("linux-amd64-e147d239df014921c6cbb49fbc3d6c41.tar.gz");
  const Report report = ScanWithAgent(capture.root());
  const LspciView lspci = RunLspci(capture.root());
  EXPECT_EQ(lspci.ids.size(), 225U);  // the whole host, all of it seen
  ExpectReportAgreesWithLspci(report, lspci);
  ASSERT_EQ(report.devices.size(), 1U);  // the iLO's Matrox VGA (01:00.1) is not a GPU
  EXPECT_EQ(Field(lspci.ids.at("0000:01:00.1"), "Vendor"), "102b");
  const json& t4 = report.devices.at("0000:08:00.0");
  EXPECT_EQ(t4["model"], "TU104GL [Tesla T4]");
  EXPECT_EQ(t4["vendor"], "NVIDIA Corporation");
  EXPECT_EQ(t4["classCode"], "030200");
  // ghw copied no subsystem_* files and no config: neither the agent nor lspci has the
  // subsystem (10de:12a2 in the modalias).
  EXPECT_FALSE(t4.contains("subsystemDeviceID"));
  EXPECT_EQ(t4["driver"], "nvidia");
  EXPECT_EQ(t4["numaNode"], 0);
  EXPECT_FALSE(t4.contains("iommuGroup"));  // the snapshot holds no IOMMU groups
  EXPECT_FALSE(t4.contains("sriov"));
  EXPECT_FALSE(t4.contains("physicalFunction"));
  EXPECT_EQ(SysfsWarnings(report), "");
}

TEST_F(RealCapture, A1_VmWithTeslaP100AndVirtioGpu) {
  const Capture capture("linux-amd64-accel-nvidia.tar.gz");
  const Report report = ScanWithAgent(capture.root());
  const LspciView lspci = RunLspci(capture.root());
  ExpectReportAgreesWithLspci(report, lspci);
  // The virtio-gpu is a display controller, but of no GPU vendor.
  EXPECT_EQ(Field(lspci.names.at("0000:04:00.0"), "Device"), "Virtio 1.0 GPU");
  EXPECT_EQ(Field(lspci.ids.at("0000:04:00.0"), "Class"), "0300");
  ASSERT_EQ(report.devices.size(), 1U);
  const json& p100 = report.devices.at("0000:06:00.0");
  EXPECT_EQ(p100["model"], "GP100GL [Tesla P100 PCIe 16GB]");
  EXPECT_EQ(p100["deviceID"], "15f8");
  EXPECT_EQ(p100["driver"], "nvidia");
  EXPECT_FALSE(p100.contains("numaNode"));  // a VM without NUMA: the kernel says -1
  EXPECT_EQ(SysfsWarnings(report), "");
}

TEST_F(RealCapture, A1_DesktopRadeonWithItsHdmiAudioAndNoDriverBound) {
  const Capture capture("linux-amd64-61797caf7c0b6bca1725ad7975ed4773.tar.gz");
  const Report report = ScanWithAgent(capture.root());
  const LspciView lspci = RunLspci(capture.root());
  ExpectReportAgreesWithLspci(report, lspci);
  ASSERT_EQ(report.devices.size(), 1U);  // the HDMI audio 0a:00.1 is not a GPU
  EXPECT_EQ(Field(lspci.ids.at("0000:0a:00.1"), "Device"), "aa90");
  const json& radeon = report.devices.at("0000:0a:00.0");
  EXPECT_EQ(radeon["model"], "Turks XT [Radeon HD 6670/7670]");
  EXPECT_EQ(radeon["vendor"], "Advanced Micro Devices, Inc. [AMD/ATI]");
  EXPECT_FALSE(radeon.contains("subsystemVendorID"));  // not captured (174b:e194 in modalias)
  EXPECT_EQ(radeon["classCode"], "030000");
  EXPECT_FALSE(radeon.contains("driver"));  // unbound on the captured host
  EXPECT_EQ(SysfsWarnings(report), "");
}

TEST_F(RealCapture, A1_LaptopIntelIgpuOnI915WithDanglingIommuGroupLinks) {
  const Capture capture("linux-amd64-415ee03b8c4d1c4f07ae2e9d8b3d3d6d.tar.gz");
  const Report report = ScanWithAgent(capture.root());
  const LspciView lspci = RunLspci(capture.root());
  ExpectReportAgreesWithLspci(report, lspci);
  ASSERT_EQ(report.devices.size(), 1U);  // the SOF audio 00:1f.3 is not a GPU
  const json& igpu = report.devices.at("0000:00:02.0");
  EXPECT_EQ(igpu["model"], "Alder Lake-P Integrated Graphics Controller");
  EXPECT_EQ(igpu["driver"], "i915");
  // lspci resolves the group link and finds no target; the agent takes the link's name.
  EXPECT_EQ(Field(lspci.ids.at("0000:00:02.0"), "IOMMUGroup"), "");
  EXPECT_EQ(
      fs::read_symlink(capture.root() / "sys/bus/pci/devices/0000:00:02.0/iommu_group").filename(),
      "0");
  EXPECT_EQ(igpu["iommuGroup"], 0);
  EXPECT_EQ(SysfsWarnings(report), "");
}

// harvester's copy of VF 08:01.7 of the A2 host in vgpu-node.umockdev, with the driver's 15
// real mdev types: every type as the files say, read by the agent through a devices/ link.
TEST_F(RealCapture, A2VfOffersItsFifteenRealMdevTypes) {
  const Capture capture("gpuhelper-testdata-sys.tar.gz");
  const fs::path sys = capture.root() / "testdata/sys";
  fs::create_directories(sys / "bus/pci/devices");
  fs::create_directory_symlink("../../../class/mdev_bus/0000:08:01.7",
                               sys / "bus/pci/devices/0000:08:01.7");
  const Report report = ScanWithAgent(capture.root() / "testdata");
  ASSERT_EQ(report.devices.size(), 1U);
  const json& vf = report.devices.at("0000:08:01.7");
  EXPECT_EQ(vf["model"], "GA107GL [A2 / A16]");
  const fs::path types = sys / "class/mdev_bus/0000:08:01.7/mdev_supported_types";
  json expected = json::array();
  for (int id = 742; id <= 756; ++id) {
    const fs::path type = types / ("nvidia-" + std::to_string(id));
    const std::string description = Slurp(type / "description");
    const size_t max = description.find("max_instance=");
    ASSERT_NE(max, std::string::npos);
    expected.push_back({{"type", "nvidia-" + std::to_string(id)},
                        {"name", Trimmed(Slurp(type / "name"))},
                        {"availableInstances", std::stoi(Slurp(type / "available_instances"))},
                        {"maxInstances", std::stoi(description.substr(max + 13))}});
  }
  EXPECT_EQ(vf["mdevTypes"], expected);
  // Spot checks against the README, so the test does not only agree with itself.
  EXPECT_EQ(vf["mdevTypes"][4]["name"], "NVIDIA A2-4Q");
  EXPECT_EQ(vf["mdevTypes"][4]["maxInstances"], 4);
  EXPECT_EQ(vf["mdevTypes"][14]["name"], "NVIDIA A2-16C");
  EXPECT_EQ(vf["mdevTypes"][14]["maxInstances"], 1);
}

// An L40S VF's real nvidia/ files (kernel 6.8+ vendor-specific VFIO) put on the fixture host's
// VF: the agent reads the driver's own creatable_vgpu_types table and current_vgpu_type 0.
TEST_F(RealCapture, L40sVfRealCreatableVgpuTypes) {
  const Capture capture("gpuhelper-testdata-sys.tar.gz");
  const fs::path real = capture.root() / "testdata/sys/bus/pci/devices/0000:26:00.4/nvidia";
  const testing::FixtureHost host("l40s-vendor-vfio");
  const fs::path vf = host.root() / "sys/bus/pci/devices/0000:41:00.5/nvidia";
  ASSERT_TRUE(fs::is_directory(vf));
  for (const auto& file : fs::directory_iterator(real)) {
    fs::copy_file(file.path(), vf / file.path().filename(), fs::copy_options::overwrite_existing);
  }
  json expected = json::array();
  std::istringstream lines(Slurp(real / "creatable_vgpu_types"));
  std::string line;
  std::getline(lines, line);  // "ID    : vGPU Name"
  while (std::getline(lines, line)) {
    const size_t colon = line.find(" : ");
    ASSERT_NE(colon, std::string::npos) << line;
    expected.push_back({{"id", Trimmed(line.substr(0, colon))}, {"name", line.substr(colon + 3)}});
  }
  ASSERT_EQ(expected.size(), 23U);
  EXPECT_EQ(expected.front(), (json{{"id", "1145"}, {"name", "NVIDIA L40S-1B"}}));
  const Report report = ScanWithAgent(host.root());
  const json& device = report.devices.at("0000:41:00.5");
  EXPECT_EQ(device["vgpu"]["creatableTypes"], expected);
  EXPECT_FALSE(device["vgpu"].contains("currentType"));  // the real file reads 0
}

}  // namespace
}  // namespace cozy
