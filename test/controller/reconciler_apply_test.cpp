// The reconcilers' writes against the fake API server (docs/controller.md, "The reconcilers",
// "The reconciler: what each finalizer waits for"): one applier writes every reconciler's actions
// to the target each declares; a reconciler declared in a test alone is run by the pass and its
// actions written; a write that fails backs off its own object, growing while it keeps failing,
// and every other object's writes go on; a conflict holds its object only while the plan reads
// the version it conflicted on.
#include "controller/reconciler/apply.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "api/keys.h"
#include "api/time.h"
#include "api/usage_record.h"
#include "controller/kinds.h"
#include "controller/reconciler/loop.h"
#include "controller/reconciler/reconcilers.h"
#include "controller/reconciler/shared.h"
#include "runtime/loop.h"
#include "runtime/metrics.h"
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
    action.what = "add-class-finalizer";
    action.target = Target{api::kGpuClassKind, kGpuClasses, "", name, ""};
    action.verb = Verb::kMergePatch;
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

// A cluster in which every standard reconciler plans every action it knows, each on an object of
// its own (ns: tenant devices, their records and monitor; ns2 a namespace with no monitor yet;
// ns3 one whose monitor nothing holds now).
ReconcileInput EveryAction() {
  using api::GpuDevice;
  const auto now = std::chrono::system_clock::now();
  ReconcileInput input;
  input.now = now;
  input.attachmentGrace = 60s;
  auto addClass = [&](const std::string& name, bool finalizer, bool deleting) {
    api::GpuClass c;
    c.metadata.name = name;
    c.metadata.resourceVersion = "1";
    if (finalizer) c.metadata.finalizers = {std::string(api::kClassFinalizer)};
    if (deleting) c.metadata.deletionTimestamp = "2026-12-01T09:00:00Z";
    input.classes.push_back(std::make_shared<api::GpuClass>(c));
  };
  addClass("a100", false, false);
  addClass("t4", true, true);
  auto device = [](const std::string& ns, const std::string& name) {
    GpuDevice d;
    d.metadata.namespaceName = ns;
    d.metadata.name = name;
    d.metadata.uid = name + "-uid";
    d.metadata.resourceVersion = "1";
    d.metadata.finalizers = {std::string(api::kDeviceFinalizer)};
    d.spec.className = "a100";
    return d;
  };
  auto bound = [](GpuDevice d) {
    d.status.phase = api::DevicePhase::kBound;
    d.status.nodeName = "n1";
    return d;
  };
  auto attached = [](GpuDevice d, const std::string& vmi, const std::string& uid,
                     const std::string& at) {
    d.status.attachment = api::Attachment{vmi, uid, at};
    return d;
  };
  std::vector<GpuDevice> devices;
  devices.push_back(device("ns", "new"));
  devices.back().metadata.finalizers.clear();
  devices.push_back(device("ns", "gone"));
  devices.back().metadata.deletionTimestamp = "2026-12-01T09:00:00Z";
  devices.push_back(attached(device("ns", "stamp"), "vm-s", "", ""));
  devices.push_back(attached(device("ns", "match"), "vm-m", "", api::FormatTime(now - 10s)));
  devices.push_back(attached(device("ns", "clear"), "vm-c", "vm-c-uid", ""));
  devices.push_back(attached(device("ns", "tmpl"), "vm-t", "vm-t-uid", ""));
  devices.back().metadata.labels[std::string(api::kTemplateDeviceLabel)] = "true";
  devices.push_back(bound(device("ns", "held")));
  devices.back().metadata.finalizers.insert(devices.back().metadata.finalizers.begin(),
                                            "example.com/hold");
  devices.back().metadata.deletionTimestamp = "2026-12-01T09:00:00Z";
  devices.push_back(bound(device("ns", "bound")));
  devices.push_back(bound(device("ns2", "other")));
  for (const GpuDevice& d : devices) input.devices.push_back(std::make_shared<GpuDevice>(d));
  input.vmis = [now](const std::string&, const std::string& name) {
    return name == "vm-m" ? VmiState{VmiState::Presence::kPresent, "vm-m-uid", api::FormatTime(now),
                                     "", nullptr}
                          : VmiState{VmiState::Presence::kAbsent, "", "", "", nullptr};
  };
  input.usageRecords = true;
  json orphan = api::UsageRecord(bound(device("ns", "orphan")));
  orphan["metadata"]["resourceVersion"] = "1";
  input.records["ns/gpudevice-orphan"] = std::make_shared<json>(orphan);
  input.monitors["ns"] = std::make_shared<json>(api::UsageMonitor("ns"));
  input.monitors["ns3"] = std::make_shared<json>(api::UsageMonitor("ns3"));
  input.settings = ReconcileInput::Settings{};
  return input;
}

// One applier writes every reconciler's actions, each to the target its reconciler declares and
// by its verb: every action's object is at the path of its kind (what the old switch over action
// kinds routed), and the request the applier sent is that object's (its collection's, for a
// create). No action is routed by which reconciler planned it.
TEST_F(ApplierTest, OneApplierWritesEveryReconcilersActionsToTheTargetEachDeclares) {
  const std::string gpu = "/apis/gpu.cozystack.io/v1alpha1/";
  const std::string cozy = "/apis/cozystack.io/v1alpha1/namespaces/";
  const std::map<std::string, std::pair<std::string, std::string>> expected = {
      {"add-class-finalizer", {"PATCH", gpu + "gpuclasses/a100"}},
      {"remove-class-finalizer", {"PATCH", gpu + "gpuclasses/t4"}},
      {"add-device-finalizer", {"PATCH", gpu + "namespaces/ns/gpudevices/new"}},
      {"remove-device-finalizer", {"PATCH", gpu + "namespaces/ns/gpudevices/gone"}},
      {"stamp-attachment", {"PATCH", gpu + "namespaces/ns/gpudevices/stamp/status"}},
      {"match-attachment", {"PATCH", gpu + "namespaces/ns/gpudevices/match/status"}},
      {"clear-attachment", {"PATCH", gpu + "namespaces/ns/gpudevices/clear/status"}},
      {"release-device", {"PATCH", gpu + "namespaces/ns/gpudevices/held/status"}},
      {"delete-template-device", {"DELETE", gpu + "namespaces/ns/gpudevices/tmpl"}},
      {"apply-usage-monitor", {"POST", cozy + "ns2/workloadmonitors/cozy-gpu-usage"}},
      {"delete-usage-monitor", {"DELETE", cozy + "ns3/workloadmonitors/cozy-gpu-usage"}},
      {"apply-usage-record", {"POST", cozy + "ns/workloads/gpudevice-bound"}},
      {"delete-usage-record", {"DELETE", cozy + "ns/workloads/gpudevice-orphan"}},
      {"apply-settings", {"POST", "/api/v1/namespaces/cozy-system/configmaps/cozy-gpu-settings"}},
  };
  const Plan plan = PlanReconcile(EveryAction());
  std::set<std::string> planned, reconcilers;
  for (const Action& action : plan.actions) {
    planned.insert(action.what);
    reconcilers.insert(action.reconciler);
    ASSERT_TRUE(expected.count(action.what)) << action.what;
    EXPECT_EQ(action.target.Path(), expected.at(action.what).second) << action.what;
  }
  EXPECT_EQ(planned.size(), expected.size()) << "every action kind, one each";
  EXPECT_EQ(reconcilers,
            (std::set<std::string>{"class-finalizers", "devices", "usage-records", "settings"}));

  const size_t before = testing::Writes(*server_).size();
  const ApplyCounts counts = applier_->Apply(plan.actions, t0_);
  const std::vector<fake::LoggedRequest> writes = testing::Writes(*server_);
  ASSERT_EQ(writes.size() - before, plan.actions.size()) << "one request for each action";
  for (size_t i = 0; i < plan.actions.size(); ++i) {
    const Action& action = plan.actions[i];
    const fake::LoggedRequest& request = writes[before + i];
    const auto& [method, path] = expected.at(action.what);
    EXPECT_EQ(request.method, method) << action.what;
    EXPECT_EQ(request.path, method == "POST" ? path.substr(0, path.rfind('/')) : path)
        << action.what;
  }
  int64_t byReconciler = 0;
  for (const auto& [key, count] : counts.byReconciler) byReconciler += count;
  EXPECT_EQ(byReconciler, static_cast<int64_t>(plan.actions.size()));
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

// A reconciler declared here and nowhere else (no other file names it), the one
// docs/controller.md's "Adding a reconciler" adds: it notes on each class the resource name its
// devices are counted in. Registered in the list a loop is given, its actions are planned by the
// pass and written by the one applier, and its metrics carry its name.
class ClassResourceNotes : public Reconciler {
 public:
  std::string_view Name() const override { return "class-notes"; }
  std::vector<Part> Reads() const override { return {Part::kClasses}; }
  controller::Plan Plan(const ReconcileInput& input) const override {
    controller::Plan plan;
    for (const auto& gpuClass : input.classes) {
      const api::ObjectMeta& meta = gpuClass->metadata;
      const std::string name = gpuClass->ResourceName();
      const auto noted = meta.annotations.find("example.com/resource-name");
      if (noted != meta.annotations.end() && noted->second == name) continue;
      plan.actions.push_back(reconciler::ObjectAction(
          "note-class-resource", reconciler::ClassTarget(meta), Verb::kMergePatch, meta,
          {{"metadata", {{"annotations", {{"example.com/resource-name", name}}}}}},
          "the class's resource name, noted"));
    }
    return plan;
  }
};

// The caches, as far as the toy reads them: class "a" as the API server holds it, its
// protection finalizer shown already (so the standard reconcilers plan nothing for it).
class ClassA : public ReconcilerSource {
 public:
  explicit ClassA(kube::Client& client) : client_(client) {}
  bool ReconcilerCachesSynced() const override { return true; }
  ReconcileInput BuildInput() const override {
    const json stored = client_.Get(kGpuClasses.Path("", "a"));
    api::GpuClass a;
    a.metadata.name = "a";
    a.metadata.resourceVersion = stored["metadata"]["resourceVersion"].get<std::string>();
    a.metadata.annotations =
        stored["metadata"].value("annotations", std::map<std::string, std::string>());
    a.metadata.finalizers = {std::string(api::kClassFinalizer)};
    a.spec.source.devicePlugin.resourceName = "nvidia.com/GA100";
    ReconcileInput input;
    input.now = std::chrono::system_clock::now();
    input.classes.push_back(std::make_shared<api::GpuClass>(a));
    input.vmis = [](const std::string&, const std::string&) { return VmiState{}; };
    return input;
  }

 private:
  kube::Client& client_;
};

TEST_F(ApplierTest, AReconcilerDeclaredInATestIsRunByThePassAndItsActionsApplied) {
  runtime::Loop loop;
  ClassA source(*client_);
  Reconcilers reconcilers = StandardReconcilers();
  reconcilers.push_back(std::make_unique<ClassResourceNotes>());  // its registration line
  ReconcilerLoop reconciler(loop, *client_, leading_, source, std::chrono::hours(1), nullptr,
                            std::move(reconcilers));
  std::thread thread([&] { loop.Run(); });
  loop.Post([&] {
    reconciler.Start();
    reconciler.Trigger();
  });
  std::string noted;
  for (int i = 0; i < 1000 && noted.empty(); ++i) {
    std::this_thread::sleep_for(10ms);
    noted = client_->Get(ClassPath("a"))["metadata"]
                .value("annotations", json::object())
                .value("example.com/resource-name", "");
  }
  // The page as a scrape renders it, on the loop. A pass's end is taken there after its writes,
  // so the write above may be seen before the pass is counted: read until it is.
  auto render = [&] {
    std::promise<std::string> rendered;
    loop.Post([&] {
      runtime::MetricsRegistry registry;
      ReconcilerMetrics::Declare(registry);
      registry.AddCollector([&](runtime::MetricsScrape& out) { reconciler.WriteMetrics(out); });
      rendered.set_value(registry.Render());
    });
    return rendered.get_future().get();
  };
  std::string page = render();
  for (int i = 0;
       i < 1000 && page.find("gpu_controller_reconcile_passes_total 0\n") != std::string::npos;
       ++i) {
    std::this_thread::sleep_for(10ms);
    page = render();
  }
  loop.Post([&] {
    reconciler.Stop();
    loop.Exit(0);
  });
  thread.join();
  EXPECT_EQ(noted, "nvidia.com/GA100") << "the toy's action was never written";
  EXPECT_NE(page.find("gpu_controller_reconcile_actions_total{reconciler=\"class-notes\","
                      "result=\"ok\"} 1\n"),
            std::string::npos)
      << page;
  EXPECT_NE(
      page.find("gpu_controller_reconcile_write_failures_total{reconciler=\"class-notes\"} 0\n"),
      std::string::npos)
      << page;
  EXPECT_NE(page.find("gpu_controller_writes_total{kind=\"GPUClass\",result=\"ok\"} 1\n"),
            std::string::npos)
      << page;
}

}  // namespace
}  // namespace cozy::controller
