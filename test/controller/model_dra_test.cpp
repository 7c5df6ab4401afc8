// The model's dra classes (docs/dra.md, "The catalog counts DRA units"): units from gpu-agent's
// ResourceSlices, held by Bound devices and by allocated claims, and one unit per PCI function
// whichever path (device plugin or DRA) could deliver it.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "api/dra.h"
#include "controller/admission/orders.h"
#include "controller/model/model.h"
#include "test/controller/model_fixtures.h"

namespace cozy::model {
namespace {

using namespace cozy::model::testing;

api::GpuClass DraClass(const std::string& name, const std::string& selector) {
  api::GpuClass gpuClass = MakeClass(name, "");
  gpuClass.spec.source.dra = api::DraSource{selector};
  return gpuClass;
}

// A GPUNode function: advertised by a device plugin as `resource`, or by none ("").
api::InventoryDevice Function(const std::string& address, const std::string& resource) {
  api::InventoryDevice device;
  device.pciAddress = address;
  if (!resource.empty()) {
    device.resources.push_back({resource, 1, 0});
    device.allocatable = 1;
    device.health = "Healthy";
  } else {
    device.health = "Unadvertised";
  }
  return device;
}

SliceDevice Published(const std::string& address, const std::string& vendor,
                      const std::string& device) {
  std::string name = "pci-" + address;
  for (char& c : name) c = (c == ':' || c == '.') ? '-' : c;
  return SliceDevice{name, address, vendor, device};
}

ResourceSlice Slice(const std::string& node, std::vector<SliceDevice> devices) {
  return ResourceSlice{node + "-gpu.cozystack.io", std::string(api::kDraDriver), node, node,
                       std::move(devices)};
}

// n1: three vfio-bound functions gpu-agent publishes. 0000:10 (an A100, 10de:20b5) is also
// advertised by KubeVirt's device plugin as kA100; 0000:11 (an A100) and 0000:12 (an A10,
// 10de:2236) by no device plugin. One device-plugin class and one dra class of the A100.
Snapshot SideBySide() {
  Snapshot snapshot;
  snapshot.classes = {MakeClass("a100", kA100), DraClass("a100-dra", "10DE:20B5")};
  snapshot.namespaces = {MakeTenant("tenant-a", {})};
  snapshot.nodes.push_back(MakeNode("n1"));
  api::GpuNodeInventory inventory;
  inventory.nodeName = "n1";
  inventory.resourceNames = {kA100};
  inventory.devices = {Function("0000:10:00.0", kA100), Function("0000:11:00.0", ""),
                       Function("0000:12:00.0", "")};
  snapshot.gpuNodes.push_back(inventory);
  snapshot.resourceSlices.push_back(Slice(
      "n1", {Published("0000:10:00.0", "10de", "20b5"), Published("0000:11:00.0", "10de", "20b5"),
             Published("0000:12:00.0", "10de", "2236")}));
  return snapshot;
}

int64_t UnitsOf(const Model& model, const std::string& node, const std::string& className) {
  const std::optional<NodeClassView> view = model.NodeClass(node, className);
  return view ? view->units : -1;
}

int64_t FreeOf(const Model& model, const std::string& node, const std::string& className) {
  const std::optional<NodeClassView> view = model.NodeClass(node, className);
  return view ? view->free : -1;
}

// C19: a dra class sells the slice's devices of its PCI ID (in any case) whose function no
// device plugin advertises; the function a device plugin advertises too is the device-plugin
// class's unit alone, and a device of another ID is nobody's here.
TEST(DraUnitsC19, OneUnitPerFunctionWhicheverPathDeliversIt) {
  const Snapshot snapshot = SideBySide();
  const Model model(snapshot);
  EXPECT_EQ(UnitsOf(model, "n1", "a100"), 1);
  EXPECT_EQ(UnitsOf(model, "n1", "a100-dra"), 1) << "0000:10 is counted once, by the plugin";
  const ClusterView view = model.View();
  ASSERT_EQ(view.classes.size(), 2U);
  EXPECT_EQ(view.classes[0].source, "devicePlugin " + kA100);
  EXPECT_EQ(view.classes[1].source, "dra 10DE:20B5");
  EXPECT_EQ(view.classes[0].units + view.classes[1].units, 2) << "two A100 functions in all";
  EXPECT_FALSE(view.gpuResourceNames.contains("DRA GPUs 10de:20b5"))
      << "a dra class asks for no resource name: nothing for the raw-name policies";
  EXPECT_FALSE(view.gpuResourceNames.contains(""));

  // Without a device plugin on 0000:10, both A100 functions are the dra class's.
  Snapshot unadvertised = SideBySide();
  unadvertised.gpuNodes.MutableAt(0).devices[0] = Function("0000:10:00.0", "");
  const Model both(unadvertised);
  EXPECT_EQ(UnitsOf(both, "n1", "a100-dra"), 2);
  EXPECT_EQ(UnitsOf(both, "n1", "a100"), 0);
}

// C19: only gpu-agent's own slice of its own node's pool counts, and only for a node with a
// GPUNode (without it nothing tells a device-plugin function from a dra one): each other case
// sells nothing, and fails closed for that node alone.
TEST(DraUnitsC19, OnlyTheAgentsSliceOfANodeWithAGpuNodeCounts) {
  const std::vector<std::pair<const char*, std::function<void(Snapshot&)>>> cases = {
      {"another driver",
       [](Snapshot& s) { s.resourceSlices.MutableAt(0).driver = "gpu.nvidia.com"; }},
      {"another pool", [](Snapshot& s) { s.resourceSlices.MutableAt(0).pool = "n2"; }},
      {"no GPUNode", [](Snapshot& s) { s.gpuNodes.MutableAt(0).nodeName = "n3"; }},
      {"no pciBusID",
       [](Snapshot& s) {
         for (SliceDevice& d : s.resourceSlices.MutableAt(0).devices) d.pciAddress.clear();
       }},
      {"a function the GPUNode does not list",
       [](Snapshot& s) { s.gpuNodes.MutableAt(0).devices.resize(1); }},
      {"a slice of a node gone",
       [](Snapshot& s) { s.resourceSlices.MutableAt(0).nodeName = "n9"; }},
  };
  for (const auto& [what, mutate] : cases) {
    Snapshot snapshot = SideBySide();
    snapshot.nodes.push_back(MakeNode("n2"));
    snapshot.gpuNodes.push_back(MakeGpuNode("n2", kA100, 1));
    snapshot.resourceSlices.push_back(Slice("n2", {Published("0000:10:00.0", "10de", "20b5")}));
    // n2's function is advertised by the plugin: n2 has no dra unit either way.
    mutate(snapshot);
    const Model model(snapshot);
    EXPECT_EQ(UnitsOf(model, "n1", "a100-dra"), 0) << what;
    EXPECT_EQ(UnitsOf(model, "n2", "a100"), 1) << what << ": the other node is untouched";
  }
}

// C19: Bound devices of a dra class hold its units as any class's; an order beyond them waits.
TEST(DraUnitsC19, BoundDevicesHoldUnitsAndAnOrderBeyondThemWaits) {
  Snapshot snapshot = SideBySide();
  snapshot.devices.push_back(Bound("tenant-a", "held", "a100-dra", 1, "n1"));
  snapshot.devices.push_back(Pending("tenant-a", "next", "a100-dra", 1));
  const Model model(snapshot);
  EXPECT_EQ(FreeOf(model, "n1", "a100-dra"), 0);
  EXPECT_EQ(FreeOf(model, "n1", "a100"), 1) << "the plugin's A100 is not the dra class's";
  bool decided = false;
  for (const Decision& decision : model.PlanPass()) {
    if (decision.deviceName != "next") continue;
    decided = true;
    EXPECT_NE(decision.action, Action::kBind) << DescribeDecision(decision);
  }
  EXPECT_TRUE(decided);

  snapshot.devices = {Pending("tenant-a", "next", "a100-dra", 1)};
  const Model room(snapshot);
  const std::vector<Decision> decisions = room.PlanPass();
  ASSERT_EQ(decisions.size(), 1U);
  EXPECT_EQ(decisions[0].action, Action::kBind) << DescribeDecision(decisions[0]);
  EXPECT_EQ(decisions[0].node, "n1");
}

// C19: an allocated claim holds its device's unit under the path that counts the device: a
// claim on 0000:11 takes the dra class's unit, one on 0000:10 (advertised by the plugin too)
// the device-plugin class's, so neither path sells a function the other gave away. Other
// drivers' results and devices no slice names hold nothing.
TEST(DraUnitsC19, AnAllocatedClaimHoldsItsDevicesUnit) {
  Snapshot snapshot = SideBySide();
  snapshot.resourceClaims.push_back(
      ResourceClaim{"admin", "own", {{"n1", "pci-0000-11-00-0"}}, ""});
  const Model drA(snapshot);
  EXPECT_EQ(FreeOf(drA, "n1", "a100-dra"), 0);
  EXPECT_EQ(FreeOf(drA, "n1", "a100"), 1);

  snapshot.resourceClaims = {ResourceClaim{"admin", "own", {{"n1", "pci-0000-10-00-0"}}, ""}};
  const Model plugin(snapshot);
  EXPECT_EQ(FreeOf(plugin, "n1", "a100-dra"), 1);
  EXPECT_EQ(FreeOf(plugin, "n1", "a100"), 0);

  snapshot.resourceClaims = {
      ResourceClaim{"admin", "own", {{"n1", "pci-0000-99-00-0"}, {"n2", "pci-0000-11-00-0"}}, ""}};
  const Model none(snapshot);
  EXPECT_EQ(FreeOf(none, "n1", "a100-dra"), 1);
  EXPECT_EQ(FreeOf(none, "n1", "a100"), 1);
}

// C19, D21: the claim the reconciler wrote for a Bound device holds what the device counts on its
// node already: allocated there, it takes nothing more; a claim of a device Bound elsewhere, or
// of no Bound device, holds its unit.
TEST(DraUnitsC19, TheClaimOfABoundDeviceHoldsNothingMore) {
  Snapshot snapshot = SideBySide();
  snapshot.devices.push_back(Bound("tenant-a", "held", "a100-dra", 1, "n1"));
  snapshot.resourceClaims.push_back(
      ResourceClaim{"tenant-a", "held", {{"n1", "pci-0000-11-00-0"}}, "held"});
  EXPECT_EQ(FreeOf(Model(snapshot), "n1", "a100-dra"), 0) << "one unit, held once";
  EXPECT_EQ(Model(snapshot).NodeClass("n1", "a100-dra")->used, 1);

  snapshot.devices = {Pending("tenant-a", "held", "a100-dra", 1)};
  EXPECT_EQ(Model(snapshot).NodeClass("n1", "a100-dra")->used, 1) << "the claim alone holds it";
  snapshot.resourceClaims = {
      ResourceClaim{"tenant-b", "held", {{"n1", "pci-0000-11-00-0"}}, "held"}};
  snapshot.devices = {Bound("tenant-a", "held", "a100-dra", 1, "n1")};
  EXPECT_EQ(Model(snapshot).NodeClass("n1", "a100-dra")->used, 2)
      << "another namespace's device of the name covers nothing";
}

// C19: a model built after a slice's change (the same nodes, classes and GPUNodes, which lend it
// their tables) counts the new slice, not the one before.
TEST(DraUnitsC19, AModelAfterASliceChangeCountsTheNewSlice) {
  const Snapshot before = SideBySide();
  const Model first(before);
  Snapshot after = before;
  after.resourceSlices = {};
  after.resourceSlices.push_back(Slice("n1", {Published("0000:12:00.0", "10de", "2236")}));
  const Model second(after, &first);
  EXPECT_EQ(UnitsOf(second, "n1", "a100-dra"), 0);
  EXPECT_EQ(UnitsOf(Model(after), "n1", "a100-dra"), 0);
  const Model third(before, &second);
  EXPECT_EQ(UnitsOf(third, "n1", "a100-dra"), 1);
}

// What the pass decides for the device named `name`.
Decision DecisionFor(const Model& model, const std::string& name) {
  for (const Decision& decision : model.PlanPass()) {
    if (decision.deviceName == name) return decision;
  }
  ADD_FAILURE() << "no decision for " << name;
  return {};
}

// D22: a node whose slice is not there (kubelet deletes its node's slices when it starts, and the
// agent puts them back) keeps the dra orders Bound to it and takes no new one; its dra units
// are not "none". The device-plugin class and another node with its slice are untouched, and
// once the slice is back its units are counted from it again.
TEST(DraUnknownD22, ANodeWithoutItsSliceKeepsWhatItHoldsAndTakesNothingNew) {
  Snapshot snapshot = SideBySide();
  snapshot.nodes.push_back(MakeNode("n2"));
  api::GpuNodeInventory n2;
  n2.nodeName = "n2";
  n2.devices = {Function("0000:11:00.0", "")};
  snapshot.gpuNodes.push_back(n2);
  snapshot.resourceSlices.push_back(Slice("n2", {Published("0000:11:00.0", "10de", "20b5")}));
  snapshot.devices.push_back(Bound("tenant-a", "held", "a100-dra", 1, "n1"));
  const Model whole(snapshot);
  EXPECT_EQ(FreeOf(whole, "n1", "a100-dra"), 0);
  EXPECT_EQ(FreeOf(whole, "n2", "a100-dra"), 1);

  Snapshot gap = snapshot;
  gap.resourceSlices = {};
  gap.resourceSlices.push_back(snapshot.resourceSlices[1]);  // n1's slice is gone, n2's is there
  gap.devices.push_back(Pending("tenant-a", "next", "a100-dra", 1));
  gap.devices.push_back(Pending("tenant-a", "third", "a100-dra", 1));
  const Model model(gap, &whole);
  const Decision held = DecisionFor(model, "held");
  EXPECT_EQ(held.action, Action::kKeep) << DescribeDecision(held);
  EXPECT_EQ(held.node, "n1");
  EXPECT_EQ(FreeOf(model, "n1", "a100-dra"), 0) << "what it holds, and nothing free";
  EXPECT_EQ(UnitsOf(model, "n1", "a100-dra"), 1);
  EXPECT_EQ(FreeOf(model, "n1", "a100"), 1) << "the device-plugin class is not the slice's";
  int bound = 0;
  for (const char* name : {"next", "third"}) {
    const Decision decision = DecisionFor(model, name);
    if (decision.action == Action::kBind) {
      ++bound;
      EXPECT_EQ(decision.node, "n2") << DescribeDecision(decision);
    }
  }
  EXPECT_EQ(bound, 1) << "n2's one unit is placed, n1 takes none";
  const std::optional<ClassRoom> room = model.Room("a100-dra");
  ASSERT_TRUE(room);
  EXPECT_EQ(room->unread, "node n1 publishes no ResourceSlice of gpu-agent now");
  EXPECT_FALSE(room->unreadEverywhere);
  api::GpuDevice order = Pending("tenant-a", "more", "a100-dra", 2);
  EXPECT_EQ(admission::CheckOrder(model, gap, order).value_or("allowed"),
            "GPUDevice tenant-a/more orders 2 GPUs of class a100-dra, but only 1 are free on the "
            "nodes that take orders now (node n1 publishes no ResourceSlice of gpu-agent now: its "
            "units there are not counted)");

  // Its held order deleted while the slice is away: n1 presumes nothing any more.
  Snapshot released = gap;
  released.devices = {};
  const Model after(released, &model);
  EXPECT_EQ(UnitsOf(after, "n1", "a100-dra"), 0);
  // The slice back: counted from it, in a model built on the presuming one.
  const Model back(snapshot, &model);
  EXPECT_EQ(UnitsOf(back, "n1", "a100-dra"), 1);
  EXPECT_EQ(FreeOf(back, "n1", "a100-dra"), 0);
  EXPECT_EQ(back.Room("a100-dra")->unread, "");
}

// D22: while the replica cannot read the slices and claims at all (resource.k8s.io not served,
// its caches not synced yet), no node's dra units are known: every Bound dra order stays where
// it is, none is placed, a Pending one says why, and an order is refused at apply with the
// reason, not "only 0 are free". The device-plugin class goes on as before.
TEST(DraUnknownD22, WhileNoSliceCanBeReadNothingOfADraClassMovesOrIsPlaced) {
  Snapshot snapshot = SideBySide();
  snapshot.devices.push_back(Bound("tenant-a", "held", "a100-dra", 1, "n1"));
  snapshot.devices.push_back(Pending("tenant-a", "next", "a100-dra", 1));
  snapshot.devices.push_back(Pending("tenant-a", "plugin", "a100", 1));
  snapshot.resourceSlices = {};
  snapshot.resourceClaims = {};
  snapshot.draUnknown = "this replica has not read the ResourceSlices and ResourceClaims yet";
  const Model model(snapshot);
  EXPECT_EQ(DecisionFor(model, "held").action, Action::kKeep);
  const Decision next = DecisionFor(model, "next");
  EXPECT_NE(next.action, Action::kBind) << DescribeDecision(next);
  EXPECT_NE(next.reason.find("while the DRA units cannot be read (this replica has not read the "
                             "ResourceSlices and ResourceClaims yet)"),
            std::string::npos)
      << next.reason;
  const Decision plugin = DecisionFor(model, "plugin");
  EXPECT_EQ(plugin.action, Action::kBind) << DescribeDecision(plugin);
  api::GpuDevice order = Pending("tenant-a", "more", "a100-dra", 1);
  EXPECT_EQ(admission::CheckOrder(model, snapshot, order).value_or("allowed"),
            "GPUDevice tenant-a/more orders 1 GPU of class a100-dra, but its GPUs are counted "
            "from gpu-agent's ResourceSlices and the cluster's ResourceClaims, which this replica "
            "cannot read now (this replica has not read the ResourceSlices and ResourceClaims "
            "yet); try again in a moment");
  api::GpuDevice pluginOrder = Pending("tenant-a", "more", "a100", 1);
  EXPECT_FALSE(admission::CheckOrder(model, snapshot, pluginOrder).has_value());

  // Readable again, with the slice: the held order keeps its unit, the next waits for one.
  Snapshot read = SideBySide();
  read.devices = snapshot.devices;
  const Model known(read, &model);
  EXPECT_EQ(UnitsOf(known, "n1", "a100-dra"), 1);
  EXPECT_EQ(FreeOf(known, "n1", "a100-dra"), 0);
}

}  // namespace
}  // namespace cozy::model
