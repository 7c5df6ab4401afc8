// PCI addresses in every form device plugins and sysfs write them (research/device-ids.md §8).
#include "sysfs/pci_address.h"

#include <gtest/gtest.h>

namespace cozy::sysfs {
namespace {

TEST(PciAddress, SysfsFormRoundTrips) {
  const auto address = ParsePciAddress("0000:3b:00.0");
  ASSERT_TRUE(address);
  EXPECT_EQ(address->ToString(), "0000:3b:00.0");
  EXPECT_EQ(ParsePciAddress("0001:04:00.2")->ToString(), "0001:04:00.2");
}

TEST(PciAddress, AnyCaseShortAndNvmlForms) {
  EXPECT_EQ(ParsePciAddress("0000:3B:00.0")->ToString(), "0000:3b:00.0");
  EXPECT_EQ(ParsePciAddress("3b:00.0")->ToString(), "0000:3b:00.0");           // domain 0000
  EXPECT_EQ(ParsePciAddress("00000000:3B:00.0")->ToString(), "0000:3b:00.0");  // NVML
  EXPECT_EQ(ParsePciAddress("10000:e0:00.0")->ToString(), "10000:e0:00.0");    // VMD domains
}

TEST(PciAddress, RefusesWhatIsNotAnAddress) {
  for (const char* bad :
       {"", "garbage", "0000:3b:00", "0000:3b:20.0", "0000:3b:00.8", "0000:3b:0.0", "0000:3bb:00.0",
        ":3b:00.0", "0000:3b:00.0x", "000:3b:00.0", "0000:3b:00.0.1", "42", "GPU-1234"}) {
    EXPECT_FALSE(ParsePciAddress(bad)) << "accepted \"" << bad << "\"";
  }
}

TEST(PciAddress, OrdersByDomainBusDeviceFunction) {
  EXPECT_LT(*ParsePciAddress("0000:3b:00.0"), *ParsePciAddress("0000:3b:00.1"));
  EXPECT_LT(*ParsePciAddress("0000:3b:1f.7"), *ParsePciAddress("0000:3c:00.0"));
  EXPECT_LT(*ParsePciAddress("0000:ff:00.0"), *ParsePciAddress("0001:00:00.0"));
}

}  // namespace
}  // namespace cozy::sysfs
