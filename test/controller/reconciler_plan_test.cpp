// The GPU reconciler's plan, as a pure function (controller/reconciler/plan.h): each D item of
// the catalog as the decisions it must produce, with no cluster. The end-to-end scenarios in
// test/e2e/controller_e2e_test.cpp run the same items against the fake API server.
#include "controller/reconciler/plan.h"
#include "controller/reconciler/reconcilers.h"

#include <gtest/gtest.h>

#include "api/keys.h"
#include "api/time.h"
#include "api/usage_record.h"
#include "test/controller/model_fixtures.h"

namespace cozy::controller {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::system_clock;

const Clock::time_point kNow = *api::ParseTime("2026-12-01T10:00:00Z");

std::shared_ptr<const api::GpuClass> Class(const std::string& name, bool finalizer,
                                           bool deleting = false) {
  api::GpuClass c;
  c.metadata.name = name;
  c.metadata.resourceVersion = "7";
  if (finalizer) c.metadata.finalizers = {std::string(api::kClassFinalizer)};
  if (deleting) c.metadata.deletionTimestamp = "2026-12-01T09:00:00Z";
  c.spec.source.devicePlugin.resourceName = "nvidia.com/GA100";
  return std::make_shared<api::GpuClass>(c);
}

api::GpuDevice Device(const std::string& name, bool finalizer = true) {
  api::GpuDevice d;
  d.metadata.name = name;
  d.metadata.namespaceName = "tenant-a";
  d.metadata.uid = name + "-uid";
  d.metadata.resourceVersion = "11";
  if (finalizer) d.metadata.finalizers = {"other", std::string(api::kDeviceFinalizer)};
  d.spec.className = "a100";
  return d;
}

api::GpuDevice Bound(api::GpuDevice d) {
  d.status.phase = api::DevicePhase::kBound;
  d.status.nodeName = "n1";
  return d;
}

api::GpuDevice Attached(api::GpuDevice d, const std::string& vmi, const std::string& uid,
                        const std::string& at = "") {
  d.status.attachment = api::Attachment{vmi, uid, at};
  return d;
}

struct Cluster {
  std::vector<std::shared_ptr<const api::GpuClass>> classes;
  std::vector<std::shared_ptr<const api::GpuDevice>> devices;
  std::map<std::string, VmiState> vmis;  // "ns/name"; absent unless listed
  bool vmisUnknown = false;
  bool records = false;
  bool podRecords = false;
  std::vector<std::shared_ptr<const model::Pod>> pods;
  std::map<std::string, JsonPtr> storedRecords;
  std::map<std::string, JsonPtr> storedMonitors;

  void Add(const api::GpuDevice& d) { devices.push_back(std::make_shared<api::GpuDevice>(d)); }
  void Vmi(const std::string& name, const std::string& uid, const std::string& created) {
    vmis["tenant-a/" + name] = VmiState{VmiState::Presence::kPresent, uid, created, "", nullptr};
  }
  // A VMI as read by name, its status.activePods listing `activePods`.
  void VmiWithPods(const std::string& name, std::vector<std::string> activePods) {
    auto object = std::make_shared<model::VirtualMachineInstance>(
        model::testing::MakeVmi("tenant-a", name, std::move(activePods)));
    vmis["tenant-a/" + name] =
        VmiState{VmiState::Presence::kPresent, object->uid, "", "", std::move(object)};
  }
  Plan PlanAt(Clock::time_point now = kNow) const {
    ReconcileInput input;
    input.classes = classes;
    input.devices = devices;
    input.vmis = [this](const std::string& ns, const std::string& name) {
      if (vmisUnknown) {
        return VmiState{VmiState::Presence::kUnknown, "", "", "not served", nullptr};
      }
      auto it = vmis.find(ns + "/" + name);
      return it == vmis.end() ? VmiState{VmiState::Presence::kAbsent, "", "", "", nullptr}
                              : it->second;
    };
    input.usageRecords = records;
    input.podRecords = podRecords;
    input.pods = pods;
    input.records = storedRecords;
    input.monitors = storedMonitors;
    input.now = now;
    input.attachmentGrace = 60s;
    return PlanReconcile(input);
  }
};

std::vector<std::string> Kinds(const Plan& plan) {
  std::vector<std::string> kinds;
  for (const Action& action : plan.actions) {
    kinds.push_back(action.what + " " + action.target.name);
  }
  return kinds;
}

using Strings = std::vector<std::string>;

TEST(ReconcilerD15, EveryClassGetsTheFinalizerAndADeletingOneWaitsForItsHolders) {
  Cluster cluster;
  cluster.classes = {Class("a100", false), Class("t4", true, true)};
  cluster.Add(Device("d1"));
  cluster.Add(Device("d2"));
  Plan plan = cluster.PlanAt();
  // t4 is being deleted and no device names it: it goes at once.
  EXPECT_EQ(Kinds(plan), (Strings{"add-class-finalizer a100", "remove-class-finalizer t4"}));
  // The patch keeps what else is there and carries the version it was read at.
  EXPECT_EQ(plan.actions[0].body["metadata"]["finalizers"],
            nlohmann::json::array({api::kClassFinalizer}));
  EXPECT_EQ(plan.actions[0].resourceVersion, "7");

  cluster.classes = {Class("a100", true, true)};
  plan = cluster.PlanAt();
  EXPECT_TRUE(plan.actions.empty());
  EXPECT_EQ(plan.waiting.classesWithHolders, 1);
  cluster.devices.clear();
  EXPECT_EQ(Kinds(cluster.PlanAt()), (Strings{"remove-class-finalizer a100"}));
}

TEST(ReconcilerD13, AReleasedDeviceStaysWhileItsVmiRunsThenItsRecordThenItsFinalizerGo) {
  Cluster cluster;
  api::GpuDevice device = Attached(Bound(Device("d1")), "vm1", "vm1-uid");
  device.metadata.deletionTimestamp = "2026-12-01T09:59:00Z";
  cluster.Add(device);
  cluster.Vmi("vm1", "vm1-uid", "2026-12-01T09:00:00Z");
  cluster.records = true;
  cluster.storedMonitors["tenant-a"] =
      std::make_shared<nlohmann::json>(api::UsageMonitor("tenant-a"));
  auto record = api::UsageRecord(Bound(Device("d1")));
  record["metadata"]["resourceVersion"] = "3";
  record["metadata"]["uid"] = "record-uid";
  cluster.storedRecords["tenant-a/gpudevice-d1"] = std::make_shared<nlohmann::json>(record);

  Plan plan = cluster.PlanAt();
  EXPECT_TRUE(plan.actions.empty()) << Kinds(plan).front();
  EXPECT_EQ(plan.waiting.devicesInUse, 1);

  cluster.vmis.clear();  // the VMI ended
  // D19: the device's other finalizer would keep it Bound once ours is gone: its units are
  // released first, and its record stays until they are.
  plan = cluster.PlanAt();
  ASSERT_EQ(Kinds(plan), (Strings{"release-device d1"}));
  EXPECT_EQ(plan.actions[0].body,
            (nlohmann::json{{"status", {{"phase", "Pending"}, {"nodeName", nullptr}}}}));
  EXPECT_EQ(plan.actions[0].resourceVersion, "11");
  device.status.phase = api::DevicePhase::kPending;
  device.status.nodeName.reset();
  cluster.devices = {std::make_shared<api::GpuDevice>(device)};
  plan = cluster.PlanAt();
  ASSERT_EQ(Kinds(plan), (Strings{"delete-usage-record gpudevice-d1"}));
  EXPECT_EQ(plan.actions[0].uid, "record-uid");  // a delete with preconditions
  EXPECT_EQ(plan.actions[0].resourceVersion, "3");

  cluster.storedRecords.clear();
  plan = cluster.PlanAt();
  ASSERT_EQ(Kinds(plan),
            (Strings{"remove-device-finalizer d1", "delete-usage-monitor cozy-gpu-usage"}));
  EXPECT_EQ(plan.actions[0].body["metadata"]["finalizers"], nlohmann::json::array({"other"}));
}

// D19: "A tenant can hold GPUs without being billed": a tenant's own finalizer on a Bound device
// it deletes kept the device Bound and counted as used, while the reconciler removed its usage
// record at once. A record lives exactly as long as the device holds units: the units are
// released first; where our finalizer is the last one, its removal ends the object and the
// units together, after the record.
TEST(ReconcilerD19, ARecordLivesAsLongAsTheDeviceHoldsUnitsWhateverFinalizersKeepIt) {
  for (const bool lost : {false, true}) {
    Cluster cluster;
    api::GpuDevice held = Bound(Device("held"));
    if (lost) held.status.phase = api::DevicePhase::kLost;
    held.metadata.finalizers = {"example.com/hold", std::string(api::kDeviceFinalizer)};
    held.metadata.deletionTimestamp = "2026-12-01T09:59:00Z";
    cluster.Add(held);
    cluster.records = true;
    cluster.storedMonitors["tenant-a"] =
        std::make_shared<nlohmann::json>(api::UsageMonitor("tenant-a"));
    cluster.storedRecords["tenant-a/gpudevice-held"] =
        std::make_shared<nlohmann::json>(api::UsageRecord(Bound(Device("held"))));
    Plan plan = cluster.PlanAt();
    ASSERT_EQ(Kinds(plan), (Strings{"release-device held"})) << "lost " << lost;
    EXPECT_EQ(plan.actions[0].target.kind, api::kGpuDeviceKind);
    // Released: the record goes, then our finalizer; the tenant's stays theirs to remove.
    held.status.phase = api::DevicePhase::kPending;
    held.status.nodeName.reset();
    cluster.devices = {std::make_shared<api::GpuDevice>(held)};
    plan = cluster.PlanAt();
    ASSERT_EQ(Kinds(plan), (Strings{"delete-usage-record gpudevice-held"}));
    cluster.storedRecords.clear();
    plan = cluster.PlanAt();
    ASSERT_EQ(Kinds(plan),
              (Strings{"remove-device-finalizer held", "delete-usage-monitor cozy-gpu-usage"}));
    EXPECT_EQ(plan.actions[0].body["metadata"]["finalizers"],
              nlohmann::json::array({"example.com/hold"}));
  }
  // Our finalizer alone: removing it ends the device and its units at once; nothing to release.
  Cluster cluster;
  api::GpuDevice alone = Bound(Device("alone"));
  alone.metadata.finalizers = {std::string(api::kDeviceFinalizer)};
  alone.metadata.deletionTimestamp = "2026-12-01T09:59:00Z";
  cluster.Add(alone);
  EXPECT_EQ(Kinds(cluster.PlanAt()), (Strings{"remove-device-finalizer alone"}));
}

TEST(ReconcilerG7, AVmiThatCannotBeToldIsNeverReadAsGone) {
  Cluster cluster;
  api::GpuDevice released = Attached(Bound(Device("d1")), "vm1", "vm1-uid");
  released.metadata.deletionTimestamp = "2026-12-01T09:59:00Z";
  cluster.Add(released);
  cluster.Add(Attached(Bound(Device("d2")), "vm1", "vm1-uid"));
  cluster.Add(Attached(Bound(Device("d3")), "vm2", "", "2026-12-01T08:00:00Z"));  // grace long over
  cluster.vmisUnknown = true;
  const Plan plan = cluster.PlanAt();
  EXPECT_TRUE(plan.actions.empty()) << Kinds(plan).front();
  EXPECT_EQ(plan.waiting.vmisUnknown, 3);
}

TEST(ReconcilerD14, ATemplateDeviceGoesWithItsVmiAndAHeldOrderIsDetached) {
  Cluster cluster;
  api::GpuDevice templated = Attached(Bound(Device("vm1-gpu")), "vm1", "vm1-uid");
  templated.metadata.labels[std::string(api::kTemplateDeviceLabel)] = "true";
  cluster.Add(templated);
  cluster.Add(Attached(Bound(Device("held")), "vm1", "vm1-uid"));
  cluster.Vmi("vm1", "vm1-uid", "2026-12-01T09:00:00Z");
  EXPECT_TRUE(cluster.PlanAt().actions.empty());

  // A VMI of the same name but another UID is another VMI: the first one ended.
  cluster.Vmi("vm1", "other-uid", "2026-12-01T09:30:00Z");
  const Plan plan = cluster.PlanAt();
  ASSERT_EQ(Kinds(plan), (Strings{"delete-template-device vm1-gpu", "clear-attachment held"}));
  EXPECT_EQ(plan.actions[0].uid, "vm1-gpu-uid");
  EXPECT_EQ(plan.actions[1].body, (nlohmann::json{{"status", {{"attachment", nullptr}}}}));
}

TEST(ReconcilerD18, AnAttachmentIsMatchedToAVmiMadeAfterItOrClearedAfterTheGrace) {
  Cluster cluster;
  cluster.Add(Attached(Bound(Device("d1")), "vm1", "", "2026-12-01T09:59:30.500Z"));
  // A VMI of that name made before the attachment is not its VMI (a create that failed with
  // AlreadyExists after the webhook attached).
  cluster.Vmi("vm1", "old-uid", "2026-12-01T09:00:00Z");
  Plan plan = cluster.PlanAt();
  EXPECT_TRUE(plan.actions.empty());
  EXPECT_EQ(plan.waiting.attachmentsInGrace, 1);
  ASSERT_TRUE(plan.wakeAt);
  EXPECT_EQ(api::FormatTime(*plan.wakeAt), "2026-12-01T10:00:30Z");  // attachedAt + 60 s

  // One made in the same second counts (creationTimestamp has whole seconds).
  cluster.Vmi("vm1", "new-uid", "2026-12-01T09:59:30Z");
  plan = cluster.PlanAt();
  ASSERT_EQ(Kinds(plan), (Strings{"match-attachment d1"}));
  EXPECT_EQ(plan.actions[0].body["status"]["attachment"]["vmiUID"], "new-uid");

  cluster.vmis.clear();
  EXPECT_TRUE(cluster.PlanAt(kNow + 29s).actions.empty());
  EXPECT_EQ(Kinds(cluster.PlanAt(kNow + 31s)), (Strings{"clear-attachment d1"}));

  // An attachment without attachedAt gets one, so its grace can run.
  Cluster stamped;
  stamped.Add(Attached(Bound(Device("d2")), "vm9", ""));
  plan = stamped.PlanAt();
  ASSERT_EQ(Kinds(plan), (Strings{"stamp-attachment d2"}));
  EXPECT_EQ(plan.actions[0].body["status"]["attachment"]["attachedAt"], "2026-12-01T10:00:00Z");
}

TEST(ReconcilerD16, RecordsComeAfterTheirMonitorAndIgnoreLabelsOthersAdd) {
  Cluster cluster;
  cluster.records = true;
  cluster.Add(Bound(Device("d1")));
  cluster.Add(Device("pending"));  // holds nothing: no record
  EXPECT_EQ(Kinds(cluster.PlanAt()), (Strings{"apply-usage-monitor cozy-gpu-usage"}));

  auto monitor = api::UsageMonitor("tenant-a");
  EXPECT_EQ(monitor["spec"]["selector"],
            (nlohmann::json{{api::kUsageMonitorLabel, api::kUsageMonitorLabelValue}}));
  cluster.storedMonitors["tenant-a"] = std::make_shared<nlohmann::json>(monitor);
  Plan plan = cluster.PlanAt();
  ASSERT_EQ(Kinds(plan), (Strings{"apply-usage-record gpudevice-d1"}));
  EXPECT_FALSE(plan.actions[0].stored);  // a create

  auto record = plan.actions[0].body;
  record["metadata"]["labels"]["hoster-label"] = "kept";
  cluster.storedRecords["tenant-a/gpudevice-d1"] = std::make_shared<nlohmann::json>(record);
  EXPECT_TRUE(cluster.PlanAt().actions.empty());

  // Lost still holds (it counts against the budgets); a record of a device gone is deleted.
  cluster.devices.clear();
  api::GpuDevice lost = Device("d1");
  lost.status.phase = api::DevicePhase::kLost;
  cluster.Add(lost);
  record["metadata"]["resourceVersion"] = "5";
  cluster.storedRecords["tenant-a/gpudevice-d1"] = std::make_shared<nlohmann::json>(record);
  cluster.storedRecords["tenant-a/gpudevice-gone"] =
      std::make_shared<nlohmann::json>(api::UsageRecord(Bound(Device("gone"))));
  plan = cluster.PlanAt();
  ASSERT_EQ(Kinds(plan),
            (Strings{"apply-usage-record gpudevice-d1", "delete-usage-record gpudevice-gone"}));
  EXPECT_EQ(plan.actions[0].body["status"]["operational"], false);
  EXPECT_EQ(plan.actions[0].resourceVersion, "5");
}

// C11, C12: a pod is a VMI's launcher only when the VMI it claims (its controller owner
// reference), read by name, lists the pod's UID in status.activePods; the devices attached to
// that VMI then cover its GPUs. Any other pod's GPUs, and what a launcher asks past its
// devices, are raw-name usage with a record of their own, owned by the pod.
TEST(ReconcilerC11C12, OnlyTheClaimedVmisActivePodsCoverAPodAndTheRestIsRecorded) {
  Cluster cluster;
  cluster.records = true;
  cluster.podRecords = true;
  cluster.classes.push_back(Class("a100", true));
  cluster.Add(Attached(Bound(Device("d1")), "vm1", "vm1-uid"));
  cluster.Add(Attached(Bound(Device("d2")), "vm2", "vm2-uid"));
  cluster.VmiWithPods("vm1", {"launcher-uid"});
  cluster.VmiWithPods("vm2", {"greedy-uid"});
  const auto pod = [&](const std::string& name, const std::string& claims, int64_t units,
                       const std::string& node = "n1", const std::string& phase = "Running") {
    model::Pod made = model::testing::MakePod("tenant-a", name, node, "nvidia.com/GA100", units);
    made.claimedVmi = claims;
    made.phase = phase;
    cluster.pods.push_back(std::make_shared<model::Pod>(made));
  };
  pod("launcher", "vm1", 1);      // listed by vm1: d1 covers it
  pod("impostor", "vm1", 1);      // owned by and named for vm1, not listed: raw usage
  pod("greedy", "vm2", 2);        // vm2's launcher asking one more than d2 holds
  pod("raw", "", 1);              // no VMI at all
  pod("unscheduled", "", 1, "");  // on no node: holds nothing
  pod("done", "", 1, "n1", "Succeeded");
  cluster.storedMonitors["tenant-a"] =
      std::make_shared<nlohmann::json>(api::UsageMonitor("tenant-a"));
  // A record of the launcher from before it was listed goes.
  cluster.storedRecords["tenant-a/gpupod-launcher"] = std::make_shared<nlohmann::json>(
      api::PodUsageRecord("tenant-a", "launcher", "launcher-uid", {{"nvidia.com/GA100", 1}}, true));
  Plan plan = cluster.PlanAt();
  std::map<std::string, nlohmann::json> applied;
  for (const Action& action : plan.actions) {
    if (action.what == "apply-usage-record") applied[action.target.name] = action.body;
  }
  EXPECT_EQ(applied.size(), 5u) << ::testing::PrintToString(Kinds(plan));  // 2 devices, 3 pods
  for (const std::string name : {"impostor", "greedy", "raw"}) {
    ASSERT_TRUE(applied.count("gpupod-" + name)) << name;
    const nlohmann::json& record = applied["gpupod-" + name];
    EXPECT_EQ(record["status"]["resources"], (nlohmann::json{{"nvidia.com/GA100", "1"}})) << name;
    EXPECT_EQ(record["status"]["type"], "raw");
    EXPECT_EQ(record["status"]["operational"], true);
    EXPECT_EQ(record["metadata"]["ownerReferences"][0]["kind"], "Pod");
    EXPECT_EQ(record["metadata"]["ownerReferences"][0]["uid"], name + "-uid");
    EXPECT_EQ(record["metadata"]["labels"][std::string(api::kWorkloadMonitorNameLabel)],
              "cozy-gpu-usage");
  }
  const Strings kinds = Kinds(plan);
  EXPECT_NE(std::find(kinds.begin(), kinds.end(), "delete-usage-record gpupod-launcher"),
            kinds.end());

  // vm1 now lists the impostor too (KubeVirt made it an active pod): its record goes.
  cluster.VmiWithPods("vm1", {"launcher-uid", "impostor-uid"});
  cluster.storedRecords.clear();
  for (const auto& [name, body] : applied) {
    cluster.storedRecords["tenant-a/" + name] = std::make_shared<nlohmann::json>(body);
  }
  plan = cluster.PlanAt();
  EXPECT_EQ(Kinds(plan), (Strings{"delete-usage-record gpupod-impostor"}));

  // The claimed VMI cannot be told now: the pod's record stays as it is, counted as waiting.
  cluster.vmisUnknown = true;
  plan = cluster.PlanAt();
  for (const Action& action : plan.actions) {
    EXPECT_NE(action.what, "delete-usage-record") << action.target.name;
  }
  EXPECT_GE(plan.waiting.vmisUnknown, 2);

  // Without the pods (GPUs off), the pods' records are left alone.
  cluster.vmisUnknown = false;
  cluster.podRecords = false;
  cluster.pods.clear();
  EXPECT_TRUE(cluster.PlanAt().actions.empty())
      << ::testing::PrintToString(Kinds(cluster.PlanAt()));
}

TEST(ReconcilerD12, WithoutRecordsKindsAReleasedDeviceGoesAtOnce) {
  Cluster cluster;  // Workload kinds not served: records are skipped, nothing waits for them
  api::GpuDevice released = Bound(Device("d1"));
  released.metadata.finalizers = {std::string(api::kDeviceFinalizer)};  // ours alone (D19)
  released.metadata.deletionTimestamp = "2026-12-01T09:59:00Z";
  cluster.Add(released);
  cluster.Add(Device("new", false));
  EXPECT_EQ(Kinds(cluster.PlanAt()),
            (Strings{"remove-device-finalizer d1", "add-device-finalizer new"}));
}

TEST(ReconcilerG10, SettingsAreWrittenOnlyWhenTheyDiffer) {
  ReconcileInput input;
  input.vmis = [](const std::string&, const std::string&) { return VmiState{}; };
  input.now = kNow;
  input.settings = ReconcileInput::Settings{std::nullopt, {}, {}};
  ReconcilerOptions options;
  options.gpuResourceNames = {"example.com/a", "example.com/b"};
  options.rawNamesForbidden = true;
  const auto PlanReconcile = [&options](const ReconcileInput& in) {
    return controller::PlanReconcile(in, StandardReconcilers(options));
  };
  Plan plan = PlanReconcile(input);
  ASSERT_EQ(Kinds(plan), (Strings{"apply-settings cozy-gpu-settings"}));
  input.settings->stored = plan.actions[0].body;
  EXPECT_TRUE(PlanReconcile(input).actions.empty());
  options.gpuResourceNames.push_back("example.com/c");
  EXPECT_EQ(Kinds(PlanReconcile(input)), (Strings{"apply-settings cozy-gpu-settings"}));
}

// D20: each dra class has its DeviceClass, selecting gpu-agent's devices of its PCI ID and owned by
// the class; written only when it differs, put back when changed, and deleted once no dra class
// names it (a class gone, or one of the label's that sells through a device plugin).
TEST(ReconcilerD20, EachDraClassHasItsDeviceClassAndNoOtherIsKept) {
  ReconcileInput input;
  input.vmis = [](const std::string&, const std::string&) { return VmiState{}; };
  input.now = kNow;
  auto dra = std::make_shared<api::GpuClass>(*Class("a100-dra", true));
  dra->metadata.uid = "class-uid";
  dra->spec.source.devicePlugin.resourceName.clear();
  dra->spec.source.dra = api::DraSource{"10DE:20B5"};
  input.classes = {Class("a100", true), dra};
  const auto PlanDeviceClasses = [](const ReconcileInput& in) {
    Reconcilers only;
    only.push_back(std::make_unique<DraDeviceClasses>());
    return controller::PlanReconcile(in, only);
  };
  EXPECT_TRUE(PlanDeviceClasses(input).actions.empty())
      << "resource.k8s.io not served (or its cache not synced): nothing is planned";

  input.deviceClasses = std::vector<JsonPtr>{};
  Plan plan = PlanDeviceClasses(input);
  ASSERT_EQ(Kinds(plan), (Strings{"apply-device-class a100-dra.gpu.cozystack.io"}));
  const nlohmann::json& object = plan.actions[0].body;
  EXPECT_EQ(plan.actions[0].target.Path(),
            "/apis/resource.k8s.io/v1/deviceclasses/a100-dra.gpu.cozystack.io");
  EXPECT_EQ(object["spec"]["selectors"][0]["cel"]["expression"],
            "device.driver == \"gpu.cozystack.io\" && "
            "device.attributes[\"gpu.cozystack.io\"].vendorID == \"10de\" && "
            "device.attributes[\"gpu.cozystack.io\"].deviceID == \"20b5\"");
  EXPECT_EQ(object["metadata"]["labels"]["gpu.cozystack.io/class"], "a100-dra");
  EXPECT_EQ(object["metadata"]["ownerReferences"][0]["uid"], "class-uid");
  EXPECT_EQ(object["metadata"]["ownerReferences"][0]["kind"], "GPUClass");

  // As stored (the API server's metadata added): nothing to write.
  nlohmann::json stored = object;
  stored["metadata"]["uid"] = "dc-uid";
  stored["metadata"]["resourceVersion"] = "5";
  input.deviceClasses = std::vector<JsonPtr>{std::make_shared<const nlohmann::json>(stored)};
  EXPECT_TRUE(PlanDeviceClasses(input).actions.empty());

  // Changed by someone else: put back over the stored one, at its version.
  stored["spec"]["selectors"][0]["cel"]["expression"] = "true";
  input.deviceClasses = std::vector<JsonPtr>{std::make_shared<const nlohmann::json>(stored)};
  plan = PlanDeviceClasses(input);
  ASSERT_EQ(Kinds(plan), (Strings{"apply-device-class a100-dra.gpu.cozystack.io"}));
  EXPECT_EQ(plan.actions[0].resourceVersion, "5");

  // The class gone: its DeviceClass goes, at its uid and version.
  input.classes = {Class("a100", true)};
  plan = PlanDeviceClasses(input);
  ASSERT_EQ(Kinds(plan), (Strings{"delete-device-class a100-dra.gpu.cozystack.io"}));
  EXPECT_EQ(plan.actions[0].verb, Verb::kDelete);
  EXPECT_EQ(plan.actions[0].uid, "dc-uid");
  // The standard list runs it.
  bool listed = false;
  for (const auto& reconciler : StandardReconcilers()) {
    listed = listed || reconciler->Name() == "device-classes";
  }
  EXPECT_TRUE(listed);
}

// D21: each Bound device of a dra class has its claim: for its count of the class's devices on
// its node, tolerating the catalog's taint, owned by the device. One that asks for something
// else (the device moved) or for a device no longer Bound goes, unless a pod holds it; a device
// of a device-plugin class has none.
TEST(ReconcilerD21, EachBoundDeviceOfADraClassHasItsClaim) {
  ReconcileInput input;
  input.vmis = [](const std::string&, const std::string&) { return VmiState{}; };
  input.now = kNow;
  auto dra = std::make_shared<api::GpuClass>(*Class("a100-dra", true));
  dra->spec.source.devicePlugin.resourceName.clear();
  dra->spec.source.dra = api::DraSource{"10DE:20B5"};
  input.classes = {Class("a100", true), dra};
  api::GpuDevice held = Bound(Device("held"));
  held.spec.className = "a100-dra";
  held.spec.count = 2;
  input.devices = {std::make_shared<api::GpuDevice>(held),
                   std::make_shared<api::GpuDevice>(Bound(Device("plugin")))};
  const auto PlanClaims = [](const ReconcileInput& in) {
    Reconcilers only;
    only.push_back(std::make_unique<DraClaims>());
    return controller::PlanReconcile(in, only);
  };
  EXPECT_TRUE(PlanClaims(input).actions.empty()) << "resource.k8s.io not served: nothing";

  input.draClaims = std::vector<JsonPtr>{};
  Plan plan = PlanClaims(input);
  ASSERT_EQ(Kinds(plan), (Strings{"create-device-claim held"}));
  EXPECT_EQ(plan.actions[0].target.Path(),
            "/apis/resource.k8s.io/v1/namespaces/tenant-a/resourceclaims/held");
  const nlohmann::json claim = plan.actions[0].body;
  // One request per GPU, each for exactly one device: KubeVirt gives each `gpus` entry the one
  // device of the request it names.
  const nlohmann::json& requests = claim["spec"]["devices"]["requests"];
  ASSERT_EQ(requests.size(), 2U);
  for (size_t i = 0; i < 2; ++i) {
    const nlohmann::json& request = requests[i];
    EXPECT_EQ(request["name"], "gpu-" + std::to_string(i));
    EXPECT_EQ(request["exactly"]["deviceClassName"], "a100-dra.gpu.cozystack.io");
    EXPECT_EQ(request["exactly"]["count"], 1);
    EXPECT_EQ(request["exactly"]["selectors"][0]["cel"]["expression"],
              "device.attributes[\"gpu.cozystack.io\"].id.startsWith(\"n1/\")");
    EXPECT_EQ(request["exactly"]["tolerations"][0],
              (nlohmann::json{{"key", "gpu.cozystack.io/catalog"},
                              {"operator", "Exists"},
                              {"effect", "NoSchedule"}}));
  }
  EXPECT_EQ(claim["metadata"]["ownerReferences"][0]["uid"], "held-uid");
  EXPECT_EQ(claim["metadata"]["labels"]["gpu.cozystack.io/device-claim"], "true");

  // Stored as written (with the API server's additions): nothing to do.
  nlohmann::json stored = claim;
  stored["metadata"]["uid"] = "claim-uid";
  stored["metadata"]["resourceVersion"] = "3";
  stored["spec"]["devices"]["requests"][1]["exactly"]["adminAccess"] = false;
  input.draClaims = std::vector<JsonPtr>{std::make_shared<const nlohmann::json>(stored)};
  EXPECT_TRUE(PlanClaims(input).actions.empty());

  // Moved to n2: the claim for n1 goes; the next pass writes the one for n2.
  held.status.nodeName = "n2";
  input.devices[0] = std::make_shared<api::GpuDevice>(held);
  ASSERT_EQ(Kinds(PlanClaims(input)), (Strings{"delete-device-claim held"}));
  // ... but not while a pod holds it.
  nlohmann::json reserved = stored;
  reserved["status"]["reservedFor"] = {{{"resource", "pods"}, {"name", "launcher"}, {"uid", "p"}}};
  input.draClaims = std::vector<JsonPtr>{std::make_shared<const nlohmann::json>(reserved)};
  EXPECT_TRUE(PlanClaims(input).actions.empty());

  // No longer Bound: its claim goes.
  held.status.phase = api::DevicePhase::kLost;
  held.status.nodeName.reset();
  input.devices[0] = std::make_shared<api::GpuDevice>(held);
  input.draClaims = std::vector<JsonPtr>{std::make_shared<const nlohmann::json>(stored)};
  plan = PlanClaims(input);
  ASSERT_EQ(Kinds(plan), (Strings{"delete-device-claim held"}));
  EXPECT_EQ(plan.actions[0].uid, "claim-uid");
}

}  // namespace
}  // namespace cozy::controller
