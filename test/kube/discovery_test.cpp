// Discovery: served, not served (group/version absent, or present without the resource),
// failing (5xx, a cut connection) and not synced yet are four different answers; a CRD
// installed later becomes served at the next refresh, by hand or on the refresh thread.
#include "kube/discovery.h"

#include <thread>

#include <gtest/gtest.h>

#include "test/kube/kube_test_support.h"

namespace cozy::kube {
namespace {
using nlohmann::json;
using namespace std::chrono_literals;

const GroupVersionResource kPods{"", "v1", "pods"};
const GroupVersionResource kWidgets{"", "v1", "widgets"};
const GroupVersionResource kVmis{"kubevirt.io", "v1", "virtualmachineinstances"};

json VmiCrd() {
  return {{"apiVersion", "apiextensions.k8s.io/v1"},
          {"kind", "CustomResourceDefinition"},
          {"metadata", {{"name", "virtualmachineinstances.kubevirt.io"}}},
          {"spec",
           {{"group", "kubevirt.io"},
            {"scope", "Namespaced"},
            {"names",
             {{"kind", "VirtualMachineInstance"},
              {"plural", "virtualmachineinstances"},
              {"singular", "virtualmachineinstance"}}},
            {"versions",
             {{{"name", "v1"},
               {"served", true},
               {"storage", true},
               {"schema",
                {{"openAPIV3Schema",
                  {{"type", "object"}, {"x-kubernetes-preserve-unknown-fields", true}}}}}}}}}}};
}

TEST(Discovery, ServedNotServedFailingAndNotSyncedAreToldApart) {
  auto server = testing::StartFakeApiServer(false);
  FakeTimeSource time;
  Client client(testing::ConfigFor(*server), testing::TestClientOptions(time));
  Discovery discovery(client);
  for (const auto& resource : {kPods, kWidgets, kVmis}) discovery.Track(resource);
  EXPECT_EQ(discovery.IsServed(kPods), Served::kNotSynced);
  EXPECT_EQ(discovery.IsServed(GroupVersionResource{"x", "v1", "never-tracked"}),
            Served::kNotSynced);

  discovery.Refresh();
  EXPECT_EQ(discovery.IsServed(kPods), Served::kServed);
  EXPECT_TRUE(discovery.State(kPods).namespaced);
  EXPECT_EQ(discovery.State(kPods).kind, "Pod");
  EXPECT_EQ(discovery.IsServed(kWidgets), Served::kNotServed);  // group/version without it
  EXPECT_EQ(discovery.IsServed(kVmis), Served::kNotServed);     // 404: group/version absent
  EXPECT_EQ(discovery.Refreshes(), 1);

  // A failing server is not an absent kind: 503 for one group/version, cut connections for
  // the other; what was known before is kept beside it.
  fake::Fault unavailable = fake::Fault::Answer(503, -1, "GET");
  unavailable.pathPrefix = "/apis/kubevirt.io/v1";
  server->AddFault(unavailable);
  fake::Fault cut = fake::Fault::Drop(-1, "GET");
  cut.pathPrefix = "/api/v1";
  server->AddFault(cut);
  discovery.Refresh();
  ResourceState vmis = discovery.State(kVmis);
  EXPECT_EQ(vmis.served, Served::kFailing);
  EXPECT_EQ(vmis.lastKnown, Served::kNotServed);
  EXPECT_NE(vmis.error.find("503"), std::string::npos) << vmis.error;
  ResourceState pods = discovery.State(kPods);
  EXPECT_EQ(pods.served, Served::kFailing);
  EXPECT_EQ(pods.lastKnown, Served::kServed);
  EXPECT_NE(pods.error.find("GET /api/v1"), std::string::npos) << pods.error;

  // The CRD is installed while the server fails; once it answers, the kind is served.
  server->ClearFaults();
  client.Create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", VmiCrd());
  EXPECT_EQ(discovery.IsServed(kVmis), Served::kFailing);  // nothing asked since
  discovery.Refresh();
  EXPECT_EQ(discovery.IsServed(kVmis), Served::kServed);
  EXPECT_EQ(discovery.State(kVmis).kind, "VirtualMachineInstance");
  EXPECT_TRUE(discovery.State(kVmis).error.empty());
  EXPECT_EQ(discovery.IsServed(kPods), Served::kServed);
  EXPECT_EQ(discovery.IsServed(kWidgets), Served::kNotServed);
  EXPECT_EQ(std::string(ServedName(Served::kFailing)), "failing");
}

TEST(Discovery, TheRefreshThreadSeesACrdInstalledAndRemovedLater) {
  auto server = testing::StartFakeApiServer(false);
  Client client(testing::ConfigFor(*server), testing::TestClientOptions(DefaultTimeSource()));
  Discovery discovery(client, {.refreshInterval = 100ms});
  discovery.Track(kVmis);
  discovery.Start();
  auto waitFor = [&](Served served) {
    const auto end = Clock::now() + 5s;
    while (Clock::now() < end && discovery.IsServed(kVmis) != served) {
      std::this_thread::sleep_for(10ms);
    }
    return discovery.IsServed(kVmis);
  };
  EXPECT_EQ(waitFor(Served::kNotServed), Served::kNotServed);
  client.Create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", VmiCrd());
  EXPECT_EQ(waitFor(Served::kServed), Served::kServed);
  server->DeleteCrd("virtualmachineinstances.kubevirt.io");
  discovery.RefreshSoon();
  EXPECT_EQ(waitFor(Served::kNotServed), Served::kNotServed);
  discovery.Stop();
  const int refreshes = discovery.Refreshes();
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(discovery.Refreshes(), refreshes);  // stopped means stopped
}

}  // namespace
}  // namespace cozy::kube
