// The binder against the fake API server, without the daemon around it: D3 (a cache behind the
// binder's own writes is read past, and a stale pass cannot book a unit twice), and the writes a
// pass makes for its decisions.
#include "controller/binder/binder.h"

#include <gtest/gtest.h>

#include "controller/snapshot_json.h"
#include "test/kube/kube_test_support.h"

namespace cozy::controller {
namespace {

using nlohmann::json;

class BinderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake::FakeApiServerOptions options;
    options.crdPaths = {testing::ChartCrdDir()};
    server_ = std::make_unique<fake::FakeApiServer>(options);
    server_->Start();
    client_ = std::make_unique<kube::Client>(testing::ConfigFor(*server_));
    server_->Seed({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "t1"}}}});
    server_->Seed({{"apiVersion", "v1"},
                   {"kind", "Node"},
                   {"metadata", {{"name", "n1"}}},
                   {"status", {{"conditions", {{{"type", "Ready"}, {"status", "True"}}}}}}});
    server_->Seed(
        {{"apiVersion", "gpu.cozystack.io/v1alpha1"},
         {"kind", "GPUNode"},
         {"metadata", {{"name", "n1"}}},
         {"status",
          {{"resourceNames", {"nvidia.com/GA100"}},
           {"devices",
            {{{"pciAddress", "0000:3b:00.0"},
              {"resources",
               {{{"name", "nvidia.com/GA100"}, {"allocatable", 1}, {"allocated", 0}}}}}}}}}});
    server_->Seed({{"apiVersion", "gpu.cozystack.io/v1alpha1"},
                   {"kind", "GPUClass"},
                   {"metadata", {{"name", "a100"}}},
                   {"spec",
                    {{"vendor", "nvidia"},
                     {"model", "A100"},
                     {"mode", "passthrough"},
                     {"source", {{"devicePlugin", {{"resourceName", "nvidia.com/GA100"}}}}}}}});
    for (const std::string name : {"d1", "d2"}) {
      server_->Seed({{"apiVersion", "gpu.cozystack.io/v1alpha1"},
                     {"kind", "GPUDevice"},
                     {"metadata", {{"name", name}, {"namespace", "t1"}}},
                     {"spec", {{"className", "a100"}, {"count", 1}}}});
    }
  }

  // The cluster as a cache would hold it now.
  model::Snapshot Read() {
    json items = json::array();
    for (const char* path : {"/api/v1/nodes", "/apis/gpu.cozystack.io/v1alpha1/gpunodes",
                             "/apis/gpu.cozystack.io/v1alpha1/gpuclasses",
                             "/apis/gpu.cozystack.io/v1alpha1/gpudevices"}) {
      const json list = client_->List(path);
      std::string kind = list.value("kind", "");
      kind.resize(kind.size() - 4);  // "GPUDeviceList": list items carry no kind of their own
      for (json item : list["items"]) {
        item["kind"] = kind;
        items.push_back(item);
      }
    }
    return DecodeSnapshotList({{"kind", "List"}, {"items", items}});
  }
  static std::vector<std::shared_ptr<const api::GpuDevice>> Shared(const model::Snapshot& s) {
    std::vector<std::shared_ptr<const api::GpuDevice>> all;
    for (const auto& device : s.devices) all.push_back(std::make_shared<api::GpuDevice>(device));
    return all;
  }
  int Bound() {
    int bound = 0;
    const json list = client_->List("/apis/gpu.cozystack.io/v1alpha1/gpudevices");
    for (const auto& item : list["items"]) {
      bound += item.value("status", json::object()).value("phase", "") == "Bound";
    }
    return bound;
  }

  std::unique_ptr<fake::FakeApiServer> server_;
  std::unique_ptr<kube::Client> client_;
  std::atomic<bool> leading_{true};
};

TEST_F(BinderTest, D3_ACacheBehindTheBindersWritesIsReadPastAndNoUnitIsBookedTwice) {
  Binder binder(*client_, leading_);
  const model::Snapshot before = Read();
  EXPECT_TRUE(binder.StaleInCache(Shared(before)).empty());
  BinderResult first = binder.Pass(before, false, true, std::chrono::system_clock::now());
  ASSERT_TRUE(first.error.empty()) << first.error;

  EXPECT_EQ(first.writes, 1);  // the oldest order takes the one unit; the other is refused
  EXPECT_EQ(Bound(), 1);

  // A watch that has not delivered the write leaves the cache showing the unit free: the
  // written device, and only it, is stale.
  const std::vector<std::string> staleKeys = binder.StaleInCache(Shared(before));
  EXPECT_EQ(staleKeys, (std::vector<std::string>{"t1/d1"}));
  // Read past it: one GET shows the bind, so the next pass books nothing.
  server_->ClearRequests();
  model::Snapshot fresh = before;
  EXPECT_EQ(binder.ReadPast(Shared(before), staleKeys, fresh.devices), 1);
  EXPECT_EQ(server_->Requests().size(), 1u);  // a GET of d1, not a LIST of every device
  EXPECT_EQ(fresh.devices.size(), 2u);
  // Until the cache itself shows the write, every pass reads the device again.
  EXPECT_EQ(binder.StaleInCache(Shared(before)), staleKeys);
  BinderResult second = binder.Pass(fresh, false, true, std::chrono::system_clock::now());
  EXPECT_EQ(second.writes, 0);
  EXPECT_EQ(Bound(), 1);
  EXPECT_TRUE(binder.StaleInCache(Shared(fresh)).empty());  // a cache that shows it: done

  // Even a pass that did plan from the stale view cannot double-book: its first write is
  // conditional on the version it read, conflicts, and the pass stops there.
  BinderResult stale = binder.Pass(before, false, true, std::chrono::system_clock::now());
  EXPECT_EQ(stale.writes, 0);
  EXPECT_EQ(stale.conflicts, 1);
  EXPECT_TRUE(stale.incomplete);
  EXPECT_EQ(Bound(), 1);
}

TEST_F(BinderTest, NothingIsWrittenAfterSteppingDown) {
  leading_ = false;
  Binder binder(*client_, leading_);
  BinderResult result = binder.Pass(Read(), false, true, std::chrono::system_clock::now());
  EXPECT_EQ(result.writes, 0);
  EXPECT_EQ(Bound(), 0);
  EXPECT_TRUE(testing::Writes(*server_).empty());
}

}  // namespace
}  // namespace cozy::controller
