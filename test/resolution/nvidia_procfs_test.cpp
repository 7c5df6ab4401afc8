// NVIDIA procfs `information` files: GPU UUID -> PCI function, read through a root.
#include "sysfs/nvidia_procfs.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "test/support/hosts.h"

namespace cozy::sysfs {
namespace {

// As NVIDIA/open-gpu-kernel-modules kernel-open/nvidia/nv-procfs.c prints it.
constexpr const char* kInformation =
    "Model: \t\t NVIDIA H100 80GB HBM3\n"
    "IRQ:   \t\t 510\n"
    "GPU UUID: \t GPU-3B6C5F0E-8a2f-11ee-b9d1-0242ac120000\n"
    "Video BIOS: \t 96.00.74.00.01\n"
    "Bus Type: \t PCIe\n"
    "DMA Size: \t 52 bits\n"
    "DMA Mask: \t 0xfffffffffffff\n"
    "Bus Location: \t 0000:18:00.0\n"
    "Device Minor: \t 0\n"
    "GPU Excluded:\t No\n";

TEST(ParseNvidiaGpuInformation, ReadsTheUuidLine) {
  EXPECT_EQ(ParseNvidiaGpuInformation(kInformation), "GPU-3b6c5f0e-8a2f-11ee-b9d1-0242ac120000");
  EXPECT_FALSE(ParseNvidiaGpuInformation("Model: x\nBus Location: 0000:18:00.0\n"));
  EXPECT_FALSE(ParseNvidiaGpuInformation("GPU UUID: \t ??\n"));
  EXPECT_FALSE(ParseNvidiaGpuInformation(""));
}

class NvidiaProcfs : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/cozy-procfs-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    root_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  void Write(const std::string& bdf, const std::string& content) {
    const auto dir = root_ / "proc/driver/nvidia/gpus" / bdf;
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "information") << content;
  }

  std::filesystem::path root_;
};

TEST_F(NvidiaProcfs, MapsUuidsToTheirDirectorysAddress) {
  Write("0000:18:00.0", kInformation);
  Write("0000:28:00.0", "GPU UUID: \t GPU-aaaaaaaa-0000-0000-0000-000000000001\n");
  const NvidiaGpuUuids uuids = ReadNvidiaGpuUuids(root_);
  EXPECT_TRUE(uuids.problems.empty());
  EXPECT_EQ(uuids.gpus,
            (NvmlGpuAddresses{
                {"GPU-3b6c5f0e-8a2f-11ee-b9d1-0242ac120000", testing::Address("0000:18:00.0")},
                {"GPU-aaaaaaaa-0000-0000-0000-000000000001", testing::Address("0000:28:00.0")}}));
}

TEST_F(NvidiaProcfs, NoDriverIsNoProblem) {
  const NvidiaGpuUuids uuids = ReadNvidiaGpuUuids(root_);
  EXPECT_TRUE(uuids.gpus.empty());
  EXPECT_TRUE(uuids.problems.empty());
}

TEST_F(NvidiaProcfs, BadEntriesAreProblemsNamingTheFile) {
  Write("0000:18:00.0", kInformation);
  Write("not-an-address", kInformation);
  Write("0000:38:00.0", "Model: no uuid here\n");
  std::filesystem::create_directories(root_ / "proc/driver/nvidia/gpus/0000:48:00.0");
  const NvidiaGpuUuids uuids = ReadNvidiaGpuUuids(root_);
  EXPECT_EQ(uuids.gpus.size(), 1u);
  ASSERT_EQ(uuids.problems.size(), 3u);
  std::string all;
  for (const auto& problem : uuids.problems) {
    all += problem.path + ": " + problem.message + "\n";
  }
  EXPECT_NE(all.find("not-an-address: directory name is not a PCI address"), std::string::npos)
      << all;
  EXPECT_NE(all.find("0000:38:00.0/information: no valid \"GPU UUID:\" line"), std::string::npos)
      << all;
  EXPECT_NE(all.find("0000:48:00.0/information: cannot open"), std::string::npos) << all;
}

}  // namespace
}  // namespace cozy::sysfs
