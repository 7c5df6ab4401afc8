// ClusterCaches, the controller's informer factory, against the fake API server: the caches made
// from their constants, every kind of the table of watched kinds (controller/watched.h) in the
// snapshot member it names, the kinds that come and go followed as discovery says, and the
// webhooks' view of a new cache state that keeps the devices of
// the state before when only other kinds changed (a pod's change must not copy
// 40,000 devices again before the next VM start is answered).
#include "controller/daemon/caches.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

#include "kube/discovery.h"
#include "test/kube/kube_test_support.h"
#include "test/support/gpu_objects.h"
#include "test/support/process.h"

namespace cozy::controller {
namespace {

using nlohmann::json;

json Device(const std::string& name) {
  return {{"apiVersion", "gpu.cozystack.io/v1alpha1"},
          {"kind", "GPUDevice"},
          {"metadata", {{"name", name}, {"namespace", "t1"}}},
          {"spec", {{"className", "a100"}, {"count", 1}}}};
}

json GpuPod(const std::string& name) {
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", "t1"}, {"uid", "uid-" + name}}},
          {"spec",
           {{"nodeName", "n1"},
            {"containers",
             {{{"name", "c"},
               {"resources",
                {{"requests", {{"nvidia.com/GA100", "1"}}},
                 {"limits", {{"nvidia.com/GA100", "1"}}}}}}}}}},
          {"status", {{"phase", "Running"}}}};
}

class ClusterCachesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake::FakeApiServerOptions serverOptions;
    // The chart's CRDs, KubeVirt's and Cozystack's: every kind of the table is served.
    serverOptions.crdPaths = {testing::ChartCrdDir(), testing::TestCrdDir()};
    server_ = std::make_unique<fake::FakeApiServer>(serverOptions);
    server_->Start();
    client_ = std::make_unique<kube::Client>(testing::ConfigFor(*server_));
    testing::SeedOneGpuNode(*server_, "t1", "n1", 4);
    for (const std::string name : {"d1", "d2"}) server_->Seed(Device(name));
    options_.enableGpu = true;
    discovery_ = std::make_unique<kube::Discovery>(*client_);
    caches_ = std::make_unique<ClusterCaches>(*client_, *discovery_, options_,
                                              [](ClusterCaches::Readers) {});
  }
  // What the daemon's Watch makes (with GPUs on): every kind of the table that does not come
  // and go, started and synced.
  void WatchAll() {
    ForEachWatched([this](const auto& watched) {
      if (!watched.followsDiscovery) Start(caches_->Make(watched));
    });
  }
  template <class T>
  void Start(kube::Cache<T>& cache) {
    cache.Start();
    ASSERT_TRUE(testing::WaitFor([&] { return cache.Synced(); }));
  }
  std::unique_ptr<fake::FakeApiServer> server_;
  std::unique_ptr<kube::Client> client_;
  CacheOptions options_;
  std::unique_ptr<kube::Discovery> discovery_;
  std::unique_ptr<ClusterCaches> caches_;  // stops its caches before the server goes
};

TEST_F(ClusterCachesTest, ACacheIsMadeOnceFromItsConstantAndFoundByIt) {
  EXPECT_THROW(caches_->Get(kPodCache), std::logic_error) << "no Watch made it";
  kube::Cache<model::Pod>& pods = caches_->Make(kPodCache);
  EXPECT_EQ(&caches_->Make(kPodCache), &pods) << "made once";
  EXPECT_EQ(&caches_->Get(kPodCache), &pods);
}

TEST_F(ClusterCachesTest, APodsChangeKeepsTheDevicesOfTheWebhooksViewBeforeIt) {
  WatchAll();
  const auto first = caches_->Prepared(nullptr);
  ASSERT_EQ(first->snapshot.devices.size(), 2U);
  ASSERT_TRUE(first->model);
  EXPECT_EQ(first->model->DevicesRead(), 2U) << "no view before: every device is read";
  EXPECT_TRUE(first->snapshot.pods.empty());

  // A GPU pod starts: the next view counts it, and shares the devices with the view before.
  client_->Create("/api/v1/namespaces/t1/pods", GpuPod("raw"));
  ASSERT_TRUE(testing::WaitFor([&] { return caches_->Get(kPodCache).Size() == 1; }));
  const auto second = caches_->Prepared(first.get());
  EXPECT_EQ(second->snapshot.pods.size(), 1U);
  EXPECT_TRUE(second->snapshot.devices.SharesWith(first->snapshot.devices))
      << "the devices did not change: no copy";
  EXPECT_TRUE(second->snapshot.nodes.SameElements(first->snapshot.nodes))
      << "the nodes are the cache's own objects, as before";
  ASSERT_TRUE(second->model);
  EXPECT_EQ(second->model->DevicesRead(), 0U) << "the model before lent every device's numbers";

  // A device changes: the next view has its own devices, with the change.
  const uint64_t version = caches_->Get(kDeviceCache).Version();
  client_->MergePatch("/apis/gpu.cozystack.io/v1alpha1/namespaces/t1/gpudevices/d1/status",
                      {{"status", {{"phase", "Bound"}, {"nodeName", "n1"}}}});
  ASSERT_TRUE(testing::WaitFor([&] { return caches_->Get(kDeviceCache).Version() != version; }));
  const auto third = caches_->Prepared(second.get());
  EXPECT_FALSE(third->snapshot.devices.SharesWith(second->snapshot.devices));
  ASSERT_TRUE(third->model);
  EXPECT_EQ(third->model->DevicesRead(), 1U) << "only the changed device is read again";
  ASSERT_EQ(third->snapshot.devices.size(), 2U);
  EXPECT_EQ(third->snapshot.devices[0].status.nodeName, std::optional<std::string>("n1"));
  EXPECT_FALSE(second->snapshot.devices[0].status.nodeName) << "the view before is as it was";
}

// Each kind of the table that the model reads fills the snapshot member it names: the ones always
// watched, and those that come and go once discovery says they are served (the VMIs then known,
// G7); stopped, they are gone from the snapshot again.
TEST_F(ClusterCachesTest, EveryWatchedKindFillsItsSnapshotMemberAndTheOptionalOnesFollowDiscovery) {
  server_->Seed({{"apiVersion", "v1"},
                 {"kind", "ResourceQuota"},
                 {"metadata", {{"name", "q"}, {"namespace", "t1"}}},
                 {"spec", {{"hard", {{"requests.nvidia.com/GA100", "2"}}}}}});
  server_->Seed({{"apiVersion", "kubevirt.io/v1"},
                 {"kind", "VirtualMachineInstance"},
                 {"metadata", {{"name", "vm"}, {"namespace", "t1"}}},
                 {"spec", json::object()},
                 {"status", {{"phase", "Running"}, {"nodeName", "n1"}}}});
  server_->Seed(
      {{"apiVersion", "kubevirt.io/v1"},
       {"kind", "KubeVirt"},
       {"metadata", {{"name", "kubevirt"}, {"namespace", "cozy-kubevirt"}}},
       {"spec",
        {{"configuration",
          {{"permittedHostDevices",
            {{"pciHostDevices",
              {{{"pciVendorSelector", "10DE:20B7"}, {"resourceName", "nvidia.com/GA100"}}}}}}}}}}});
  // DRA (C19): gpu-agent's slice and another driver's, whose field selector leaves it out; a
  // claim allocated one of the agent's devices and one allocated nothing, which is not kept.
  for (const char* driver : {"gpu.cozystack.io", "gpu.nvidia.com"}) {
    server_->Seed({{"apiVersion", "resource.k8s.io/v1"},
                   {"kind", "ResourceSlice"},
                   {"metadata", {{"name", std::string("n1-") + driver}}},
                   {"spec",
                    {{"driver", driver},
                     {"nodeName", "n1"},
                     {"pool", {{"name", "n1"}, {"generation", 1}, {"resourceSliceCount", 1}}},
                     {"devices", {{{"name", "pci-0000-3b-00-0"}}}}}}});
  }
  for (const bool allocated : {true, false}) {
    json claim = {{"apiVersion", "resource.k8s.io/v1"},
                  {"kind", "ResourceClaim"},
                  {"metadata", {{"name", allocated ? "held" : "waiting"}, {"namespace", "t1"}}},
                  {"spec", {{"devices", {{"requests", json::array()}}}}}};
    if (allocated) {
      const json result = {{"request", "gpu"},
                           {"driver", "gpu.cozystack.io"},
                           {"pool", "n1"},
                           {"device", "pci-0000-3b-00-0"}};
      claim["status"]["allocation"]["devices"]["results"] = json::array({result});
    }
    server_->Seed(claim);
  }
  client_->Create("/api/v1/namespaces/t1/pods", GpuPod("raw"));
  WatchAll();

  model::Snapshot before;
  EXPECT_FALSE(caches_->FillSnapshot(before)) << "discovery has not answered: no VMI is known";
  EXPECT_TRUE(
      std::ranges::any_of(before.namespaces, [](const auto& ns) { return ns.name == "t1"; }));
  EXPECT_EQ(before.quotas.size(), 1U);
  EXPECT_EQ(before.nodes.size(), 1U);
  EXPECT_EQ(before.pods.size(), 1U);
  EXPECT_EQ(before.gpuNodes.size(), 1U);
  EXPECT_EQ(before.classes.size(), 1U);
  EXPECT_TRUE(before.devices.empty()) << "each reader puts the devices in its own way";
  EXPECT_TRUE(before.vmis.empty());
  EXPECT_TRUE(before.permittedHostDevices.pciHostDevices.empty());
  // D22: no DRA unit is known before discovery says the kinds are served and both caches list.
  EXPECT_EQ(before.draUnknown, "resourceslices of resource.k8s.io/v1 are not known served yet");

  discovery_->Refresh();
  EXPECT_TRUE(caches_->FollowDiscovery()) << "the served kinds start";
  std::vector<std::string> running;
  caches_->ForEachOptional(
      [&](const std::string& name, const kube::CacheBase&) { running.push_back(name); });
  EXPECT_EQ(running, (std::vector<std::string>{"virtualmachineinstances", "kubevirts",
                                               "resourceslices", "resourceclaims", "deviceclasses",
                                               "dra-claims", "workloads", "workloadmonitors"}));
  ASSERT_TRUE(testing::WaitFor([&] {
    const auto vmis = caches_->Running(kVmiCache);
    const auto kubevirt = caches_->Running(kKubeVirtCache);
    const auto slices = caches_->Running(kResourceSliceCache);
    const auto claims = caches_->Running(kResourceClaimCache);
    return vmis && kubevirt && slices && claims && vmis->Synced() && kubevirt->Synced() &&
           slices->Synced() && claims->Synced();
  }));
  model::Snapshot after;
  EXPECT_TRUE(caches_->FillSnapshot(after)) << "served and listed: the VMIs are known";
  ASSERT_EQ(after.vmis.size(), 1U);
  EXPECT_EQ(after.vmis[0].name, "vm");
  ASSERT_EQ(after.permittedHostDevices.pciHostDevices.size(), 1U);
  EXPECT_EQ(after.permittedHostDevices.pciHostDevices[0].resourceName, "nvidia.com/GA100");
  ASSERT_EQ(after.resourceSlices.size(), 1U) << "gpu-agent's slice alone";
  EXPECT_EQ(after.resourceSlices[0].driver, "gpu.cozystack.io");
  ASSERT_EQ(after.resourceSlices[0].devices.size(), 1U);
  ASSERT_EQ(after.resourceClaims.size(), 1U) << "only a claim holding the agent's devices";
  EXPECT_EQ(after.resourceClaims[0].name, "held");
  EXPECT_EQ(after.resourceClaims[0].devices,
            (std::vector<model::ClaimDevice>{{"n1", "pci-0000-3b-00-0"}}));
  EXPECT_EQ(after.draUnknown, "") << "D22: the slices and claims read, the DRA units are known";
  EXPECT_FALSE(caches_->FollowDiscovery()) << "nothing moved";

  caches_->StopOptional();
  EXPECT_EQ(caches_->Running(kUsageRecordCache), nullptr);
  model::Snapshot stopped;
  EXPECT_FALSE(caches_->FillSnapshot(stopped));
  EXPECT_TRUE(stopped.vmis.empty());
  EXPECT_EQ(stopped.draUnknown,
            "this replica has not read the ResourceSlices and ResourceClaims yet")
      << "D22: served, but no cache runs";
}

}  // namespace
}  // namespace cozy::controller
