// The reconciler's writes against the fake API server (docs/controller.md, "The reconciler: what
// each finalizer waits for"): a write that fails backs off its own object, growing while it keeps
// failing, and every other object's writes go on; a conflict holds its object only while the plan
// reads the version it conflicted on.
#include "controller/reconciler/apply.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "api/keys.h"
#include "controller/kinds.h"
#include "test/kube/kube_test_support.h"
#include "test/support/gpu_objects.h"

namespace cozy::controller {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

class ApplierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = testing::StartChartApiServer();
    // No client retries: each write is one request, so the log counts attempts.
    client_ = std::make_unique<kube::Client>(testing::ConfigFor(*server_),
                                             testing::TestClientOptions(time_, 0));
    for (const std::string name : {"a", "b"}) server_->Seed(testing::GpuClassObject(name));
    applier_ = std::make_unique<Applier>(*client_, leading_);
  }

  static std::string ClassPath(const std::string& name) { return kGpuClasses.Path("", name); }
  std::string Version(const std::string& name) {
    return client_->Get(ClassPath(name))["metadata"]["resourceVersion"].get<std::string>();
  }
  bool HasFinalizer(const std::string& name) {
    const json finalizers =
        client_->Get(ClassPath(name))["metadata"].value("finalizers", json::array());
    return finalizers == json::array({std::string(api::kClassFinalizer)});
  }
  // The plan's action for the class as the cache shows it at `version` (now's, by default).
  Action AddFinalizer(const std::string& name, std::string version = "") {
    Action action;
    action.kind = ActionKind::kAddClassFinalizer;
    action.name = name;
    action.resourceVersion = version.empty() ? Version(name) : version;
    action.body = {{"metadata", {{"finalizers", {std::string(api::kClassFinalizer)}}}}};
    action.reason = "test";
    return action;
  }
  size_t PatchesTo(const std::string& name) {
    return testing::RequestsTo(*server_, "PATCH", ClassPath(name)).size();
  }
  void FailPatchesTo(const std::string& name, int status) {
    fake::Fault fault = fake::Fault::Answer(status, -1, "PATCH");
    fault.pathPrefix = ClassPath(name);
    server_->AddFault(fault);
  }
  static int64_t Writes(const ApplyCounts& counts, const std::string& result) {
    auto found = counts.writes.find({"GPUClass", result});
    return found == counts.writes.end() ? 0 : found->second;
  }

  kube::FakeTimeSource time_;
  std::unique_ptr<fake::FakeApiServer> server_;
  std::unique_ptr<kube::Client> client_;
  kube::Leadership leading_{true};
  std::unique_ptr<Applier> applier_;
  const std::chrono::steady_clock::time_point t0_{std::chrono::hours(1)};
};

// Every action kind writes the object of its target kind, at that kind's path: a kind added to
// ActionKind must be named by TargetKind (-Wswitch) and have a path here.
TEST(ActionPath, EachActionKindWritesItsTargetKindsObject) {
  const std::vector<std::pair<ActionKind, std::string>> cases = {
      {ActionKind::kAddClassFinalizer, "/apis/gpu.cozystack.io/v1alpha1/gpuclasses/x"},
      {ActionKind::kRemoveClassFinalizer, "/apis/gpu.cozystack.io/v1alpha1/gpuclasses/x"},
      {ActionKind::kAddDeviceFinalizer,
       "/apis/gpu.cozystack.io/v1alpha1/namespaces/ns/gpudevices/x"},
      {ActionKind::kRemoveDeviceFinalizer,
       "/apis/gpu.cozystack.io/v1alpha1/namespaces/ns/gpudevices/x"},
      {ActionKind::kStampAttachment, "/apis/gpu.cozystack.io/v1alpha1/namespaces/ns/gpudevices/x"},
      {ActionKind::kMatchAttachment, "/apis/gpu.cozystack.io/v1alpha1/namespaces/ns/gpudevices/x"},
      {ActionKind::kClearAttachment, "/apis/gpu.cozystack.io/v1alpha1/namespaces/ns/gpudevices/x"},
      {ActionKind::kReleaseDevice, "/apis/gpu.cozystack.io/v1alpha1/namespaces/ns/gpudevices/x"},
      {ActionKind::kDeleteTemplateDevice,
       "/apis/gpu.cozystack.io/v1alpha1/namespaces/ns/gpudevices/x"},
      {ActionKind::kApplyMonitor, "/apis/cozystack.io/v1alpha1/namespaces/ns/workloadmonitors/x"},
      {ActionKind::kDeleteMonitor, "/apis/cozystack.io/v1alpha1/namespaces/ns/workloadmonitors/x"},
      {ActionKind::kApplyRecord, "/apis/cozystack.io/v1alpha1/namespaces/ns/workloads/x"},
      {ActionKind::kDeleteRecord, "/apis/cozystack.io/v1alpha1/namespaces/ns/workloads/x"},
      {ActionKind::kApplySettings, "/api/v1/namespaces/ns/configmaps/x"},
  };
  for (const auto& [kind, path] : cases) {
    Action action;
    action.kind = kind;
    action.namespaceName =
        kind == ActionKind::kAddClassFinalizer || kind == ActionKind::kRemoveClassFinalizer ? ""
                                                                                            : "ns";
    action.name = "x";
    EXPECT_EQ(ActionPath(action), path) << ToString(kind);
  }
  Action release;
  release.kind = ActionKind::kReleaseDevice;
  release.namespaceName = "ns";
  release.name = "x";
  EXPECT_EQ(ActionPath(release, true),
            "/apis/gpu.cozystack.io/v1alpha1/namespaces/ns/gpudevices/x/status");
}

TEST_F(ApplierTest, OneFailingObjectBacksOffAloneWhileTheOthersAreWritten) {
  FailPatchesTo("a", 503);
  ApplyCounts counts = applier_->Apply({AddFinalizer("a"), AddFinalizer("b")}, t0_);
  EXPECT_EQ(Writes(counts, "error"), 1);
  EXPECT_EQ(Writes(counts, "ok"), 1) << "the write after the failing one is made";
  EXPECT_TRUE(HasFinalizer("b"));
  EXPECT_EQ(counts.retryAt, t0_ + 1s);
  EXPECT_EQ(counts.backingOff, 1u);
  EXPECT_EQ(PatchesTo("a"), 1u);

  // Passes before its delay is over leave it alone (no request), whatever else they do.
  counts = applier_->Apply({AddFinalizer("a")}, t0_ + 500ms);
  EXPECT_EQ(counts.heldOff, 1);
  EXPECT_EQ(Writes(counts, "backoff"), 1);
  EXPECT_EQ(PatchesTo("a"), 1u);
  EXPECT_EQ(counts.retryAt, t0_ + 1s) << "the pass to run then";

  // Tried again at its retry; failing again doubles its delay.
  counts = applier_->Apply({AddFinalizer("a")}, t0_ + 1s);
  EXPECT_EQ(PatchesTo("a"), 2u);
  EXPECT_EQ(counts.retryAt, t0_ + 3s);

  server_->ClearFaults();
  counts = applier_->Apply({AddFinalizer("a")}, t0_ + 2s);
  EXPECT_EQ(PatchesTo("a"), 2u) << "still within its 2 s";
  EXPECT_FALSE(HasFinalizer("a"));
  counts = applier_->Apply({AddFinalizer("a")}, t0_ + 3s);
  EXPECT_EQ(Writes(counts, "ok"), 1);
  EXPECT_TRUE(HasFinalizer("a"));
  EXPECT_EQ(counts.retryAt, std::nullopt);
  EXPECT_EQ(counts.backingOff, 0u);
}

TEST_F(ApplierTest, AConflictWaitsOnlyUntilTheCacheShowsANewerVersion) {
  const std::string stale = Version("a");
  json labelled = client_->Get(ClassPath("a"));
  labelled["metadata"]["labels"] = {{"hoster", "x"}};
  client_->Update(ClassPath("a"), labelled);  // someone else writes first

  ApplyCounts counts = applier_->Apply({AddFinalizer("a", stale)}, t0_);
  EXPECT_EQ(Writes(counts, "conflict"), 1);
  EXPECT_EQ(counts.retryAt, t0_ + 1s);
  counts = applier_->Apply({AddFinalizer("a", stale)}, t0_ + 100ms);
  EXPECT_EQ(counts.heldOff, 1) << "planned from the version that conflicted";
  EXPECT_EQ(PatchesTo("a"), 1u);

  counts = applier_->Apply({AddFinalizer("a")}, t0_ + 100ms);  // the watch delivered the write
  EXPECT_EQ(Writes(counts, "ok"), 1) << "a newer version goes at once";
  EXPECT_TRUE(HasFinalizer("a"));
  EXPECT_EQ(counts.backingOff, 0u);
}

TEST_F(ApplierTest, AnObjectDeletedWhileItBacksOffIsForgotten) {
  FailPatchesTo("a", 500);
  applier_->Apply({AddFinalizer("a")}, t0_);
  server_->ClearFaults();
  client_->Delete(ClassPath("a"));
  const ApplyCounts counts = applier_->Apply({AddFinalizer("a", "1")}, t0_ + 1s);
  EXPECT_EQ(Writes(counts, "gone"), 1);
  EXPECT_EQ(counts.backingOff, 0u);
  EXPECT_EQ(counts.retryAt, std::nullopt) << "no pass is asked for an object that is gone";
}

}  // namespace
}  // namespace cozy::controller
