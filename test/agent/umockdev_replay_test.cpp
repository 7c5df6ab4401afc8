// Replayed device events: the built `gpu-agent run` reads a umockdev testbed as its
// /sys and hears umockdev's uevents on its own libudev monitor; each test changes the testbed
// the way the kernel changes sysfs, emits the kernel's uevent sequence for it
// (research/sysfs.md §6) and reads the fake API server's request log: exactly one status patch
// per sequence, carrying what `gpu-agent scan` makes of the fixture spec of the end state, and
// nothing for devices outside the GPU set. DESIGN §4.6 is the contract (debounce, mdev link
// retry); A1 (status from sysfs GPU functions) and A8 (a merge patch of the agent's own fields)
// are what the patches are checked against.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include <nlohmann/json.hpp>

#include "fixtures/sysfs/fixture_builder.h"
#include "test/support/fixture_host.h"
#include "test/support/umockdev_replay.h"

namespace cozy {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using nlohmann::json;
using testing::UmockdevReplay;

constexpr const char* kA100 = "0000:3b:00.0";  // on nvidia, rebound to vfio-pci
constexpr const char* kL40s = "0000:41:00.0";  // SR-IOV PF, no VFs at start
constexpr const char* kT4 = "0000:5e:00.0";    // mdev parent, no mdevs at start
constexpr const char* kNic = "0000:d1:00.0";   // outside the GPU set
constexpr const char* kMdev = "cccccccc-0000-4000-8000-000000000001";

json& Function(json& spec, const std::string& address) {
  for (json& function : spec["functions"]) {
    if (function.value("address", "") == address) {
      return function;
    }
  }
  throw std::runtime_error("no function " + address + " in the spec");
}

// A uevent file's text without its DRIVER= line: the device as the kernel shows it unbound.
std::string WithoutDriver(const fs::path& ueventFile) {
  std::ifstream in(ueventFile);
  std::string line;
  std::string text;
  while (std::getline(in, line)) {
    if (line.rfind("DRIVER=", 0) != 0) {
      text += line + "\n";
    }
  }
  return text;
}

class UmockdevReplayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string reason = testing::UmockdevUnusableReason(Options().udevSource);
        !reason.empty()) {
      GTEST_SKIP() << reason;
    }
    spec_ = fixtures::LoadSpec(testing::SpecPath("umockdev-replay"));
    start_ = Variant([](json&) {});
    replay_ = std::make_unique<UmockdevReplay>(spec_);
    ASSERT_TRUE(replay_->Start(Options())) << replay_->AgentLog();
    // The testbed is what the agent published first.
    ASSERT_EQ(replay_->PublishedStatus()["devices"],
              UmockdevReplay::ExpectedStatus(start_)["devices"]);
    replay_->server().ClearRequests();
  }

  void TearDown() override {
    if (replay_) {
      // Clean exit on SIGTERM: under ASan this is also where the agent's own reports show.
      const int status = replay_->StopAgent();
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "agent wait status " << status << "\n"
          << replay_->AgentLog();
    }
  }

  // A sequence's events come within one debounce window, as the kernel sends them; 500 ms
  // leaves room for a loaded machine (the burst test uses the agent's default, 50 ms).
  virtual testing::ReplayOptions Options() const {
    testing::ReplayOptions options;
    options.debounce = "500ms";
    return options;
  }

  // Builds the start spec, changed by `edit`, into a tree of its own: a sequence's end state.
  fs::path Variant(const std::function<void(json&)>& edit) {
    json spec = spec_;
    edit(spec);
    const fs::path root = variants_.path() / std::to_string(variantCount_++);
    fixtures::BuildTree(spec, root);
    return root;
  }

  // "sys/devices/..." of a PCI function in a built tree.
  static std::string DevicePath(const fs::path& tree, const std::string& address) {
    const fs::path link = fs::path("sys/bus/pci/devices") / address;
    return (link.parent_path() / fs::read_symlink(tree / link)).lexically_normal().string();
  }

  static std::string Sys(const std::string& relative) { return "/" + relative; }

  // A VFIO group's device (/sys/devices/virtual/vfio/<N>) as vfio_group_alloc makes it, and
  // its /dev node from the end state's devroot.
  void AddVfioGroup(const fs::path& endState, int group) {
    const std::string name = std::to_string(group);
    const std::string device = "sys/devices/virtual/vfio/" + name;
    replay_->Write(device + "/uevent",
                   "MAJOR=243\nMINOR=" + name + "\nDEVNAME=vfio/" + name + "\n");
    replay_->Link(device + "/subsystem", "../../../../class/vfio");
    replay_->Link("sys/class/vfio/" + name, "../../devices/virtual/vfio/" + name);
    if (fs::exists(endState / "dev/vfio" / name)) {
      replay_->CopyFrom(endState, "dev/vfio/" + name);
    }
    replay_->Uevent(Sys(device), "add");
  }

  void RemoveVfioGroup(int group) {
    const std::string name = std::to_string(group);
    replay_->Uevent(Sys("sys/devices/virtual/vfio/" + name), "remove");
    replay_->Remove("sys/devices/virtual/vfio/" + name);
    replay_->Remove("sys/class/vfio/" + name);
    replay_->Remove("dev/vfio/" + name);
  }

  // The sequence that just ran makes exactly one status patch, which carries the agent's view
  // of `endState`, and nothing follows it. The testbed then equals `endState` under sys/.
  void ExpectOnePatchTo(const fs::path& endState) {
    const json expected = UmockdevReplay::ExpectedStatus(endState);
    ASSERT_FALSE(expected.contains("error")) << expected.dump();
    ASSERT_TRUE(testing::WaitFor([&] { return !replay_->StatusPatches().empty(); }, 10s))
        << replay_->AgentLog();
    // Longer than the debounce and the mdev link retries: a second patch would be here by now.
    std::this_thread::sleep_for(1s);
    const auto patches = replay_->StatusPatches();
    ASSERT_EQ(patches.size(), 1U) << replay_->AgentLog();
    EXPECT_EQ(patches[0].contentType, "application/merge-patch+json");
    const json patch = json::parse(patches[0].body);
    ASSERT_TRUE(patch["status"].contains("devices")) << patch.dump();
    EXPECT_EQ(patch["status"]["devices"], expected["devices"]);
    EXPECT_FALSE(patch["status"].contains("conditions"));
    const json published = replay_->PublishedStatus();
    for (const auto& [key, value] : expected.items()) {
      EXPECT_EQ(published[key], value) << key;
    }
    EXPECT_EQ(replay_->Writes().size(), 1U);
    EXPECT_EQ(UmockdevReplay::ListingDifference(replay_->root(), endState), "")
        << "the script left the testbed unlike the end state's fixture";
    replay_->server().ClearRequests();
  }

  void RebindA100FromNvidiaToVfioPci();

  json spec_;
  testing::TempDir variants_;
  int variantCount_ = 0;
  fs::path start_;
  std::unique_ptr<UmockdevReplay> replay_;
};

void UmockdevReplayTest::RebindA100FromNvidiaToVfioPci() {
  std::string source = Options().udevSource;
  if (source == "auto") {
    source = fs::exists("/run/udev/control") ? "udev" : "kernel";
  }
  EXPECT_NE(replay_->AgentLog().find("listening for device events source=" + source),
            std::string::npos)
      << replay_->AgentLog();
  const fs::path end = Variant([](json& spec) { Function(spec, kA100)["driver"] = "vfio-pci"; });
  const std::string device = DevicePath(end, kA100);
  // Unbind: the kernel clears dev->driver first, so the event carries no DRIVER=.
  replay_->Remove(device + "/driver");
  replay_->Remove(std::string("sys/bus/pci/drivers/nvidia/") + kA100);
  replay_->CopyFrom(end, device + "/enable");
  replay_->Write(device + "/uevent", WithoutDriver(end / device / "uevent"));
  replay_->Uevent(Sys(device), "unbind");
  // vfio-pci's probe registers the group's device first (the group's first member), then the
  // per-device cdev, and the PCI bind comes last, with DRIVER=vfio-pci.
  AddVfioGroup(end, 40);
  replay_->CopyFrom(end, device + "/vfio-dev");
  replay_->CopyFrom(end, "dev/vfio/vfio");
  replay_->CopyFrom(end, "dev/vfio/devices");
  replay_->CopyFrom(end, "sys/bus/pci/drivers/vfio-pci");
  replay_->CopyFrom(end, device + "/driver");
  replay_->CopyFrom(end, device + "/uevent");
  replay_->Uevent(Sys(device), "bind");
  ExpectOnePatchTo(end);
  EXPECT_EQ(replay_->PublishedStatus()["devices"][0]["driver"], "vfio-pci");
}

// The agent's default source: "udev" where /run/udev/control exists, else "kernel".
TEST_F(UmockdevReplayTest, GpuReboundFromNvidiaToVfioPciIsOnePatch) {
  RebindA100FromNvidiaToVfioPci();
}

// Either source hears umockdev's events, whichever "auto" picks on this machine.
class UmockdevReplayUdevSourceTest : public UmockdevReplayTest {
 protected:
  testing::ReplayOptions Options() const override {
    testing::ReplayOptions options = UmockdevReplayTest::Options();
    options.udevSource = "udev";
    return options;
  }
};
TEST_F(UmockdevReplayUdevSourceTest, GpuReboundFromNvidiaToVfioPciIsOnePatch) {
  RebindA100FromNvidiaToVfioPci();
}

class UmockdevReplayKernelSourceTest : public UmockdevReplayTest {
 protected:
  testing::ReplayOptions Options() const override {
    testing::ReplayOptions options = UmockdevReplayTest::Options();
    options.udevSource = "kernel";
    return options;
  }
};
TEST_F(UmockdevReplayKernelSourceTest, GpuReboundFromNvidiaToVfioPciIsOnePatch) {
  RebindA100FromNvidiaToVfioPci();
}

TEST_F(UmockdevReplayTest, VfsEnabledThenDisabledAreOnePatchEach) {
  const fs::path end = Variant([](json& spec) { Function(spec, kL40s)["sriov"]["numVFs"] = 2; });
  const std::string pf = DevicePath(end, kL40s);
  const std::vector<std::string> vfs = {"0000:41:00.4", "0000:41:00.5"};
  // echo 2 > sriov_numvfs: per VF an add before the physfn/virtfn links exist, a change once
  // they do, a bind (autoprobe); then one change on the PF.
  for (size_t i = 0; i < vfs.size(); ++i) {
    const std::string vf = DevicePath(end, vfs[i]);
    const std::string group = fs::read_symlink(end / vf / "iommu_group").filename().string();
    for (const auto& entry : fs::directory_iterator(end / vf)) {
      const std::string name = entry.path().filename().string();
      if (name != "physfn" && name != "driver") {
        replay_->CopyFrom(end, vf + "/" + name);
      }
    }
    replay_->Write(vf + "/uevent", WithoutDriver(end / vf / "uevent"));
    replay_->CopyFrom(end, "sys/kernel/iommu_groups/" + group);
    replay_->CopyFrom(end, "sys/bus/pci/devices/" + vfs[i]);
    replay_->Uevent(Sys(vf), "add");
    replay_->CopyFrom(end, vf + "/physfn");
    replay_->CopyFrom(end, pf + "/virtfn" + std::to_string(i));
    replay_->Uevent(Sys(vf), "change");
    replay_->CopyFrom(end, vf + "/driver");
    replay_->CopyFrom(end, "sys/bus/pci/drivers/nvidia/" + vfs[i]);
    replay_->CopyFrom(end, vf + "/uevent");
    replay_->Uevent(Sys(vf), "bind");
  }
  replay_->CopyFrom(end, pf + "/sriov_numvfs");
  replay_->Uevent(Sys(pf), "change");
  ExpectOnePatchTo(end);
  EXPECT_EQ(replay_->PublishedStatus()["devices"].size(), 5U);

  // echo 0 > sriov_numvfs: per VF an unbind, then a remove; no change on the PF.
  replay_->CopyFrom(start_, pf + "/sriov_numvfs");
  for (size_t i = 0; i < vfs.size(); ++i) {
    const std::string vf = DevicePath(end, vfs[i]);
    const std::string group = fs::read_symlink(end / vf / "iommu_group").filename().string();
    replay_->Remove(vf + "/driver");
    replay_->Remove("sys/bus/pci/drivers/nvidia/" + vfs[i]);
    replay_->Write(vf + "/uevent", WithoutDriver(end / vf / "uevent"));
    replay_->Uevent(Sys(vf), "unbind");
    replay_->Remove(pf + "/virtfn" + std::to_string(i));
    replay_->Uevent(Sys(vf), "remove");
    replay_->Remove(vf);
    replay_->Remove("sys/bus/pci/devices/" + vfs[i]);
    replay_->Remove("sys/kernel/iommu_groups/" + group);
  }
  ExpectOnePatchTo(start_);
  EXPECT_EQ(replay_->PublishedStatus()["devices"].size(), 3U);
}

TEST_F(UmockdevReplayTest, MdevCreatedIsOnePatchOnceItsTypeLinkAppearsAndRemovedIsOne) {
  const fs::path end = Variant([](json& spec) {
    json& t4 = Function(spec, kT4);
    t4["mdevTypes"][0]["available"] = 7;
    t4["mdevs"] = json::array({{{"uuid", kMdev}, {"type", "nvidia-231"}, {"iommuGroup", 200}}});
  });
  const std::string parent = DevicePath(end, kT4);
  const std::string mdev = parent + "/" + kMdev;
  const std::string type = parent + "/mdev_supported_types/nvidia-231";
  // echo UUID > create: device_add (add, no driver yet), the probe attaches the IOMMU group
  // (vfio add), the driver binds (bind, DRIVER=); only then the mdev_type link is made.
  replay_->CopyFrom(end, type + "/available_instances");
  replay_->CopyFrom(end, mdev + "/subsystem");
  replay_->CopyFrom(end, mdev + "/remove");
  replay_->CopyFrom(end, mdev + "/nvidia");
  replay_->Write(mdev + "/uevent", "");
  replay_->CopyFrom(end, std::string("sys/bus/mdev/devices/") + kMdev);
  replay_->Uevent(Sys(mdev), "add");
  replay_->CopyFrom(end, mdev + "/iommu_group");
  replay_->CopyFrom(end, "sys/kernel/iommu_groups/200");
  AddVfioGroup(end, 200);
  replay_->CopyFrom(end, "sys/bus/mdev/drivers");
  replay_->CopyFrom(end, mdev + "/driver");
  replay_->CopyFrom(end, mdev + "/uevent");
  const double rescans = replay_->Metric("gpu_agent_device_rescans_total").value_or(-1);
  replay_->Uevent(Sys(mdev), "bind");
  // The agent's first read after these events misses the type link...
  ASSERT_TRUE(testing::WaitFor(
      [&] { return replay_->Metric("gpu_agent_device_rescans_total").value_or(-1) > rescans; },
      10s))
      << replay_->AgentLog();
  EXPECT_TRUE(replay_->StatusPatches().empty())
      << "published an mdev whose type link was not there yet: "
      << replay_->StatusPatches()[0].body;
  // ...which appears now, with no event of its own: the agent's retry finds it.
  replay_->CopyFrom(end, mdev + "/mdev_type");
  replay_->CopyFrom(end, type + "/devices");
  ExpectOnePatchTo(end);
  const json device = replay_->PublishedStatus()["devices"][2];
  EXPECT_EQ(device["mdevs"], json::array({{{"uuid", kMdev}, {"type", "nvidia-231"}}}));

  // echo 1 > remove: links go first, then unbind, the group's removal, the mdev's removal.
  replay_->Remove(mdev + "/mdev_type");
  replay_->Remove(type + "/devices/" + kMdev);
  replay_->Remove(mdev + "/driver");
  replay_->Write(mdev + "/uevent", "");
  replay_->Uevent(Sys(mdev), "unbind");
  RemoveVfioGroup(200);
  replay_->Remove("sys/kernel/iommu_groups/200");
  replay_->Uevent(Sys(mdev), "remove");
  replay_->Remove(mdev);
  replay_->Remove(std::string("sys/bus/mdev/devices/") + kMdev);
  replay_->CopyFrom(start_, type + "/available_instances");
  // The fixture of the start state has no mdev bus; the kernel keeps it once loaded.
  replay_->Remove("sys/bus/mdev");
  replay_->Remove("dev");
  ExpectOnePatchTo(start_);
  EXPECT_FALSE(replay_->PublishedStatus()["devices"][2].contains("mdevs"));
}

// The agent's default debounce, 50 ms.
class UmockdevReplayBurstTest : public UmockdevReplayTest {
 protected:
  testing::ReplayOptions Options() const override { return {}; }
};

TEST_F(UmockdevReplayBurstTest, BurstOf500EventsIsAtMostTwoRescansAndOnePatch) {
  const fs::path end = Variant([](json& spec) {
    Function(spec, kT4)["mdevTypes"][0]["available"] = 5;  // e.g. mdevs made on another node
  });
  const std::string parent = DevicePath(end, kT4);
  const double rescans = replay_->Metric("gpu_agent_device_rescans_total").value_or(-1);
  const double events = replay_->Metric("gpu_agent_device_events_total").value_or(-1);
  ASSERT_GE(rescans, 0);
  replay_->CopyFrom(end, parent + "/mdev_supported_types/nvidia-231/available_instances");
  const auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < 500; ++i) {
    replay_->Uevent(Sys(parent), "change");
  }
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - started);
  std::printf("500 uevents emitted in %lld ms\n", static_cast<long long>(took.count()));
  ExpectOnePatchTo(end);
  EXPECT_EQ(replay_->Metric("gpu_agent_device_events_total").value_or(-1), events + 500);
  const double burstRescans =
      replay_->Metric("gpu_agent_device_rescans_total").value_or(-1) - rescans;
  EXPECT_GE(burstRescans, 1);
  // One rescan per debounce window (50 ms) the burst touched: a burst within 100 ms costs at
  // most two (the second window opens after the first rescan and covers the rest).
  const double allowed = took < 100ms ? 2 : 1 + static_cast<double>(took / 50ms + 1);
  EXPECT_LE(burstRescans, allowed) << "the burst took " << took.count() << " ms";
}

TEST_F(UmockdevReplayTest, EventsForADeviceOutsideTheGpuSetWriteNothing) {
  const fs::path end = Variant([](json& spec) { Function(spec, kNic)["driver"] = "vfio-pci"; });
  const std::string nic = DevicePath(end, kNic);
  const double events = replay_->Metric("gpu_agent_device_events_total").value_or(-1);
  const double rescans = replay_->Metric("gpu_agent_device_rescans_total").value_or(-1);
  // The NIC goes from ixgbe to vfio-pci: the agent hears it all, rescans, and writes nothing.
  replay_->Remove(nic + "/driver");
  replay_->Remove(std::string("sys/bus/pci/drivers/ixgbe/") + kNic);
  replay_->CopyFrom(end, nic + "/enable");
  replay_->Write(nic + "/uevent", WithoutDriver(end / nic / "uevent"));
  replay_->Uevent(Sys(nic), "unbind");
  AddVfioGroup(end, 901);
  replay_->CopyFrom(end, nic + "/vfio-dev");
  replay_->CopyFrom(end, "dev/vfio");
  replay_->CopyFrom(end, "sys/bus/pci/drivers/vfio-pci");
  replay_->CopyFrom(end, nic + "/driver");
  replay_->CopyFrom(end, nic + "/uevent");
  replay_->Uevent(Sys(nic), "bind");
  replay_->Uevent(Sys(nic), "change");
  ASSERT_TRUE(testing::WaitFor(
      [&] { return replay_->Metric("gpu_agent_device_rescans_total").value_or(-1) > rescans; },
      10s))
      << replay_->AgentLog();
  std::this_thread::sleep_for(1s);
  EXPECT_EQ(replay_->Metric("gpu_agent_device_events_total").value_or(-1), events + 4);
  EXPECT_TRUE(replay_->Writes().empty()) << replay_->Writes()[0].body;
  EXPECT_EQ(UmockdevReplay::ListingDifference(replay_->root(), end), "");
}

}  // namespace
}  // namespace cozy

int main(int argc, char** argv) {
  // Re-executes under umockdev's preload when not there yet; the reason it could not is kept
  // for the tests to skip with.
  cozy::testing::EnterUmockdevPreload(argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
