// A whole recorded host: the HPE ProLiant DL360 Gen9 of shared/real-sysfs/vgpu-node.umockdev
// (harvester/pcidevices), an NVIDIA A2 PF on `nvidia` with 16 SR-IOV VFs, three vGPU mdevs on
// VFs, the iLO's Matrox VGA and an ixgbe NIC. This binary runs INSIDE `umockdev-run -d <dump>`
// (test/integration/vgpu_node_capture.sh loads the testbed once for all of it: building it is
// the slow part), where /sys is the recorded host for every process it starts.
//
// The capture is what umockdev records: device directories only. Its driver and IOMMU group
// links point at targets it lacks and it has no mdev_supported_types, so the agent must find
// the mdevs through sys/bus/mdev/devices and take each link's name. lspci resolves links to
// their targets and reports no driver or group for a dangling one, so for the oracle the test
// then creates the missing targets in the testbed: the agent's report must not change, and must
// agree with lspci on every GPU and on the GPU set. Last, VF 08:01.7 gets back the 15 mdev types
// harvester recorded of it separately (gpuhelper-testdata-sys.tar.gz).
// A1 (report from sysfs), A2 (mdev UUID -> parent), A6 (units per function).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "test/fakes/fake_kubelet.h"
#include "test/integration/capture_report.h"

namespace cozy {
namespace {

using namespace captures;  // NOLINT: the helpers this file is about

constexpr const char* kPf = "0000:08:00.0";

std::string UmockdevDir() {
  const char* dir = std::getenv("UMOCKDEV_DIR");
  return dir == nullptr ? std::string() : std::string(dir);
}

// The 16 VFs: devfn = PF devfn + offset 4 + stride 1 x i (08:00.4 ... 08:02.3).
std::vector<std::string> VfAddresses() {
  std::vector<std::string> addresses;
  for (unsigned i = 0; i < 16; ++i) {
    const unsigned devfn = 4 + i;
    char buffer[16];
    std::snprintf(buffer, sizeof buffer, "0000:08:%02x.%u", devfn >> 3, devfn & 7);
    addresses.emplace_back(buffer);
  }
  return addresses;
}

// Creates the directory every dangling `driver` and `iommu_group` link of the testbed points
// at, as a live sysfs has them. Returns how many it created.
size_t CreateMissingLinkTargets(const fs::path& testbed) {
  size_t created = 0;
  for (const auto& entry : fs::recursive_directory_iterator(testbed / "sys/devices")) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_symlink() || (name != "driver" && name != "iommu_group")) {
      continue;
    }
    const fs::path target =
        (entry.path().parent_path() / fs::read_symlink(entry.path())).lexically_normal();
    if (!fs::exists(target)) {
      fs::create_directories(target);
      ++created;
    }
  }
  return created;
}

struct Testbed {
  Report raw;  // the capture as recorded
  size_t createdTargets = 0;
  Report completed;    // after its link targets exist
  LspciView lspci;     // on the completed testbed
  Report withKubelet;  // completed, with the fake kubelet's pod-resources
  Report withTypes;    // completed, with VF 08:01.7's real mdev_supported_types put back
};

// harvester's gpuhelper test data holds VF 08:01.7 of this same host, copied before it had a
// vGPU, with the 15 mdev types the driver offered: put them where the kernel shows them.
void PutBackRecordedMdevTypes(const fs::path& testbed) {
  testing::TempDir unpacked;
  const auto result = RunCommand(
      "tar -xzf " +
      ShellQuote((testing::SharedDir() / kCaptures / "gpuhelper-testdata-sys.tar.gz").string()) +
      " -C " + ShellQuote(unpacked.path().string()));
  if (result.exitCode != 0) {
    throw std::runtime_error("tar: " + result.err);
  }
  const fs::path vf = testbed / "sys/devices/pci0000:00/0000:00:03.0/0000:08:01.7";
  if (!fs::is_directory(vf)) {
    throw std::runtime_error(vf.string() + " is not in the testbed");
  }
  fs::copy(unpacked.path() / "testdata/sys/class/mdev_bus/0000:08:01.7/mdev_supported_types",
           vf / "mdev_supported_types", fs::copy_options::recursive);
}

const Testbed& LoadTestbed() {
  static std::optional<Testbed> testbed;
  if (!testbed) {
    Testbed loaded;
    loaded.raw = ScanWithAgent("/");
    loaded.createdTargets = CreateMissingLinkTargets(UmockdevDir());
    loaded.completed = ScanWithAgent("/");
    loaded.lspci = RunLspci("/");
    // umockdev redirects unix socket paths into its testbed, so kubelet's socket is served
    // from inside the same umockdev-run as the agent that connects to it.
    testing::TempDir socketDir;
    const std::string socket = (socketDir.path() / "kubelet.sock").string();
    fakes::FakeKubelet kubelet;
    kubelet.Start(socket,
                  fakes::LoadScenario(
                      (testing::SourceDir() / "fixtures/kubelet/vgpu-node-a2.json").string()));
    loaded.withKubelet = ScanWithAgent("/", "--pod-resources " + ShellQuote("unix://" + socket));
    kubelet.Stop();
    PutBackRecordedMdevTypes(UmockdevDir());
    loaded.withTypes = ScanWithAgent("/");
    testbed = std::move(loaded);
  }
  return *testbed;
}

class VgpuNodeCapture : public ::testing::Test {
 protected:
  void SetUp() override {
    if (UmockdevDir().empty()) {
      GTEST_SKIP() << "not inside umockdev-run: run through ctest (vgpu_node_capture), which "
                      "loads shared/real-sysfs/vgpu-node.umockdev";
    }
  }
};

TEST_F(VgpuNodeCapture, A1_TheGpusAreTheA2PfAndItsSixteenVfs) {
  const Report& raw = LoadTestbed().raw;
  std::vector<std::string> expected{kPf};
  for (const std::string& vf : VfAddresses()) {
    expected.push_back(vf);
  }
  std::vector<std::string> reported;
  for (const auto& [address, device] : raw.devices) {
    reported.push_back(address);
  }
  EXPECT_EQ(reported, expected);  // no Matrox (01:00.1), no ixgbe
  const json& pf = raw.devices.at(kPf);
  EXPECT_EQ(pf["vendor"], "NVIDIA Corporation");
  EXPECT_EQ(pf["model"], "GA107GL [A2 / A16]");
  EXPECT_EQ(pf["deviceID"], "25b6");
  EXPECT_EQ(pf["subsystemDeviceID"], "157e");
  EXPECT_EQ(pf["classCode"], "030200");
  EXPECT_EQ(pf["driver"], "nvidia");
  EXPECT_EQ(pf["numaNode"], 0);
  EXPECT_EQ(pf["iommuGroup"], 38);
  EXPECT_EQ(pf["sriov"], (json{{"totalVFs", 16}, {"numVFs", 16}}));
  EXPECT_FALSE(pf.contains("physicalFunction"));
  EXPECT_FALSE(pf.contains("mdevTypes"));  // umockdev did not record mdev_supported_types
  std::set<int> groups;
  for (const std::string& address : VfAddresses()) {
    SCOPED_TRACE(address);
    const json& vf = raw.devices.at(address);
    EXPECT_EQ(vf["physicalFunction"], kPf);
    EXPECT_EQ(vf["deviceID"], "25b6");
    EXPECT_EQ(vf["subsystemDeviceID"], "0000");
    EXPECT_EQ(vf["model"], "GA107GL [A2 / A16]");
    EXPECT_EQ(vf["driver"], "nvidia");
    EXPECT_EQ(vf["numaNode"], 0);
    EXPECT_FALSE(vf.contains("sriov"));
    groups.insert(vf["iommuGroup"].get<int>());
    EXPECT_EQ(vf["iommuGroupViable"], true);  // alone in its group
  }
  EXPECT_EQ(groups.size(), 16U);  // each VF its own group
  EXPECT_EQ(raw.devices.at("0000:08:01.7")["iommuGroup"], 101);
}

TEST_F(VgpuNodeCapture, A2_MdevsFoundThroughTheMdevBusWithTheirTypes) {
  const Report& raw = LoadTestbed().raw;
  const std::map<std::string, json> expected{
      {"0000:08:00.4", json::array({{{"uuid", "f715f63c-0d00-4007-9c5a-b07b0c6c05de"},
                                     {"type", "nvidia-754"}}})},  // A2-4C
      {"0000:08:00.6", json::array({{{"uuid", "3deab9a4-200a-4c54-99b1-5eb0722d1d81"},
                                     {"type", "nvidia-751"}}})},  // A2-4A
      {"0000:08:02.0", json::array({{{"uuid", "c728e022-f16f-434b-ad2c-9665ee634d3d"},
                                     {"type", "nvidia-746"}}})},  // A2-4Q
  };
  for (const auto& [address, device] : raw.devices) {
    SCOPED_TRACE(address);
    const auto it = expected.find(address);
    if (it == expected.end()) {
      EXPECT_FALSE(device.contains("mdevs"));
    } else {
      EXPECT_EQ(device["mdevs"], it->second);
    }
  }
}

TEST_F(VgpuNodeCapture, DanglingDriverLinksAreNamedAndSaidOnce) {
  // 90 of the 226 functions link to drivers the capture lacks: one line, not one per function.
  EXPECT_EQ(SysfsWarnings(LoadTestbed().raw),
            "gpu-agent: warning: sys/bus/pci/drivers: missing (a captured tree?); 90 "
            "functions' drivers taken from their driver links' names\n");
}

TEST_F(VgpuNodeCapture, A1_LspciAgreesOnceTheLinkTargetsExist) {
  const Testbed& testbed = LoadTestbed();
  EXPECT_GT(testbed.createdTargets, 0U);
  // The targets only let lspci resolve the links: the agent read their names all along.
  EXPECT_EQ(testbed.completed.object, testbed.raw.object);
  EXPECT_EQ(SysfsWarnings(testbed.completed), "");
  EXPECT_EQ(testbed.lspci.ids.size(), 226U);  // every PCI function of the host
  ExpectReportAgreesWithLspci(testbed.completed, testbed.lspci);
  // What lspci says of the functions that are not GPUs.
  const LspciRecord& matrox = testbed.lspci.ids.at("0000:01:00.1");
  EXPECT_EQ(Field(matrox, "Vendor"), "102b");
  EXPECT_EQ(Field(matrox, "Class"), "0300");
  EXPECT_EQ(Field(matrox, "Driver"), "mgag200");
  EXPECT_EQ(Field(testbed.lspci.names.at("0000:01:00.1"), "Device"), "MGA G200EH");
  EXPECT_EQ(Field(testbed.lspci.ids.at(kPf), "Driver"), "nvidia");
  EXPECT_EQ(Field(testbed.lspci.ids.at(kPf), "IOMMUGroup"), "38");
}

TEST_F(VgpuNodeCapture, TheVfsRecordedMdevTypesJoinItsReport) {
  const Testbed& testbed = LoadTestbed();
  const json& vf = testbed.withTypes.devices.at("0000:08:01.7");
  ASSERT_EQ(vf["mdevTypes"].size(), 15U);
  EXPECT_EQ(vf["mdevTypes"][0], (json{{"type", "nvidia-742"},
                                      {"name", "NVIDIA A2-1B"},
                                      {"availableInstances", 0},
                                      {"maxInstances", 16}}));
  EXPECT_EQ(vf["mdevTypes"][4], (json{{"type", "nvidia-746"},
                                      {"name", "NVIDIA A2-4Q"},
                                      {"availableInstances", 1},
                                      {"maxInstances", 4}}));
  // Nothing else changes: the VF, without its types, and every other device are as before.
  json without = testbed.withTypes.object;
  for (auto& device : without["status"]["devices"]) {
    if (device["pciAddress"] == "0000:08:01.7") {
      device.erase("mdevTypes");
    }
  }
  EXPECT_EQ(without, testbed.completed.object);
}

TEST_F(VgpuNodeCapture, A6_PodResourcesUnitsLandOnTheMdevsVfs) {
  const Report& report = LoadTestbed().withKubelet;
  EXPECT_EQ(report.warnings, "");
  EXPECT_EQ(report.object["status"]["resourceNames"],
            json::array(
                {"nvidia.com/NVIDIA_A2-4A", "nvidia.com/NVIDIA_A2-4C", "nvidia.com/NVIDIA_A2-4Q"}));
  EXPECT_EQ(report.object["status"]["unplaced"], json::array());
  const std::map<std::string, std::pair<std::string, int>> held{
      {"0000:08:00.4", {"nvidia.com/NVIDIA_A2-4C", 1}},
      {"0000:08:00.6", {"nvidia.com/NVIDIA_A2-4A", 0}},
      {"0000:08:02.0", {"nvidia.com/NVIDIA_A2-4Q", 1}},
  };
  for (const auto& [address, device] : report.devices) {
    SCOPED_TRACE(address);
    const auto it = held.find(address);
    if (it == held.end()) {
      EXPECT_EQ(device["health"], "Unadvertised");  // the PF and the VFs without an mdev
      EXPECT_EQ(device["allocatable"], 0);
      continue;
    }
    const auto& [resource, allocated] = it->second;
    EXPECT_EQ(device["resources"],
              json::array({{{"name", resource}, {"allocatable", 1}, {"allocated", allocated}}}));
    EXPECT_EQ(device["allocatable"], 1);
    EXPECT_EQ(device["allocated"], allocated);
    EXPECT_EQ(device["health"], "Healthy");
  }
}

}  // namespace
}  // namespace cozy
