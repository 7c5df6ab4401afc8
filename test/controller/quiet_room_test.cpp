// The quiet room (docs/controller.md, "Who wakes for a change"): on a quiet cluster (the last full
// pass decided only held keeps), a pod change model::AbsorbPodChange takes in the room that pass
// left wakes no pass, which is safe only if no such change could have changed a decision. On random
// quiet clusters (Bound sets, some attached to VMIs whose launchers run or are yet to come, raw GPU
// pods, nodes cordoned or tainted, two resource names), random sequences of pod changes (GPU pods
// starting, growing, ending and going; launchers appearing; pods asking for cpu only, or for no
// node yet) are applied one by one: after each change the room took, a binder pass on the cluster
// as it now stands must decide exactly what the quiet pass did. A change the room turns down is
// what a woken pass decides on: where its decisions are quiet again, the room is the new pass's.
// Each outcome (taken, turned down, turned down and the pass then moving sets) must happen often,
// so the check cannot pass by turning everything down or by never overfilling a node.
//
// A fixed seed always runs; a second seed is drawn per run and printed with every failure
// (COZY_PROPERTY_SEED replays one).
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "controller/model/model.h"
#include "test/controller/model_fixtures.h"

namespace cozy::model {
namespace {

using namespace cozy::model::testing;

const std::string kL4 = "nvidia.com/L4";
const std::vector<std::string> kTenants = {"tenant-a", "tenant-b"};
const std::vector<std::string> kClasses = {"a100", "a100-pair", "l4"};

std::vector<std::string> Describe(const std::vector<Decision>& decisions) {
  std::vector<std::string> text;
  for (const Decision& d : decisions) text.push_back(DescribeDecision(d));
  return text;
}

bool Quiet(const std::vector<Decision>& decisions) {
  return std::all_of(decisions.begin(), decisions.end(), [](const Decision& d) {
    return d.action == Action::kKeep && !d.startRefused && d.reason == kHeldReason;
  });
}

Snapshot RandomCluster(std::mt19937& random) {
  auto pick = [&random](int low, int high) {
    return std::uniform_int_distribution<int>(low, high)(random);
  };
  Snapshot snapshot;
  snapshot.now = "2025-01-01T01:00:00Z";
  snapshot.classes = {MakeClass("a100", kA100), MakeClass("l4", kL4),
                      MakeClass("a100-pair", kA100, api::GpuMode::kPassthrough, 2)};
  snapshot.namespaces = {MakeTenant("tenant-a", {}), MakeTenant("tenant-b", {})};
  const int nodes = pick(1, 4);
  for (int n = 0; n < nodes; ++n) {
    const std::string name = "n" + std::to_string(n + 1);
    Node node = MakeNode(name);
    if (pick(0, 5) == 0) node.unschedulable = true;
    if (pick(0, 5) == 0) node.taints.push_back({"gpu", "reserved", "NoSchedule"});
    snapshot.nodes.push_back(node);
    snapshot.gpuNodes.push_back(MakeGpuNode(name, pick(0, 2) == 0 ? kL4 : kA100, pick(2, 8), 1));
  }
  const int devices = pick(0, 8);
  for (int i = 0; i < devices; ++i) {
    const std::string ns = kTenants[static_cast<size_t>(pick(0, 1))];
    const std::string vm = pick(0, 1) == 0 ? "vm" + std::to_string(pick(1, 3)) : "";
    snapshot.devices.push_back(Bound(ns, "d" + std::to_string(i),
                                     kClasses[static_cast<size_t>(pick(0, 2))], pick(1, 2),
                                     "n" + std::to_string(pick(1, nodes)), vm));
  }
  for (const std::string& ns : kTenants) {
    for (int v = 1; v <= 3; ++v) {
      VirtualMachineInstance vmi = MakeVmi(ns, "vm" + std::to_string(v), {});
      vmi.nodeName = "n" + std::to_string(pick(1, nodes));
      vmi.phase = "Running";
      vmi.activePodUids.push_back("virt-launcher-" + vmi.name + "-uid");  // its pod comes later
      snapshot.vmis.push_back(vmi);
    }
  }
  for (int p = pick(0, 3); p > 0; --p) {
    snapshot.pods.push_back(MakePod(kTenants[static_cast<size_t>(pick(0, 1))],
                                    "raw" + std::to_string(p), "n" + std::to_string(pick(1, nodes)),
                                    pick(0, 2) == 0 ? kL4 : kA100, pick(1, 2)));
  }
  return snapshot;
}

struct Outcomes {
  int quietClusters = 0, taken = 0, turnedDown = 0, turnedDownAndMoved = 0;
};

// One random pod change on `snapshot`: the pod before (none for a new pod) and after (none for
// a deleted one). `serial` names new pods.
std::pair<std::optional<Pod>, std::optional<Pod>> RandomChange(const Snapshot& snapshot,
                                                               std::mt19937& random, int serial) {
  auto pick = [&random](int low, int high) {
    return std::uniform_int_distribution<int>(low, high)(random);
  };
  const std::string node = "n" + std::to_string(pick(1, static_cast<int>(snapshot.nodes.size())));
  const std::string ns = kTenants[static_cast<size_t>(pick(0, 1))];
  const std::string name = "p" + std::to_string(serial);
  std::optional<Pod> existing;
  if (!snapshot.pods.empty()) {
    existing =
        snapshot.pods[static_cast<size_t>(pick(0, static_cast<int>(snapshot.pods.size()) - 1))];
  }
  switch (pick(0, 8)) {
    case 0:
    case 1:  // a raw GPU pod starts
      return {std::nullopt, MakePod(ns, name, node, pick(0, 2) == 0 ? kL4 : kA100, pick(1, 2))};
    case 2: {  // a VMI's launcher starts, on the VMI's node or not
      const VirtualMachineInstance& vmi =
          snapshot.vmis[static_cast<size_t>(pick(0, static_cast<int>(snapshot.vmis.size()) - 1))];
      Pod pod = MakePod(vmi.namespaceName, "virt-launcher-" + vmi.name,
                        pick(0, 2) == 0 ? node : vmi.nodeName, kA100, pick(1, 2));
      pod.uid = vmi.activePodUids.front();
      const bool there = std::any_of(snapshot.pods.begin(), snapshot.pods.end(),
                                     [&](const Pod& p) { return p.uid == pod.uid; });
      if (there) break;
      return {std::nullopt, pod};
    }
    case 3:  // a pod asking for cpu alone
      return {std::nullopt, MakePod(ns, name, node, "cpu", 2)};
    case 4: {  // a GPU pod not yet scheduled, or one scheduled now
      if (existing && existing->nodeName.empty()) {
        Pod after = *existing;
        after.nodeName = node;
        return {existing, after};
      }
      Pod pod = MakePod(ns, name, "", kA100, pick(1, 2));
      pod.phase = "Pending";
      return {std::nullopt, pod};
    }
    case 5:  // a pod goes
      if (existing) return {existing, std::nullopt};
      break;
    case 6:  // a pod ends
      if (existing) {
        Pod after = *existing;
        after.phase = pick(0, 1) == 0 ? "Succeeded" : "Failed";
        return {existing, after};
      }
      break;
    case 7:  // a pod's containers ask for one unit more
      if (existing && !existing->containers.empty()) {
        Pod after = *existing;
        for (auto& [resource, quantity] : after.containers[0].requests) {
          if (resource == "cpu") continue;
          quantity = std::to_string(std::stoll(quantity) + 1);
          after.containers[0].limits[resource] = quantity;
        }
        return {existing, after};
      }
      break;
    default:  // a heartbeat: nothing changes
      if (existing) return {existing, existing};
      break;
  }
  return {std::nullopt, MakePod(ns, name, node, kA100, 1)};
}

void Apply(Snapshot& snapshot, const std::optional<Pod>& before, const std::optional<Pod>& after) {
  if (before) {
    snapshot.pods.EraseIf([&](const Pod& p) {
      return p.namespaceName == before->namespaceName && p.name == before->name;
    });
  }
  if (after) snapshot.pods.push_back(*after);
}

void CheckSeed(uint32_t seed, int clusters, Outcomes& outcomes) {
  std::mt19937 random(seed);
  for (int c = 0; c < clusters; ++c) {
    Snapshot snapshot = RandomCluster(random);
    std::vector<Decision> quiet = Model(snapshot).PlanPass();
    if (!Quiet(quiet)) continue;
    ++outcomes.quietClusters;
    FreeUnits room = Model(snapshot).Free();
    for (int step = 0; step < 16; ++step) {
      const auto [before, after] = RandomChange(snapshot, random, step);
      const Pod* beforePod = before ? &*before : nullptr;
      const Pod* afterPod = after ? &*after : nullptr;
      // The pods cache's filter: a change the model reads nothing in is not asked about.
      const bool taken =
          !PodChangeMatters(beforePod, afterPod) || AbsorbPodChange(room, beforePod, afterPod);
      Apply(snapshot, before, after);
      const std::vector<Decision> now = Model(snapshot).PlanPass();
      SCOPED_TRACE("seed " + std::to_string(seed) + ", cluster " + std::to_string(c) + ", step " +
                   std::to_string(step) + ": pod " +
                   (after ? after->namespaceName + "/" + after->name + " on '" + after->nodeName +
                                "' " + after->phase
                          : before->namespaceName + "/" + before->name + " deleted"));
      if (taken) {
        ++outcomes.taken;
        ASSERT_EQ(Describe(now), Describe(quiet)) << "a change the room took changed a decision";
        continue;
      }
      ++outcomes.turnedDown;
      if (!Quiet(now)) {
        ++outcomes.turnedDownAndMoved;
        break;  // the woken pass moves sets: the cluster is not quiet now
      }
      quiet = now;  // the woken pass is quiet again, and its room is what the filter asks
      room = Model(snapshot).Free();
    }
  }
}

TEST(QuietRoom, APodChangeTheRoomTakesNeverChangesADecision) {
  Outcomes outcomes;
  const std::vector<uint32_t> seeds = PropertySeeds(20261203);
  for (const uint32_t seed : seeds) {
    CheckSeed(seed, 3000, outcomes);
    if (HasFailure()) {
      ADD_FAILURE() << "replay with COZY_PROPERTY_SEED=" << seed;
      return;
    }
  }
  std::cout << "quiet clusters " << outcomes.quietClusters << ", changes taken " << outcomes.taken
            << ", turned down " << outcomes.turnedDown << " (then sets moved "
            << outcomes.turnedDownAndMoved << ")\n";
  const int perSeed = static_cast<int>(seeds.size());  // the counts per seed (a replay runs one)
  EXPECT_GE(outcomes.quietClusters, 500 * perSeed);
  EXPECT_GE(outcomes.taken, 5000 * perSeed);
  EXPECT_GE(outcomes.turnedDown, 1000 * perSeed);
  // Pods never evict a held set (docs/controller.md, "Placement", step 2): a change the room
  // turns down wakes a pass, and in a quiet cluster that pass moves nothing.
  EXPECT_EQ(outcomes.turnedDownAndMoved, 0);
}

// Two nodes of two A100 units; one unit of n1 held by a Bound device.
Snapshot TwoNodesOneHeld() {
  Snapshot snapshot;
  snapshot.now = "2025-01-01T01:00:00Z";
  snapshot.classes = {MakeClass("a100", kA100)};
  snapshot.namespaces = {MakeTenant("tenant-a", {})};
  snapshot.nodes = {MakeNode("n1"), MakeNode("n2")};
  snapshot.gpuNodes = {MakeGpuNode("n1", kA100, 2), MakeGpuNode("n2", kA100, 2)};
  snapshot.devices = {Bound("tenant-a", "held", "a100", 1, "n1")};
  return snapshot;
}

// The room is taken by what it absorbs: two pods that each fit a node's last unit are not both
// taken, and the second, which overfills the node, is left to a pass (which keeps the held set:
// pods never evict one).
TEST(QuietRoom, TheRoomIsTakenByWhatItAbsorbs) {
  Snapshot snapshot = TwoNodesOneHeld();
  const Model model(snapshot);
  ASSERT_TRUE(Quiet(model.PlanPass()));
  FreeUnits room = model.Free();
  EXPECT_EQ(room.byNode["n1"][kA100], 1);
  EXPECT_EQ(room.byNode["n2"][kA100], 2);
  const Pod first = MakePod("tenant-a", "raw1", "n1", kA100, 1);
  const Pod second = MakePod("tenant-a", "raw2", "n1", kA100, 1);
  EXPECT_TRUE(AbsorbPodChange(room, nullptr, &first));
  EXPECT_EQ(room.byNode["n1"][kA100], 0);
  EXPECT_TRUE(AbsorbPodChange(room, &first, &first)) << "counted already";
  EXPECT_FALSE(AbsorbPodChange(room, nullptr, &second));
  EXPECT_EQ(room.byNode["n1"][kA100], 0) << "a change turned down takes nothing";
  snapshot.pods = {first, second};
  const std::vector<std::string> decisions = Describe(Model(snapshot).PlanPass());
  ASSERT_EQ(decisions.size(), 1u);
  EXPECT_EQ(decisions[0].rfind("tenant-a/held keep n1", 0), 0u) << decisions[0];
  // A pod on a node the room does not know (no GPUNode) is turned down; one that frees units,
  // or asks for no class's resource, is taken.
  const Pod elsewhere = MakePod("tenant-a", "raw3", "n9", kA100, 1);
  EXPECT_FALSE(AbsorbPodChange(room, nullptr, &elsewhere));
  Pod ended = first;
  ended.phase = "Succeeded";
  EXPECT_TRUE(AbsorbPodChange(room, &first, &ended));
  EXPECT_EQ(room.byNode["n1"][kA100], 1) << "the pod the room took ended: its unit is back";
  EXPECT_TRUE(AbsorbPodChange(room, &ended, nullptr));
  EXPECT_EQ(room.byNode["n1"][kA100], 1) << "given back once";
  const Pod other = MakePod("tenant-a", "other", "n1", "x.io/y", 9);
  EXPECT_TRUE(AbsorbPodChange(room, nullptr, &other));
}

// A churn of pods that start and end on a node does not use its room up: each gives back what
// the room took for it, and only that. A pod the pass itself counted gives nothing back when it
// goes (the room did not take its units), so its node's room stays as small as the pass left
// it until the next pass.
TEST(QuietRoom, APodThatEndsGivesBackWhatTheRoomTookForItAndNoMore) {
  Snapshot snapshot = TwoNodesOneHeld();
  const Pod counted = MakePod("tenant-a", "counted", "n2", kA100, 1);
  snapshot.pods = {counted};
  const Model model(snapshot);
  ASSERT_TRUE(Quiet(model.PlanPass()));
  FreeUnits room = model.Free();
  ASSERT_EQ(room.byNode["n1"][kA100], 1);
  ASSERT_EQ(room.byNode["n2"][kA100], 1);
  for (int i = 0; i < 20; ++i) {
    const Pod pod = MakePod("tenant-a", "churn-" + std::to_string(i), "n1", kA100, 1);
    ASSERT_TRUE(AbsorbPodChange(room, nullptr, &pod)) << i;
    ASSERT_EQ(room.byNode["n1"][kA100], 0);
    ASSERT_TRUE(AbsorbPodChange(room, &pod, nullptr)) << i;
    ASSERT_EQ(room.byNode["n1"][kA100], 1);
  }
  EXPECT_TRUE(room.taken.empty());
  // The pass's own pod goes: nothing comes back, and a pod on n2 now still finds one unit.
  EXPECT_TRUE(AbsorbPodChange(room, &counted, nullptr));
  EXPECT_EQ(room.byNode["n2"][kA100], 1);
  // A pod the room took that asks for one unit more is weighed whole (and refused here); when
  // it goes, the unit the room took for it comes back.
  const Pod small = MakePod("tenant-a", "grows", "n2", kA100, 1);
  const Pod grown = MakePod("tenant-a", "grows", "n2", kA100, 2);
  ASSERT_TRUE(AbsorbPodChange(room, nullptr, &small));
  EXPECT_EQ(room.byNode["n2"][kA100], 0);
  EXPECT_FALSE(AbsorbPodChange(room, &small, &grown)) << "2 more units do not fit in 0";
  EXPECT_TRUE(AbsorbPodChange(room, &small, nullptr));
  EXPECT_EQ(room.byNode["n2"][kA100], 1);
}

}  // namespace
}  // namespace cozy::model
