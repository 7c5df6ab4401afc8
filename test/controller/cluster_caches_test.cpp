// ClusterCaches, the controller's informer factory, against the fake API server: the caches made
// from their constants, and the webhooks' view of a new cache state that keeps the devices of
// the state before when only other kinds changed (a pod's change must not copy
// 40,000 devices again before the next VM start is answered).
#include "controller/daemon/caches.h"

#include <gtest/gtest.h>

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
    server_ = testing::StartChartApiServer();
    client_ = std::make_unique<kube::Client>(testing::ConfigFor(*server_));
    testing::SeedOneGpuNode(*server_, "t1", "n1", 4);
    for (const std::string name : {"d1", "d2"}) server_->Seed(Device(name));
    options_.enableGpu = true;
    discovery_ = std::make_unique<kube::Discovery>(*client_);
    caches_ = std::make_unique<ClusterCaches>(*client_, *discovery_, options_,
                                              [](ClusterCaches::Readers) {});
  }
  // What the daemon's Watch lines make for the model (with GPUs on), started and synced.
  void WatchAll() {
    Start(caches_->Make(kClassCache));
    Start(caches_->Make(kDeviceCache));
    Start(caches_->Make(kGpuNodeCache));
    Start(caches_->Make(kNamespaceCache));
    Start(caches_->Make(kQuotaCache));
    Start(caches_->Make(kNodeCache));
    Start(caches_->Make(kPodCache));
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
  EXPECT_THROW(caches_->Get(kPodCache), std::logic_error) << "no Watch line made it";
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

}  // namespace
}  // namespace cozy::controller
