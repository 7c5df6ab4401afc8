// Discovery on every fixture host: the functions a hoster would read about, field by field.
// A1: the agent's view of a node's GPU functions comes from sysfs.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "sysfs/scanner.h"
#include "test/support/fixture_host.h"

namespace cozy::sysfs {
namespace {

using cozy::testing::FixtureHost;

std::vector<std::string> GpuAddresses(const HostScan& scan) {
  std::vector<std::string> addresses;
  for (const PciFunction* gpu : scan.Gpus()) {
    addresses.push_back(gpu->address.ToString());
  }
  return addresses;
}

const PciFunction& Function(const HostScan& scan, const std::string& address) {
  const PciFunction* function = scan.Find(*ParsePciAddress(address));
  if (function == nullptr) {
    throw std::runtime_error("no function " + address);
  }
  return *function;
}

bool HasProblemMentioning(const HostScan& scan, const std::string& needle) {
  for (const auto& problem : scan.problems) {
    if ((problem.path + ": " + problem.message).find(needle) != std::string::npos) {
      return true;
    }
  }
  for (const auto& function : scan.functions) {
    for (const auto& problem : function.problems) {
      if (problem.find(needle) != std::string::npos) {
        return true;
      }
    }
  }
  return false;
}

TEST(ScanFixture, A100PassthroughIdentityGroupsAndNuma) {
  const FixtureHost host("a100-vfio");
  const HostScan scan = host.Scan();
  EXPECT_TRUE(scan.problems.empty());
  EXPECT_EQ(GpuAddresses(scan), (std::vector<std::string>{"0000:3b:00.0", "0000:af:00.0"}));
  const PciFunction& first = Function(scan, "0000:3b:00.0");
  EXPECT_EQ(first.vendorId, 0x10de);
  EXPECT_EQ(first.deviceId, 0x20f1);
  EXPECT_EQ(first.subsystemVendorId, 0x10de);
  EXPECT_EQ(first.subsystemDeviceId, 0x145f);
  EXPECT_EQ(first.classCode, 0x030200U);
  EXPECT_EQ(first.vendorName, "NVIDIA Corporation");
  EXPECT_EQ(first.deviceName, "GA100 [A100 PCIe 40GB]");
  EXPECT_EQ(first.driver, "vfio-pci");
  EXPECT_EQ(first.iommuGroup, 40U);
  EXPECT_EQ(first.iommuGroupViable, true);
  EXPECT_EQ(first.numaNode, 0);
  ASSERT_TRUE(first.sriov);
  EXPECT_EQ(first.sriov->totalVfs, 16U);
  EXPECT_EQ(first.sriov->numVfs, 0U);
  EXPECT_TRUE(first.problems.empty());
  const PciFunction& second = Function(scan, "0000:af:00.0");
  EXPECT_EQ(second.iommuGroup, 90U);
  EXPECT_EQ(second.numaNode, 1);
  // Root ports are scanned (libpci lists every entry) but are not GPUs.
  EXPECT_FALSE(Function(scan, "0000:3a:00.0").isGpu);
  EXPECT_EQ(scan.iommuGroups.at(40).size(), 1U);
}

TEST(ScanFixture, T4MdevTypesAndCreatedMdevs) {
  const FixtureHost host("t4-mdev");
  const HostScan scan = host.Scan();
  const PciFunction& t4 = Function(scan, "0000:5e:00.0");
  EXPECT_EQ(t4.driver, "nvidia");
  ASSERT_EQ(t4.mdevTypes.size(), 5U);
  EXPECT_EQ(t4.mdevTypes[0].type, "nvidia-230");
  EXPECT_EQ(t4.mdevTypes[0].name, "GRID T4-1Q");
  EXPECT_EQ(t4.mdevTypes[0].availableInstances, 0);
  EXPECT_EQ(t4.mdevTypes[0].maxInstances, 16);
  EXPECT_EQ(t4.mdevTypes[1].type, "nvidia-231");
  EXPECT_EQ(t4.mdevTypes[1].availableInstances, 6);
  EXPECT_EQ(t4.mdevTypes[1].maxInstances, 8);
  EXPECT_EQ(t4.mdevTypes[4].maxInstances, 1);
  ASSERT_EQ(t4.mdevs.size(), 2U);
  EXPECT_EQ(t4.mdevs[0].uuid, "aaaaaaaa-0000-4000-8000-000000000001");
  EXPECT_EQ(t4.mdevs[0].type, "nvidia-231");
  EXPECT_EQ(t4.mdevs[0].iommuGroup, 200U);
  EXPECT_EQ(t4.mdevs[1].iommuGroup, 201U);
  EXPECT_EQ(scan.mdevParents.at("aaaaaaaa-0000-4000-8000-000000000002"), t4.address);
  EXPECT_FALSE(scan.mdevLinksPending);
}

TEST(ScanFixture, L40sSriovVfsAreGpusWithTheirOwnMdevTypes) {
  const FixtureHost host("l40s-sriov-mdev");
  const HostScan scan = host.Scan();
  const auto gpus = GpuAddresses(scan);
  ASSERT_EQ(gpus.size(), 9U);  // the PF and 8 VFs
  const PciFunction& pf = Function(scan, "0000:41:00.0");
  ASSERT_TRUE(pf.sriov);
  EXPECT_EQ(pf.sriov->totalVfs, 32U);
  EXPECT_EQ(pf.sriov->numVfs, 8U);
  EXPECT_TRUE(pf.mdevTypes.empty());  // types live on the VFs in the mdev era
  // VFs follow devfn = PF devfn + offset 4 + stride 1 * i.
  EXPECT_EQ(gpus[1], "0000:41:00.4");
  EXPECT_EQ(gpus[8], "0000:41:01.3");
  const PciFunction& vf1 = Function(scan, "0000:41:00.5");
  EXPECT_EQ(vf1.physicalFunction, pf.address);
  EXPECT_FALSE(vf1.sriov);
  EXPECT_EQ(vf1.iommuGroup, 32U);
  ASSERT_EQ(vf1.mdevTypes.size(), 2U);
  EXPECT_EQ(vf1.mdevTypes[1].name, "NVIDIA L40S-4Q");
  EXPECT_EQ(vf1.mdevTypes[1].availableInstances, 0);
  ASSERT_EQ(vf1.mdevs.size(), 1U);
  EXPECT_EQ(vf1.mdevs[0].type, "nvidia-1150");
  EXPECT_EQ(Function(scan, "0000:41:00.4").mdevTypes[0].availableInstances, 1);
  EXPECT_TRUE(Function(scan, "0000:41:00.4").mdevs.empty());
}

TEST(ScanFixture, L40sVendorSpecificVfioVgpuFiles) {
  const FixtureHost host("l40s-vendor-vfio");
  const HostScan scan = host.Scan();
  const PciFunction& pf = Function(scan, "0000:41:00.0");
  EXPECT_FALSE(pf.vgpu);  // only VFs carry nvidia/
  const PciFunction& vf0 = Function(scan, "0000:41:00.4");
  ASSERT_TRUE(vf0.vgpu);
  EXPECT_FALSE(vf0.vgpu->currentType);  // current_vgpu_type reads 0
  ASSERT_EQ(vf0.vgpu->creatableTypes.size(), 5U);
  EXPECT_EQ(vf0.vgpu->creatableTypes[0].id, "1145");
  EXPECT_EQ(vf0.vgpu->creatableTypes[0].name, "NVIDIA L40S-1B");
  const PciFunction& vf1 = Function(scan, "0000:41:00.5");
  ASSERT_TRUE(vf1.vgpu);
  EXPECT_EQ(vf1.vgpu->currentType, "1150");
  EXPECT_EQ(vf1.driver, "nvidia");
  EXPECT_TRUE(vf1.mdevTypes.empty());
  EXPECT_TRUE(vf1.mdevs.empty());
}

TEST(ScanFixture, Rtx3090GroupViableOnlyWhenTheAudioIsOnVfio) {
  const FixtureHost viableHost("rtx3090-vfio");
  const HostScan viable = viableHost.Scan();
  EXPECT_EQ(GpuAddresses(viable), std::vector<std::string>{"0000:0a:00.0"});  // audio: not a GPU
  EXPECT_EQ(Function(viable, "0000:0a:00.0").iommuGroupViable, true);
  EXPECT_FALSE(Function(viable, "0000:0a:00.0").numaNode);  // the kernel says -1
  EXPECT_EQ(viable.iommuGroups.at(25).size(), 2U);

  const FixtureHost blockedHost("rtx3090-audio-snd");
  const HostScan blocked = blockedHost.Scan();
  EXPECT_EQ(Function(blocked, "0000:0a:00.1").driver, "snd_hda_intel");
  EXPECT_EQ(Function(blocked, "0000:0a:00.0").iommuGroupViable, false);
}

TEST(ScanFixture, Mi210BehindItsSwitch) {
  const FixtureHost host("mi210-vfio");
  const HostScan scan = host.Scan();
  EXPECT_EQ(GpuAddresses(scan), std::vector<std::string>{"0000:43:00.0"});
  const PciFunction& mi210 = Function(scan, "0000:43:00.0");
  EXPECT_EQ(mi210.classCode, 0x038000U);
  EXPECT_EQ(mi210.deviceName, "Aldebaran/MI200 [Instinct MI210]");
  EXPECT_EQ(mi210.driver, "vfio-pci");
  EXPECT_EQ(mi210.iommuGroup, 70U);
  EXPECT_EQ(mi210.iommuGroupViable, true);
  EXPECT_TRUE(Function(scan, "0000:42:00.0").IsBridge());
  EXPECT_TRUE(mi210.sysfsPath.ends_with(
      "sys/devices/pci0000:40/0000:40:03.1/0000:41:00.0/0000:42:00.0/0000:43:00.0"));
}

TEST(ScanFixture, HgxNvSwitchesAndBmcVgaAreNotGpus) {
  const FixtureHost host("hgx-h100");
  const HostScan scan = host.Scan();
  const auto gpus = GpuAddresses(scan);
  ASSERT_EQ(gpus.size(), 8U);
  for (const auto& address : gpus) {
    EXPECT_EQ(Function(scan, address).deviceId, 0x2330);
  }
  EXPECT_FALSE(Function(scan, "0000:9a:00.0").isGpu);  // NVSwitch, class 0x0680
  EXPECT_EQ(Function(scan, "0000:9a:00.0").driver, "nvidia-nvswitch");
  EXPECT_FALSE(Function(scan, "0000:03:00.0").isGpu);  // ASPEED VGA, class 0x0300
  EXPECT_EQ(Function(scan, "0000:03:00.0").classCode, 0x030000U);
  EXPECT_EQ(Function(scan, "0000:19:00.0").numaNode, 0);
  EXPECT_EQ(Function(scan, "0000:89:00.0").numaNode, 1);
}

TEST(ScanFixture, ExtraVendorFlagAddsClass03FunctionsOfThatVendor) {
  const FixtureHost host("hgx-h100");
  ScanOptions options;
  options.root = host.root().string();
  options.extraGpuVendors = {0x1a03};
  const HostScan scan = ScanHost(options);
  EXPECT_TRUE(Function(scan, "0000:03:00.0").isGpu);
  EXPECT_FALSE(Function(scan, "0000:9a:00.0").isGpu);  // class 0x06 stays out
}

TEST(ScanFixture, NoIommuMeansNoGroupAndNoViability) {
  const FixtureHost host("no-iommu");
  const HostScan scan = host.Scan();
  const PciFunction& gpu = Function(scan, "0000:17:00.0");
  EXPECT_TRUE(gpu.isGpu);
  EXPECT_FALSE(gpu.iommuGroup);
  EXPECT_FALSE(gpu.iommuGroupViable);
  EXPECT_TRUE(scan.iommuGroups.empty());
  EXPECT_FALSE(std::filesystem::exists(host.root() / "sys/kernel/iommu_groups"));
}

TEST(ScanFixture, NoGpuHostHasFunctionsButNoGpu) {
  const FixtureHost host("no-gpu");
  const HostScan scan = host.Scan();
  EXPECT_TRUE(scan.Gpus().empty());
  EXPECT_EQ(scan.functions.size(), 7U);  // 2 bridges, root port, VGA, NIC PF and 2 VFs
  const PciFunction& nicVf = Function(scan, "0000:5e:10.2");
  EXPECT_EQ(nicVf.deviceId, 0x10ed);
  EXPECT_EQ(nicVf.driver, "vfio-pci");
  // physfn is read for GPU vendors only; Intel is one, so the NIC VF knows its PF.
  EXPECT_EQ(nicVf.physicalFunction, *ParsePciAddress("0000:5e:00.0"));
  EXPECT_FALSE(nicVf.isGpu);
}

TEST(ScanFixture, UnknownIdLeavesTheNameEmpty) {
  const FixtureHost host("h200-vfio");
  const HostScan scan = host.Scan();
  const PciFunction& h200 = Function(scan, "0000:1b:00.0");
  EXPECT_TRUE(h200.isGpu);
  EXPECT_EQ(h200.vendorName, "NVIDIA Corporation");
  EXPECT_EQ(h200.deviceName, "");  // never a guess, never "Device 2335"
}

TEST(ScanFixture, Mi300xClass12AndItsVf) {
  // shared/real-sysfs/lspci-gpu-hosts.md §4: PF 85:00.0 on gim, VF 85:02.0 on vfio-pci.
  const FixtureHost host("mi300x-sriov");
  const HostScan scan = host.Scan();
  EXPECT_TRUE(scan.problems.empty());
  EXPECT_EQ(GpuAddresses(scan), (std::vector<std::string>{"0000:85:00.0", "0000:85:02.0"}));
  const PciFunction& pf = Function(scan, "0000:85:00.0");
  EXPECT_EQ(pf.classCode, 0x120000U);
  EXPECT_EQ(pf.driver, "gim");
  EXPECT_EQ(pf.deviceName, "Aqua Vanjaram [Instinct MI300X]");
  ASSERT_TRUE(pf.sriov);
  EXPECT_EQ(pf.sriov->totalVfs, 1U);
  EXPECT_EQ(pf.sriov->numVfs, 1U);
  const PciFunction& vf = Function(scan, "0000:85:02.0");
  EXPECT_EQ(vf.deviceId, 0x74b5);           // its own device ID ...
  EXPECT_EQ(vf.subsystemDeviceId, 0x74a1);  // ... and the PF's subsystem
  EXPECT_EQ(vf.classCode, 0x120000U);
  EXPECT_EQ(vf.driver, "vfio-pci");
  EXPECT_EQ(vf.deviceName, "Aqua Vanjaram [Instinct MI300X VF]");
  EXPECT_EQ(vf.physicalFunction, *ParsePciAddress("0000:85:00.0"));
  EXPECT_EQ(vf.numaNode, 1);
  EXPECT_EQ(vf.iommuGroupViable, true);
}

TEST(ScanFixture, ArcAudioOnAnotherBusDecidesTheGroupsViability) {
  // shared/real-sysfs/lspci-gpu-hosts.md §2: the A310's audio is 04:00.0, not 03:00.1.
  FixtureHost host("arc-a310-vfio");
  const HostScan scan = host.Scan();
  EXPECT_TRUE(scan.problems.empty());
  EXPECT_EQ(GpuAddresses(scan), (std::vector<std::string>{"0000:03:00.0"}));  // audio is not
  const PciFunction& arc = Function(scan, "0000:03:00.0");
  EXPECT_EQ(arc.deviceName, "DG2 [Arc A310]");
  EXPECT_EQ(arc.subsystemVendorId, 0x172f);
  EXPECT_EQ(arc.iommuGroup, 14U);
  EXPECT_FALSE(arc.numaNode);
  // Switch ports aside, the group's only other member is the audio on bus 04, on vfio-pci.
  EXPECT_EQ(scan.iommuGroups.at(14).size(), 5U);
  EXPECT_EQ(arc.iommuGroupViable, true);
  // The same card with its audio back on snd_hda_intel: a same-slot rule (03:00.1) finds
  // nothing to object to, the group rule does.
  const auto audioDriver = host.root() / "sys/bus/pci/devices/0000:04:00.0/driver";
  std::filesystem::remove(audioDriver);
  std::filesystem::create_directories(host.root() / "sys/bus/pci/drivers/snd_hda_intel");
  std::filesystem::create_symlink("../../../../../../bus/pci/drivers/snd_hda_intel", audioDriver);
  const HostScan rebound = host.Scan();
  EXPECT_EQ(Function(rebound, "0000:04:00.0").driver, "snd_hda_intel");
  EXPECT_EQ(Function(rebound, "0000:03:00.0").iommuGroupViable, false);
}

TEST(ScanFixture, FourRtx6000AdaWithAudioAndAnAspeedBmc) {
  // shared/real-sysfs/lspci-gpu-hosts.md §6-7: ASUS ESC8000A-E12.
  const FixtureHost host("rtx6000ada-x4");
  const HostScan scan = host.Scan();
  EXPECT_TRUE(scan.problems.empty());
  EXPECT_EQ(GpuAddresses(scan), (std::vector<std::string>{"0000:01:00.0", "0000:41:00.0",
                                                          "0000:c1:00.0", "0000:e1:00.0"}));
  for (const PciFunction* gpu : scan.Gpus()) {
    SCOPED_TRACE(gpu->address.ToString());
    EXPECT_EQ(gpu->classCode, 0x030000U);  // VGA, not 3D, on this data-center card
    EXPECT_EQ(gpu->deviceName, "AD102GL [RTX 6000 Ada Generation]");
    EXPECT_EQ(gpu->driver, "nvidia");
    EXPECT_EQ(gpu->numaNode, gpu->address.bus < 0x80 ? 0 : 1);
    // The audio (function 1, snd_hda_intel) shares the group: not a whole group for a VM.
    EXPECT_EQ(gpu->iommuGroupViable, false);
  }
  const PciFunction& bmc = Function(scan, "0000:75:00.0");
  EXPECT_FALSE(bmc.isGpu);
  EXPECT_EQ(bmc.driver, "ast");
  EXPECT_EQ(bmc.deviceName, "ASPEED Graphics Family");
  EXPECT_FALSE(Function(scan, "0000:01:00.1").isGpu);
}

TEST(ScanFixture, CaptureWithoutADriversDirectoryNamesDriversAndSaysSoOnce) {
  // umockdev records device directories only: every driver link dangles. The drivers are still
  // named by their links, and the report says so once, not once per function.
  FixtureHost host("rtx6000ada-x4");
  std::filesystem::remove_all(host.root() / "sys/bus/pci/drivers");
  const HostScan scan = host.Scan();
  EXPECT_EQ(Function(scan, "0000:01:00.0").driver, "nvidia");
  EXPECT_EQ(Function(scan, "0000:01:00.1").driver, "snd_hda_intel");
  for (const PciFunction& function : scan.functions) {
    EXPECT_TRUE(function.problems.empty()) << function.problems.front();
  }
  ASSERT_EQ(scan.problems.size(), 1U);
  EXPECT_EQ(scan.problems[0].path, "sys/bus/pci/drivers");
  EXPECT_EQ(scan.problems[0].message,
            "missing (a captured tree?); 14 functions' drivers taken from their driver links' "
            "names");
}

TEST(GpuFilter, VendorsAndClasses) {
  EXPECT_TRUE(IsGpuFunction(0x10de, 0x030200, {}));
  EXPECT_TRUE(IsGpuFunction(0x10de, 0x030000, {}));
  EXPECT_TRUE(IsGpuFunction(0x1002, 0x038000, {}));
  EXPECT_TRUE(IsGpuFunction(0x8086, 0x038000, {}));
  EXPECT_TRUE(IsGpuFunction(0x1002, 0x120000, {}));   // MI300
  EXPECT_FALSE(IsGpuFunction(0x8086, 0x120000, {}));  // Intel NPU
  EXPECT_FALSE(IsGpuFunction(0x10de, 0x068000, {}));  // NVSwitch
  EXPECT_FALSE(IsGpuFunction(0x10de, 0x040300, {}));  // HDMI audio
  EXPECT_FALSE(IsGpuFunction(0x1a03, 0x030000, {}));  // ASPEED BMC
  EXPECT_FALSE(IsGpuFunction(0x102b, 0x030000, {}));  // Matrox BMC
  EXPECT_FALSE(IsGpuFunction(0x1af4, 0x030000, {}));  // virtio-gpu
  EXPECT_TRUE(IsGpuFunction(0x1af4, 0x030000, {0x1af4}));
}

TEST(ScanBroken, EveryFaultIsReportedAndTheGoodGpuSurvives) {
  const FixtureHost host("broken");
  const HostScan scan = host.Scan();
  // The good A100 is whole.
  const PciFunction& good = Function(scan, "0000:3b:00.0");
  EXPECT_TRUE(good.isGpu);
  EXPECT_EQ(good.driver, "vfio-pci");
  EXPECT_TRUE(good.problems.empty());
  // Non-hex vendor and missing class: left out, named with the file and the reason.
  EXPECT_EQ(scan.Find(*ParsePciAddress("0000:60:00.0")), nullptr);
  EXPECT_TRUE(HasProblemMentioning(scan, "0000:60:00.0/vendor: not hex: \"0xzz\""));
  EXPECT_EQ(scan.Find(*ParsePciAddress("0000:61:00.0")), nullptr);
  EXPECT_TRUE(HasProblemMentioning(scan, "0000:61:00.0/class: cannot read: missing"));
  // A devices/ entry that is not an address: reported, and libpci never sees it.
  EXPECT_TRUE(HasProblemMentioning(scan, "sys/bus/pci/devices/garbage: entry is not a PCI"));
  // A dangling driver link: the basename is kept and the link reported.
  const PciFunction& dangling = Function(scan, "0000:62:00.0");
  EXPECT_EQ(dangling.driver, "ghost");
  ASSERT_EQ(dangling.problems.size(), 1U);
  EXPECT_NE(dangling.problems[0].find("driver: link target ../../../bus/pci/drivers/ghost is "
                                      "missing"),
            std::string::npos);
  // An unreadable numa_node: the function stays, without a NUMA node, with the reason.
  const PciFunction& unreadable = Function(scan, "0000:63:00.0");
  EXPECT_TRUE(unreadable.isGpu);
  EXPECT_FALSE(unreadable.numaNode);
  ASSERT_EQ(unreadable.problems.size(), 1U);
  EXPECT_NE(unreadable.problems[0].find("numa_node: Is a directory"), std::string::npos);
  // A malformed SR-IOV count: no sriov block rather than a wrong one.
  const PciFunction& badSriov = Function(scan, "0000:64:00.0");
  EXPECT_FALSE(badSriov.sriov);
  EXPECT_NE(badSriov.problems.at(0).find("sriov_totalvfs: not an unsigned number: \"sixteen\""),
            std::string::npos);
}

TEST(ScanBroken, VanishedFunctionIsReportedNotFatal) {
  FixtureHost host("a100-vfio");
  // A devices/ link whose function directory is gone (removed between listing and reading).
  std::filesystem::remove_all(host.root() / "sys/devices/pci0000:ae/0000:ae:00.0/0000:af:00.0");
  const HostScan scan = host.Scan();
  EXPECT_EQ(scan.Find(*ParsePciAddress("0000:af:00.0")), nullptr);
  EXPECT_TRUE(HasProblemMentioning(scan, "0000:af:00.0: function vanished or its link dangles"));
  EXPECT_NE(scan.Find(*ParsePciAddress("0000:3b:00.0")), nullptr);
}

// A function's identity and subsystem come from its one `uevent` file when that holds them: the
// five files are not read (a scan is system calls). The files are read, each named in what is
// reported, when uevent is missing or garbled.
TEST(ScanIdentity, UeventFirstTheFiveFilesWhenItIsMissingOrGarbled) {
  FixtureHost host("a100-vfio");
  const std::filesystem::path a100 =
      host.root() / "sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0";
  const HostScan before = host.Scan();
  const PciFunction& original = Function(before, "0000:3b:00.0");
  ASSERT_EQ(original.subsystemDeviceId, 0x145f);
  const auto write = [](const std::filesystem::path& path, const std::string& text) {
    std::ofstream(path, std::ios::trunc) << text;
  };
  // The files say something else: uevent wins, and nothing is reported.
  for (const char* file : {"vendor", "device", "class", "subsystem_vendor", "subsystem_device"}) {
    write(a100 / file, "garbage\n");
  }
  HostScan scan = host.Scan();
  const PciFunction& fromUevent = Function(scan, "0000:3b:00.0");
  EXPECT_EQ(fromUevent.vendorId, original.vendorId);
  EXPECT_EQ(fromUevent.deviceId, original.deviceId);
  EXPECT_EQ(fromUevent.classCode, original.classCode);
  EXPECT_EQ(fromUevent.subsystemVendorId, original.subsystemVendorId);
  EXPECT_EQ(fromUevent.subsystemDeviceId, original.subsystemDeviceId);
  EXPECT_TRUE(fromUevent.isGpu);
  EXPECT_FALSE(HasProblemMentioning(scan, "0000:3b:00.0/"));
  // uevent without PCI_SUBSYS_ID: the files are read, and the bad vendor is named.
  write(a100 / "uevent", "DRIVER=vfio-pci\nPCI_CLASS=30200\nPCI_ID=10DE:20B5\n");
  scan = host.Scan();
  EXPECT_EQ(scan.Find(*ParsePciAddress("0000:3b:00.0")), nullptr);
  EXPECT_TRUE(HasProblemMentioning(scan, "0000:3b:00.0/vendor: not hex: \"garbage\""));
  // No uevent, sound files: read from the files, another device than uevent said before.
  std::filesystem::remove(a100 / "uevent");
  write(a100 / "vendor", "0x10de\n");
  write(a100 / "device", "0x20b5\n");
  write(a100 / "class", "0x030200\n");
  write(a100 / "subsystem_vendor", "0x10de\n");
  write(a100 / "subsystem_device", "0x1533\n");
  scan = host.Scan();
  const PciFunction& fromFiles = Function(scan, "0000:3b:00.0");
  EXPECT_EQ(fromFiles.deviceId, 0x20b5);
  EXPECT_EQ(fromFiles.subsystemDeviceId, 0x1533);
  EXPECT_FALSE(HasProblemMentioning(scan, "0000:3b:00.0/"));
  // A malformed subsystem file, read because uevent is gone, is the function's own problem.
  write(a100 / "subsystem_device", "0xnope\n");
  scan = host.Scan();
  const PciFunction& badSubsystem = Function(scan, "0000:3b:00.0");
  EXPECT_FALSE(badSubsystem.subsystemDeviceId);
  EXPECT_TRUE(HasProblemMentioning(scan, "0000:3b:00.0/subsystem_device: not hex"));
}

TEST(ScanBroken, MissingMdevTypeLinkIsPendingNotAnError) {
  FixtureHost host("t4-mdev");
  // Right after `bind` the mdev exists but its mdev_type link does not yet (research §6).
  std::filesystem::remove(host.root() /
                          "sys/devices/pci0000:5d/0000:5d:00.0/0000:5e:00.0/"
                          "aaaaaaaa-0000-4000-8000-000000000002/mdev_type");
  const HostScan scan = host.Scan();
  EXPECT_TRUE(scan.mdevLinksPending);
  const PciFunction& t4 = Function(scan, "0000:5e:00.0");
  ASSERT_EQ(t4.mdevs.size(), 2U);
  EXPECT_EQ(t4.mdevs[0].type, "nvidia-231");
  EXPECT_FALSE(t4.mdevs[1].type);
}

TEST(ScanRoot, MissingRootOrNoBusPciIsARootError) {
  ScanOptions options;
  options.root = "/nonexistent/cozy-gpu-root";
  EXPECT_THROW(ScanHost(options), RootError);
  cozy::testing::TempDir empty;
  options.root = empty.path().string();
  try {
    ScanHost(options);
    FAIL() << "no RootError";
  } catch (const RootError& error) {
    EXPECT_NE(std::string(error.what()).find("holds no sys/bus/pci/devices"), std::string::npos);
  }
}

TEST(ScanLarge, SyntheticHostHasAboutSixHundredFunctions) {
  const FixtureHost host("large-synthetic");
  const HostScan scan = host.Scan();
  EXPECT_TRUE(scan.problems.empty());
  EXPECT_GE(scan.functions.size(), 580U);
  EXPECT_EQ(scan.Gpus().size(), 16U + 16U * 32U);
  size_t mdevs = 0;
  for (const PciFunction* gpu : scan.Gpus()) {
    mdevs += gpu->mdevs.size();
  }
  EXPECT_EQ(mdevs, 512U);
}

// Everything a scan says, in its order, as text: two scans are the same when these are.
std::string Describe(const HostScan& scan) {
  std::ostringstream out;
  for (const PciFunction& f : scan.functions) {
    out << f.address.ToString() << " " << f.vendorId << ":" << f.deviceId << " " << f.classCode
        << " [" << f.vendorName << "|" << f.deviceName << "] driver=" << f.driver.value_or("-")
        << " group=" << (f.iommuGroup ? std::to_string(*f.iommuGroup) : "-")
        << " viable=" << (f.iommuGroupViable ? (*f.iommuGroupViable ? "y" : "n") : "-")
        << " numa=" << (f.numaNode ? std::to_string(*f.numaNode) : "-")
        << " pf=" << (f.physicalFunction ? f.physicalFunction->ToString() : "-") << " sriov="
        << (f.sriov ? std::to_string(f.sriov->numVfs) + "/" + std::to_string(f.sriov->totalVfs)
                    : "-")
        << " gpu=" << f.isGpu << " path=" << f.sysfsPath << "\n";
    for (const MdevType& type : f.mdevTypes) {
      out << "  type " << type.type << " [" << type.name << "] "
          << type.availableInstances.value_or(-1) << "/" << type.maxInstances.value_or(-1) << " "
          << type.deviceApi << "\n";
    }
    for (const Mdev& mdev : f.mdevs) {
      out << "  mdev " << mdev.uuid << " " << mdev.type.value_or("-") << "\n";
    }
    if (f.vgpu) {
      out << "  vgpu " << f.vgpu->currentType.value_or("-") << " " << f.vgpu->creatableTypes.size()
          << "\n";
    }
    for (const std::string& problem : f.problems) {
      out << "  problem " << problem << "\n";
    }
  }
  for (const ScanProblem& problem : scan.problems) {
    out << "problem " << problem.path << ": " << problem.message << "\n";
  }
  out << "pending=" << scan.mdevLinksPending << "\n";
  return out.str();
}

// The functions are read on several threads at once (ScanOptions::readers); what a scan says,
// problems and their order included, must not depend on how many.
size_t OpenDescriptors() {
  size_t count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    ++count;
  }
  return count;
}

// Readers open a directory handle per function and mdev, each on a descriptor table of its own
// where the kernel lets them: whatever the number of readers, a scan leaves no descriptor open
// in the process, also when functions vanish or the tree is broken.
TEST(ScanThreads, AScanLeavesNoDescriptorOpen) {
  for (const std::string spec : {"broken", "l40s-sriov-mdev"}) {
    SCOPED_TRACE(spec);
    const FixtureHost host(spec);
    std::filesystem::remove_all(host.root() / "sys/bus/pci/devices/0000:3b:00.0");  // vanished
    ScanOptions options;
    options.root = host.root().string();
    options.pciIdsPath = cozy::testing::FixturePciIds().string();
    const size_t before = OpenDescriptors();
    for (const int readers : {1, 2, 7, 0}) {
      options.readers = readers;
      const HostScan scan = ScanHost(options);
      EXPECT_FALSE(scan.functions.empty());
      EXPECT_EQ(OpenDescriptors(), before) << readers << " readers";
    }
  }
}

TEST(ScanThreads, OneReaderOrManyTheScanIsTheSame) {
  for (const std::string spec : {"broken", "large-synthetic", "t4-vgpu-4", "l40s-sriov-mdev"}) {
    SCOPED_TRACE(spec);
    const FixtureHost host(spec);
    ScanOptions options;
    options.root = host.root().string();
    options.pciIdsPath = cozy::testing::FixturePciIds().string();
    options.readers = 1;
    const std::string one = Describe(ScanHost(options));
    for (const int readers : {2, 7, 0}) {
      options.readers = readers;
      EXPECT_EQ(Describe(ScanHost(options)), one) << readers << " readers";
    }
  }
  // A type whose `name` cannot be read (a directory in its place, on every parent: the type is
  // the driver's): said once, for the first function in listing order that offers it.
  {
    const FixtureHost host("l40s-sriov-mdev");
    size_t broken = 0;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(host.root() / "sys")) {
      if (entry.path().filename() == "name" &&
          entry.path().parent_path().filename() == "nvidia-1150" && entry.is_regular_file()) {
        std::filesystem::remove(entry.path());
        std::filesystem::create_directory(entry.path());
        ++broken;
      }
    }
    ASSERT_GT(broken, 1U);
    ScanOptions options;
    options.root = host.root().string();
    options.readers = 1;
    const HostScan serial = ScanHost(options);
    size_t said = 0;
    for (const PciFunction& function : serial.functions) {
      for (const std::string& problem : function.problems) {
        said += problem.find("mdev_supported_types/nvidia-1150/name: ") != std::string::npos;
      }
    }
    EXPECT_EQ(said, 1U);
    options.readers = 6;
    EXPECT_EQ(Describe(ScanHost(options)), Describe(serial));
  }
  // A capture without sys/bus/pci/drivers: the one line that says so counts every reader's.
  FixtureHost capture("rtx6000ada-x4");
  std::filesystem::remove_all(capture.root() / "sys/bus/pci/drivers");
  ScanOptions options;
  options.root = capture.root().string();
  options.readers = 1;
  const std::string one = Describe(ScanHost(options));
  options.readers = 5;
  EXPECT_EQ(Describe(ScanHost(options)), one);
}

}  // namespace
}  // namespace cozy::sysfs
