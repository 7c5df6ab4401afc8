// The Model: capacity, budgets and the binder pass over whole snapshots. Each test quotes the
// design-note sentence it implements and names its catalog ID.
#include "controller/model/model.h"

#include <gtest/gtest.h>

#include <limits>
#include <type_traits>

#include "api/quantity.h"
#include "controller/model/readers.h"
#include "test/controller/model_fixtures.h"
#include "test/support/snapshot_fixture.h"

namespace cozy::model {
namespace {

using namespace cozy::model::testing;
using namespace cozy::testing;
using api::DevicePhase;

// A copy, so a decision of a temporary pass outlives it.
Decision DecisionFor(const std::vector<Decision>& decisions, const std::string& device) {
  for (const Decision& decision : decisions) {
    if (decision.deviceNamespace + "/" + decision.deviceName == device) {
      return decision;
    }
  }
  ADD_FAILURE() << "no decision for " << device;
  return Decision{"", "<no decision>", Action::kKeep, "", ""};
}

int64_t FreeOn(const Model& model, const std::string& node, const std::string& className) {
  const std::optional<NodeClassView> view = model.NodeClass(node, className);
  EXPECT_TRUE(view.has_value()) << node << " does not serve " << className;
  return view ? view->free : -1;
}

// C13: "the units a node serves are now counted once, for both" — from each function's
// allocatable for the class's resource name, so an mdev parent serves several.
TEST(NodeUnitsC13, MdevParentServesItsAllocatableSlots) {
  struct Case {
    const char* what;
    int functions;
    int64_t perFunction;
    int64_t units;
  };
  const std::vector<Case> cases = {
      {"one mdev parent with 4 slots", 1, 4, 4},
      {"mdev parent with lost capacity, 2 slots left", 1, 2, 2},
      {"eight passthrough functions", 8, 1, 8},
      {"unhealthy function serves nothing", 1, 0, 0},
  };
  for (const Case& c : cases) {
    Snapshot snapshot = BaseSnapshot();
    snapshot.classes = {MakeClass("a2-4q", kA2Vgpu, api::GpuMode::kVgpu, 4)};
    AddNode(snapshot, "n1", c.functions, kA2Vgpu, c.perFunction);
    const Model model(snapshot);
    EXPECT_EQ(model.NodeClass("n1", "a2-4q")->units, c.units) << c.what;
  }
}

// C13 catalog: "mdev parent with lost capacity, 2 slots left: a 2-GPU VM admitted and kept"
TEST(NodeUnitsC13, TwoSlotsLeftKeepATwoDeviceSet) {
  Snapshot snapshot = BaseSnapshot();
  snapshot.classes = {MakeClass("a2-4q", kA2Vgpu, api::GpuMode::kVgpu, 4)};
  AddNode(snapshot, "n1", 1, kA2Vgpu, 2);
  snapshot.devices = {Bound("tenant-a", "g1", "a2-4q", 1, "n1", "vm1"),
                      Bound("tenant-a", "g2", "a2-4q", 1, "n1", "vm1")};
  const std::vector<Decision> decisions = Model(snapshot).PlanPass();
  EXPECT_EQ(DecisionFor(decisions, "tenant-a/g1").action, Action::kKeep);
  EXPECT_EQ(DecisionFor(decisions, "tenant-a/g2").action, Action::kKeep);
}

// C6: "so the binder never books a unit a raw-name pod holds" — catalog: 2-unit node, raw pod
// holding 1: a 2-unit order fails there.
// Two GPUs on n1, one held by a pod of the raw name; orders for two and for one, oldest first.
Snapshot RawPodAndTwoOrders() {
  Snapshot snapshot = BaseSnapshot();
  AddNode(snapshot, "n1", 2);
  snapshot.pods = {MakePod("tenant-a", "raw", "n1", kA100, 1)};
  snapshot.devices = {Pending("tenant-a", "two", "a100", 2), Pending("tenant-a", "one", "a100", 1)};
  snapshot.devices.MutableAt(0).metadata.creationTimestamp = "2025-01-01T00:00:00Z";
  snapshot.devices.MutableAt(1).metadata.creationTimestamp = "2025-01-01T00:00:01Z";
  return snapshot;
}

TEST(NodeCapacityC6, RawNamePodHoldsUnits) {
  const Snapshot snapshot = RawPodAndTwoOrders();
  const Model model(snapshot);
  EXPECT_EQ(FreeOn(model, "n1", "a100"), 1);
  const std::vector<Decision> decisions = model.PlanPass();
  EXPECT_EQ(DecisionFor(decisions, "tenant-a/two").action, Action::kRefuse);
  EXPECT_EQ(DecisionFor(decisions, "tenant-a/one").action, Action::kBind);
}

// docs/controller.md, "Who wakes for a change": the pod cache wakes no pass for a change
// PodChangeMatters turns down, which is safe only if such pods never change a decision. Fifty pods
// of cpu and memory alone, running, pending and ended, on the GPU node and in the tenant: every
// decision stays as it was. A pod that asks for the GPU (PodChangeMatters says it matters) does
// change them.
TEST(PodChangeFilter, PodsThatAskForNoExtendedResourceChangeNoDecision) {
  const Snapshot snapshot = RawPodAndTwoOrders();
  const auto plan = [](const Snapshot& s) {
    std::vector<std::string> lines;
    for (const Decision& d : Model(s).PlanPass()) {
      lines.push_back(d.deviceNamespace + "/" + d.deviceName + " " +
                      std::string(ToString(d.action)) + " " + d.node + " " + d.reason);
    }
    return lines;
  };
  const std::vector<std::string> before = plan(snapshot);
  ASSERT_EQ(before.size(), 2U);

  Snapshot churned = snapshot;
  for (int i = 0; i < 50; ++i) {
    Pod pod = MakePod("tenant-a", "web-" + std::to_string(i), i % 2 ? "n1" : "", "cpu", 2);
    pod.containers[0].requests["memory"] = "1Gi";
    pod.phase = i % 3 == 0 ? "Pending" : (i % 3 == 1 ? "Running" : "Succeeded");
    ASSERT_FALSE(PodChangeMatters(nullptr, &pod)) << pod.name;
    churned.pods.push_back(pod);
  }
  EXPECT_EQ(plan(churned), before);

  Pod gpu = MakePod("tenant-a", "another-raw", "n1", kA100, 1);
  ASSERT_TRUE(PodChangeMatters(nullptr, &gpu));
  churned.pods.push_back(gpu);
  EXPECT_NE(plan(churned), before) << "the last unit is taken: the one-GPU order is refused too";
}

TEST(NodeCapacityA7, PodsInAFinalPhaseHoldNothing) {
  Snapshot snapshot = BaseSnapshot();
  AddNode(snapshot, "n1", 2);
  snapshot.pods = {MakePod("tenant-a", "done", "n1", kA100, 1)};
  snapshot.pods.MutableAt(0).phase = "Succeeded";
  EXPECT_EQ(FreeOn(Model(snapshot), "n1", "a100"), 2);
}

// A running VMI with one attached device and a launcher pod requesting its GPU.
Snapshot VmiSnapshot(DevicePhase devicePhase, bool podListedInActivePods) {
  Snapshot snapshot = BaseSnapshot();
  AddNode(snapshot, "n1", 4);
  snapshot.quotas = {MakeQuota(
      "tenant-a", {{"requests.gpu.cozystack.io/a100", "10"}, {"requests.nvidia.com/GA100", "3"}})};
  snapshot.devices = {MakeDevice("tenant-a", "held", "a100", 1, devicePhase,
                                 devicePhase == DevicePhase::kBound ? "n1" : "", "vm1")};
  snapshot.pods = {MakePod("tenant-a", "virt-launcher-vm1", "n1", kA100, 1)};
  snapshot.vmis = {
      MakeVmi("tenant-a", "vm1", {podListedInActivePods ? "virt-launcher-vm1-uid" : "other-uid"})};
  return snapshot;
}

// C11: "A pod now counts as a VMI's launcher only when that VMI lists the pod's UID in
// status.activePods; any other pod's GPUs count as raw-name usage." C14: "for budgets every
// attached device covers its pod, since a Lost device still counts itself"; C15: "for node
// capacity only a device holding units does"; D11: "A Lost device already counts against its
// tenant's budgets, so the pod of its still running VMI is not counted again under a raw GPU
// key; for node capacity it is, since the device itself holds no units."
TEST(CoverageC11C14C15, TwoNamedReaders) {
  struct Case {
    const char* what;
    DevicePhase phase;
    bool listed;
    int64_t nodeFree;      // of 4
    int64_t rawRemaining;  // raw key 3: devices + uncovered pods
  };
  const std::vector<Case> cases = {
      {"bound device covers its launcher in both", DevicePhase::kBound, true, 3, 2},
      {"C14/C15 Lost device: covered for budgets, not for capacity", DevicePhase::kLost, true, 3,
       2},
      {"C11 pod not in activePods: raw usage in both", DevicePhase::kBound, false, 2, 1},
      {"C11 Lost device, pod not listed", DevicePhase::kLost, false, 3, 1},
  };
  for (const Case& c : cases) {
    const Snapshot snapshot = VmiSnapshot(c.phase, c.listed);  // outlives the model
    const Model model(snapshot);
    EXPECT_EQ(FreeOn(model, "n1", "a100"), c.nodeFree) << c.what;
    const RemainingBudget remaining = model.Remaining("tenant-a", "a100");
    EXPECT_EQ(remaining.remaining, c.rawRemaining) << c.what;
    EXPECT_EQ(remaining.key, "requests.nvidia.com/GA100") << c.what;
    // C11's usage-record leg: the records' reader (PodRawUsage, over the same launcher reader)
    // counts what the model counts in the budget: the raw key's 3 less the device's 1 less
    // what is left.
    const LauncherIndex launchers(snapshot.vmis);
    std::vector<std::shared_ptr<const api::GpuDevice>> devices;
    for (const api::GpuDevice& device : snapshot.devices) {
      devices.push_back(std::make_shared<api::GpuDevice>(device));
    }
    std::vector<std::shared_ptr<const api::GpuClass>> classes;
    for (const api::GpuClass& gpuClass : snapshot.classes) {
      classes.push_back(std::make_shared<api::GpuClass>(gpuClass));
    }
    const Pod& pod = snapshot.pods[0];
    const auto raw = PodRawUsage(pod, {kA100}, launchers.LauncherOf(pod), devices, classes);
    const int64_t recorded = raw.count(kA100) != 0 ? raw.at(kA100) : 0;
    EXPECT_EQ(recorded, 3 - 1 - c.rawRemaining) << c.what;
  }
}

// D11 catalog: "device goes Lost: budget unchanged, node free units rise"
TEST(LostDeviceD11, BudgetUnchangedNodeFreeRises) {
  Snapshot snapshot = BaseSnapshot();
  AddNode(snapshot, "n1", 2);
  snapshot.quotas = {MakeQuota("tenant-a", {{"requests.gpu.cozystack.io/a100", "2"}})};
  snapshot.devices = {Bound("tenant-a", "g", "a100", 1, "n1")};
  const Model bound(snapshot);
  snapshot.devices = {Lost("tenant-a", "g", "a100", 1)};
  const Model lost(snapshot);
  EXPECT_EQ(bound.Remaining("tenant-a", "a100").remaining, 1);
  EXPECT_EQ(lost.Remaining("tenant-a", "a100").remaining, 1);
  EXPECT_EQ(FreeOn(bound, "n1", "a100"), 1);
  EXPECT_EQ(FreeOn(lost, "n1", "a100"), 2);
}

struct BudgetCase {
  const char* what;
  std::vector<ResourceQuota> quotas;
  std::vector<api::GpuDevice> devices;
  std::vector<Pod> pods;
  std::string tenant;
  std::optional<int64_t> remaining;
  std::string limitedBy;
  bool blocked = false;
};

// C3: "GPU budgets cap the whole subtree of the tenant that declares them, walked over the
// namespace ancestry and independent of the tenant quota pools." C4: "A raw GPU key blocks a
// class until the same tenant also declares a GPU key, and then caps devices and raw-name pods
// together." E3: "a budget of the tenant or an ancestor".
TEST(RemainingBudgetC3C4, Table) {
  const std::string classKey = "requests.gpu.cozystack.io/a100";
  const std::string rawKey = "requests.nvidia.com/GA100";
  const std::vector<BudgetCase> cases = {
      {"no budget anywhere: unlimited", {}, {}, {}, "tenant-a-b", std::nullopt, ""},
      {"C3 catalog: root declares 2, two children hold 1 each",
       {MakeQuota("tenant-root", {{classKey, "2"}})},
       {Bound("tenant-a", "g1", "a100", 1, "n1"), Bound("tenant-b", "g2", "a100", 1, "n1")},
       {},
       "tenant-a-b",
       0,
       "tenant-root"},
      {"C3 a grandchild's device counts against the root",
       {MakeQuota("tenant-root", {{classKey, "3"}})},
       {Bound("tenant-a-b", "g1", "a100", 2, "n1")},
       {},
       "tenant-b",
       1,
       "tenant-root"},
      {"C3 a sibling's budget does not cap",
       {MakeQuota("tenant-b", {{classKey, "0"}})},
       {},
       {},
       "tenant-a",
       std::nullopt,
       ""},
      {"E3 parent budget full, child has room",
       {MakeQuota("tenant-a", {{classKey, "1"}}), MakeQuota("tenant-a-b", {{classKey, "5"}})},
       {Bound("tenant-a", "g1", "a100", 1, "n1")},
       {},
       "tenant-a-b",
       0,
       "tenant-a"},
      {"the nearest of equal limits is named",
       {MakeQuota("tenant-a", {{classKey, "2"}}), MakeQuota("tenant-a-b", {{classKey, "2"}})},
       {},
       {},
       "tenant-a-b",
       2,
       "tenant-a-b"},
      {"total key caps every class",
       {MakeQuota("tenant-a", {{"requests.gpu.cozystack.io/total", "3"}})},
       {Bound("tenant-a", "g1", "a100", 2, "n1")},
       {},
       "tenant-a",
       1,
       "tenant-a"},
      {"two quotas in one namespace: the smaller",
       {MakeQuota("tenant-a", {{classKey, "4"}}),
        ResourceQuota{"tenant-a", "other", {{classKey, "1"}}}},
       {},
       {},
       "tenant-a",
       1,
       "tenant-a"},
      {"C4 catalog: only a raw key = 2: blocked",
       {MakeQuota("tenant-a", {{rawKey, "2"}})},
       {},
       {},
       "tenant-a",
       0,
       "tenant-a",
       true},
      {"C4 a GPU key in an ancestor does not unblock",
       {MakeQuota("tenant-a", {{rawKey, "2"}}), MakeQuota("tenant-root", {{classKey, "9"}})},
       {},
       {},
       "tenant-a",
       0,
       "tenant-a",
       true},
      {"C4 catalog: with a class key, 1 device + 1-GPU raw pod fill a raw key of 2",
       {MakeQuota("tenant-a", {{rawKey, "2"}, {classKey, "10"}})},
       {Bound("tenant-a", "g1", "a100", 1, "n1")},
       {MakePod("tenant-a", "raw", "n1", kA100, 1)},
       "tenant-a",
       0,
       "tenant-a"},
      {"C4 the total key also unblocks",
       {MakeQuota("tenant-a", {{rawKey, "2"}, {"requests.gpu.cozystack.io/total", "10"}})},
       {},
       {MakePod("tenant-a", "raw", "n1", kA100, 1)},
       "tenant-a",
       1,
       "tenant-a"},
      {"C4 a sub-tenant's raw pod counts under the ancestor's raw key",
       {MakeQuota("tenant-a", {{rawKey, "2"}, {classKey, "10"}})},
       {},
       {MakePod("tenant-a-b", "raw", "n1", kA100, 2)},
       "tenant-a-b",
       0,
       "tenant-a"},
      {"raw keys of other resources do not matter",
       {MakeQuota("tenant-a", {{"requests.amd.com/gpu", "0"}, {"requests.cpu", "1"}})},
       {},
       {},
       "tenant-a",
       std::nullopt,
       ""},
  };
  for (const BudgetCase& c : cases) {
    Snapshot snapshot = BaseSnapshot();
    AddNode(snapshot, "n1", 8);
    snapshot.quotas = c.quotas;
    snapshot.devices = c.devices;
    snapshot.pods = c.pods;
    const RemainingBudget remaining = Model(snapshot).Remaining(c.tenant, "a100");
    EXPECT_EQ(remaining.remaining, c.remaining) << c.what;
    EXPECT_EQ(remaining.limitedBy, c.limitedBy) << c.what;
    EXPECT_EQ(remaining.blockedByRawKey, c.blocked) << c.what;
  }
}

// C3 and C4 through the binder pass: the orders the budgets leave no room for are refused.
TEST(BudgetsInPassC3C4, OrdersOverABudgetAreRefused) {
  Snapshot snapshot = BaseSnapshot();
  AddNode(snapshot, "n1", 8);
  snapshot.quotas = {MakeQuota("tenant-root", {{"requests.gpu.cozystack.io/a100", "2"}}),
                     MakeQuota("tenant-b", {{"requests.nvidia.com/GA100", "4"}})};
  snapshot.devices = {
      Bound("tenant-a", "held", "a100", 1, "n1"), Pending("tenant-a-b", "first", "a100", 1),
      Pending("tenant-a-b", "second", "a100", 1), Pending("tenant-b", "blocked", "a100", 1)};
  snapshot.devices.MutableAt(1).metadata.creationTimestamp = "2025-01-01T00:00:00Z";
  snapshot.devices.MutableAt(2).metadata.creationTimestamp = "2025-01-01T00:00:01Z";
  const std::vector<Decision> decisions = Model(snapshot).PlanPass();
  EXPECT_EQ(DecisionFor(decisions, "tenant-a-b/first").action, Action::kBind);
  const Decision second = DecisionFor(decisions, "tenant-a-b/second");
  EXPECT_EQ(second.action, Action::kRefuse);
  EXPECT_NE(second.reason.find("tenant-root"), std::string::npos) << second.reason;
  const Decision blocked = DecisionFor(decisions, "tenant-b/blocked");
  EXPECT_EQ(blocked.action, Action::kRefuse);
  EXPECT_NE(blocked.reason.find("requests.nvidia.com/GA100"), std::string::npos) << blocked.reason;
}

// C3 with D8, D9: the template device a VM start creates beside a held device
// is a new bind. The gather step checks it against the budgets and books it, so an order later
// in the same pass cannot take the same room. Before, it was bound unchecked and unbooked: with
// a budget of 2 and one device held, vm1's template and vm2's template both bound (3 of 2).
TEST(BudgetsInPassC3D8, AMixedSetsTemplateIsCheckedAndBookedBeforeLaterOrders) {
  for (const bool roomForOne : {true, false}) {
    SCOPED_TRACE(roomForOne ? "budget 2, one held" : "budget 1, one held");
    Snapshot snapshot = BaseSnapshot();
    AddNode(snapshot, "n1", 8);
    snapshot.quotas = {
        MakeQuota("tenant-root", {{"requests.gpu.cozystack.io/a100", roomForOne ? "2" : "1"}})};
    snapshot.vmis = {MakeVmi("tenant-a", "vm1", {}), MakeVmi("tenant-a", "vm2", {})};
    snapshot.devices = {Bound("tenant-a", "held", "a100", 1, "n1", "vm1"),
                        Pending("tenant-a", "vm1-scratch", "a100", 1, "vm1"),
                        Pending("tenant-a", "vm2-scratch", "a100", 1, "vm2")};
    const std::vector<Decision> decisions = Model(snapshot).PlanPass();
    const Decision first = DecisionFor(decisions, "tenant-a/vm1-scratch");
    const Decision second = DecisionFor(decisions, "tenant-a/vm2-scratch");
    if (roomForOne) {
      EXPECT_EQ(first.action, Action::kBind) << first.reason;
      EXPECT_EQ(first.node, "n1");
    } else {
      EXPECT_EQ(first.action, Action::kRefuse) << first.reason;
      EXPECT_NE(first.reason.find("tenant-root"), std::string::npos) << first.reason;
      const Decision held = DecisionFor(decisions, "tenant-a/held");
      EXPECT_NE(held.action, Action::kMove) << held.reason;
      EXPECT_NE(held.action, Action::kLost) << held.reason;
    }
    EXPECT_EQ(second.action, Action::kRefuse) << second.reason;
    int bound = 1;  // held
    for (const Decision& decision : decisions) {
      if (decision.action == Action::kBind) ++bound;
    }
    EXPECT_LE(bound, roomForOne ? 2 : 1);
  }
}

// C2: "the catalog skipped a budget it could not read, where the others failed" — a malformed
// budget is never skipped: every order of its own subtree is refused, naming it, in the pass,
// the order check and the remaining budget alike. C18: no other tenant's order is.
TEST(BudgetsC2C18, AnUnreadableBudgetRefusesItsOwnSubtreeAndNoOneElse) {
  Snapshot snapshot = BaseSnapshot();
  AddNode(snapshot, "n1", 4);
  snapshot.quotas = {MakeQuota("tenant-a", {{"requests.gpu.cozystack.io/a100", "two"}})};
  snapshot.devices = {Pending("tenant-a", "mine", "a100", 1),
                      Pending("tenant-a-b", "child", "a100", 1),
                      Pending("tenant-b", "other", "a100", 1)};
  const Model model(snapshot);
  ASSERT_EQ(model.Problems().size(), 1u);
  EXPECT_EQ(model.Problems()[0].Describe().rfind(
                "ResourceQuota tenant-a/gpu: spec.hard[\"requests.gpu.cozystack.io/a100\"]: "
                "\"two\" is not a quantity",
                0),
            0u)
      << model.Problems()[0].Describe();
  const std::vector<Decision> decisions = model.PlanPass();
  for (const char* refused : {"tenant-a/mine", "tenant-a-b/child"}) {
    const Decision decision = DecisionFor(decisions, refused);
    EXPECT_EQ(decision.action, Action::kRefuse) << refused;
    EXPECT_NE(decision.reason.find("ResourceQuota tenant-a/gpu"), std::string::npos)
        << decision.reason;
  }
  EXPECT_EQ(DecisionFor(decisions, "tenant-b/other").action, Action::kBind);
  EXPECT_TRUE(model.CheckNewOrder("tenant-a-b", {{"a100", 1}}).has_value());
  EXPECT_FALSE(model.CheckNewOrder("tenant-b", {{"a100", 1}}).has_value());
  EXPECT_EQ(model.Remaining("tenant-a", "a100").remaining, 0);
  EXPECT_FALSE(model.Remaining("tenant-b", "a100").remaining.has_value());
  // Keys the model does not read are not its to judge.
  snapshot.quotas = {MakeQuota("tenant-a", {{"requests.memory", "lots"}})};
  EXPECT_TRUE(Model(snapshot).Problems().empty());
}

// C18: a pod asking for "10E" GPUs (the API server accepts it; it stays Pending) or for a
// quantity that does not read holds everything it could on its own node and in its own tenant
// chain, is named, and stops no other decision. Before, the model threw and every order, VM
// start and binder pass of the cluster failed.
TEST(InputsOutOfRangeC18, APodAskingForMoreThanAnyNodeHasHoldsItsOwnNodeAndTenantAlone) {
  for (const std::string quantity : {"10E", "9e30", "one"}) {
    Snapshot snapshot = BaseSnapshot();
    AddNode(snapshot, "n1", 2);
    AddNode(snapshot, "n2", 2);
    // A raw-name key caps devices and raw-name pods together (C4): the pod's request counts.
    const ResourceList budget = {{"requests.gpu.cozystack.io/a100", "8"},
                                 {"requests." + kA100, "8"}};
    snapshot.quotas = {MakeQuota("tenant-a", budget), MakeQuota("tenant-b", budget)};
    Pod huge = MakePod("tenant-a", "huge", "n1", kA100, 1);
    huge.containers[0].requests[kA100] = quantity;
    huge.containers[0].limits[kA100] = quantity;
    // One pod outside the tenant tree, not scheduled, asking for as much.
    Pod stranger = huge;
    stranger.namespaceName = "default";
    stranger.name = "stranger";
    stranger.nodeName = "";
    snapshot.pods = {huge, stranger};
    snapshot.devices = {Pending("tenant-a", "mine", "a100", 1),
                        Pending("tenant-b", "other", "a100", 2)};
    const Model model(snapshot);
    ASSERT_EQ(model.Problems().size(), 2u) << quantity;  // each pod's request
    EXPECT_EQ(
        model.Problems()[0].Describe().rfind(
            "Pod tenant-a/huge: spec.containers[0].resources.requests[\"nvidia.com/GA100\"]", 0),
        0u)
        << model.Problems()[0].Describe();
    EXPECT_EQ(FreeOn(model, "n1", "a100"), 0) << quantity;
    EXPECT_EQ(FreeOn(model, "n2", "a100"), 2) << quantity;
    const std::vector<Decision> decisions = model.PlanPass();
    const Decision mine = DecisionFor(decisions, "tenant-a/mine");
    EXPECT_EQ(mine.action, Action::kRefuse) << quantity;
    EXPECT_NE(mine.reason.find("Pod tenant-a/huge"), std::string::npos) << mine.reason;
    const Decision other = DecisionFor(decisions, "tenant-b/other");
    EXPECT_EQ(other.action, Action::kBind) << quantity << ": " << other.reason;
    EXPECT_EQ(other.node, "n2");
    EXPECT_FALSE(model.CheckNewOrder("tenant-b", {{"a100", 2}}).has_value());
    EXPECT_TRUE(model.CheckNewOrder("tenant-a", {{"a100", 1}}).has_value());
  }
}

// C18: sums saturate. Two pods of 9E on one node (each inside int64, their sum not), a GPUNode
// reporting allocatable near INT64_MAX on two nodes, a budget of 10E and an order of 2^62 GPUs:
// nothing wraps round to a small or negative number that would read as room.
TEST(InputsOutOfRangeC18, SumsSaturateAndNeverWrap) {
  Snapshot snapshot = BaseSnapshot();
  AddNode(snapshot, "n1", 2);
  AddNode(snapshot, "big1", 1);
  AddNode(snapshot, "big2", 1);
  AddNode(snapshot, "big3", 1);
  AddNode(snapshot, "big4", 1);
  for (size_t i = 1; i < snapshot.gpuNodes.size(); ++i) {
    snapshot.gpuNodes.MutableAt(i).devices[0].resources[0].allocatable =
        std::numeric_limits<int64_t>::max() - 1;
  }
  std::vector<Pod> pods = {MakePod("tenant-a", "p1", "n1", kA100, 1),
                           MakePod("tenant-a", "p2", "n1", kA100, 1)};
  for (Pod& pod : pods) {
    pod.containers[0].requests[kA100] = "9E";
    pod.containers[0].limits[kA100] = "9E";
  }
  snapshot.pods = pods;
  snapshot.quotas = {MakeQuota("tenant-a", {{"requests.gpu.cozystack.io/total", "10E"}})};
  snapshot.devices = {Pending("tenant-b", "huge", "a100", int64_t{1} << 62),
                      Pending("tenant-b", "one", "a100", 1)};
  snapshot.devices.MutableAt(0).metadata.creationTimestamp = "2025-01-01T00:00:00Z";
  snapshot.devices.MutableAt(1).metadata.creationTimestamp = "2025-01-01T00:00:01Z";
  const Model model(snapshot);
  EXPECT_EQ(FreeOn(model, "n1", "a100"), 0);
  EXPECT_EQ(model.NodeClass("big1", "a100")->units, api::kMaxUnits);
  const ClusterView view = model.View();
  ASSERT_EQ(view.classes.size(), 1u);
  EXPECT_GE(view.classes[0].units, 4 * api::kMaxUnits);
  EXPECT_GE(view.classes[0].free, 4 * api::kMaxUnits);
  size_t gpuNodeProblems = 0, quotaProblems = 0;
  for (const InputProblem& problem : model.Problems()) {
    gpuNodeProblems += problem.kind == "GPUNode" ? 1u : 0u;
    quotaProblems += problem.kind == "ResourceQuota" ? 1u : 0u;
  }
  EXPECT_EQ(gpuNodeProblems, 4u);
  EXPECT_EQ(quotaProblems, 1u);
  EXPECT_EQ(model.Remaining("tenant-a", "a100").remaining, api::kMaxUnits);
  // 2^62 GPUs are read as api::kMaxUnits, which one of the big nodes serves; the next order
  // still fits its budget and a node.
  const std::vector<Decision> decisions = model.PlanPass();
  EXPECT_EQ(DecisionFor(decisions, "tenant-b/huge").action, Action::kBind);
  const Decision one = DecisionFor(decisions, "tenant-b/one");
  EXPECT_EQ(one.action, Action::kBind) << one.reason;
  EXPECT_NE(one.node, "n1");
  EXPECT_FALSE(model.CheckNewOrder("tenant-a", {{"a100", 1}}).has_value());
}

// C1: "The model is pure, so each caller builds a snapshot from its own cache." One snapshot,
// every reader: the view, the single-tenant reader and the node reader agree.
TEST(SharedModelC1, ReadersAgree) {
  Snapshot snapshot = BaseSnapshot();
  AddNode(snapshot, "n1", 4);
  AddNode(snapshot, "n2", 2);
  snapshot.quotas = {MakeQuota("tenant-a", {{"requests.gpu.cozystack.io/a100", "3"}})};
  snapshot.devices = {Bound("tenant-a", "g1", "a100", 2, "n1"),
                      Bound("tenant-a-b", "g2", "a100", 1, "n2")};
  snapshot.pods = {MakePod("tenant-b", "raw", "n1", kA100, 1)};
  const Model model(snapshot);
  const ClusterView view = model.View();
  for (const TenantView& tenant : view.tenants) {
    const RemainingBudget direct = model.Remaining(tenant.name, "a100");
    EXPECT_EQ(tenant.classes.at("a100").budget.remaining, direct.remaining) << tenant.name;
    EXPECT_EQ(tenant.classes.at("a100").budget.limitedBy, direct.limitedBy) << tenant.name;
  }
  for (const NodeView& node : view.nodes) {
    EXPECT_EQ(node.classes.at("a100").free, model.NodeClass(node.name, "a100")->free);
  }
  ASSERT_EQ(view.classes.size(), 1U);
  EXPECT_EQ(view.classes[0].units, 6);
  EXPECT_EQ(view.classes[0].free, 2) << "6 units - 3 bound - 1 raw";
  EXPECT_EQ(view.tenants[0].name, "tenant-a");
  EXPECT_EQ(view.tenants[0].classes.at("a100").used, 3) << "its own and tenant-a-b's";
  EXPECT_EQ(view.tenants[0].classes.at("a100").budget.remaining, 0);
}

TEST(ClassView, NodeSelectorAndEligibilityShapeUnitsAndFree) {
  Snapshot snapshot = BaseSnapshot();
  snapshot.classes[0].spec.nodeSelector = api::LabelSelector{{{"gpu", "a100"}}, {}};
  AddNode(snapshot, "n1", 4);
  AddNode(snapshot, "n2", 4);
  AddNode(snapshot, "n3", 4);
  snapshot.nodes.MutableAt(0).labels["gpu"] = "a100";
  snapshot.nodes.MutableAt(1).labels["gpu"] = "a100";
  snapshot.nodes.MutableAt(1).unschedulable = true;
  const ClusterView view = Model(snapshot).View();
  EXPECT_EQ(view.classes[0].units, 8) << "n3 is not selected";
  EXPECT_EQ(view.classes[0].free, 4) << "cordoned n2 takes no binds";
  EXPECT_EQ(view.classes[0].maxCount, std::nullopt) << "B9: passthrough without maxCount";
  EXPECT_TRUE(view.nodes[2].classes.empty());
  EXPECT_FALSE(view.nodes[1].eligible);
  EXPECT_EQ(view.nodes[1].reasons, std::vector<std::string>{"cordoned"});
}

// D6: "binds new orders onto the fullest node with room" — catalog: A 3/4 used, B 0/4: an order
// of 1 goes to A, an order of 2 to B.
TEST(PlacementD6, FullestNodeWithRoom) {
  Snapshot snapshot = BaseSnapshot();
  AddNode(snapshot, "a", 4);
  AddNode(snapshot, "b", 4);
  snapshot.devices = {Bound("tenant-a", "held", "a100", 3, "a"),
                      Pending("tenant-a", "one", "a100", 1), Pending("tenant-a", "two", "a100", 2)};
  snapshot.devices.MutableAt(1).metadata.creationTimestamp = "2025-01-01T00:00:00Z";
  snapshot.devices.MutableAt(2).metadata.creationTimestamp = "2025-01-01T00:00:01Z";
  const std::vector<Decision> decisions = Model(snapshot).PlanPass();
  EXPECT_EQ(DecisionFor(decisions, "tenant-a/held").action, Action::kKeep);
  EXPECT_EQ(DecisionFor(decisions, "tenant-a/one").node, "a");
  EXPECT_EQ(DecisionFor(decisions, "tenant-a/two").node, "b");
}

// D5: "rebinds Lost sets before new orders" — catalog: one free unit, a Lost set and a new
// order: the Lost set wins.
TEST(PlacementD5, LostSetsBeforeNewOrders) {
  Snapshot snapshot = BaseSnapshot();
  AddNode(snapshot, "n1", 1);
  snapshot.devices = {Pending("tenant-a", "aaa-new", "a100", 1),
                      Lost("tenant-a", "zzz-lost", "a100", 1)};
  const std::vector<Decision> decisions = Model(snapshot).PlanPass();
  EXPECT_EQ(DecisionFor(decisions, "tenant-a/zzz-lost").action, Action::kBind);
  EXPECT_EQ(DecisionFor(decisions, "tenant-a/aaa-new").action, Action::kRefuse);
  EXPECT_EQ(decisions.front().deviceName, "zzz-lost") << "taken in pass order";
}

struct SetCase {
  const char* what;
  std::vector<std::pair<std::string, int>> nodes;  // name, GPUs
  std::vector<api::GpuDevice> devices;
  std::map<std::string, std::pair<Action, std::string>> expected;  // device -> action, node
};

void RunSetCases(const std::vector<SetCase>& cases,
                 const std::function<void(Snapshot&)>& adjust = nullptr) {
  for (const SetCase& c : cases) {
    Snapshot snapshot = BaseSnapshot();
    for (const auto& [name, gpus] : c.nodes) {
      AddNode(snapshot, name, gpus);
    }
    snapshot.devices = c.devices;
    if (adjust) {
      adjust(snapshot);
    }
    const std::vector<Decision> decisions = Model(snapshot).PlanPass();
    for (const auto& [device, outcome] : c.expected) {
      const Decision decision = DecisionFor(decisions, "tenant-a/" + device);
      EXPECT_EQ(decision.action, outcome.first)
          << c.what << ": " << device << " got " << ToString(decision.action) << " ("
          << decision.reason << ")";
      EXPECT_EQ(decision.node, outcome.second) << c.what << ": " << device;
      EXPECT_FALSE(decision.reason.empty()) << c.what << ": a decision says why";
    }
  }
}

// D7: "The devices one VM names move, go Lost and are rebound as a set." D8: "Every pass
// restores that invariant before it places anything, gathering a set left partly Lost ...
// onto one node or sending all of it to Lost". D9: the binder "either gathers a set onto one
// eligible node or refuses it".
TEST(PlacementD7D8D9, SetsStayTogether) {
  const std::vector<SetCase> cases = {
      {"D8 one member on A, one Lost, room on A: gathered on A",
       {{"A", 2}, {"B", 4}},
       {Bound("tenant-a", "m1", "a100", 1, "A", "vm"), Lost("tenant-a", "m2", "a100", 1, "vm")},
       {{"m1", {Action::kKeep, "A"}}, {"m2", {Action::kBind, "A"}}}},
      {"D8 no room on A: the set moves whole to B",
       {{"A", 1}, {"B", 4}},
       {Bound("tenant-a", "m1", "a100", 1, "A", "vm"), Lost("tenant-a", "m2", "a100", 1, "vm")},
       {{"m1", {Action::kMove, "B"}}, {"m2", {Action::kBind, "B"}}}},
      {"D8 no node has room for both: all of it goes Lost",
       {{"A", 1}, {"B", 1}},
       {Bound("tenant-a", "m1", "a100", 1, "A", "vm"), Lost("tenant-a", "m2", "a100", 1, "vm")},
       {{"m1", {Action::kLost, ""}}, {"m2", {Action::kLost, ""}}}},
      {"D8 split over two nodes: gathered where most members are",
       {{"A", 3}, {"B", 3}},
       {Bound("tenant-a", "m1", "a100", 1, "A", "vm"),
        Bound("tenant-a", "m2", "a100", 1, "B", "vm"),
        Bound("tenant-a", "m3", "a100", 1, "B", "vm")},
       {{"m1", {Action::kMove, "B"}}, {"m2", {Action::kKeep, "B"}}, {"m3", {Action::kKeep, "B"}}}},
      {"D9 new set whose members fit only on different nodes: refused",
       {{"A", 1}, {"B", 1}},
       {Pending("tenant-a", "m1", "a100", 1, "vm"), Pending("tenant-a", "m2", "a100", 1, "vm")},
       {{"m1", {Action::kRefuse, ""}}, {"m2", {Action::kRefuse, ""}}}},
      {"D7 a Lost set is rebound as a set",
       {{"A", 1}, {"B", 2}},
       {Lost("tenant-a", "m1", "a100", 1, "vm"), Lost("tenant-a", "m2", "a100", 1, "vm")},
       {{"m1", {Action::kBind, "B"}}, {"m2", {Action::kBind, "B"}}}},
      {"D7 catalog: one of a VM's 2 devices loses its function: both move",
       {{"A", 1}, {"B", 2}},
       {Bound("tenant-a", "m1", "a100", 1, "A", "vm"),
        Bound("tenant-a", "m2", "a100", 1, "A", "vm")},
       {{"m1", {Action::kMove, "B"}}, {"m2", {Action::kMove, "B"}}}},
      {"D7 ... and both go Lost when no node has room",
       {{"A", 1}, {"B", 1}},
       {Bound("tenant-a", "m1", "a100", 1, "A", "vm"),
        Bound("tenant-a", "m2", "a100", 1, "A", "vm")},
       {{"m1", {Action::kLost, ""}}, {"m2", {Action::kLost, ""}}}},
  };
  RunSetCases(cases);
}

// D10: "a cordon alone does not move a set with no room elsewhere, and a device of a class with
// onCordon Stay keeps its node". Nodes that cannot keep a set at all (gone, NotReady, an
// untolerated taint, no longer selected) move it or send it to Lost.
TEST(PlacementD10, HeldSetsLeaveOnlyNodesThatCannotKeepThem) {
  const std::vector<api::GpuDevice> held = {Bound("tenant-a", "g", "a100", 1, "n1")};
  struct Case {
    const char* what;
    std::function<void(Snapshot&)> adjust;
    int otherNodeGpus;
    Action action;
    std::string node;
  };
  const std::vector<Case> cases = {
      {"healthy node keeps", [](Snapshot&) {}, 4, Action::kKeep, "n1"},
      {"D10 cordoned, room elsewhere: move",
       [](Snapshot& s) { s.nodes.MutableAt(0).unschedulable = true; }, 4, Action::kMove, "n2"},
      {"D10 cordoned, no room elsewhere: keep",
       [](Snapshot& s) { s.nodes.MutableAt(0).unschedulable = true; }, 0, Action::kKeep, "n1"},
      {"D10 cordoned, class Stay: keep",
       [](Snapshot& s) {
         s.nodes.MutableAt(0).unschedulable = true;
         s.classes[0].spec.onCordon = api::OnCordon::kStay;
       },
       4, Action::kKeep, "n1"},
      {"NotReady, room elsewhere: move", [](Snapshot& s) { s.nodes.MutableAt(0).ready = false; }, 4,
       Action::kMove, "n2"},
      {"NotReady, no room: Lost", [](Snapshot& s) { s.nodes.MutableAt(0).ready = false; }, 0,
       Action::kLost, ""},
      {"node gone: Lost",
       [](Snapshot& s) {
         s.nodes.EraseAt(0);
         s.gpuNodes.EraseAt(0);
       },
       0, Action::kLost, ""},
      {"C8 untolerated NoExecute taint: move (it is no cordon)",
       [](Snapshot& s) {
         s.nodes.MutableAt(0).taints = {{"maintenance", "", "NoExecute"}};
       },
       4, Action::kMove, "n2"},
      {"C8 stale unreachable taint on a Ready node: keep",
       [](Snapshot& s) {
         s.nodes.MutableAt(0).taints = {{"node.kubernetes.io/unreachable", "", "NoExecute"}};
       },
       4, Action::kKeep, "n1"},
      {"F3 nodeSelector moved the offer: move",
       [](Snapshot& s) {
         s.classes[0].spec.nodeSelector = api::LabelSelector{{{"pool", "new"}}, {}};
         s.nodes.MutableAt(1).labels["pool"] = "new";
       },
       4, Action::kMove, "n2"},
      {"C13 the function failed: its unit is gone, move",
       [](Snapshot& s) { s.gpuNodes.MutableAt(0).devices[0].resources[0].allocatable = 0; }, 4,
       Action::kMove, "n2"},
      // A pod on a node its orders fill (a VM's launcher its VMI does not list in activePods
      // yet, C12) keeps new orders off it (C6) but evicts no held set: before, another tenant's
      // order went Lost at each VM start on a full node (docs/reliability.md).
      {"C6 a raw-name pod on the full node: keep, room elsewhere or not",
       [](Snapshot& s) { s.pods = {MakePod("tenant-b", "launcher", "n1", kA100, 1)}; }, 0,
       Action::kKeep, "n1"},
      {"C6 a raw-name pod on the full node, room elsewhere: keep",
       [](Snapshot& s) { s.pods = {MakePod("tenant-b", "launcher", "n1", kA100, 1)}; }, 4,
       Action::kKeep, "n1"},
  };
  for (const Case& c : cases) {
    Snapshot snapshot = BaseSnapshot();
    AddNode(snapshot, "n1", 1);
    AddNode(snapshot, "n2", c.otherNodeGpus);
    snapshot.devices = held;
    c.adjust(snapshot);
    const Decision decision = DecisionFor(Model(snapshot).PlanPass(), "tenant-a/g");
    EXPECT_EQ(decision.action, c.action) << c.what << ": " << decision.reason;
    EXPECT_EQ(decision.node, c.node) << c.what;
  }
}

TEST(PlacementD10, VmiTolerationsLetASetStayOnATaintedNode) {
  Snapshot snapshot = BaseSnapshot();
  AddNode(snapshot, "n1", 2);
  AddNode(snapshot, "n2", 2);
  snapshot.nodes.MutableAt(0).taints = {{"gpu", "a100", "NoSchedule"}};
  snapshot.devices = {Bound("tenant-a", "g", "a100", 1, "n1", "vm1")};
  snapshot.vmis = {MakeVmi("tenant-a", "vm1", {})};
  snapshot.vmis.MutableAt(0).tolerations = {{"gpu", "Exists", "", ""}};
  EXPECT_EQ(DecisionFor(Model(snapshot).PlanPass(), "tenant-a/g").action, Action::kKeep);
}

// E1: "an unknown or deleted class, maxCount" — the binder re-checks what admission checked.
TEST(PlacementE1, NewOrdersAgainstTheirClass) {
  struct Case {
    const char* what;
    std::function<void(Snapshot&)> adjust;
    api::GpuDevice order;
    Action action;
  };
  const std::vector<Case> cases = {
      {"fits", [](Snapshot&) {}, Pending("tenant-a", "o", "a100", 2), Action::kBind},
      {"unknown class", [](Snapshot&) {}, Pending("tenant-a", "o", "h100", 1), Action::kRefuse},
      {"over maxCount", [](Snapshot& s) { s.classes[0].spec.maxCount = 1; },
       Pending("tenant-a", "o", "a100", 2), Action::kRefuse},
      {"B9 vgpu class without maxCount allows 1",
       [](Snapshot& s) { s.classes[0].spec.mode = api::GpuMode::kVgpu; },
       Pending("tenant-a", "o", "a100", 2), Action::kRefuse},
      {"class being deleted",
       [](Snapshot& s) { s.classes[0].metadata.deletionTimestamp = "2025-01-01T00:00:00Z"; },
       Pending("tenant-a", "o", "a100", 1), Action::kRefuse},
      {"no room", [](Snapshot&) {}, Pending("tenant-a", "o", "a100", 5), Action::kRefuse},
      {"order being deleted",
       [](Snapshot& s) {
         s.devices.MutableAt(0).metadata.deletionTimestamp = "2025-01-01T00:00:00Z";
       },
       Pending("tenant-a", "o", "a100", 1), Action::kRefuse},
  };
  for (const Case& c : cases) {
    Snapshot snapshot = BaseSnapshot();
    AddNode(snapshot, "n1", 4);
    snapshot.devices = {c.order};
    c.adjust(snapshot);
    const Decision decision = DecisionFor(Model(snapshot).PlanPass(), "tenant-a/o");
    EXPECT_EQ(decision.action, c.action) << c.what << ": " << decision.reason;
  }
}

// The model views the snapshot's strings rather than copying them, so a temporary snapshot must
// not bind: it would be gone before the first lookup.
static_assert(std::is_constructible_v<Model, const Snapshot&>);
static_assert(!std::is_constructible_v<Model, Snapshot&&>);
static_assert(!std::is_constructible_v<Model, const Snapshot&&>);

// D5 fixes the order of a pass's steps; within a step the sets go in the order of their keys,
// "ns/<device>" or "ns/vmi <name> <uid>", compared as bytes, so every caller given the same
// snapshot decides the same. '-' and '.' sort before '/', so "a-b/..." and "a.b/..." come before
// "a/...", and "ab/..." after it. The pass orders by namespace first; this pins that it is the
// same order.
TEST(PassOrderD5, SetsInKeyOrderAcrossNamespaces) {
  Snapshot snapshot = BaseSnapshot();
  AddNode(snapshot, "n1", 8);
  snapshot.devices = {Lost("ab", "x", "a100", 1),        Lost("a", "y", "a100", 1),
                      Lost("a.b", "x", "a100", 1),       Lost("a-b", "x", "a100", 1),
                      Lost("a", "x", "a100", 1),         Lost("a", "vm-z", "a100", 1, "vm"),
                      Lost("a", "vm-w", "a100", 1, "vm")};
  std::vector<std::string> order;
  for (const Decision& decision : Model(snapshot).PlanPass()) {
    order.push_back(decision.deviceNamespace + "/" + decision.deviceName);
  }
  // The set "a/vmi vm vm-uid" comes before the orders "a/x" and "a/y"; its members in their
  // own order.
  EXPECT_EQ(order,
            (std::vector<std::string>{"a-b/x", "a.b/x", "a/vm-z", "a/vm-w", "a/x", "a/y", "ab/x"}));
}

// D7: a set is the devices attached to one VMI, told apart by UID: devices left attached to an
// earlier VMI of the same name form their own set and are not gathered with the new one.
TEST(PlacementD7, AnEarlierVmiOfTheSameNameIsAnotherSet) {
  Snapshot snapshot = BaseSnapshot();
  AddNode(snapshot, "n1", 1);
  AddNode(snapshot, "n2", 1);
  api::GpuDevice earlier = Bound("tenant-a", "old", "a100", 1, "n1", "vm");
  earlier.status.attachment->vmiUid = "first-uid";
  snapshot.devices = {earlier, Bound("tenant-a", "new", "a100", 1, "n2", "vm")};
  const std::vector<Decision> decisions = Model(snapshot).PlanPass();
  EXPECT_EQ(DecisionFor(decisions, "tenant-a/old").action, Action::kKeep);
  EXPECT_EQ(DecisionFor(decisions, "tenant-a/old").node, "n1");
  EXPECT_EQ(DecisionFor(decisions, "tenant-a/new").action, Action::kKeep);
  EXPECT_EQ(DecisionFor(decisions, "tenant-a/new").node, "n2");
}

// A snapshot's copy shares its devices until one of the two changes them: the
// change copies the list and the element it changes, the other copy sees nothing of it, and
// pointers into the one that did not change stay good.
TEST(SharedVector, ACopySharesItsElementsUntilOneOfTheTwoChangesThem) {
  Snapshot snapshot;
  snapshot.devices = {Pending("tenant-a", "a", "a100", 1), Pending("tenant-a", "b", "a100", 1)};
  const api::GpuDevice* first = &snapshot.devices[0];
  Snapshot copy = snapshot;
  EXPECT_TRUE(copy.devices.SharesWith(snapshot.devices));
  EXPECT_EQ(&copy.devices[0], first) << "the same elements, not a copy";
  copy.devices.MutableAt(0).metadata.name = "changed";
  EXPECT_FALSE(copy.devices.SharesWith(snapshot.devices));
  EXPECT_EQ(copy.devices[0].metadata.name, "changed");
  EXPECT_EQ(snapshot.devices[0].metadata.name, "a") << "the other copy is as it was";
  EXPECT_EQ(&snapshot.devices[0], first);
  copy.devices.push_back(Pending("tenant-a", "c", "a100", 1));
  EXPECT_EQ(copy.devices.size(), 3U);
  EXPECT_EQ(snapshot.devices.size(), 2U);
  // A vector of a cache's elements holds those very elements, and a change copies the one.
  const std::vector<std::shared_ptr<const api::GpuDevice>> cache = snapshot.devices.Items();
  SharedVector<api::GpuDevice> shared = SharedVector<api::GpuDevice>::Sharing(cache);
  EXPECT_EQ(&shared[1], cache[1].get());
  shared.MutableAt(1).metadata.name = "changed";
  EXPECT_EQ(cache[1]->metadata.name, "b") << "the cache's element is never written";
  EXPECT_EQ(&shared[0], cache[0].get());
  EXPECT_EQ(shared.EraseIf([](const api::GpuDevice& d) { return d.metadata.name == "a"; }), 1U);
  EXPECT_EQ(shared.size(), 1U);
  EXPECT_EQ(cache.size(), 2U);
  copy.devices.clear();
  EXPECT_TRUE(copy.devices.empty());
  EXPECT_EQ(snapshot.devices.size(), 2U);
}

}  // namespace
}  // namespace cozy::model
