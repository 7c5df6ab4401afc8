// The last good pod-resources answer is kept, marked stale, while kubelet cannot answer; it is
// never replaced by zeros (issue 3), and units stay unknown until kubelet first answers.
#include "agent/status/units_tracker.h"

#include <gtest/gtest.h>

#include "test/support/hosts.h"

namespace cozy::agent {
namespace {

using cozy::testing::HostBuilder;

sysfs::HostScan OneVfioGpu() {
  return HostBuilder()
      .Add({.address = "0000:3b:00.0",
            .vendor = 0x10de,
            .device = 0x20f1,
            .classCode = 0x030200,
            .driver = "vfio-pci",
            .iommuGroup = 40,
            .isGpu = true,
            .physicalFunction = std::nullopt})
      .Build();
}

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

TEST(UnitsTracker, A5_RemembersAdvertisedFunctionsAcrossAnswers) {
  UnitsTracker tracker;
  const auto host = OneVfioGpu();
  tracker.Update(Answer(false));
  EXPECT_EQ(tracker.Count(host, {}, {})->functions[0].health, Health::kHealthy);
  // The plugin stops listing it (unhealthy): advertised before on this run, so Unhealthy.
  podresources::FetchResult empty{podresources::FetchState::kOk, podresources::Allocation{}, ""};
  tracker.Update(empty);
  EXPECT_EQ(tracker.Count(host, {}, {})->functions[0].health, Health::kUnhealthy);
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
