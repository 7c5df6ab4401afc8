// The VMI webhook's pure part: its own GPU entries (E11), the start plan that runs every
// refusal check before anything is written (E5, with E1-E4 for templates and E6's mark), the
// gpus patch (E9, E10), and the pod webhook's pin (E13: by the Node's name,
// tolerating its cordon, D10).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "api/device_references.h"
#include "api/keys.h"
#include "api/validation.h"
#include "controller/admission/pod.h"
#include "controller/admission/review.h"
#include "controller/admission/vmi.h"
#include "controller/model/readers.h"
#include "test/controller/admission_fixtures.h"
#include "test/controller/model_fixtures.h"
#include "test/support/node_fit.h"
#include "test/support/snapshot_fixture.h"

namespace cozy::admission {
namespace {

using namespace cozy::admission::testing;
using namespace cozy::model::testing;
using namespace cozy::testing;
using api::DeviceReferences;
using model::Snapshot;
using nlohmann::json;

VmiInput Input(DeviceReferences references) {
  VmiInput input;
  input.namespaceName = "tenant-a";
  input.vmiName = "vm1";
  input.references = std::move(references);
  input.now = "2026-12-01T10:00:00Z";
  return input;
}

VmiStartPlan Plan(const Snapshot& snapshot, const VmiInput& input) {
  const model::Model model(snapshot);
  return PlanVmiStart(snapshot, model, input);
}

// A refused plan carries nothing to write.
void ExpectNothingToWrite(const VmiStartPlan& plan) {
  EXPECT_TRUE(plan.heldDevices.empty());
  EXPECT_TRUE(plan.templateDevices.empty());
  EXPECT_TRUE(plan.devices.empty());
  EXPECT_TRUE(plan.node.empty());
}

// ---- own GPU entries (E11) ----

json VmiWithDevices(json devices, json resources = json::object()) {
  return {{"spec", {{"domain", {{"devices", std::move(devices)}, {"resources", resources}}}}}};
}

// E11: "the VMI webhook adds them when it looks for a VMI's own GPU entries" — a hostDevice on
// a table-only name is a GPU entry; a ConnectX VF is not.
TEST(OwnGpuEntriesE11, TableOnlyNvidiaNameIsAGpuEntryConnectXIsNot) {
  model::PermittedHostDevices permitted;
  permitted.pciHostDevices = {{"10DE:2236", "nvidia.com/GA102GL_A10"},
                              {"15B3:101E", "mellanox.com/cx7_vf"}};
  permitted.mediatedDevices = {{"NVIDIA A2-4Q", "nvidia.com/NVIDIA_A2-4Q"}};
  const std::set<std::string> names =
      model::EffectiveGpuResourceNames(model::Settings{}, {}, permitted, {});
  const json vmi =
      VmiWithDevices({{"hostDevices",
                       {{{"name", "a10"}, {"deviceName", "nvidia.com/GA102GL_A10"}},
                        {{"name", "vf"}, {"deviceName", "mellanox.com/cx7_vf"}},
                        {{"name", "mdev"}, {"deviceName", "nvidia.com/NVIDIA_A2-4Q"}}}}});
  const VmiGpuEntries entries = OwnGpuEntries(vmi, names);
  ASSERT_EQ(entries.own.size(), 2U);
  EXPECT_EQ(entries.own[0],
            (GpuEntry{"spec.domain.devices.hostDevices[0]", "a10", "nvidia.com/GA102GL_A10"}));
  EXPECT_EQ(entries.own[1].resourceName, "nvidia.com/NVIDIA_A2-4Q");
  EXPECT_TRUE(entries.webhook.empty());
}

TEST(OwnGpuEntriesE11, EveryGpusEntryAndGpuResourceKeysWebhookEntriesApart) {
  const std::set<std::string> names = {kA100};
  const json vmi =
      VmiWithDevices({{"gpus",
                       {{{"name", "mine"}, {"deviceName", "vendor.example/other"}},
                        {{"name", GpuEntryName("held", 0)}, {"deviceName", kA100}}}}},
                     {{"requests", {{kA100, "1"}, {"memory", "1Gi"}}}, {"limits", {{kA100, "1"}}}});
  const VmiGpuEntries entries = OwnGpuEntries(vmi, names);
  ASSERT_EQ(entries.own.size(), 3U);
  EXPECT_EQ(entries.own[0].name, "mine");  // any gpus entry, whatever its deviceName
  EXPECT_EQ(entries.own[1].field, "spec.domain.resources.requests[\"nvidia.com/GA100\"]");
  EXPECT_EQ(entries.own[2].field, "spec.domain.resources.limits[\"nvidia.com/GA100\"]");
  ASSERT_EQ(entries.webhook.size(), 1U);
  EXPECT_EQ(entries.webhook[0].name, "cozy-gpu-held-0");
  EXPECT_TRUE(OwnGpuEntries(json{{"spec", json::object()}}, names).own.empty());
}

// ---- the start plan (E5, E6, E9; E1-E4 for templates) ----

// E5: "a dry run and a refused start leave no trace" — each refusal is found before anything
// is written: the plan then holds nothing to create or attach.
TEST(VmiStartPlanE5, EveryRefusalBeforeAnyWrite) {
  Snapshot snapshot = FlatTenantsSnapshot();
  AddNode(snapshot, "n1", 2);
  snapshot.devices = {Bound("tenant-a", "held", "a100", 1, "n1"),
                      Bound("tenant-a", "theirs", "a100", 1, "n1", "vm2"),
                      Pending("tenant-a", "going", "a100", 1)};
  snapshot.devices.MutableAt(2).metadata.deletionTimestamp = "2026-12-01T09:00:00Z";
  snapshot.devices.push_back(Bound("tenant-b", "elsewhere", "a100", 0, "n1"));
  snapshot.devices.push_back(Pending("tenant-a", "vm1-dup", "a100", 1));
  struct Case {
    const char* what;
    DeviceReferences refs;
    const char* refusal;
  };
  const std::vector<Case> cases = {
      {"missing device", {{"held", "nope"}, {{"gpu", "a100", 1}}}, "nope, which does not exist"},
      {"another namespace's device", {{"elsewhere"}, {}}, "elsewhere, which does not exist"},
      {"device being deleted", {{"going"}, {}}, "going, which is being deleted"},
      {"attached to another VMI", {{"theirs"}, {}}, "attached to VMI vm2"},
      {"template of an unknown class (E1)", {{"held"}, {{"gpu", "h100", 1}}}, "no GPUClass h100"},
      {"no room on one node", {{"held"}, {{"gpu", "a100", 2}}}, "cannot be placed on one node"},
      {"template device also held", {{"vm1-dup"}, {{"dup", "a100", 1}}}, "also referenced"},
  };
  for (const Case& c : cases) {
    const VmiStartPlan plan = Plan(snapshot, Input(c.refs));
    EXPECT_TRUE(Contains(plan.refusal, c.refusal)) << c.what << ": " << plan.refusal.value_or("-");
    ExpectNothingToWrite(plan);
  }
}

// E6: "one template: one marked device" — with a held device, the whole set on one node.
TEST(VmiStartPlanE6, TemplatesBecomeMarkedDevicesReadyToCreate) {
  Snapshot snapshot = FlatTenantsSnapshot();
  AddNode(snapshot, "n1", 2);
  AddNode(snapshot, "n2", 4);
  snapshot.devices = {Bound("tenant-a", "held", "a100", 1, "n1")};
  const VmiStartPlan plan = Plan(snapshot, Input({{"held"}, {{"gpu", "a100", 1}}}));
  ASSERT_FALSE(plan.refusal) << *plan.refusal;
  EXPECT_EQ(plan.heldDevices, std::vector<std::string>{"held"});
  EXPECT_EQ(plan.node, "n1");  // the held device's node has room for the template
  ASSERT_EQ(plan.templateDevices.size(), 1U);
  const json& device = plan.templateDevices[0];
  EXPECT_EQ(device["apiVersion"], "gpu.cozystack.io/v1alpha1");
  EXPECT_EQ(device["kind"], "GPUDevice");
  EXPECT_EQ(device["metadata"]["name"], model::TemplateDeviceName("vm1", "gpu"));
  EXPECT_EQ(device["metadata"]["namespace"], "tenant-a");
  EXPECT_EQ(device["metadata"]["labels"], (json{{"gpu.cozystack.io/template-device", "true"}}));
  EXPECT_EQ(device["spec"], (json{{"className", "a100"}, {"count", 1}}));
  EXPECT_FALSE(device.contains("status"));
  EXPECT_EQ(api::GpuDeviceFromJson(device).spec.count, 1);  // what the CRD accepts
  EXPECT_EQ(plan.devices, (std::vector<PlacedDevice>{{"held", kA100, 1}, {"vm1-gpu", kA100, 1}}));
}

// B3: the template mark carries no VMI name, which may be longer than a label value allows: a
// VMI of 200 characters gets the same mark, a valid label value, and a device name that is a
// valid subdomain.
TEST(VmiStartPlanB3E6, TheTemplateMarkIsTheSameWhateverTheVmisName) {
  Snapshot snapshot = FlatTenantsSnapshot();
  AddNode(snapshot, "n1", 2);
  VmiInput input = Input({{}, {{"gpu", "a100", 1}}});
  input.vmiName = std::string(200, 'v');
  const VmiStartPlan plan = Plan(snapshot, input);
  ASSERT_FALSE(plan.refusal) << *plan.refusal;
  ASSERT_EQ(plan.templateDevices.size(), 1U);
  const json& device = plan.templateDevices[0];
  EXPECT_EQ(device["metadata"]["labels"], (json{{"gpu.cozystack.io/template-device", "true"}}));
  const std::string name = device["metadata"]["name"];
  EXPECT_LE(name.size(), 253U);
  EXPECT_EQ(api::GpuDeviceFromJson(device).metadata.name, name);  // what the CRD accepts
}

// The model moves a held set that cannot grow where it is, as the binder would.
TEST(VmiStartPlanE5, SetGoesWhereTheWholeOfItFits) {
  Snapshot snapshot = FlatTenantsSnapshot();
  AddNode(snapshot, "n1", 1);
  AddNode(snapshot, "n2", 4);
  snapshot.devices = {Bound("tenant-a", "held", "a100", 1, "n1")};
  VmiStartPlan plan = Plan(snapshot, Input({{"held"}, {{"gpu", "a100", 2}}}));
  ASSERT_FALSE(plan.refusal) << *plan.refusal;
  EXPECT_EQ(plan.node, "n2");
  snapshot.nodes.MutableAt(1).unschedulable = true;
  plan = Plan(snapshot, Input({{"held"}, {{"gpu", "a100", 2}}}));
  EXPECT_TRUE(Contains(plan.refusal, "no eligible node has room for 3 units of nvidia.com/GA100"))
      << plan.refusal.value_or("admitted");
  ExpectNothingToWrite(plan);
}

// E15: a start on a dra class is planned as any other, its members marked dra for the patch; a
// set mixing dra and device-plugin classes, or dra members beside the VMI's own device-plugin
// gpus entry, is refused before anything is written (KubeVirt gives a VM GPUs of one kind).
TEST(VmiStartPlanE15, ADraStartIsPlannedAndAMixedOneRefused) {
  Snapshot snapshot = FlatTenantsSnapshot();
  AddNode(snapshot, "n1", 2);
  api::GpuClass dra = MakeClass("a100-dra", "");
  dra.spec.source.dra = api::DraSource{"10DE:20B5"};
  snapshot.classes.push_back(dra);
  // The dra class's units: a function of n1 no device plugin advertises, in n1's slice.
  api::InventoryDevice function;
  function.pciAddress = "0000:af:00.0";
  function.health = "Unadvertised";
  snapshot.gpuNodes.MutableAt(0).devices.push_back(function);
  snapshot.resourceSlices.push_back(model::ResourceSlice{
      "n1-gpu.cozystack.io",
      "gpu.cozystack.io",
      "n1",
      "n1",
      {model::SliceDevice{"pci-0000-af-00-0", "0000:af:00.0", "10de", "20b5"}}});
  snapshot.devices = {Bound("tenant-a", "held", "a100-dra", 1, "n1")};
  VmiStartPlan plan = Plan(snapshot, Input({{"held"}, {}}));
  ASSERT_FALSE(plan.refusal) << *plan.refusal;
  EXPECT_EQ(plan.node, "n1");
  EXPECT_EQ(plan.devices, (std::vector<PlacedDevice>{{"held", "", 1, true}}));

  plan = Plan(snapshot, Input({{"held"}, {{"gpu", "a100", 1}}}));
  EXPECT_TRUE(Contains(plan.refusal,
                       "is delivered through DRA and vm1-gpu (GPUClass a100) through "
                       "a device plugin; KubeVirt gives a VM GPUs of one kind"))
      << plan.refusal.value_or("admitted");
  ExpectNothingToWrite(plan);

  VmiInput own = Input({{"held"}, {}});
  own.entries.own = {{"spec.domain.devices.gpus[0]", "mine", kA100}};
  plan = Plan(snapshot, own);
  EXPECT_TRUE(Contains(plan.refusal,
                       "its own GPU entry spec.domain.devices.gpus[0] through a "
                       "device plugin"))
      << plan.refusal.value_or("admitted");
  ExpectNothingToWrite(plan);
}

// C7, E5: the classes' tolerations decide which nodes a starting VM's set
// may go to, not the VMI's own. The binder answers the start before the VMI exists, so it cannot
// read them; a plan that counted them admitted a start the binder then refused after the writes.
// A VMI tolerating a taint its class does not is refused at once, the taint named.
TEST(VmiStartPlanC7E5, TheClassesTolerationsCountNotTheVmis) {
  Snapshot snapshot = FlatTenantsSnapshot();
  AddNode(snapshot, "n1", 2);
  snapshot.nodes.MutableAt(0).taints = {{"gpu", "", "NoSchedule"}};
  const VmiInput input = Input({{}, {{"gpu", "a100", 1}}});
  std::optional<std::string> refusal = Plan(snapshot, input).refusal;
  EXPECT_TRUE(Contains(refusal, "no eligible node has room")) << refusal.value_or("admitted");
  snapshot.classes[0].spec.tolerations = {{"gpu", "Exists", "", "NoSchedule"}};
  const VmiStartPlan plan = Plan(snapshot, input);
  ASSERT_FALSE(plan.refusal) << *plan.refusal;
  EXPECT_EQ(plan.node, "n1");
}

// E3 for templates: "all templates counted together against budgets".
TEST(VmiStartPlanE3, TemplatesCountTogetherAgainstBudgets) {
  Snapshot snapshot = FlatTenantsSnapshot();
  AddNode(snapshot, "n1", 8);
  snapshot.quotas = {MakeQuota("tenant-root", {{"requests.gpu.cozystack.io/a100", "3"}})};
  const DeviceReferences two = {{}, {{"a", "a100", 2}, {"b", "a100", 2}}};
  VmiStartPlan plan = Plan(snapshot, Input(two));
  EXPECT_TRUE(Contains(plan.refusal, "of tenant-root is 3 with 0 used; the order needs 4"))
      << plan.refusal.value_or("admitted");
  ExpectNothingToWrite(plan);
  plan = Plan(snapshot, Input({{}, {{"a", "a100", 2}, {"b", "a100", 1}}}));
  EXPECT_FALSE(plan.refusal) << plan.refusal.value_or("");
  EXPECT_EQ(plan.templateDevices.size(), 2U);
}

// E4 for templates: a vgpu template without the entitlement.
TEST(VmiStartPlanE4, VgpuTemplateNeedsTheEntitlement) {
  Snapshot snapshot = FlatTenantsSnapshot();
  snapshot.classes.push_back(MakeClass("a2-4q", kA2Vgpu, api::GpuMode::kVgpu));
  AddNode(snapshot, "n1", 2, kA2Vgpu);
  const DeviceReferences refs = {{}, {{"gpu", "a2-4q", 1}}};
  EXPECT_TRUE(Contains(Plan(snapshot, Input(refs)).refusal, "not entitled to vGPUs"));
  snapshot.namespaces[0].labels[std::string(api::kVgpuEntitledLabel)] = "true";
  EXPECT_FALSE(Plan(snapshot, Input(refs)).refusal);
}

TEST(VmiStartPlanE5, RawNamesForbiddenRefusesTheVmisOwnEntries) {
  Snapshot snapshot = FlatTenantsSnapshot();
  AddNode(snapshot, "n1", 2);
  VmiInput input = Input({{}, {{"gpu", "a100", 1}}});
  input.entries.own = {{"spec.domain.devices.gpus[0]", "mine", kA100}};
  input.entries.webhook = {{"spec.domain.devices.gpus[1]", "cozy-gpu-x-0", kA100}};
  input.rawNamesForbidden = true;
  const VmiStartPlan plan = Plan(snapshot, input);
  EXPECT_TRUE(Contains(plan.refusal, "own GPU entry spec.domain.devices.gpus[0] (mine)"))
      << plan.refusal.value_or("admitted");
  ExpectNothingToWrite(plan);
  input.entries.own.clear();  // the webhook's own entries are replaced, not refused
  EXPECT_FALSE(Plan(snapshot, input).refusal);
  input.entries.own = {{"spec.domain.devices.gpus[0]", "mine", kA100}};
  input.rawNamesForbidden = false;
  EXPECT_FALSE(Plan(snapshot, input).refusal);
}

// E9: "a recent answered request for the same VMI is taken as its own" — on a reinvocation the
// devices the first call attached and created are this VMI's: nothing is created twice.
TEST(VmiStartPlanE9, ReinvocationTakesItsOwnAttachmentsAndTemplateDevices) {
  Snapshot snapshot = FlatTenantsSnapshot();
  AddNode(snapshot, "n1", 2);
  api::GpuDevice created =
      Pending("tenant-a", model::TemplateDeviceName("vm1", "gpu"), "a100", 1, "vm1");
  created.status.attachment->vmiUid = "";
  created.metadata.labels[std::string(api::kTemplateDeviceLabel)] = "true";
  snapshot.devices = {Bound("tenant-a", "held", "a100", 1, "n1", "vm1"), created};
  snapshot.devices.MutableAt(0).status.attachment->vmiUid = "";
  const DeviceReferences refs = {{"held"}, {{"gpu", "a100", 1}}};
  VmiStartPlan plan = Plan(snapshot, Input(refs));
  ASSERT_FALSE(plan.refusal) << *plan.refusal;
  EXPECT_TRUE(plan.templateDevices.empty());
  EXPECT_EQ(plan.heldDevices, (std::vector<std::string>{"held", "vm1-gpu"}));
  EXPECT_EQ(plan.node, "n1");
  // A device of that name that is not the template's is refused, not taken.
  snapshot.devices.MutableAt(1).metadata.labels.clear();
  plan = Plan(snapshot, Input(refs));
  EXPECT_TRUE(Contains(plan.refusal, "already exists and is not this template's device"));
  // Nor is one another VMI of that name... holds: attached to vm2.
  snapshot.devices.MutableAt(1).metadata.labels[std::string(api::kTemplateDeviceLabel)] = "true";
  snapshot.devices.MutableAt(1).status.attachment->vmiName = "vm2";
  EXPECT_TRUE(Contains(Plan(snapshot, Input(refs)).refusal, "attached to VMI vm2"));
}

// ---- the gpus patch (E9, E10) ----

// E10: "count 2: two entries, resources untouched".
TEST(VmiGpuPatchE10, OneEntryPerGpuAndNoResourcesKey) {
  const json vmi = ReadTestdata("vmi-create-dryrun.json")["request"]["object"];
  const json ops = VmiGpuPatch(vmi, {{"held", kA100, 2}, {"vm1-gpu", "nvidia.com/other", 1}});
  const json patched = vmi.patch(ops);
  EXPECT_EQ(patched["spec"]["domain"]["devices"]["gpus"],
            (json{{{"name", "cozy-gpu-held-0"}, {"deviceName", kA100}},
                  {{"name", "cozy-gpu-held-1"}, {"deviceName", kA100}},
                  {{"name", "cozy-gpu-vm1-gpu-0"}, {"deviceName", "nvidia.com/other"}}}));
  EXPECT_EQ(patched["spec"]["domain"]["resources"], vmi["spec"]["domain"]["resources"]);
  for (const json& op : ops) {
    EXPECT_EQ(op["path"].get<std::string>().find("/resources"), std::string::npos) << op;
  }
  // Only the gpus list changed.
  json without = patched;
  without["spec"]["domain"]["devices"].erase("gpus");
  EXPECT_EQ(without, vmi);
}

TEST(VmiGpuPatchE10, AddsMissingParents) {
  const std::vector<PlacedDevice> devices = {{"d", kA100, 1}};
  const json gpus = json::array({{{"name", "cozy-gpu-d-0"}, {"deviceName", kA100}}});
  for (const json& vmi :
       {json{{"spec", {{"domain", {{"devices", json::object()}}}}}},
        json{{"spec", {{"domain", json::object()}}}}, json{{"spec", json::object()}}}) {
    const json ops = VmiGpuPatch(vmi, devices);
    ASSERT_EQ(ops.size(), 1U) << vmi;
    EXPECT_EQ(vmi.patch(ops)["spec"]["domain"]["devices"]["gpus"], gpus) << ops;
  }
  EXPECT_EQ(VmiGpuPatch(json{{"spec", json::object()}}, {}), json::array());
}

// E9: "call twice for one VMI: same patch, no second write" — the patched VMI gets no ops, and
// the reinvocation payload (virt-api's mutations since) neither.
TEST(VmiGpuPatchE9, IdempotentAndStaleEntriesReplaced) {
  const std::vector<PlacedDevice> devices = {{"held", kA100, 1}, {"vm1-gpu", kA100, 1}};
  const json first = ReadTestdata("vmi-create-dryrun.json")["request"]["object"];
  const json ops = VmiGpuPatch(first, devices);
  EXPECT_EQ(VmiGpuPatch(first.patch(ops), devices), json::array());
  const AdmissionRequest again = DecodeAdmissionReview(ReadTestdata("vmi-reinvocation.json"));
  EXPECT_EQ(VmiGpuPatch(again.object, devices), json::array());
  // Another set: the stale webhook entry goes, the tenant's own stays, the new one comes.
  json vmi = again.object;
  vmi["spec"]["domain"]["devices"]["gpus"].insert(
      vmi["spec"]["domain"]["devices"]["gpus"].begin(),
      json{{"name", "tenants"}, {"deviceName", "vendor.example/x"}});
  const json patched = vmi.patch(VmiGpuPatch(vmi, {{"held", kA100, 1}, {"other", kA100, 1}}));
  EXPECT_EQ(patched["spec"]["domain"]["devices"]["gpus"],
            (json{{{"name", "tenants"}, {"deviceName", "vendor.example/x"}},
                  {{"name", "cozy-gpu-held-0"}, {"deviceName", kA100}},
                  {{"name", "cozy-gpu-other-0"}, {"deviceName", kA100}}}));
  // An entry of ours with fields another mutator added still counts as ours.
  json tagged = first.patch(ops);
  tagged["spec"]["domain"]["devices"]["gpus"][0]["tag"] = "x";
  EXPECT_EQ(VmiGpuPatch(tagged, devices), json::array());
}

// E15: a dra device gets KubeVirt's DRA form: one spec.resourceClaims entry naming its claim
// (the device's name) and one gpus entry per GPU naming that entry and request gpu-<i>, beside a
// device-plugin device's entries; idempotent; a stale claim entry of ours goes, a tenant's stays.
TEST(VmiGpuPatchE15, ADraDeviceGetsItsClaimAndOneEntryPerRequest) {
  const std::vector<PlacedDevice> devices = {{"pair", "", 2, true}};
  const json vmi = {{"spec", {{"domain", {{"devices", json::object()}}}}}};
  const json patched = vmi.patch(VmiGpuPatch(vmi, devices));
  EXPECT_EQ(patched["spec"]["resourceClaims"],
            (json{{{"name", "cozy-gpu-pair"}, {"resourceClaimName", "pair"}}}));
  EXPECT_EQ(
      patched["spec"]["domain"]["devices"]["gpus"],
      (json{{{"name", "cozy-gpu-pair-0"}, {"claimName", "cozy-gpu-pair"}, {"requestName", "gpu-0"}},
            {{"name", "cozy-gpu-pair-1"},
             {"claimName", "cozy-gpu-pair"},
             {"requestName", "gpu-1"}}}));
  EXPECT_FALSE(patched["spec"]["domain"]["devices"]["gpus"][0].contains("deviceName"));
  EXPECT_EQ(VmiGpuPatch(patched, devices), json::array()) << "E9: nothing twice";

  json other = patched;
  other["spec"]["resourceClaims"].push_back({{"name", "tenants"}, {"resourceClaimName", "own"}});
  const json moved = other.patch(VmiGpuPatch(other, {{"single", "", 1, true}}));
  EXPECT_EQ(moved["spec"]["resourceClaims"],
            (json{{{"name", "tenants"}, {"resourceClaimName", "own"}},
                  {{"name", "cozy-gpu-single"}, {"resourceClaimName", "single"}}}));
  EXPECT_EQ(moved["spec"]["domain"]["devices"]["gpus"].size(), 1U);
  // A long or dotted device name makes a DNS label too, distinct per device.
  const std::string longName(200, 'a');
  EXPECT_TRUE(api::CheckDnsLabel(ClaimEntryName(longName)).empty());
  EXPECT_TRUE(api::CheckDnsLabel(ClaimEntryName("a.b")).empty());
  EXPECT_NE(ClaimEntryName(longName), ClaimEntryName(longName + "b"));
  // A device-plugin set keeps its form and gets no resourceClaims.
  EXPECT_FALSE(
      vmi.patch(VmiGpuPatch(vmi, {{"held", kA100, 1}}))["spec"].contains("resourceClaims"));
}

TEST(VmiGpuPatchE10, EntryNamesAreDnsLabelsDistinctPerDeviceAndIndex) {
  const std::string longName(200, 'a');
  const std::vector<std::pair<std::string, int64_t>> inputs = {
      {"held", 0},   {"held", 1},         {"gpu.a", 0},  {"gpu-a", 0},
      {longName, 0}, {longName + "b", 0}, {longName, 12}};
  std::set<std::string> names;
  for (const auto& [device, index] : inputs) {
    const std::string name = GpuEntryName(device, index);
    EXPECT_EQ(api::CheckDnsLabel(name), "") << name;
    EXPECT_TRUE(IsWebhookGpuEntryName(name)) << name;
    EXPECT_EQ(name, GpuEntryName(device, index));
    names.insert(name);
  }
  EXPECT_EQ(names.size(), inputs.size());
  EXPECT_EQ(GpuEntryName("held", 1), "cozy-gpu-held-1");
}

// The VMI review from the wire to the answer: annotation, entries, plan, patch.
TEST(VmiStartPlanE10, FromTheReviewToThePatch) {
  Snapshot snapshot = FlatTenantsSnapshot();
  AddNode(snapshot, "n1", 2);
  snapshot.nodes.MutableAt(0).taints = {{"gpu", "", "NoSchedule"}};
  snapshot.classes[0].spec.tolerations = {{"gpu", "Exists", "", "NoSchedule"}};
  snapshot.devices = {Bound("tenant-a", "held", "a100", 1, "n1")};
  const model::Model model(snapshot);
  const AdmissionRequest request = DecodeAdmissionReview(ReadTestdata("vmi-create-dryrun.json"));
  VmiInput input;
  input.namespaceName = request.namespaceName;
  input.vmiName = request.name;
  input.references = api::ParseDeviceReferences(
      request.object["metadata"]["annotations"][std::string(api::kDeviceReferenceAnnotation)]
          .get<std::string>());
  input.entries = OwnGpuEntries(request.object, {kA100});
  input.rawNamesForbidden = true;
  const VmiStartPlan plan = PlanVmiStart(snapshot, model, input);
  ASSERT_FALSE(plan.refusal) << *plan.refusal;
  const json answer =
      EncodeAdmissionReview(Allow(request, VmiGpuPatch(request.object, plan.devices)));
  EXPECT_EQ(answer["response"]["patchType"], "JSONPatch");
  EXPECT_EQ(answer["response"]["uid"], "7d4b2a10-1e2f-4a3b-8c9d-0e1f2a3b4c5d");
}

// ---- the launcher pod's pin (E13) ----

json Terms(const json& pod) {
  return pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"];
}

const json kOnN1 = {{"key", "metadata.name"}, {"operator", "In"}, {"values", {"n1"}}};
const json kCordon = {
    {"key", "node.kubernetes.io/unschedulable"}, {"operator", "Exists"}, {"effect", "NoSchedule"}};

// A Node as the API server holds it, with the label virt-controller's nodeSelector asks for.
json NodeNamed(const std::string& name, const std::string& hostname, bool cordoned = false) {
  json node = {{"apiVersion", "v1"},
               {"kind", "Node"},
               {"metadata",
                {{"name", name},
                 {"labels",
                  {{"kubernetes.io/hostname", hostname},
                   {"kubevirt.io/schedulable", "true"},
                   {"topology.kubernetes.io/zone", "z1"}}}}},
               {"spec", json::object()}};
  if (cordoned) {
    node["spec"]["unschedulable"] = true;
    node["spec"]["taints"] = {{{"key", "node.kubernetes.io/unschedulable"},
                               {"effect", "NoSchedule"},
                               {"timeAdded", "2026-01-01T00:00:00Z"}}};
  }
  return node;
}

// E13: "set on n1: pod gets required affinity to n1" — in every ORed term.
TEST(PodPinPatchE13, EveryTermGetsTheNode) {
  const json pod = ReadTestdata("pod-create.json")["request"]["object"];
  const json ops = PodPinPatch(pod, "n1");
  const json patched = pod.patch(ops);
  const json terms = Terms(patched);
  ASSERT_EQ(terms.size(), 2U);
  EXPECT_EQ(terms[0]["matchExpressions"], Terms(pod)[0]["matchExpressions"]);
  EXPECT_EQ(terms[0]["matchFields"], json::array({kOnN1}));
  json fields = Terms(pod)[1]["matchFields"];
  fields.push_back(kOnN1);
  EXPECT_EQ(terms[1]["matchFields"], fields);
  EXPECT_FALSE(terms[1].contains("matchExpressions"));
  EXPECT_EQ(patched["spec"]["tolerations"], json::array({kCordon}));
  EXPECT_EQ(PodPinPatch(patched, "n1"), json::array());  // idempotent
  // Only the affinity and the tolerations changed; the VMI is not what gets pinned.
  json without = patched;
  without["spec"].erase("affinity");
  without["spec"].erase("tolerations");
  json original = pod;
  original["spec"].erase("affinity");
  EXPECT_EQ(without, original);
}

TEST(PodPinPatchE13, CreatesWhatIsMissing) {
  const json bare = {{"metadata", {{"name", "p"}}}, {"spec", {{"containers", json::array()}}}};
  const json term = {{"matchFields", {kOnN1}}};
  const json withPreferred = {
      {"spec",
       {{"affinity",
         {{"nodeAffinity",
           {{"preferredDuringSchedulingIgnoredDuringExecution", json::array()}}}}}}}};
  const json emptyTerms = {{"spec",
                            {{"affinity",
                              {{"nodeAffinity",
                                {{"requiredDuringSchedulingIgnoredDuringExecution",
                                  {{"nodeSelectorTerms", json::array()}}}}}}}}}};
  const json noSpec = {{"metadata", {{"name", "p"}}}};
  for (const json& pod :
       {bare, json{{"spec", {{"affinity", {{"podAntiAffinity", json::object()}}}}}}, withPreferred,
        emptyTerms, noSpec}) {
    const json patched = pod.patch(PodPinPatch(pod, "n1"));
    EXPECT_EQ(Terms(patched), json::array({term})) << pod;
    EXPECT_EQ(patched["spec"]["tolerations"], json::array({kCordon})) << pod;
    EXPECT_EQ(PodPinPatch(patched, "n1"), json::array()) << pod;
  }
  // Another node than the one pinned: the term gets the new node too (and is then unsatisfiable
  // unless the node is the same, as a pin must be); the toleration is there already.
  const json onN1 = bare.patch(PodPinPatch(bare, "n1"));
  EXPECT_EQ(PodPinPatch(onN1, "n2").size(), 1U);
}

// E13: the pin selects the Node by its name, not by a kubernetes.io/hostname label
// assumed to equal it. An installer that sets hostnames (gpu-host-17.example for Node n1) left
// the launcher pinned to `kubernetes.io/hostname In [n1]`, which no node matches: Pending
// forever. Also: a node whose hostname label happens to be another node's name gets nothing.
TEST(PodPinPatchE13, PinsByTheNodesNameWhenItsHostnameLabelDiffers) {
  const json pod = ReadTestdata("pod-create.json")["request"]["object"];
  const json patched = pod.patch(PodPinPatch(pod, "n1"));
  const json n1 = NodeNamed("n1", "gpu-host-17.example");
  EXPECT_EQ(cozy::testing::WhyNotOn(patched, n1), "") << patched["spec"].dump();
  EXPECT_NE(cozy::testing::WhyNotOn(patched, NodeNamed("n2", "n1")), "");
  EXPECT_NE(cozy::testing::WhyNotOn(patched, NodeNamed("n3", "n3")), "");
  // The same with no affinity of the pod's own.
  const json bare = {{"metadata", {{"name", "p"}}}, {"spec", {{"containers", json::array()}}}};
  const json pinned = bare.patch(PodPinPatch(bare, "n1"));
  EXPECT_EQ(cozy::testing::WhyNotOn(pinned, n1), "");
  EXPECT_NE(cozy::testing::WhyNotOn(pinned, NodeNamed("n2", "n1")), "");
}

// E13, D10: the binder answers Succeeded on a cordoned node (onCordon Stay, or no
// room elsewhere), so the launcher pinned there tolerates the cordon's taint, or it is never
// scheduled. Always added: the pin already decides the node, so the toleration lets the pod onto
// that one cordoned node and no other, and a cordon after the pod was admitted is covered too.
TEST(PodPinPatchE13D10, TheLauncherToleratesTheCordonOfItsPinnedNode) {
  const json pod = ReadTestdata("pod-create.json")["request"]["object"];
  const json patched = pod.patch(PodPinPatch(pod, "n1"));
  EXPECT_NE(cozy::testing::WhyNotOn(pod, NodeNamed("n1", "n1", true)), "") << "the cordon counts";
  EXPECT_EQ(cozy::testing::WhyNotOn(patched, NodeNamed("n1", "n1", true)), "");
  EXPECT_EQ(cozy::testing::WhyNotOn(patched, NodeNamed("n1", "gpu-host-17", true)), "");
  EXPECT_NE(cozy::testing::WhyNotOn(patched, NodeNamed("n2", "n2", true)), "")
      << "only the pinned one";
  EXPECT_NE(cozy::testing::WhyNotOn(patched, NodeNamed("n2", "n2")), "");
  // A pod's own tolerations are kept, and one that already tolerates the cordon gets no other.
  json tolerating = pod;
  tolerating["spec"]["tolerations"] = {{{"key", "gpu"}, {"operator", "Exists"}}};
  json afterwards = tolerating.patch(PodPinPatch(tolerating, "n1"));
  EXPECT_EQ(afterwards["spec"]["tolerations"],
            (json{{{"key", "gpu"}, {"operator", "Exists"}}, kCordon}));
  for (const json& already :
       {json{{"operator", "Exists"}},
        json{{"key", "node.kubernetes.io/unschedulable"}, {"operator", "Exists"}},
        json{{"key", "node.kubernetes.io/unschedulable"}, {"effect", "NoSchedule"}}}) {
    tolerating["spec"]["tolerations"] = json::array({already});
    afterwards = tolerating.patch(PodPinPatch(tolerating, "n1"));
    EXPECT_EQ(afterwards["spec"]["tolerations"], json::array({already}));
    EXPECT_EQ(cozy::testing::WhyNotOn(afterwards, NodeNamed("n1", "x", true)), "") << already;
  }
  // One for another effect does not tolerate it.
  tolerating["spec"]["tolerations"] = {{{"key", "node.kubernetes.io/unschedulable"},
                                        {"operator", "Exists"},
                                        {"effect", "NoExecute"}}};
  afterwards = tolerating.patch(PodPinPatch(tolerating, "n1"));
  EXPECT_EQ(afterwards["spec"]["tolerations"].size(), 2U);
}

// E13 on a tainted GPU pool: the binder placed the set where its classes'
// tolerations let it go, so the launcher pinned there carries them: without them it fits no node
// (Pending forever), with them only the pinned one. A toleration the pod carries already is not
// added twice, and a second call adds nothing.
TEST(PodPinPatchE13, TheLauncherCarriesItsClassesTolerations) {
  const json pod = ReadTestdata("pod-create.json")["request"]["object"];
  json pool = NodeNamed("n1", "n1");
  pool["spec"]["taints"] = {
      {{"key", "nvidia.com/gpu"}, {"value", "present"}, {"effect", "NoSchedule"}}};
  const std::vector<api::Toleration> classTolerations = {
      {"nvidia.com/gpu", "Exists", "", "NoSchedule"},
      {"gpu-maintenance", "Equal", "soon", "NoExecute", 600}};
  EXPECT_NE(cozy::testing::WhyNotOn(pod.patch(PodPinPatch(pod, "n1")), pool), "")
      << "without the class's toleration the pool's taint keeps the launcher off";
  const json patched = pod.patch(PodPinPatch(pod, "n1", classTolerations));
  EXPECT_EQ(cozy::testing::WhyNotOn(patched, pool), "") << patched["spec"].dump();
  json other = NodeNamed("n2", "n2");
  other["spec"]["taints"] = pool["spec"]["taints"];
  EXPECT_NE(cozy::testing::WhyNotOn(patched, other), "") << "the pin still decides the node";
  EXPECT_EQ(patched["spec"]["tolerations"],
            (json{kCordon,
                  {{"key", "nvidia.com/gpu"}, {"operator", "Exists"}, {"effect", "NoSchedule"}},
                  {{"key", "gpu-maintenance"},
                   {"operator", "Equal"},
                   {"value", "soon"},
                   {"effect", "NoExecute"},
                   {"tolerationSeconds", 600}}}));
  EXPECT_EQ(PodPinPatch(patched, "n1", classTolerations), json::array());
  // Two devices of one class: each toleration once.
  std::vector<api::Toleration> twice = classTolerations;
  twice.insert(twice.end(), classTolerations.begin(), classTolerations.end());
  EXPECT_EQ(pod.patch(PodPinPatch(pod, "n1", twice))["spec"]["tolerations"].size(), 3U);
}

// E13, E14: the VMI is named by the controller owner reference; a label that disagrees voids it,
// and a label alone names none (whoever creates a pod writes its labels).
TEST(LauncherVmiNameE13E14, TheControllerOwnerReferenceNamesTheVmiALabelAloneDoesNot) {
  json pod = ReadTestdata("pod-create.json")["request"]["object"];
  EXPECT_EQ(LauncherVmiName(pod), "vm1");
  pod["metadata"]["labels"]["vm.kubevirt.io/name"] = "vm2";
  EXPECT_EQ(LauncherVmiName(pod), std::nullopt);
  pod["metadata"]["labels"].erase("vm.kubevirt.io/name");
  EXPECT_EQ(LauncherVmiName(pod), "vm1");
  pod["metadata"]["ownerReferences"][0]["controller"] = false;
  EXPECT_EQ(LauncherVmiName(pod), std::nullopt);
  pod["metadata"]["labels"]["vm.kubevirt.io/name"] = "vm1";
  EXPECT_EQ(LauncherVmiName(pod), std::nullopt) << "a label alone";
  EXPECT_EQ(LauncherVmiName(json::object()), std::nullopt);
}

// E14: "Any tenant pod can pose as a VM's launcher": a tenant pod labelled as the launcher of its
// own running VMI, with a VMI owner reference it wrote itself, got the pin and the cordon and
// class tolerations. A launcher to the pod webhook is created by KubeVirt's controller, naming
// its VMI by a controller owner reference.
TEST(WhyNotALauncherE14, OnlyKubeVirtsControllerCreatesALauncher) {
  const std::string kubevirt = "system:serviceaccount:cozy-kubevirt:kubevirt-controller";
  AdmissionRequest request = DecodeAdmissionReview(ReadTestdata("pod-create.json"));
  EXPECT_EQ(WhyNotALauncher(request, kubevirt), std::nullopt);
  for (const std::string user : {"alice", "system:serviceaccount:tenant-a:default",
                                 "system:serviceaccount:cozy-kubevirt:virt-handler", ""}) {
    request.userInfo.username = user;
    const auto why = WhyNotALauncher(request, kubevirt);
    ASSERT_TRUE(why.has_value()) << user;
    EXPECT_NE(why->find("only KubeVirt's controller (" + kubevirt + ")"), std::string::npos)
        << *why;
  }
  request.userInfo.username = kubevirt;
  request.object["metadata"].erase("ownerReferences");
  const auto why = WhyNotALauncher(request, kubevirt);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("names no VirtualMachineInstance"), std::string::npos) << *why;
  // Another name for KubeVirt's controller (KubeVirt installed in another namespace).
  EXPECT_TRUE(WhyNotALauncher(request, "system:serviceaccount:kubevirt:kubevirt-controller"));
}

// E13: where a launcher goes is its devices' one node, with their classes' tolerations; a VMI
// with no device, a device not placed, or devices on two nodes refuse the launcher with the
// tenant's reason.
TEST(LauncherPinE13, TheDevicesOneNodeAndTheirClassesTolerationsOrTheReasonNot) {
  auto device = [](const std::string& name, const std::string& className,
                   std::optional<std::string> node) {
    api::GpuDevice d;
    d.metadata.namespaceName = "t1";
    d.metadata.name = name;
    d.spec.className = className;
    d.spec.count = 1;
    if (node) {
      d.status.phase = api::DevicePhase::kBound;
      d.status.nodeName = node;
    } else {
      d.status.phase = api::DevicePhase::kPending;
    }
    return d;
  };
  api::GpuClass pool;
  pool.metadata.name = "pool";
  pool.spec.tolerations = {{"nvidia.com/gpu", "Exists", "", "NoSchedule"}};
  api::GpuClass plain;
  plain.metadata.name = "plain";
  const std::vector<api::GpuClass> classes = {plain, pool};

  const LauncherPin pinned = PlanLauncherPin(
      "t1", "vm1", {device("a", "pool", "n1"), device("b", "plain", "n1")}, classes);
  EXPECT_EQ(pinned.refusal, std::nullopt);
  EXPECT_EQ(pinned.node, "n1");
  EXPECT_EQ(pinned.tolerations, pool.spec.tolerations);
  EXPECT_TRUE(AllPlaced({device("a", "pool", "n1")}));

  const LauncherPin none = PlanLauncherPin("t1", "vm1", {}, classes);
  EXPECT_EQ(none.refusal,
            "no GPUDevice in namespace t1 is attached to VirtualMachineInstance vm1: "
            "its GPUs were not attached");
  EXPECT_FALSE(AllPlaced({}));
  const LauncherPin pending =
      PlanLauncherPin("t1", "vm1", {device("a", "pool", "n1"), device("b", "plain", {})}, classes);
  EXPECT_EQ(pending.refusal,
            "GPUDevice b is Pending, not bound to a node; the launcher of vm1 would start "
            "without it");
  EXPECT_FALSE(AllPlaced({device("a", "pool", "n1"), device("b", "plain", {})}));
  const LauncherPin split = PlanLauncherPin(
      "t1", "vm1", {device("a", "pool", "n1"), device("b", "plain", "n2")}, classes);
  EXPECT_EQ(split.refusal, "the GPUDevices of vm1 are bound to different nodes");
  EXPECT_TRUE(split.node.empty());
}

}  // namespace
}  // namespace cozy::admission
