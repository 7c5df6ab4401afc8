// The sysfs attribute parsers, against the kernel's exact formats (research/sysfs.md §1).
#include "sysfs/attributes.h"

#include <gtest/gtest.h>

namespace cozy::sysfs {
namespace {

TEST(ParseHexId, ReadsTheKernelsFormatWithTrailingNewline) {
  const auto parsed = ParseHexId("0x10de\n");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*parsed, 0x10de);
  EXPECT_EQ(*ParseHexId("0X20F1"), 0x20f1);
}

TEST(ParseHexId, RefusesWhatStrtolWouldTakeForZero) {
  // libpci's strtol reads all of these as 0 (or a prefix); the agent must refuse them.
  for (const char* bad : {"0xzz\n", "10de\n", "", "\n", "0x", "0x10de0", "0x10 de", "-0x1"}) {
    const auto parsed = ParseHexId(bad);
    EXPECT_FALSE(parsed.ok()) << "accepted \"" << bad << "\"";
  }
  EXPECT_EQ(ParseHexId("0xzz\n").error(), "not hex: \"0xzz\"");
  EXPECT_EQ(ParseHexId("0x10de0").error(), "hex value too long: \"0x10de0\"");
}

TEST(ParseClassCode, ReadsSixDigitsAndRefusesMore) {
  EXPECT_EQ(*ParseClassCode("0x030200\n"), 0x030200U);
  EXPECT_EQ(*ParseClassCode("0x120000\n"), 0x120000U);
  EXPECT_FALSE(ParseClassCode("0x0302000\n").ok());
  EXPECT_FALSE(ParseClassCode("30200\n").ok());  // uevent's PCI_CLASS form is not the file's
}

TEST(ParseNumaNode, MinusOneMeansNoAffinity) {
  EXPECT_EQ(*ParseNumaNode("0\n"), std::optional<int32_t>(0));
  EXPECT_EQ(*ParseNumaNode("3\n"), std::optional<int32_t>(3));
  EXPECT_EQ(*ParseNumaNode("-1\n"), std::optional<int32_t>());
  EXPECT_FALSE(ParseNumaNode("-2\n").ok());
  EXPECT_FALSE(ParseNumaNode("zero\n").ok());
  EXPECT_FALSE(ParseNumaNode("").ok());
  EXPECT_FALSE(ParseNumaNode("1x\n").ok());
}

TEST(ParseUnsigned, SriovCounts) {
  EXPECT_EQ(*ParseUnsigned("32\n"), 32U);
  EXPECT_FALSE(ParseUnsigned("-1\n").ok());
  EXPECT_FALSE(ParseUnsigned("sixteen\n").ok());
  EXPECT_FALSE(ParseUnsigned("99999999999\n").ok());
}

TEST(MdevDescription, MaxInstanceOfNvidiaDescriptions) {
  EXPECT_EQ(MaxInstancesFromDescription("num_heads=4, frl_config=60, framebuffer=1024M, "
                                        "max_resolution=5120x2880, max_instance=16\n"),
            16);
  const auto pairs = ParseMdevDescription("num_heads=4, frl_config=45, framebuffer=1024M");
  ASSERT_TRUE(pairs.ok());
  EXPECT_EQ(pairs->at("framebuffer"), "1024M");
  EXPECT_EQ(MaxInstancesFromDescription("num_heads=4"), std::nullopt);
  EXPECT_EQ(MaxInstancesFromDescription("max_instance=lots"), std::nullopt);
  EXPECT_EQ(MaxInstancesFromDescription("low_gm_size: 128MB"), std::nullopt);  // GVT-g prose
  EXPECT_FALSE(ParseMdevDescription("").ok());
}

TEST(CreatableVgpuTypes, ReadsTheRealFileWithItsHeader) {
  // The layout of the captured L40S VF's file (shared/real-sysfs gpuhelper tarball).
  const auto types = ParseCreatableVgpuTypes(
      "ID    : vGPU Name\n1145  : NVIDIA L40S-1B\n1150  : NVIDIA L40S-4Q\n");
  ASSERT_TRUE(types.ok()) << types.error();
  ASSERT_EQ(types->size(), 2U);
  EXPECT_EQ((*types)[0].id, "1145");
  EXPECT_EQ((*types)[0].name, "NVIDIA L40S-1B");
  EXPECT_EQ((*types)[1].name, "NVIDIA L40S-4Q");
}

TEST(CreatableVgpuTypes, EmptyMeansNothingFitsAndGarbageIsAnError) {
  EXPECT_TRUE(ParseCreatableVgpuTypes("").ok());
  EXPECT_TRUE(ParseCreatableVgpuTypes("\n")->empty());
  EXPECT_TRUE(ParseCreatableVgpuTypes("1428 : NVIDIA H200X-141C\n").ok());
  EXPECT_FALSE(ParseCreatableVgpuTypes("ID : vGPU Name\nnot a line\n").ok());
  EXPECT_FALSE(ParseCreatableVgpuTypes("abc : NVIDIA\n").ok());
  EXPECT_FALSE(ParseCreatableVgpuTypes("1145 :\n").ok());
  EXPECT_EQ(ParseCreatableVgpuTypes("ID : vGPU Name\nbroken\n").error(),
            "line 2: no ':' in \"broken\"");
}

TEST(Uevent, ReadsAPciFunctionsVariables) {
  const auto variables = ParseUevent(
      "DRIVER=vfio-pci\nPCI_CLASS=30200\nPCI_ID=10DE:20F1\nPCI_SLOT_NAME=0000:3b:00.0\n"
      "MODALIAS=pci:v000010DEd000020F1sv000010DEsd0000145Fbc03sc02i00\n");
  ASSERT_TRUE(variables.ok());
  EXPECT_EQ(variables->at("PCI_CLASS"), "30200");
  EXPECT_EQ(variables->at("DRIVER"), "vfio-pci");
  EXPECT_FALSE(ParseUevent("=x\n").ok());
  EXPECT_FALSE(ParseUevent("NOEQUALS\n").ok());
}

// The scanner reads a function's identity from its uevent: the kernel's own format, any case.
TEST(PciUevent, ReadsTheKernelsIdentityLines) {
  const auto identity = ParsePciUevent(
      "DRIVER=vfio-pci\nPCI_CLASS=30200\nPCI_ID=10DE:20F1\nPCI_SUBSYS_ID=10DE:145F\n"
      "PCI_SLOT_NAME=0000:3b:00.0\nMODALIAS=pci:"
      "v000010DEd000020F1sv000010DEsd0000145Fbc03sc02i00\n");
  ASSERT_TRUE(identity);
  EXPECT_EQ(identity->vendorId, 0x10de);
  EXPECT_EQ(identity->deviceId, 0x20f1);
  EXPECT_EQ(identity->classCode, 0x030200U);
  EXPECT_EQ(identity->subsystemVendorId, 0x10de);
  EXPECT_EQ(identity->subsystemDeviceId, 0x145f);
  const auto bridge =
      ParsePciUevent("PCI_CLASS=60400\nPCI_ID=8086:2030\nPCI_SUBSYS_ID=0000:0000");  // no \n
  ASSERT_TRUE(bridge);
  EXPECT_EQ(bridge->classCode, 0x060400U);
  EXPECT_EQ(bridge->subsystemVendorId, 0);
  EXPECT_EQ(
      ParsePciUevent("PCI_CLASS=120000\nPCI_ID=1002:74a1\nPCI_SUBSYS_ID=1002:74a1\n")->deviceId,
      0x74a1);
}

// Anything short of all three keys, once each and well formed, is no identity: the scanner
// then reads the five files and reports the bad one by name.
TEST(PciUevent, AnythingMalformedIsNoIdentity) {
  const std::string good = "PCI_CLASS=30200\nPCI_ID=10DE:20F1\nPCI_SUBSYS_ID=10DE:145F\n";
  EXPECT_TRUE(ParsePciUevent(good));
  EXPECT_FALSE(ParsePciUevent(""));
  EXPECT_FALSE(ParsePciUevent("PCI_ID=10DE:20F1\nPCI_SUBSYS_ID=10DE:145F\n"));  // no class
  EXPECT_FALSE(ParsePciUevent("PCI_CLASS=30200\nPCI_SUBSYS_ID=10DE:145F\n"));   // no ID
  EXPECT_FALSE(ParsePciUevent("PCI_CLASS=30200\nPCI_ID=10DE:20F1\n"));          // no subsystem
  EXPECT_FALSE(ParsePciUevent(good + "PCI_ID=10DE:20F2\n"));                    // twice
  EXPECT_FALSE(ParsePciUevent("PCI_CLASS=1030200\nPCI_ID=10DE:20F1\nPCI_SUBSYS_ID=0:0\n"));
  EXPECT_FALSE(ParsePciUevent("PCI_CLASS=30200\nPCI_ID=ZZZZ:20F1\nPCI_SUBSYS_ID=10DE:145F\n"));
  EXPECT_FALSE(ParsePciUevent("PCI_CLASS=30200\nPCI_ID=10DE:20F\nPCI_SUBSYS_ID=10DE:145F\n"));
  EXPECT_FALSE(ParsePciUevent("PCI_CLASS=30200\nPCI_ID=10DE-20F1\nPCI_SUBSYS_ID=10DE:145F\n"));
  EXPECT_FALSE(ParsePciUevent("PCI_CLASS=\nPCI_ID=10DE:20F1\nPCI_SUBSYS_ID=10DE:145F\n"));
  EXPECT_FALSE(ParsePciUevent("PCI_CLASS=0x30200\nPCI_ID=10DE:20F1\nPCI_SUBSYS_ID=10DE:145F\n"));
  EXPECT_FALSE(ParsePciUevent("PCI_CLASS=30200\nPCI_ID=10DE:20F1 \nPCI_SUBSYS_ID=10DE:145F\n"));
}

TEST(MdevUuid, ShapeOnly) {
  EXPECT_TRUE(IsMdevUuid("aaaaaaaa-0000-4000-8000-000000000001"));
  EXPECT_TRUE(IsMdevUuid("83B8F4F2-509F-382F-3C1E-E6BFE0FA1001"));
  EXPECT_FALSE(IsMdevUuid("GPU-83b8f4f2-509f-382f-3c1e-e6bfe0fa1001"));
  EXPECT_FALSE(IsMdevUuid("aaaaaaaa-0000-4000-8000-00000000000"));
  EXPECT_FALSE(IsMdevUuid("aaaaaaaa_0000-4000-8000-000000000001"));
  EXPECT_FALSE(IsMdevUuid("gggggggg-0000-4000-8000-000000000001"));
}

TEST(Links, BasenameAndParentOfTargets) {
  EXPECT_EQ(LinkBasename("../../../../kernel/iommu_groups/40"), "40");
  EXPECT_EQ(LinkBasename("../../../../bus/pci/drivers/vfio-pci/"), "vfio-pci");
  EXPECT_EQ(LinkBasename("nvidia"), "nvidia");
  EXPECT_EQ(LinkParentName("../../../devices/pci0000:5d/0000:5d:00.0/0000:5e:00.0/"
                           "aaaaaaaa-0000-4000-8000-000000000001"),
            "0000:5e:00.0");
  EXPECT_EQ(LinkParentName("uuid-only"), "");
}

}  // namespace
}  // namespace cozy::sysfs
