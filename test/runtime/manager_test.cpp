// The daemon's runnables (docs/runtime.md): started in the order added and stopped in reverse, a
// start that throws undoing what started before it, readiness derived from what gates it.
#include "runtime/manager.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace cozy::runtime {
namespace {

struct Recorder {
  std::vector<std::string> calls;
  Manager::Runnable Make(const std::string& name, bool gates = false, const bool* synced = nullptr,
                         bool throwOnStart = false) {
    Manager::Runnable runnable;
    runnable.name = name;
    runnable.start = [this, name, throwOnStart] {
      if (throwOnStart) throw std::runtime_error(name + " cannot start");
      calls.push_back("start " + name);
    };
    runnable.stop = [this, name] { calls.push_back("stop " + name); };
    if (synced) runnable.synced = [synced] { return *synced; };
    runnable.gatesReadiness = gates;
    return runnable;
  }
};

TEST(Manager, StartsInOrderAndStopsInReverseOnce) {
  Recorder r;
  Manager manager;
  manager.Add(r.Make("health"));
  manager.Add(r.Make("classes"));
  manager.Add(
      "webhooks", [&] { r.calls.push_back("start webhooks"); },
      [&] { r.calls.push_back("stop webhooks"); });
  manager.Start();
  EXPECT_TRUE(manager.Ready()) << "nothing gates readiness: ready once all started";
  manager.Stop();
  manager.Stop();  // once
  EXPECT_EQ(r.calls, (std::vector<std::string>{"start health", "start classes", "start webhooks",
                                               "stop webhooks", "stop classes", "stop health"}));
  EXPECT_EQ(manager.Names(), (std::vector<std::string>{"health", "classes", "webhooks"}));
  EXPECT_THROW(manager.Add(r.Make("late")), std::logic_error);
}

// Work only the leader does says so: from Start on, Lead tells each of those, in order, and no
// other, started or not yet (the elector that calls it starts before the parts that lead).
TEST(Manager, LeadTellsTheRunnablesThatNeedTheLeaseOnceStarted) {
  Recorder r;
  Manager manager;
  auto leaderOnly = [&](const std::string& name) {
    Manager::Runnable runnable = r.Make(name);
    runnable.needsLease = true;
    runnable.lead = [&r, name] { r.calls.push_back("lead " + name); };
    return runnable;
  };
  manager.Add(r.Make("caches"));
  manager.Add(leaderOnly("reconciler"));
  manager.Add(leaderOnly("binder"));
  manager.Add(r.Make("tick"));
  manager.Lead();  // before Start: the list may not be complete
  EXPECT_EQ(r.calls, std::vector<std::string>{});
  manager.Start();
  r.calls.clear();
  manager.Lead();
  EXPECT_EQ(r.calls, (std::vector<std::string>{"lead reconciler", "lead binder"}));
}

// The elector starts before the parts that lead and may take the lead while they start: they are
// told even so.
TEST(Manager, LeadDuringStartTellsThePartsNotStartedYet) {
  Recorder r;
  Manager manager;
  Manager::Runnable elector = r.Make("leader election");
  elector.start = [&] {
    r.calls.push_back("start leader election");
    manager.Lead();
  };
  manager.Add(std::move(elector));
  Manager::Runnable binder = r.Make("binder");
  binder.needsLease = true;
  binder.lead = [&r] { r.calls.push_back("lead binder"); };
  manager.Add(std::move(binder));
  manager.Start();
  EXPECT_EQ(r.calls,
            (std::vector<std::string>{"start leader election", "lead binder", "start binder"}));
}

TEST(Manager, AStartThatThrowsStopsWhatStartedBeforeItInReverse) {
  Recorder r;
  Manager manager;
  manager.Add(r.Make("health"));
  manager.Add(r.Make("classes"));
  manager.Add(r.Make("webhooks", false, nullptr, /*throwOnStart=*/true));
  manager.Add(r.Make("never"));
  EXPECT_THROW(manager.Start(), std::runtime_error);
  EXPECT_EQ(r.calls, (std::vector<std::string>{"start health", "start classes", "stop classes",
                                               "stop health"}));
  EXPECT_FALSE(manager.Ready());
}

TEST(Manager, ReadyOnceEveryRunnableThatGatesItHasStartedAndSynced) {
  Recorder r;
  Manager manager;
  bool classesSynced = false;
  bool podsSynced = false;
  bool vmisSynced = false;
  manager.Add(r.Make("classes", true, &classesSynced));
  manager.Add(r.Make("pods", true, &podsSynced));
  manager.Add(r.Make("vmis", false, &vmisSynced));  // KubeVirt's never gate readiness (G4)
  manager.Add(r.Make("webhooks", true));            // no synced: ready once started
  EXPECT_FALSE(manager.Ready()) << "nothing started";
  EXPECT_EQ(manager.Waiting(), (std::vector<std::string>{"classes", "pods", "webhooks"}));
  manager.Start();
  EXPECT_EQ(manager.Waiting(), (std::vector<std::string>{"classes", "pods"}));
  classesSynced = true;
  EXPECT_FALSE(manager.Ready());
  podsSynced = true;
  EXPECT_TRUE(manager.Ready()) << "the VMI cache, unsynced, does not hold readiness";
  manager.Stop();
  EXPECT_FALSE(manager.Ready()) << "a stopped runnable is not ready";
}

}  // namespace
}  // namespace cozy::runtime
