// The GPUDevice order webhook's decisions (E1-E4): an unknown or deleting class, room on one
// node, budgets up the tenant tree and the vGPU entitlement, each from the model's own check.
// Each test names the catalog ID it covers; the VMI and launcher-pod webhooks' decisions are in
// admission_vmi_test.cpp.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "api/device_references.h"
#include "api/keys.h"
#include "api/validation.h"
#include "controller/admission/orders.h"
#include "controller/admission/pod.h"
#include "controller/admission/review.h"
#include "controller/admission/vmi.h"
#include "controller/model/readers.h"
#include "test/controller/admission_fixtures.h"
#include "test/controller/model_fixtures.h"
#include "test/support/snapshot_fixture.h"

namespace cozy::admission {
namespace {

using namespace cozy::admission::testing;
using namespace cozy::model::testing;
using namespace cozy::testing;
using api::DevicePhase;
using model::Snapshot;
using nlohmann::json;

api::GpuDevice Order(const std::string& ns, const std::string& className, int64_t count) {
  return MakeDevice(ns, "gpu1", className, count);
}

std::optional<std::string> Check(const Snapshot& snapshot, const api::GpuDevice& order) {
  const model::Model model(snapshot);
  return CheckOrder(model, snapshot, order);
}

// ---- the GPUDevice webhook ----

// E1: "refuses an order that cannot be met now: an unknown or deleted class, maxCount"
TEST(OrderCheckE1, UnknownClassIsRefused) {
  Snapshot snapshot = BaseSnapshot();
  AddNode(snapshot, "n1", 4);
  const std::optional<std::string> refusal = Check(snapshot, Order("tenant-a", "h100", 1));
  EXPECT_TRUE(Contains(refusal, "no GPUClass h100 exists")) << refusal.value_or("admitted");
  EXPECT_TRUE(Contains(refusal, "GPUDevice tenant-a/gpu1 orders 1 GPU of class h100"));
  EXPECT_EQ(Check(snapshot, Order("tenant-a", "a100", 1)), std::nullopt);
}

TEST(OrderCheckE1, ClassBeingDeletedIsRefused) {
  Snapshot snapshot = BaseSnapshot();
  AddNode(snapshot, "n1", 4);
  snapshot.classes[0].metadata.deletionTimestamp = "2026-12-01T10:00:00Z";
  EXPECT_TRUE(Contains(Check(snapshot, Order("tenant-a", "a100", 1)), "is being deleted"));
}

TEST(OrderCheckE1, CountOverTheResolvedMaxCountIsRefused) {
  Snapshot snapshot = BaseSnapshot();
  snapshot.classes = {MakeClass("a100", kA100, api::GpuMode::kPassthrough, 2),
                      MakeClass("a2-4q", kA2Vgpu, api::GpuMode::kVgpu)};  // vgpu: maxCount 1
  snapshot.namespaces[0].labels[std::string(api::kVgpuEntitledLabel)] = "true";
  AddNode(snapshot, "n1", 4);
  AddNode(snapshot, "n2", 4, kA2Vgpu);
  EXPECT_TRUE(Contains(Check(snapshot, Order("tenant-a", "a100", 3)), "allows at most 2 GPUs"));
  EXPECT_EQ(Check(snapshot, Order("tenant-a", "a100", 2)), std::nullopt);
  EXPECT_TRUE(Contains(Check(snapshot, Order("tenant-a", "a2-4q", 2)), "allows at most 1 GPU "));
  EXPECT_EQ(Check(snapshot, Order("tenant-a", "a2-4q", 1)), std::nullopt);
}

// E2: "the class's free units or one node's" — 2+2 free on two nodes: 3 refused, 2 admitted.
TEST(OrderCheckE2, NoSingleNodeHasRoom) {
  Snapshot snapshot = BaseSnapshot();
  AddNode(snapshot, "n1", 2);
  AddNode(snapshot, "n2", 2);
  const std::optional<std::string> refusal = Check(snapshot, Order("tenant-a", "a100", 3));
  EXPECT_TRUE(Contains(refusal, "4 are free in all, at most 2 on node n1"))
      << refusal.value_or("admitted");
  EXPECT_EQ(Check(snapshot, Order("tenant-a", "a100", 2)), std::nullopt);
}

TEST(OrderCheckE2, OnlyNodesThatTakeBindsCount) {
  Snapshot snapshot = BaseSnapshot();
  AddNode(snapshot, "n1", 2);
  AddNode(snapshot, "n2", 4);
  snapshot.nodes.MutableAt(1).unschedulable = true;  // cordoned: its 4 free units take no order
  snapshot.pods = {MakePod("tenant-b", "raw", "n1", kA100, 1)};
  const std::optional<std::string> refusal = Check(snapshot, Order("tenant-a", "a100", 2));
  EXPECT_TRUE(Contains(refusal, "only 1 are free")) << refusal.value_or("admitted");
  EXPECT_EQ(Check(snapshot, Order("tenant-a", "a100", 1)), std::nullopt);
}

// E3: "a budget of the tenant or an ancestor" — parent budget full, child has room: refused.
TEST(OrderCheckE3, AncestorBudgetFullRefuses) {
  Snapshot snapshot = BaseSnapshot();
  AddNode(snapshot, "n1", 8);
  snapshot.quotas = {MakeQuota("tenant-a", {{"requests.gpu.cozystack.io/a100", "2"}}),
                     MakeQuota("tenant-a-b", {{"requests.gpu.cozystack.io/a100", "4"}})};
  snapshot.devices = {Bound("tenant-a", "held", "a100", 2, "n1")};
  const std::optional<std::string> refusal = Check(snapshot, Order("tenant-a-b", "a100", 1));
  EXPECT_TRUE(Contains(refusal, "requests.gpu.cozystack.io/a100 of tenant-a is 2 with 2 used"))
      << refusal.value_or("admitted");
  EXPECT_TRUE(Contains(refusal, "0 of class a100 remain to order in tenant-a-b"));
  snapshot.quotas[0].hard["requests.gpu.cozystack.io/a100"] = "3";
  EXPECT_EQ(Check(snapshot, Order("tenant-a-b", "a100", 1)), std::nullopt);
}

TEST(OrderCheckE3, PendingOrdersCountAndTheTotalBudgetToo) {
  Snapshot snapshot = BaseSnapshot();
  AddNode(snapshot, "n1", 8);
  snapshot.quotas = {MakeQuota("tenant-root", {{"requests.gpu.cozystack.io/total", "3"}})};
  snapshot.devices = {Pending("tenant-b", "waiting", "a100", 2)};
  EXPECT_TRUE(Contains(Check(snapshot, Order("tenant-a", "a100", 2)), "total of tenant-root"));
  EXPECT_EQ(Check(snapshot, Order("tenant-a", "a100", 1)), std::nullopt);
}

TEST(OrderCheckE3, ARawKeyAloneBlocksTheClass) {
  Snapshot snapshot = BaseSnapshot();
  AddNode(snapshot, "n1", 8);
  snapshot.quotas = {MakeQuota("tenant-a", {{"requests.nvidia.com/GA100", "8"}})};
  const model::Model model(snapshot);
  EXPECT_TRUE(model.Remaining("tenant-a", "a100").blockedByRawKey);
  EXPECT_TRUE(Contains(CheckOrder(model, snapshot, Order("tenant-a", "a100", 1)),
                       "the raw quota key requests.nvidia.com/GA100 of tenant-a blocks class"));
}

// A namespace that is no tenant's has no ancestors: no budget applies unless its own quota.
TEST(OrderCheckE3, NonTenantNamespaceHasOnlyItsOwnBudgets) {
  Snapshot snapshot = BaseSnapshot();
  AddNode(snapshot, "n1", 8);
  snapshot.quotas = {MakeQuota("tenant-root", {{"requests.gpu.cozystack.io/total", "0"}})};
  EXPECT_EQ(Check(snapshot, Order("hoster-lab", "a100", 4)), std::nullopt);
  EXPECT_TRUE(Contains(Check(snapshot, Order("tenant-a", "a100", 1)), "tenant-root"));
  snapshot.quotas.push_back(MakeQuota("hoster-lab", {{"requests.gpu.cozystack.io/a100", "2"}}));
  EXPECT_TRUE(Contains(Check(snapshot, Order("hoster-lab", "a100", 4)), "of hoster-lab is 2"));
}

// E4: "or a vGPU class without the entitlement" — no entitlement: vgpu refused, passthrough
// admitted.
TEST(OrderCheckE4, VgpuNeedsTheEntitlementOnTheTenantOrAnAncestor) {
  Snapshot snapshot = BaseSnapshot();
  snapshot.classes.push_back(MakeClass("a2-4q", kA2Vgpu, api::GpuMode::kVgpu, 4));
  AddNode(snapshot, "n1", 4);
  AddNode(snapshot, "n2", 1, kA2Vgpu, 4);
  const std::optional<std::string> refusal = Check(snapshot, Order("tenant-a-b", "a2-4q", 1));
  EXPECT_TRUE(Contains(refusal, "not entitled to vGPUs")) << refusal.value_or("admitted");
  EXPECT_TRUE(Contains(refusal, "gpu.cozystack.io/vgpu-entitled=true"));
  EXPECT_EQ(Check(snapshot, Order("tenant-a-b", "a100", 1)), std::nullopt);
  // On an ancestor (tenant-a) it covers the sub-tenant; on a sibling it does not.
  snapshot.namespaces[3].labels[std::string(api::kVgpuEntitledLabel)] = "true";  // tenant-b
  EXPECT_TRUE(Contains(Check(snapshot, Order("tenant-a-b", "a2-4q", 1)), "not entitled"));
  snapshot.namespaces[1].labels[std::string(api::kVgpuEntitledLabel)] = "true";  // tenant-a
  EXPECT_EQ(Check(snapshot, Order("tenant-a-b", "a2-4q", 1)), std::nullopt);
  snapshot.namespaces[1].labels[std::string(api::kVgpuEntitledLabel)] = "false";
  EXPECT_TRUE(Contains(Check(snapshot, Order("tenant-a-b", "a2-4q", 1)), "not entitled"));
}

// The review as the API server sends it, through the check, to the answer it gets back.
TEST(OrderCheckE2, FromTheReviewToTheAnswer) {
  Snapshot snapshot = BaseSnapshot();
  AddNode(snapshot, "n1", 2);
  AddNode(snapshot, "n2", 2);
  const model::Model model(snapshot);
  const AdmissionRequest request = DecodeAdmissionReview(ReadTestdata("gpudevice-create.json"));
  const std::optional<std::string> refusal =
      CheckOrder(model, snapshot, api::GpuDeviceFromJson(request.object));
  ASSERT_TRUE(refusal);
  const json answer = EncodeAdmissionReview(Refuse(request, *refusal));
  EXPECT_EQ(answer["response"]["uid"], request.uid);
  EXPECT_EQ(answer["response"]["status"]["code"], 403);
  EXPECT_EQ(answer["response"]["status"]["message"],
            "GPUDevice tenant-a/gpu1 orders 3 GPUs of class a100, but no single node has that "
            "many free: 4 are free in all, at most 2 on node n1, and one order's GPUs must share "
            "a node");
}

// ---- the model's per-class queries the checks read ----

TEST(ModelRoomE2, FreeUnitsAndTheLargestNodeWithoutTheWholeView) {
  Snapshot snapshot = BaseSnapshot();
  AddNode(snapshot, "n1", 2);
  AddNode(snapshot, "n2", 3);
  AddNode(snapshot, "n3", 8);
  snapshot.nodes.MutableAt(2).ready = false;  // takes no binds: its units are not free to order
  snapshot.devices = {Bound("tenant-a", "held", "a100", 1, "n2")};
  const model::Model model(snapshot);
  const std::optional<model::ClassRoom> room = model.Room("a100");
  ASSERT_TRUE(room);
  EXPECT_EQ(room->free, 4);
  EXPECT_EQ(room->largestNodeFree, 2);
  EXPECT_EQ(room->largestNode, "n1");  // a tie goes to the first by name
  EXPECT_EQ(room->maxCount, std::nullopt);
  EXPECT_EQ(model.Room("h100"), std::nullopt);
  // The same numbers as the whole view.
  const model::ClusterView view = model.View();
  EXPECT_EQ(view.classes[0].free, room->free);
}

TEST(ModelCheckNewOrderE3, SeveralClassesTogetherAgainstTheTotal) {
  Snapshot snapshot = BaseSnapshot();
  snapshot.classes.push_back(MakeClass("l40s", "nvidia.com/AD102GL_L40S"));
  snapshot.quotas = {MakeQuota("tenant-a", {{"requests.gpu.cozystack.io/total", "3"}})};
  const model::Model model(snapshot);
  EXPECT_EQ(model.CheckNewOrder("tenant-a", {{"a100", 2}, {"l40s", 1}}), std::nullopt);
  EXPECT_TRUE(
      Contains(model.CheckNewOrder("tenant-a", {{"a100", 2}, {"l40s", 2}}), "the order needs 4"));
  EXPECT_EQ(model.CheckNewOrder("tenant-b", {{"a100", 9}}), std::nullopt);
}

}  // namespace
}  // namespace cozy::admission
