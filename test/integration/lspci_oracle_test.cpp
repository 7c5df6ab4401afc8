// lspci is the oracle: on every good fixture host, and on this machine's own /sys, the agent's
// view of vendor, device, class, driver, IOMMU group and NUMA node agrees with lspci's.
#include <gtest/gtest.h>

#include <map>

#include "sysfs/scanner.h"
#include "test/support/fixture_host.h"
#include "test/support/lspci.h"

namespace cozy::sysfs {
namespace {

using cozy::testing::RunCommand;
using cozy::testing::ShellQuote;

using cozy::testing::ParseLspciMachineReadable;
using Record = cozy::testing::LspciRecord;

std::string Hex(uint32_t value, int digits) {
  char buffer[16];
  std::snprintf(buffer, sizeof buffer, "%0*x", digits, value);
  return buffer;
}

// Checks every function of `scan` against lspci run on the same tree.
void ExpectAgreesWithLspci(const HostScan& scan, const std::string& sysfsRoot) {
  const std::string busPci = (sysfsRoot == "/" ? std::string() : sysfsRoot) + "/sys/bus/pci";
  const auto result =
      RunCommand("lspci -A linux-sysfs -O sysfs.path=" + ShellQuote(busPci) + " -D -n -k -vmm");
  ASSERT_EQ(result.exitCode, 0) << result.err;
  const auto records = ParseLspciMachineReadable(result.out);
  ASSERT_EQ(records.size(), scan.functions.size()) << result.out;
  for (const PciFunction& function : scan.functions) {
    const std::string slot = function.address.ToString();
    SCOPED_TRACE(slot);
    ASSERT_EQ(records.count(slot), 1U);
    const Record& record = records.at(slot);
    EXPECT_EQ(record.at("Vendor"), Hex(function.vendorId, 4));
    EXPECT_EQ(record.at("Device"), Hex(function.deviceId, 4));
    EXPECT_EQ(record.at("Class"), Hex(function.classCode >> 8, 4));
    EXPECT_EQ(record.count("ProgIf") ? record.at("ProgIf") : "00",
              Hex(function.classCode & 0xff, 2));
    EXPECT_EQ(record.count("Driver") ? record.at("Driver") : "", function.driver.value_or(""));
    EXPECT_EQ(record.count("IOMMUGroup") ? record.at("IOMMUGroup") : "",
              function.iommuGroup ? std::to_string(*function.iommuGroup) : "");
    EXPECT_EQ(record.count("NUMANode") ? record.at("NUMANode") : "",
              function.numaNode ? std::to_string(*function.numaNode) : "");
    // The GPU set is the filter applied to lspci's vendor and class (a VF follows its PF).
    if (!function.physicalFunction) {
      const uint32_t lspciClass =
          static_cast<uint32_t>(std::stoul(record.at("Class"), nullptr, 16));
      const uint16_t lspciVendor =
          static_cast<uint16_t>(std::stoul(record.at("Vendor"), nullptr, 16));
      EXPECT_EQ(function.isGpu, IsGpuFunction(lspciVendor, lspciClass << 8, {}));
    }
    if (function.subsystemVendorId && *function.subsystemVendorId != 0) {
      EXPECT_EQ(record.at("SVendor"), Hex(*function.subsystemVendorId, 4));
      EXPECT_EQ(record.at("SDevice"), Hex(*function.subsystemDeviceId, 4));
    }
  }
}

class LspciOracle : public ::testing::TestWithParam<std::string> {};

TEST_P(LspciOracle, AgentAgreesWithLspciOnEveryFunction) {
  const cozy::testing::FixtureHost host(GetParam());
  const HostScan scan = host.Scan();
  ASSERT_FALSE(scan.functions.empty());
  ExpectAgreesWithLspci(scan, host.root().string());
}

INSTANTIATE_TEST_SUITE_P(GoodFixtures, LspciOracle,
                         ::testing::Values("a100-vfio", "t4-mdev", "l40s-sriov-mdev",
                                           "l40s-vendor-vfio", "rtx3090-vfio", "rtx3090-audio-snd",
                                           "mi210-vfio", "hgx-h100", "no-iommu", "no-gpu",
                                           "h200-vfio", "mi300x-sriov", "arc-a310-vfio",
                                           "rtx6000ada-x4", "large-synthetic"),
                         [](const ::testing::TestParamInfo<std::string>& parameter) {
                           std::string name = parameter.param;
                           for (char& c : name) {
                             c = (c == '-') ? '_' : c;
                           }
                           return name;
                         });

TEST(LspciOracleHost, AgentAgreesWithLspciOnThisMachine) {
  ScanOptions options;
  options.root = "/";
  const HostScan scan = ScanHost(options);
  ExpectAgreesWithLspci(scan, "/");
}

}  // namespace
}  // namespace cozy::sysfs
