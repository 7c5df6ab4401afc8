// The gpu.cozystack.io types: their JSON mapping, the checks decoding shares with the CRDs,
// and the shared keys.
#include <gtest/gtest.h>

#include "api/gpuclass.h"
#include "api/gpudevice.h"
#include "api/gpunode_types.h"
#include "api/keys.h"

namespace cozy::api {
namespace {

using nlohmann::json;

json FullClass() {
  return json::parse(R"({
    "apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUClass",
    "metadata": {"name": "a100-40c", "uid": "u-1", "resourceVersion": "7",
                 "creationTimestamp": "2025-01-01T00:00:00Z",
                 "labels": {"tier": "gold"}, "annotations": {"note": "x"},
                 "finalizers": ["gpu.cozystack.io/class-protection"]},
    "spec": {"vendor": "NVIDIA", "model": "A100 80GB", "mode": "vgpu", "profile": "A100-40C",
             "memory": "40Gi", "maxCount": 2,
             "source": {"devicePlugin": {"resourceName": "nvidia.com/NVIDIA_A100-40C"}},
             "nodeSelector": {"matchLabels": {"gpu": "a100"},
                              "matchExpressions": [{"key": "zone", "operator": "In",
                                                    "values": ["a", "b"]}]},
             "onCordon": "Stay",
             "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                              "effect": "NoSchedule"},
                             {"key": "drain", "operator": "Equal", "value": "soon",
                              "effect": "NoExecute", "tolerationSeconds": 300},
                             {"operator": "Exists"}]}
  })");
}

// B10: a class carries what it sells (vendor, model, mode, profile, memory, maxCount, source)
// plus resourceName, nodeSelector and onCordon; a class with every field round-trips unchanged.
TEST(GpuClassB10, EveryFieldRoundTrips) {
  const json original = FullClass();
  const GpuClass decoded = GpuClassFromJson(original);
  EXPECT_EQ(decoded.spec.mode, GpuMode::kVgpu);
  EXPECT_EQ(decoded.spec.onCordon, OnCordon::kStay);
  EXPECT_EQ(decoded.spec.maxCount, 2);
  EXPECT_EQ(decoded.ResourceName(), "nvidia.com/NVIDIA_A100-40C");
  ASSERT_EQ(decoded.spec.tolerations.size(), 3U);  // a class's tolerations
  EXPECT_EQ(decoded.spec.tolerations[1].tolerationSeconds, 300);
  EXPECT_EQ(ToJson(decoded), original);
  EXPECT_EQ(GpuClassFromJson(ToJson(decoded)), decoded);
}

// B5: a passthrough class may sell through DRA instead of a device plugin; the model counts its
// units under a name no pod can request, the same for every class of one PCI ID.
TEST(GpuClassB5, DraSourceRoundTripsAndNamesItsUnits) {
  json object = FullClass();
  object["spec"]["mode"] = "passthrough";
  object["spec"].erase("profile");
  object["spec"]["source"] = {{"dra", {{"pciVendorSelector", "10DE:20b5"}}}};
  const GpuClass decoded = GpuClassFromJson(object);
  ASSERT_TRUE(decoded.IsDra());
  EXPECT_EQ(decoded.spec.source.dra->pciVendorSelector, "10DE:20b5");
  EXPECT_EQ(decoded.ResourceName(), "");
  EXPECT_EQ(decoded.UnitsName(), "DRA GPUs 10de:20b5");
  EXPECT_EQ(ToJson(decoded), object);
  EXPECT_FALSE(GpuClassFromJson(FullClass()).IsDra());
  EXPECT_EQ(GpuClassFromJson(FullClass()).UnitsName(), "nvidia.com/NVIDIA_A100-40C");
}

TEST(GpuClass, OnCordonDefaultsToMoveAndMaxCountStaysUnset) {
  json object = FullClass();
  object["spec"].erase("onCordon");
  object["spec"].erase("maxCount");
  const GpuClass decoded = GpuClassFromJson(object);
  EXPECT_EQ(decoded.spec.onCordon, OnCordon::kMove);
  EXPECT_FALSE(decoded.spec.maxCount.has_value()) << "B9: no default; the model resolves it";
}

struct BadClassCase {
  const char* what;
  std::function<void(json&)> mutate;
  const char* field;  // the path the error must name
};

// Decoding refuses what the CRD refuses (B4, B5, B8) and names the field, so `simulate` can
// say what is wrong and where.
TEST(GpuClass, RefusesMalformedNamingTheField) {
  const std::vector<BadClassCase> cases = {
      {"B4 total", [](json& o) { o["metadata"]["name"] = "total"; }, "metadata.name"},
      {"B5 dra on a vgpu class",  // FullClass is vgpu; dra sells whole functions
       [](json& o) {
         o["spec"]["source"] = {{"dra", {{"pciVendorSelector", "10DE:20B5"}}}};
       },
       "spec.source.dra"},
      {"B5 dra without a selector",
       [](json& o) {
         o["spec"]["mode"] = "passthrough";
         o["spec"]["source"] = {{"dra", json::object()}};
       },
       "spec.source.dra.pciVendorSelector"},
      {"B5 dra selector shape",
       [](json& o) {
         o["spec"]["mode"] = "passthrough";
         o["spec"]["source"] = {{"dra", {{"pciVendorSelector", "10DE:20B"}}}};
       },
       "spec.source.dra.pciVendorSelector"},
      {"B5 dra selector not hex",
       [](json& o) {
         o["spec"]["mode"] = "passthrough";
         o["spec"]["source"] = {{"dra", {{"pciVendorSelector", "10DE:2:B5"}}}};
       },
       "spec.source.dra.pciVendorSelector"},
      {"B5 two members",
       [](json& o) {
         o["spec"]["source"]["dra"] = {{"pciVendorSelector", "10DE:20B5"}};
       },
       "spec.source"},
      {"B5 unknown member", [](json& o) { o["spec"]["source"]["other"] = json::object(); },
       "spec.source.other"},
      {"B5 no member", [](json& o) { o["spec"]["source"] = json::object(); },
       "spec.source.devicePlugin"},
      {"B8 own group",
       [](json& o) { o["spec"]["source"]["devicePlugin"]["resourceName"] = "gpu.cozystack.io/x"; },
       "spec.source.devicePlugin.resourceName"},
      {"mode enum", [](json& o) { o["spec"]["mode"] = "mig"; }, "spec.mode"},
      {"onCordon enum", [](json& o) { o["spec"]["onCordon"] = "move"; }, "spec.onCordon"},
      {"maxCount 0", [](json& o) { o["spec"]["maxCount"] = 0; }, "spec.maxCount"},
      {"maxCount type", [](json& o) { o["spec"]["maxCount"] = "2"; }, "spec.maxCount"},
      {"memory", [](json& o) { o["spec"]["memory"] = "lots"; }, "spec.memory"},
      {"vendor missing", [](json& o) { o["spec"].erase("vendor"); }, "spec.vendor"},
      {"selector operator",
       [](json& o) { o["spec"]["nodeSelector"]["matchExpressions"][0]["operator"] = "Gt"; },
       "spec.nodeSelector.matchExpressions[0].operator"},
      {"label value type", [](json& o) { o["metadata"]["labels"]["tenant.cozystack.io/a"] = 1; },
       "metadata.labels[\"tenant.cozystack.io/a\"]"},
      // Tolerations as the API server validates a pod's; Gt and Lt tolerate
      // nothing (C9), so a class carrying one is refused rather than silently useless.
      {"toleration operator Gt", [](json& o) { o["spec"]["tolerations"][0]["operator"] = "Gt"; },
       "spec.tolerations[0].operator"},
      {"Exists with a value", [](json& o) { o["spec"]["tolerations"][0]["value"] = "x"; },
       "spec.tolerations[0].value"},
      {"empty key needs Exists", [](json& o) { o["spec"]["tolerations"][2]["operator"] = "Equal"; },
       "spec.tolerations[2]"},
      {"toleration effect", [](json& o) { o["spec"]["tolerations"][0]["effect"] = "NoRun"; },
       "spec.tolerations[0].effect"},
      {"tolerationSeconds without NoExecute",
       [](json& o) { o["spec"]["tolerations"][0]["tolerationSeconds"] = 5; },
       "spec.tolerations[0].tolerationSeconds"},
  };
  for (const BadClassCase& c : cases) {
    json object = FullClass();
    c.mutate(object);
    try {
      GpuClassFromJson(object);
      ADD_FAILURE() << c.what << ": accepted";
    } catch (const DecodeError& error) {
      EXPECT_EQ(error.field(), c.field) << c.what << ": " << error.what();
    }
  }
}

json FullDevice() {
  return json::parse(R"({
    "apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUDevice",
    "metadata": {"name": "gpu-1", "namespace": "tenant-a", "uid": "d-1"},
    "spec": {"className": "a100", "count": 2},
    "status": {"phase": "Bound", "nodeName": "n1",
               "attachment": {"vmiName": "vm1", "vmiUID": "vmi-uid"},
               "bindRequest": {"id": "r1", "requestedAt": "2025-01-01T00:00:00Z"},
               "bindResponse": {"id": "r1", "result": "Failed", "reason": "NoRoom",
                                "message": "no node has 2 free units"},
               "conditions": [{"type": "Bound", "status": "True", "reason": "Bound",
                               "message": "", "lastTransitionTime": "2025-01-01T00:00:00Z",
                               "observedGeneration": 1}]}
  })");
}

TEST(GpuDevice, EveryFieldRoundTrips) {
  const json original = FullDevice();
  const GpuDevice decoded = GpuDeviceFromJson(original);
  EXPECT_EQ(decoded.Phase(), DevicePhase::kBound);
  EXPECT_EQ(decoded.status.attachment->vmiUid, "vmi-uid");
  EXPECT_EQ(decoded.status.bindResponse->result, BindResult::kFailed);
  EXPECT_EQ(ToJson(decoded), original);
}

TEST(GpuDevice, NewOrderWithoutStatusIsPending) {
  json object = FullDevice();
  object.erase("status");
  EXPECT_EQ(GpuDeviceFromJson(object).Phase(), DevicePhase::kPending);
}

// B6: "a device's spec ... orders at least one GPU" (immutability is the CRD's, see crd_test).
TEST(GpuDeviceB6, RefusesCountBelowOneAndBadEnums) {
  const std::vector<std::pair<std::function<void(json&)>, std::string>> cases = {
      {[](json& o) { o["spec"]["count"] = 0; }, "spec.count"},
      {[](json& o) { o["spec"]["count"] = -1; }, "spec.count"},
      {[](json& o) { o["spec"]["count"] = 1.5; }, "spec.count"},
      {[](json& o) { o["spec"].erase("className"); }, "spec.className"},
      {[](json& o) { o["status"]["phase"] = "Running"; }, "status.phase"},
      {[](json& o) { o["status"]["bindResponse"]["result"] = "OK"; }, "status.bindResponse.result"},
      {[](json& o) { o["status"]["attachment"].erase("vmiName"); }, "status.attachment.vmiName"},
  };
  for (const auto& [mutate, field] : cases) {
    json object = FullDevice();
    mutate(object);
    try {
      GpuDeviceFromJson(object);
      ADD_FAILURE() << field << ": accepted";
    } catch (const DecodeError& error) {
      EXPECT_EQ(error.field(), field) << error.what();
    }
  }
}

TEST(GpuNodeInventory, ReadsUnitsPerResource) {
  const GpuNodeInventory inventory = GpuNodeInventoryFromJson(json::parse(R"({
    "kind": "GPUNode", "metadata": {"name": "n1"},
    "status": {"resourceNames": ["nvidia.com/A2-4Q"],
               "devices": [{"pciAddress": "0000:3b:00.0", "allocatable": 4, "allocated": 1,
                            "health": "Healthy",
                            "resources": [{"name": "nvidia.com/A2-4Q", "allocatable": 4,
                                           "allocated": 1}]}]}
  })"));
  ASSERT_EQ(inventory.devices.size(), 1U);
  EXPECT_EQ(inventory.nodeName, "n1");
  EXPECT_EQ(inventory.devices[0].resources[0].allocatable, 4);
  EXPECT_THROW(GpuNodeInventoryFromJson(json::parse(R"({"metadata": {"name": "n1"},
    "status": {"devices": [{"pciAddress": "x", "resources": [{"name": "r", "allocatable": -1}]}]}
  })")),
               DecodeError);
}

// B1: the quota keys are spelled once; these are the strings quotas and policies carry.
TEST(KeysB1, QuotaKeys) {
  EXPECT_EQ(ClassBudgetKey("a100"), "requests.gpu.cozystack.io/a100");
  EXPECT_EQ(ClassBudgetKey(kTotalBudgetName), kTotalBudgetKey);
  EXPECT_EQ(RawQuotaKey("nvidia.com/GA100"), "requests.nvidia.com/GA100");
}

}  // namespace
}  // namespace cozy::api
