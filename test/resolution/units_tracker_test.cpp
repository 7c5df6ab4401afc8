// The last good pod-resources answer is kept, marked stale, while kubelet cannot answer, and a
// resource's devices that all vanish at once are kept for a grace; it is never replaced by zeros,
// and units stay unknown until kubelet first answers.
#include "agent/status/units_tracker.h"

#include <gtest/gtest.h>

#include "test/support/hosts.h"

namespace cozy::agent {
namespace {

using cozy::testing::HostBuilder;

// A GA100 function bound to vfio-pci, its IOMMU group its plugin ID.
testing::FunctionSpec VfioGpu(const char* address, uint32_t iommuGroup) {
  return {.address = address,
          .vendor = 0x10de,
          .device = 0x20f1,
          .classCode = 0x030200,
          .driver = "vfio-pci",
          .iommuGroup = iommuGroup,
          .isGpu = true,
          .physicalFunction = std::nullopt};
}

sysfs::HostScan OneVfioGpu() { return HostBuilder().Add(VfioGpu("0000:3b:00.0", 40)).Build(); }

podresources::FetchResult Answer(bool held) {
  podresources::Allocation allocation;
  allocation.allocatable["nvidia.com/A100"] = {{"40", std::vector<int64_t>{0}}};
  if (held) {
    podresources::PodAllocation pod{"tenant-a", "virt-launcher-vm", {}};
    pod.containers.push_back({"compute", {{"nvidia.com/A100", {"40"}}}});
    allocation.pods.push_back(pod);
  }
  return {podresources::FetchState::kOk, allocation, ""};
}

podresources::FetchResult Failure(podresources::FetchState state) {
  return {state, std::nullopt, "GetAllocatableResources on unix:///x: failed"};
}

TEST(UnitsTracker, UnknownUntilKubeletFirstAnswers) {
  UnitsTracker tracker;
  tracker.Update(Failure(podresources::FetchState::kSocketAbsent));
  EXPECT_FALSE(tracker.known());
  EXPECT_FALSE(tracker.stale());
  EXPECT_FALSE(tracker.Count(OneVfioGpu(), {}, {}));
}

TEST(UnitsTracker, KeepsTheLastGoodCountsMarkedStaleNeverZeros) {
  UnitsTracker tracker;
  const auto host = OneVfioGpu();
  tracker.Update(Answer(/*held=*/true));
  ASSERT_TRUE(tracker.Count(host, {}, {}));
  for (const auto state :
       {podresources::FetchState::kDeadlineExceeded, podresources::FetchState::kSocketAbsent,
        podresources::FetchState::kResourceExhausted, podresources::FetchState::kUnimplemented}) {
    tracker.Update(Failure(state));
    EXPECT_TRUE(tracker.stale());
    EXPECT_EQ(tracker.lastState(), state);
    const auto units = tracker.Count(host, {}, {});
    ASSERT_TRUE(units);
    ASSERT_EQ(units->functions.size(), 1U);
    EXPECT_EQ(units->functions[0].allocatable, 1);
    EXPECT_EQ(units->functions[0].allocated, 1);
    EXPECT_EQ(units->functions[0].health, Health::kHealthy);
  }
  tracker.Update(Answer(/*held=*/false));
  EXPECT_FALSE(tracker.stale());
  EXPECT_EQ(tracker.Count(host, {}, {})->functions[0].allocated, 0);
}

podresources::FetchResult NoDevices() {
  return {podresources::FetchState::kOk, podresources::Allocation{}, ""};
}

TEST(UnitsTracker, A5_RemembersAdvertisedFunctionsAcrossAnswers) {
  UnitsTracker tracker;
  const auto host = OneVfioGpu();
  const auto t0 = std::chrono::system_clock::now();
  tracker.Update(Answer(false), t0);
  EXPECT_EQ(tracker.Count(host, {}, {})->functions[0].health, Health::kHealthy);
  // The plugin stops listing its only device (unhealthy, or the plugin gone): held for the
  // grace, then advertised before on this run, so Unhealthy.
  tracker.Update(NoDevices(), t0 + std::chrono::seconds(1));
  EXPECT_EQ(tracker.Count(host, {}, {})->functions[0].health, Health::kHealthy);
  tracker.Update(NoDevices(), t0 + std::chrono::seconds(12));
  EXPECT_EQ(tracker.Count(host, {}, {})->functions[0].health, Health::kUnhealthy);
}

// A restarted kubelet answers with none of its plugins' devices until they register again
// (about 300 ms on kubelet 1.36; docs/pod-resources.md): a resource whose every device vanished
// at once keeps its last devices, stale, for the grace, and kubelet is asked again soon; zeros
// would tell the binder the node's GPUs failed.
TEST(UnitsTracker, AResourceWhoseDevicesAllVanishKeepsThemForTheGraceAndIsAskedAgainSoon) {
  UnitsTracker tracker;
  const auto host = OneVfioGpu();
  const auto t0 = std::chrono::system_clock::now();
  tracker.Update(Answer(/*held=*/true), t0);
  tracker.Update(Failure(podresources::FetchState::kSocketAbsent), t0 + std::chrono::seconds(1));
  tracker.Update(NoDevices(), t0 + std::chrono::seconds(2));  // kubelet back, no plugin yet
  EXPECT_TRUE(tracker.stale());
  EXPECT_EQ(tracker.holding(), std::set<std::string>{"nvidia.com/A100"});
  const auto held = tracker.Count(host, {}, {});
  ASSERT_TRUE(held);
  EXPECT_EQ(held->functions[0].allocatable, 1);
  EXPECT_EQ(held->functions[0].allocated, 0);  // List is the new answer's: the pod is gone
  EXPECT_EQ(tracker.NextFetchDelay(0.5), std::chrono::milliseconds(1000));
  tracker.Update(Answer(/*held=*/false), t0 + std::chrono::seconds(3));  // the plugin is back
  EXPECT_FALSE(tracker.stale());
  EXPECT_TRUE(tracker.holding().empty());
  EXPECT_EQ(tracker.Count(host, {}, {})->functions[0].allocatable, 1);
  EXPECT_EQ(tracker.NextFetchDelay(0.5), std::chrono::milliseconds(10000));
}

TEST(UnitsTracker, AResourceGoneLongerThanTheGraceIsPublishedGone) {
  UnitsTracker tracker;
  const auto host = OneVfioGpu();
  const auto t0 = std::chrono::system_clock::now();
  tracker.Update(Answer(false), t0);
  tracker.Update(NoDevices(), t0 + std::chrono::seconds(1));
  tracker.Update(NoDevices(), t0 + std::chrono::seconds(6));
  EXPECT_EQ(tracker.Count(host, {}, {})->functions[0].allocatable, 1);  // within 10 s
  tracker.Update(NoDevices(), t0 + std::chrono::seconds(11));
  EXPECT_FALSE(tracker.stale());
  EXPECT_EQ(tracker.Count(host, {}, {})->functions[0].allocatable, 0);
  // Gone, it is no longer held: a later empty answer changes nothing and holds nothing.
  tracker.Update(NoDevices(), t0 + std::chrono::seconds(12));
  EXPECT_TRUE(tracker.holding().empty());
}

// A5: a resource that loses one of its devices (turned Unhealthy) is taken at once.
TEST(UnitsTracker, A5_OneOfTwoDevicesGoneIsTakenAtOnce) {
  UnitsTracker tracker;
  const auto host =
      HostBuilder().Add(VfioGpu("0000:3b:00.0", 40)).Add(VfioGpu("0000:af:00.0", 90)).Build();
  podresources::Allocation both;
  both.allocatable["nvidia.com/A100"] = {{"40", std::nullopt}, {"90", std::nullopt}};
  tracker.Update({podresources::FetchState::kOk, both, ""});
  EXPECT_EQ(tracker.Count(host, {}, {})->functions[1].allocatable, 1);
  podresources::Allocation one;
  one.allocatable["nvidia.com/A100"] = {{"40", std::nullopt}};
  tracker.Update({podresources::FetchState::kOk, one, ""});
  EXPECT_FALSE(tracker.stale());
  const auto units = tracker.Count(host, {}, {});
  ASSERT_TRUE(units);
  ASSERT_EQ(units->functions.size(), 2U);
  EXPECT_EQ(units->functions[0].allocatable, 1);
  EXPECT_EQ(units->functions[1].allocatable, 0);
  EXPECT_EQ(units->functions[1].health, Health::kUnhealthy);
}

TEST(UnitsTracker, BacksOffExponentiallyAfterFailuresWithJitter) {
  UnitsTracker tracker;
  using std::chrono::milliseconds;
  EXPECT_EQ(tracker.NextFetchDelay(0.5), milliseconds(10000));  // the regular interval
  tracker.Update(Failure(podresources::FetchState::kResourceExhausted));
  EXPECT_EQ(tracker.NextFetchDelay(0.5), milliseconds(1000));
  tracker.Update(Failure(podresources::FetchState::kResourceExhausted));
  EXPECT_EQ(tracker.NextFetchDelay(0.5), milliseconds(2000));
  tracker.Update(Failure(podresources::FetchState::kSocketAbsent));
  EXPECT_EQ(tracker.NextFetchDelay(0.5), milliseconds(4000));
  EXPECT_EQ(tracker.NextFetchDelay(0.0), milliseconds(3200));  // -20 %
  EXPECT_EQ(tracker.NextFetchDelay(1.0), milliseconds(4800));  // +20 %
  for (int i = 0; i < 20; ++i) {
    tracker.Update(Failure(podresources::FetchState::kResourceExhausted));
  }
  EXPECT_EQ(tracker.NextFetchDelay(0.5), milliseconds(60000));  // capped
  tracker.Update(Answer(false));
  EXPECT_EQ(tracker.NextFetchDelay(0.5), milliseconds(10000));
  EXPECT_EQ(tracker.consecutiveFailures(), 0);
}

}  // namespace
}  // namespace cozy::agent
