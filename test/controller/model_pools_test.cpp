// The model on clusters as hosters run them: GPU pools behind a NoSchedule taint that a class
// tolerates (C7; docs/install.md, "GPU nodes behind a taint"), nodes that are NotReady for a
// while and sets whose VM runs (C7, D5; docs/controller.md, "NotReady is not gone"), and held
// sets whose class is gone (D9). Each test would fail on the model before these rules: orders
// refused and held sets sent Lost on a tainted pool, every set moved off a node the moment it
// blinked, a start answered Succeeded for a class that no longer exists.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>

#include "api/time.h"
#include "controller/admission/orders.h"
#include "controller/model/model.h"
#include "test/controller/model_fixtures.h"

namespace cozy::model {
namespace {

using namespace cozy::model::testing;

const Taint kPoolTaint{"nvidia.com/gpu", "present", "NoSchedule"};
const Toleration kPoolToleration{"nvidia.com/gpu", "Exists", "", "NoSchedule"};

Decision DecisionFor(const std::vector<Decision>& decisions, const std::string& device) {
  for (const Decision& decision : decisions) {
    if (decision.deviceNamespace + "/" + decision.deviceName == device) {
      return decision;
    }
  }
  ADD_FAILURE() << "no decision for " << device;
  return Decision{"", "<no decision>", Action::kKeep, "", "", false};
}

// Two GPU nodes of two units each, both in the tainted pool, and one class that tolerates the
// pool's taint when `tolerates`.
Snapshot TaintedPool(bool tolerates) {
  Snapshot snapshot;
  snapshot.classes = {MakeClass("a100", kA100)};
  if (tolerates) {
    snapshot.classes[0].spec.tolerations = {kPoolToleration};
  }
  snapshot.namespaces = {MakeTenant("tenant-a", {})};
  for (const std::string name : {"n1", "n2"}) {
    snapshot.nodes.push_back(MakeNode(name));
    snapshot.nodes.MutableAt(snapshot.nodes.size() - 1).taints = {kPoolTaint};
    snapshot.gpuNodes.push_back(MakeGpuNode(name, kA100, 2));
  }
  return snapshot;
}

TEST(TaintedPoolC7, AClassThatToleratesThePoolTakesOrdersThere) {
  const Snapshot snapshot = TaintedPool(true);
  const Model model(snapshot);
  const std::optional<ClassRoom> room = model.Room("a100");
  ASSERT_TRUE(room);
  EXPECT_EQ(room->free, 4);
  EXPECT_EQ(room->largestNodeFree, 2);
  EXPECT_EQ(model.View().classes.at(0).free, 4);
  EXPECT_TRUE(model.View().nodes.at(0).eligible) << "kubectl gpu and simulate say it takes binds";
  const Snapshot untolerated = TaintedPool(false);
  EXPECT_FALSE(Model(untolerated).View().nodes.at(0).eligible);
  api::GpuDevice order = Pending("tenant-a", "o", "a100", 2);
  EXPECT_EQ(admission::CheckOrder(model, snapshot, order), std::nullopt);

  Snapshot withOrder = snapshot;
  withOrder.devices = {order};
  const Decision decision = DecisionFor(Model(withOrder).PlanPass(), "tenant-a/o");
  EXPECT_EQ(decision.action, Action::kBind) << decision.reason;
  EXPECT_EQ(decision.node, "n1");
}

TEST(TaintedPoolC7, AClassWithoutTheTolerationIsRefusedNamingTheTaint) {
  const Snapshot snapshot = TaintedPool(false);
  const Model model(snapshot);
  const std::optional<ClassRoom> room = model.Room("a100");
  ASSERT_TRUE(room);
  EXPECT_EQ(room->free, 0);
  EXPECT_EQ(room->freeElsewhere, 4);
  const std::optional<std::string> refusal =
      admission::CheckOrder(model, snapshot, Pending("tenant-a", "o", "a100", 1));
  ASSERT_TRUE(refusal);
  EXPECT_NE(refusal->find("only 0 are free"), std::string::npos) << *refusal;
  EXPECT_NE(refusal->find("taint nvidia.com/gpu=present:NoSchedule not tolerated"),
            std::string::npos)
      << *refusal;
  EXPECT_NE(refusal->find("the class tolerates no taint"), std::string::npos) << *refusal;
}

// E5: a template device the VMI webhook creates once it has placed the VM's set
// (with the VMI's own tolerations of the pool's taint) is not refused for room by the GPUDevice
// webhook, which counts room without the VMI: that refusal came after the held devices were
// attached. A tenant's own order still is, and so is the template for the other rules.
TEST(TaintedPoolC7, ATemplateDeviceIsNotRefusedForRoomAfterItsVmWasPlaced) {
  const Snapshot snapshot = TaintedPool(false);
  const Model model(snapshot);
  api::GpuDevice scratch = Pending("tenant-a", "vm-scratch", "a100", 1);
  EXPECT_TRUE(admission::CheckOrder(model, snapshot, scratch)) << "no mark: room is checked";
  scratch.metadata.labels[std::string(api::kTemplateDeviceLabel)] = "true";
  EXPECT_EQ(admission::CheckOrder(model, snapshot, scratch), std::nullopt);
  scratch.spec.className = "h100";
  EXPECT_TRUE(admission::CheckOrder(model, snapshot, scratch)) << "an unknown class still is";
}

// The first pass after the class gained its toleration (or after a restart) keeps every held
// order whose VM is off where it is: none goes Lost for the pool's taint.
TEST(TaintedPoolC7, HeldOrdersWithTheirVmOffStayOnTheTaintedPool) {
  for (const bool tolerates : {true, false}) {
    Snapshot snapshot = TaintedPool(tolerates);
    snapshot.devices = {Bound("tenant-a", "held", "a100", 1, "n1")};
    const Decision decision = DecisionFor(Model(snapshot).PlanPass(), "tenant-a/held");
    if (tolerates) {
      EXPECT_EQ(decision.action, Action::kKeep) << decision.reason;
      EXPECT_EQ(decision.node, "n1");
      EXPECT_TRUE(decision.StartsOnNode());
    } else {
      EXPECT_EQ(decision.action, Action::kLost) << "without the toleration: " << decision.reason;
    }
  }
}

// A VM start whose set mixes a held device and a template: the new member is placed on the
// pool with the held one, through the class's toleration and not the VMI's.
TEST(TaintedPoolC7, AStartGathersATemplateOntoThePoolByTheClassToleration) {
  Snapshot snapshot = TaintedPool(true);
  snapshot.devices = {Bound("tenant-a", "held", "a100", 1, "n2", "vm"),
                      Pending("tenant-a", "vm-scratch", "a100", 1, "vm")};
  snapshot.vmis = {MakeVmi("tenant-a", "vm", {})};
  const std::vector<Decision> decisions = Model(snapshot).PlanPass();
  EXPECT_EQ(DecisionFor(decisions, "tenant-a/held").action, Action::kKeep);
  const Decision scratch = DecisionFor(decisions, "tenant-a/vm-scratch");
  EXPECT_EQ(scratch.action, Action::kBind) << scratch.reason;
  EXPECT_EQ(scratch.node, "n2");
}

// A set of two classes on two pools' taints: each class tolerates its own, and the launcher
// carries both, so the node carrying both taints takes the set.
TEST(TaintedPoolC7, ASetOfTwoClassesToleratesWhatEitherClassTolerates) {
  Snapshot snapshot;
  snapshot.namespaces = {MakeTenant("tenant-a", {})};
  snapshot.classes = {MakeClass("a100", kA100), MakeClass("l40s", "nvidia.com/L40S")};
  snapshot.classes[0].spec.tolerations = {{"pool-a", "Exists", "", ""}};
  snapshot.classes[1].spec.tolerations = {{"pool-b", "Equal", "yes", "NoSchedule"}};
  snapshot.nodes = {MakeNode("n1")};
  snapshot.nodes.MutableAt(0).taints = {{"pool-a", "", "NoSchedule"},
                                        {"pool-b", "yes", "NoSchedule"}};
  api::GpuNodeInventory inventory = MakeGpuNode("n1", kA100, 1);
  inventory.devices.push_back(MakeGpuNode("n1", "nvidia.com/L40S", 1).devices[0]);
  inventory.devices.back().pciAddress = "0000:20:00.0";
  inventory.resourceNames.push_back("nvidia.com/L40S");
  snapshot.gpuNodes = {inventory};
  EXPECT_EQ(Model(snapshot).Room("a100")->free, 0) << "a100 alone does not tolerate pool-b";
  snapshot.devices = {Pending("tenant-a", "vm-a", "a100", 1, "vm"),
                      Pending("tenant-a", "vm-l", "l40s", 1, "vm")};
  snapshot.vmis = {MakeVmi("tenant-a", "vm", {})};
  const std::vector<Decision> decisions = Model(snapshot).PlanPass();
  EXPECT_EQ(DecisionFor(decisions, "tenant-a/vm-a").node, "n1")
      << DecisionFor(decisions, "tenant-a/vm-a").reason;
  EXPECT_EQ(DecisionFor(decisions, "tenant-a/vm-l").node, "n1");
}

// ---- NotReady is not gone (C7, D5) ----

constexpr const char* kNow = "2026-12-02T12:00:00Z";

// n1 holds `g` (attached to vm when `attached`), n2 has room; n1 went NotReady `secondsAgo`.
Snapshot NotReadyFor(int secondsAgo, bool attached = false) {
  Snapshot snapshot;
  snapshot.classes = {MakeClass("a100", kA100)};
  snapshot.namespaces = {MakeTenant("tenant-a", {})};
  snapshot.nodes = {MakeNode("n1"), MakeNode("n2")};
  snapshot.gpuNodes = {MakeGpuNode("n1", kA100, 1), MakeGpuNode("n2", kA100, 1)};
  snapshot.nodes.MutableAt(0).ready = false;
  const std::string since =
      api::FormatTime(*api::ParseTime(kNow) - std::chrono::seconds(secondsAgo));
  snapshot.nodes.MutableAt(0).conditionsSince["Ready"] = since;
  snapshot.nodes.MutableAt(0).taints = {{"node.kubernetes.io/unreachable", "", "NoExecute"}};
  snapshot.now = kNow;
  snapshot.devices = {Bound("tenant-a", "g", "a100", 1, "n1", attached ? "vm" : "")};
  if (attached) {
    snapshot.vmis = {MakeVmi("tenant-a", "vm", {})};
  }
  return snapshot;
}

TEST(NotReadyC7D5, AHeldSetWaitsOutTheGraceThenMoves) {
  {
    const Snapshot snapshot = NotReadyFor(20);
    const Decision decision = DecisionFor(Model(snapshot).PlanPass(), "tenant-a/g");
    EXPECT_EQ(decision.action, Action::kKeep) << decision.reason;
    EXPECT_EQ(decision.node, "n1");
    EXPECT_FALSE(decision.StartsOnNode()) << "no VM starts on a node that is not Ready";
    EXPECT_NE(decision.reason.find("node n1 is not Ready; its GPUs wait there 280s more"),
              std::string::npos)
        << decision.reason;
  }
  {
    const Snapshot snapshot = NotReadyFor(301);
    const Decision decision = DecisionFor(Model(snapshot).PlanPass(), "tenant-a/g");
    EXPECT_EQ(decision.action, Action::kMove) << decision.reason;
    EXPECT_EQ(decision.node, "n2");
  }
  {
    Snapshot snapshot = NotReadyFor(20);
    snapshot.settings.notReadyGraceSeconds = 0;  // --not-ready-grace 0s: at once, as before
    EXPECT_EQ(DecisionFor(Model(snapshot).PlanPass(), "tenant-a/g").action, Action::kMove);
  }
  {
    Snapshot snapshot = NotReadyFor(20);
    snapshot.now.clear();  // no clock (simulate on a file): no grace to measure
    EXPECT_EQ(DecisionFor(Model(snapshot).PlanPass(), "tenant-a/g").action, Action::kMove);
  }
}

// A VM start on a set within the grace moves it to a node that takes it, or is refused while
// none has room; the set then stays held where it was.
TEST(NotReadyC7D5, AStartWithinTheGraceMovesTheSetOrIsRefusedInPlace) {
  Snapshot snapshot = NotReadyFor(20, true);
  snapshot.devices.MutableAt(0).status.bindRequest = api::BindRequest{"req-1", kNow};
  Decision decision = DecisionFor(Model(snapshot).PlanPass(), "tenant-a/g");
  EXPECT_EQ(decision.action, Action::kMove) << decision.reason;
  EXPECT_EQ(decision.node, "n2");
  EXPECT_TRUE(decision.StartsOnNode());

  snapshot.gpuNodes.MutableAt(1).devices[0].resources[0].allocatable = 0;  // n2 has no room
  decision = DecisionFor(Model(snapshot).PlanPass(), "tenant-a/g");
  EXPECT_EQ(decision.action, Action::kKeep) << decision.reason;
  EXPECT_EQ(decision.node, "n1");
  EXPECT_FALSE(decision.StartsOnNode());
}

// A set whose VM runs on its node never moves: not past the grace, not for a cordon with
// onCordon Move, not for an untolerated taint, not to make room on an over-full node.
TEST(NotReadyC7D5, ASetWhoseVmRunsNeverMoves) {
  struct Case {
    const char* what;
    std::function<void(Snapshot&)> adjust;
  };
  const std::vector<Case> cases = {
      {"NotReady past the grace", [](Snapshot&) {}},
      {"cordoned, onCordon Move",
       [](Snapshot& s) {
         s.nodes.MutableAt(0).ready = true;
         s.nodes.MutableAt(0).taints.clear();
         s.nodes.MutableAt(0).unschedulable = true;
       }},
      {"an untolerated NoExecute taint",
       [](Snapshot& s) {
         s.nodes.MutableAt(0).ready = true;
         s.nodes.MutableAt(0).taints = {{"maintenance", "", "NoExecute"}};
       }},
      {"its function failed (the node over-full)",
       [](Snapshot& s) {
         s.nodes.MutableAt(0).ready = true;
         s.nodes.MutableAt(0).taints.clear();
         s.gpuNodes.MutableAt(0).devices[0].resources[0].allocatable = 0;
       }},
  };
  for (const Case& c : cases) {
    Snapshot snapshot = NotReadyFor(3600, true);
    snapshot.vmis.MutableAt(0).nodeName = "n1";
    snapshot.vmis.MutableAt(0).phase = "Running";
    c.adjust(snapshot);
    Decision decision = DecisionFor(Model(snapshot).PlanPass(), "tenant-a/g");
    EXPECT_EQ(decision.action, Action::kKeep) << c.what << ": " << decision.reason;
    EXPECT_EQ(decision.node, "n1") << c.what;
    // The same set once its VM has ended moves.
    snapshot.vmis.MutableAt(0).phase = "Failed";
    decision = DecisionFor(Model(snapshot).PlanPass(), "tenant-a/g");
    EXPECT_EQ(decision.action, Action::kMove)
        << c.what << " after the VM ended: " << decision.reason;
  }
}

// A set whose VM starts on its node never moves either: its launcher pod (listed in the VMI's
// activePods, C11) is alive, bound there or not yet, and KubeVirt has not written the VMI's
// node. The pod webhook pinned that launcher to the set's node (E13); were the set moved, kubelet
// would still admit the launcher there once the node is back, with GPUs held for others. Found
// by the chaos test (docs/reliability.md): a kubelet stopped between a launcher's binding and
// its start, its node NotReady past the grace.
TEST(NotReadyC7D5, ASetWhoseVmStartsNeverMoves) {
  struct Case {
    const char* what;
    std::function<void(Snapshot&)> adjust;
    Action expected;
  };
  const auto launcher = [](Snapshot& s, const std::string& node, const std::string& phase,
                           bool listed) {
    Pod pod = MakePod("tenant-a", "virt-launcher-vm", node, kA100, 1);
    pod.phase = phase;
    s.pods = {pod};
    s.vmis.MutableAt(0).activePodUids =
        listed ? std::vector<std::string>{pod.uid} : std::vector<std::string>{};
  };
  const std::vector<Case> cases = {
      {"launcher bound on n1, Pending", [&](Snapshot& s) { launcher(s, "n1", "Pending", true); },
       Action::kKeep},
      {"launcher not bound yet", [&](Snapshot& s) { launcher(s, "", "Pending", true); },
       Action::kKeep},
      {"launcher bound, the node cordoned (onCordon Move)",
       [&](Snapshot& s) {
         launcher(s, "n1", "Pending", true);
         s.nodes.MutableAt(0).ready = true;
         s.nodes.MutableAt(0).taints.clear();
         s.nodes.MutableAt(0).unschedulable = true;
       },
       Action::kKeep},
      {"a pod the VMI does not list (C11: no launcher)",
       [&](Snapshot& s) { launcher(s, "n1", "Pending", false); }, Action::kMove},
      {"the launcher ended", [&](Snapshot& s) { launcher(s, "n1", "Failed", true); },
       Action::kMove},
      {"the VMI ended, its launcher not yet gone",
       [&](Snapshot& s) {
         launcher(s, "n1", "Running", true);
         s.vmis.MutableAt(0).phase = "Failed";
       },
       Action::kMove},
      {"no launcher", [](Snapshot&) {}, Action::kMove},
  };
  for (const Case& c : cases) {
    Snapshot snapshot = NotReadyFor(3600, true);
    c.adjust(snapshot);
    const Decision decision = DecisionFor(Model(snapshot).PlanPass(), "tenant-a/g");
    EXPECT_EQ(decision.action, c.expected) << c.what << ": " << decision.reason;
    EXPECT_EQ(decision.node, c.expected == Action::kKeep ? "n1" : "n2") << c.what;
    if (c.expected == Action::kKeep) {
      EXPECT_NE(decision.reason.find("so its GPUs stay"), std::string::npos) << decision.reason;
    }
  }
}

// The condition taints (memory, disk, PID pressure, network unavailable) come and go with
// their condition: measured by its lastTransitionTime, as NotReady is. A hoster's own taint
// moves the set at once.
TEST(NotReadyC7D5, ConditionTaintsGetTheGraceAndOtherTaintsDoNot) {
  Snapshot snapshot = NotReadyFor(0);
  snapshot.nodes.MutableAt(0).ready = true;
  snapshot.nodes.MutableAt(0).taints = {{"node.kubernetes.io/memory-pressure", "", "NoSchedule"}};
  snapshot.nodes.MutableAt(0).conditionsSince["MemoryPressure"] = "2026-12-02T11:59:00Z";
  Decision decision = DecisionFor(Model(snapshot).PlanPass(), "tenant-a/g");
  EXPECT_EQ(decision.action, Action::kKeep) << decision.reason;
  EXPECT_NE(decision.reason.find("240s more"), std::string::npos) << decision.reason;
  // The node takes no new binds meanwhile.
  EXPECT_EQ(Model(snapshot).Room("a100")->largestNode, "n2");

  snapshot.nodes.MutableAt(0).conditionsSince["MemoryPressure"] = "2026-12-02T11:50:00Z";
  EXPECT_EQ(DecisionFor(Model(snapshot).PlanPass(), "tenant-a/g").action, Action::kMove);

  snapshot.nodes.MutableAt(0).taints.push_back({"hoster/maintenance", "", "NoSchedule"});
  snapshot.nodes.MutableAt(0).conditionsSince["MemoryPressure"] = "2026-12-02T11:59:59Z";
  decision = DecisionFor(Model(snapshot).PlanPass(), "tenant-a/g");
  EXPECT_EQ(decision.action, Action::kMove) << decision.reason;
  EXPECT_NE(decision.reason.find("hoster/maintenance"), std::string::npos) << decision.reason;
}

// ---- a held set whose class is gone (D9) ----

TEST(ClassGoneD9, AStartOnAHeldSetWhoseClassIsGoneIsRefused) {
  Snapshot snapshot;
  snapshot.classes = {MakeClass("a100", kA100)};
  snapshot.namespaces = {MakeTenant("tenant-a", {})};
  snapshot.nodes = {MakeNode("n1")};
  snapshot.gpuNodes = {MakeGpuNode("n1", kA100, 2)};
  snapshot.devices = {Bound("tenant-a", "g", "h100", 1, "n1", "vm")};
  snapshot.devices.MutableAt(0).status.bindRequest = api::BindRequest{"req-1", kNow};
  snapshot.vmis = {MakeVmi("tenant-a", "vm", {})};
  const Decision decision = DecisionFor(Model(snapshot).PlanPass(), "tenant-a/g");
  EXPECT_EQ(decision.action, Action::kKeep) << "the devices stay where they are";
  EXPECT_EQ(decision.node, "n1");
  EXPECT_FALSE(decision.StartsOnNode());
  EXPECT_NE(decision.reason.find("class h100 does not exist"), std::string::npos)
      << decision.reason;
}

}  // namespace
}  // namespace cozy::model
