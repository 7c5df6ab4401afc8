// End to end: `gpu-controller run` as real processes (two replicas where it matters) against the
// fake API server or a real control plane (controller_fixture.h), with kubectl as the client that
// tenants and hosters use. Each scenario is named by the catalog item it covers: G1, G8-G11 (the
// daemon), D12-D16, D18 (the GPU reconciler), D1-D10, D17, G5-G7 (the binder).
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "test/e2e/controller_fixture.h"

namespace cozy::e2e {
namespace {

TEST_F(ControllerEndToEnd, G8_OneLeaseHolderAndTheStandbyLeadsSoonAfterTheLeaderStops) {
  StartReplica("replica-a");
  ASSERT_TRUE(WaitFor([&] { return Holder() == "replica-a"; }, 15s)) << Logs();
  StartReplica("replica-b");
  ASSERT_TRUE(WaitFor([&] {
    return Metrics("replica-b").find("gpu_controller_leader 0") != std::string::npos;
  })) << Logs();
  EXPECT_NE(Metrics("replica-a").find("gpu_controller_leader 1"), std::string::npos);
  EXPECT_EQ(Holder(), "replica-a");  // the standby does not take a renewed Lease

  // SIGTERM: the leader releases the Lease on its way out, so the standby takes it within about
  // a retry period (2 s), well before the 15 s lease duration would run out.
  const auto stopped = std::chrono::steady_clock::now();
  const int status = StopReplica("replica-a");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << Log("replica-a");
  EXPECT_NE(Log("replica-a").find("stopping"), std::string::npos);
  ASSERT_TRUE(WaitFor([&] { return Holder() == "replica-b"; }, 8s)) << Logs();
  EXPECT_LT(std::chrono::steady_clock::now() - stopped, 8s);
  ASSERT_TRUE(WaitFor([&] {
    return Metrics("replica-b").find("gpu_controller_leader 1") != std::string::npos;
  })) << Logs();
  const json lease = Get("lease gpu-controller", "cozy-system");
  EXPECT_EQ(lease["spec"]["leaseDurationSeconds"], 15);
  EXPECT_GE(lease["spec"].value("leaseTransitions", 0), 1);
}

// G1 with GPUs off, as a hoster's monitoring sees it: /healthz and /readyz answer once the
// caches have listed; a 409 on the class finalizer's first write is counted as a conflict, the
// write it left undone shows as queue depth until a later pass makes it, and each pass is timed.
TEST_F(ControllerEndToEnd, G1_HealthAndTheReconcilersMetricsWithGpusOff) {
  Apply(Class("a100"));
  fake::Fault conflict = fake::Fault::Answer(409, 1, "PATCH");
  conflict.pathPrefix = "/apis/gpu.cozystack.io/v1alpha1/gpuclasses";
  Fake().AddFault(conflict);
  StartReplica("replica-a");
  ASSERT_TRUE(WaitFor([&] { return Holder() == "replica-a"; }, 15s)) << Logs();
  ASSERT_TRUE(WaitFor([&] {
    return HasFinalizer(Get("gpuclass a100"), "gpu.cozystack.io/class-protection");
  })) << Logs();
  const std::string base = "http://127.0.0.1:" + std::to_string(ports_["replica-a"]);
  for (const char* path : {"/healthz", "/readyz"}) {  // as of the loop's next tick (1 s)
    EXPECT_TRUE(WaitFor([&] {
      return testing::RunCommand("curl -s -o /dev/null -w '%{http_code}' " + base + path).out ==
             "200";
    })) << path;
  }
  // The metrics, too, as of the last tick: wait for the write after the conflict.
  std::string metrics;
  ASSERT_TRUE(WaitFor([&] {
    metrics = Metrics("replica-a");
    return metrics.find("{kind=\"GPUClass\",result=\"ok\"} 1\n") != std::string::npos;
  })) << metrics;
  EXPECT_NE(metrics.find("gpu_controller_queue_depth 0\n"), std::string::npos) << metrics;
  for (const std::string sample :
       {"gpu_controller_leader 1\n", "gpu_controller_leader_acquisitions_total 1\n",
        "gpu_controller_lease_transitions 0\n", "gpu_controller_conflicts_total 1\n",
        "gpu_controller_writes_total{kind=\"GPUClass\",result=\"conflict\"} 1\n",
        "gpu_controller_writes_total{kind=\"GPUClass\",result=\"ok\"} 1\n"}) {
    EXPECT_NE(metrics.find(sample), std::string::npos) << sample << metrics;
  }
  for (const std::string zero : {"gpu_controller_reconcile_passes_total 0\n",
                                 "gpu_controller_reconcile_duration_seconds_count 0\n"}) {
    EXPECT_EQ(metrics.find(zero), std::string::npos) << zero << metrics;
  }
  EXPECT_NE(metrics.find("gpu_controller_reconcile_duration_seconds_count "), std::string::npos);
  // A standby's: not leading, and the Lease's transitions as it reads them.
  StartReplica("replica-b");
  ASSERT_TRUE(WaitFor([&] {
    return Metrics("replica-b").find("gpu_controller_leader 0\n") != std::string::npos;
  })) << Logs();
  // Ready too, though it writes nothing: a standby's caches are warm for the day it leads.
  EXPECT_TRUE(WaitFor([&] {
    return testing::RunCommand("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:" +
                               std::to_string(ports_["replica-b"]) + "/readyz")
               .out == "200";
  }));
}

// G1: a class whose finalizer write the API server keeps refusing (422 for it
// alone, as a policy that denies it would; a 422 is not retried by the client, so each request
// is one try of the reconciler's) backs off by itself, each try at least twice as long after the
// one before (1 s, 2 s, 4 s), while the other class gets its finalizer; once the server takes the
// write, the pass the backoff asked for makes it, with nothing else changing in the cluster.
TEST_F(ControllerEndToEnd, G1_AWriteThatKeepsFailingBacksOffItsObjectAloneAndLandsWhenItCan) {
  Apply(Class("a100"));
  Apply(Class("h100"));
  const std::string failing = "/apis/gpu.cozystack.io/v1alpha1/gpuclasses/a100";
  fake::Fault refused = fake::Fault::Answer(422, -1, "PATCH");
  refused.pathPrefix = failing;
  Fake().AddFault(refused);
  StartReplica("replica-a");
  ASSERT_TRUE(WaitFor([&] {
    return HasFinalizer(Get("gpuclass h100"), "gpu.cozystack.io/class-protection");
  })) << Logs();
  auto attempts = [&] {
    std::vector<std::chrono::steady_clock::time_point> at;
    for (const auto& request : Requests()) {
      if (request.method == "PATCH" && request.path == failing) at.push_back(request.received);
    }
    return at;
  };
  ASSERT_TRUE(WaitFor([&] { return attempts().size() >= 3; }, 20s)) << Logs();
  const auto tries = attempts();
  for (size_t i = 1; i < tries.size(); ++i) {
    // The delay before try i+1 is 2^(i-1) s; a slow machine only makes it longer.
    const auto least = std::chrono::milliseconds(1000 << (i - 1)) - 100ms;
    EXPECT_GE(tries[i] - tries[i - 1], least)
        << "try " << i + 1 << " came "
        << std::chrono::duration_cast<std::chrono::milliseconds>(tries[i] - tries[i - 1]).count()
        << " ms after the one before";
  }
  std::string metrics;
  ASSERT_TRUE(WaitFor([&] {
    metrics = Metrics("replica-a");
    return metrics.find("gpu_controller_write_backoff_objects 1\n") != std::string::npos;
  })) << metrics;
  EXPECT_NE(metrics.find("gpu_controller_writes_total{kind=\"GPUClass\",result=\"error\"}"),
            std::string::npos)
      << metrics;
  EXPECT_FALSE(HasFinalizer(Get("gpuclass a100"), "gpu.cozystack.io/class-protection"));

  Fake().ClearFaults();
  ASSERT_TRUE(WaitFor(
      [&] { return HasFinalizer(Get("gpuclass a100"), "gpu.cozystack.io/class-protection"); }, 20s))
      << Logs();
  EXPECT_TRUE(WaitFor([&] {
    return Metrics("replica-a").find("gpu_controller_write_backoff_objects 0\n") !=
           std::string::npos;
  }));
}

// docs/controller.md, "Who wakes for a change": pod churn that cannot change a decision wakes no
// pass. Pods of cpu and memory alone are created, move to Running and go: the pod cache takes every
// change (each counted as taken quietly) and keeps none of them (its object count stays: it keeps
// only pods that ask for an extended resource), and neither the binder nor the reconciler runs a
// pass for them. A pod that asks for the GPU's resource then wakes the binder (which then moves the
// held device off the unit the pod took, and that write wakes the reconciler, as it should).
TEST_F(ControllerEndToEnd, PodChurnThatCannotChangeADecisionWakesNoPass) {
  GpuNode("n1", 1);
  Apply(Class("a100"));
  StartReplica("replica-a", {"--enable-gpu", "--resync", "1h"});
  Apply(Device("held"));
  ASSERT_TRUE(WaitFor([&] { return Phase("held") == "Bound"; })) << Logs();
  const std::string full = "gpu_controller_binder_passes_total{kind=\"full\"}";
  const std::string reconciles = "gpu_controller_reconcile_passes_total";
  const std::string pods = "gpu_controller_cache_objects{cache=\"pods\"}";
  // Settled: no pass for two ticks of the metrics (a second each). The sleeps stay: settled is
  // the absence of passes, which no pass count can show but over time.
  double fullBefore = -1, reconcilesBefore = -1;
  ASSERT_TRUE(WaitFor(
      [&] {
        const double f = Metric("replica-a", full), r = Metric("replica-a", reconciles);
        const bool same = f == fullBefore && r == reconcilesBefore;
        fullBefore = f;
        reconcilesBefore = r;
        if (!same) std::this_thread::sleep_for(2s);
        return same && f > 0;
      },
      30s))
      << Logs();
  const double podsBefore = Metric("replica-a", pods);
  const std::string ignored = "gpu_controller_cache_ignored_changes_total{cache=\"pods\"}";
  const double ignoredBefore = Metric("replica-a", ignored);

  auto pod = [](const std::string& name, const std::string& resource) {
    return json{
        {"apiVersion", "v1"},
        {"kind", "Pod"},
        {"metadata", {{"name", name}, {"namespace", Tenant()}}},
        {"spec",
         {{"nodeName", "n1"},
          {"containers",
           {{{"name", "c"},
             {"image", "busybox"},
             {"resources", {{"requests", {{resource, "1"}}}, {"limits", {{resource, "1"}}}}}}}}}}};
  };
  for (int i = 0; i < 6; ++i) Apply(pod("web-" + std::to_string(i), "cpu"));
  for (int i = 0; i < 6; ++i) {
    Kubectl("-n " + Tenant() + " patch pod web-" + std::to_string(i) +
            " --subresource=status --type=merge -p '{\"status\":{\"phase\":\"Running\"}}'");
  }
  for (int i = 0; i < 3; ++i) {
    Kubectl("-n " + Tenant() + " delete pod web-" + std::to_string(i) +
            " --grace-period=0 --force --wait=false");
  }
  // Six creations, six status writes, three deletions.
  ASSERT_TRUE(WaitFor([&] { return Metric("replica-a", ignored) >= ignoredBefore + 15; }, 20s))
      << Metrics("replica-a");
  EXPECT_EQ(Metric("replica-a", pods), podsBefore) << "pods of cpu alone are not kept";
  EXPECT_EQ(Metric("replica-a", full), fullBefore) << "the binder ran for pods it cannot count";
  EXPECT_EQ(Metric("replica-a", reconciles), reconcilesBefore)
      << "the reconciler ran for pods it does not read";

  Apply(pod("raw", testing::GpuClassObject("a100")["spec"]["source"]["devicePlugin"]["resourceName"]
                       .get<std::string>()));
  EXPECT_TRUE(WaitFor([&] { return Metric("replica-a", full) > fullBefore; }, 20s))
      << "a pod asking for the GPU wakes the binder";
  EXPECT_EQ(Metric("replica-a", pods), podsBefore + 1) << "and is kept";
}

// The quiet room (docs/controller.md, "Who wakes for a change"): once a full pass decided only held
// keeps, a GPU pod whose units fit in its node's room wakes no pass (the room takes them), and a
// pod that overfills the node wakes one, which moves the set off it.
TEST_F(ControllerEndToEnd, OnAQuietClusterAPodThatFitsWakesNoPassAndOneThatOverfills) {
  GpuNode("n1", 2);
  GpuNode("n2", 2);
  Apply(Class("a100"));
  StartReplica("replica-a", {"--enable-gpu", "--resync", "1h"});
  Apply(Device("held"));
  ASSERT_TRUE(WaitFor([&] { return Phase("held") == "Bound"; })) << Logs();
  const std::string node = NodeOf("held"), other = node == "n1" ? "n2" : "n1";
  const std::string full = "gpu_controller_binder_passes_total{kind=\"full\"}";
  const std::string quiet = "gpu_controller_binder_quiet";
  const std::string absorbed = "gpu_controller_binder_quiet_pod_changes_total";
  // Settled: the room is, and no pass ran for a second (a pass's count lands after its room).
  // The sleep stays: settled is the absence of passes, which no count can show but over time.
  double fullBefore = -1;
  ASSERT_TRUE(WaitFor(
      [&] {
        const double f = Metric("replica-a", full);
        const bool same = f == fullBefore && Metric("replica-a", quiet) == 1;
        fullBefore = f;
        if (!same) std::this_thread::sleep_for(1s);
        return same;
      },
      20s))
      << Metrics("replica-a");
  const std::string resource =
      testing::GpuClassObject("a100")["spec"]["source"]["devicePlugin"]["resourceName"];
  auto pod = [&](const std::string& name) {
    return json{
        {"apiVersion", "v1"},
        {"kind", "Pod"},
        {"metadata", {{"name", name}, {"namespace", Tenant()}}},
        {"spec",
         {{"nodeName", node},
          {"containers",
           {{{"name", "c"},
             {"image", "busybox"},
             {"resources", {{"requests", {{resource, "1"}}}, {"limits", {{resource, "1"}}}}}}}}}}};
  };
  Apply(pod("raw-1"));  // the node's last free unit
  ASSERT_TRUE(WaitFor([&] { return Metric("replica-a", absorbed) >= 1; }, 20s))
      << Metrics("replica-a");
  // A pass it woke would have run by now (50 ms debounce) and been counted (the metrics are
  // rendered at each scrape). Kept a sleep: what is asserted is that no pass ran, so no pass
  // count can mark the time, and with --resync 1h nothing else runs a pass.
  std::this_thread::sleep_for(1500ms);
  EXPECT_EQ(Metric("replica-a", full), fullBefore) << "a pod that fits woke the binder\n" << Logs();
  EXPECT_EQ(NodeOf("held"), node);

  // One more than the node serves: the room cannot take it, so it wakes a pass; and the pass
  // keeps the held set where it is (pods never evict a held set, docs/controller.md "Placement",
  // step 2: such a pod is nearly always a launcher its VMI does not list yet).
  Apply(pod("raw-2"));
  EXPECT_TRUE(WaitFor([&] { return Metric("replica-a", full) > fullBefore; }, 20s))
      << "a pod that overfills the node wakes a pass\n"
      << Logs();
  EXPECT_EQ(NodeOf("held"), node) << "the overfilling pod moved " << other << Logs();
  EXPECT_EQ(Phase("held"), "Bound");
  EXPECT_EQ(Metric("replica-a", absorbed), 1);
}

TEST_F(ControllerEndToEnd, G9_ANonPositiveAttachmentGraceIsRefused) {
  for (const std::string grace : {"0s", "-1s", "0"}) {
    const auto result = testing::RunCommand(std::string(GPU_CONTROLLER) + " run --kubeconfig " +
                                            ShellQuote(Path("kubeconfig").string()) +
                                            " --attachment-grace=" + grace);
    EXPECT_EQ(result.exitCode, 2) << grace;
    EXPECT_NE(result.err.find("--attachment-grace"), std::string::npos) << result.err;
    EXPECT_NE(result.err.find("positive"), std::string::npos) << result.err;
  }
  EXPECT_EQ(Holder(), "");  // refused before it touched the cluster
}

// Flags client-go would refuse stop the start with exit 2 and the rule, before the cluster is
// touched; without --identity a replica campaigns as its hostname (a pod's name in-cluster).
TEST_F(ControllerEndToEnd, G8_LeaseTimingsClientGoRefusesExitTwoAndTheIdentityIsTheHostname) {
  const std::string base = std::string(GPU_CONTROLLER) + " run --kubeconfig " +
                           ShellQuote(Path("kubeconfig").string()) + " --health-addr off ";
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"--lease-duration 5s --renew-deadline 10s",
       "leaseDuration must be greater than renewDeadline"},
      {"--renew-deadline 2s --retry-period 2s", "renewDeadline must be greater than retryPeriod"},
      {"--qps -1", "must be 0 or more"},
      {"--burst 0", "must be at least 1"}};
  for (const auto& [flags, message] : refused) {
    const auto result = testing::RunCommand(base + flags);
    EXPECT_EQ(result.exitCode, 2) << flags << result.err;
    EXPECT_NE(result.err.find(message), std::string::npos) << flags << ": " << result.err;
  }
  EXPECT_EQ(Holder(), "");

  KubeconfigFor("default");
  char hostname[256] = {};
  ASSERT_EQ(gethostname(hostname, sizeof(hostname) - 1), 0);
  pid_t replica = testing::Spawn({GPU_CONTROLLER, "run", "--kubeconfig",
                                  Path("kubeconfig-default").string(), "--health-addr", "off"},
                                 Path("default.log"));
  const bool led = WaitFor([&] { return Holder() == hostname; }, 15s);
  testing::Finish(replica, SIGTERM);
  EXPECT_TRUE(led) << Holder() << " " << Log("default");
}

TEST_F(ControllerEndToEnd, G10_G11_SettingsConfigMapCarriesTheFlagsAndIsTheOnlyOneCached) {
  Apply({{"apiVersion", "v1"},
         {"kind", "ConfigMap"},
         {"metadata", {{"name", "unrelated"}, {"namespace", "cozy-system"}}},
         {"data", {{"big", "x"}}}});
  StartReplica("replica-a",
               {"--gpu-resource-names", "nvidia.com/A,nvidia.com/B", "--raw-gpu-names", "forbid"});
  Apply(Class("a100"));
  ASSERT_TRUE(WaitFor([&] {
    const json settings = Get("configmap cozy-gpu-settings", "cozy-system");
    return settings.is_object() && settings["data"].value("resourceNames", "") ==
                                       "nvidia.com/A,nvidia.com/B,nvidia.com/GA100";
  })) << Logs();
  const json settings = Get("configmap cozy-gpu-settings", "cozy-system");
  EXPECT_EQ(settings["data"]["rawResourceNames"], "forbidden");
  // G11: every list and watch of ConfigMaps the controller made selects the settings by name.
  int configMapReads = 0;
  for (const auto& request : Requests()) {
    if (request.method != "GET" || request.bearerToken != "replica-a" ||
        request.path.find("/configmaps") == std::string::npos ||
        request.path.find("/configmaps/") != std::string::npos) {
      continue;
    }
    ++configMapReads;
    EXPECT_TRUE(std::regex_search(
        request.query,
        std::regex("(^|&)fieldSelector=metadata\\.name(=|%3D)cozy-gpu-settings(&|$)")))
        << request.path << "?" << request.query;
    EXPECT_EQ(request.path, "/api/v1/namespaces/cozy-system/configmaps");
  }
  EXPECT_GE(configMapReads, 2);  // the list and the watch
}

TEST_F(ControllerEndToEnd, G1_D15_ClassWaitsForItsHolderWithGpusOff) {
  StartReplica("replica-a");
  Apply(Class("a100"));
  Apply(Device("held"));
  WaitProtected("held");
  ASSERT_TRUE(WaitFor([&] {
    return HasFinalizer(Get("gpuclass a100"), "gpu.cozystack.io/class-protection");
  })) << Logs();
  // G1: with GPUs off nothing places the order.
  EXPECT_FALSE(Get("gpudevice held", Tenant())["status"].contains("nodeName"));

  Kubectl("delete gpuclass a100 --wait=false");
  // Two passes that saw the deletion: the class must still be there.
  ASSERT_TRUE(WaitForPasses("replica-a", "reconciler", 2)) << Logs();
  const json deleting = Get("gpuclass a100");
  ASSERT_TRUE(deleting.is_object()) << Logs();
  EXPECT_TRUE(deleting["metadata"].contains("deletionTimestamp"));

  Kubectl("-n " + Tenant() + " delete gpudevice held --wait=false");
  ASSERT_TRUE(WaitFor([&] { return Get("gpudevice held", Tenant()).is_null(); })) << Logs();
  ASSERT_TRUE(WaitFor([&] { return Get("gpuclass a100").is_null(); })) << Logs();
}

TEST_F(ControllerEndToEnd, D12_NamespaceHoldingDevicesIsDeletedWithGpusOff) {
  StartReplica("replica-a");
  Apply(Class("a100"));
  Apply(Device("bound"));
  Apply(Device("attached"));
  WaitProtected("bound");
  WaitProtected("attached");
  PatchStatus("bound", {{"phase", "Bound"}, {"nodeName", "n1"}});
  // Attached to a VMI that is gone: with GPUs off the VMI is read by name, and a 404 frees it.
  PatchStatus("attached", {{"phase", "Bound"},
                           {"nodeName", "n1"},
                           {"attachment", {{"vmiName", "vm-gone"}, {"vmiUID", "uid-gone"}}}});
  ASSERT_TRUE(WaitFor([&] { return Get("workload gpudevice-bound", Tenant()).is_object(); }))
      << Logs();
  Kubectl("delete namespace " + Tenant() + " --wait=false");
  ASSERT_TRUE(WaitFor([&] { return Get("namespace " + Tenant()).is_null(); }, 20s))
      << Logs() << Get("gpudevices", Tenant()).dump(2);
}

// D20: with GPUs on the leader keeps a DeviceClass for each dra class, owned by it, selecting the
// class's PCI ID; one changed by hand is put back, and it goes when its class does.
TEST_F(ControllerEndToEnd, D20_TheLeaderKeepsEachDraClassesDeviceClass) {
  GpuNode("n1", 2);
  StartReplica("replica-a", {"--enable-gpu"});
  Apply(DraClass("a100-dra"));
  const std::string name = "deviceclass a100-dra.gpu.cozystack.io";
  auto selects = [&](const json& object) {
    return object.is_object() &&
           object["spec"]["selectors"][0]["cel"]["expression"].get<std::string>().find(
               "deviceID == \"20b5\"") != std::string::npos;
  };
  // Owned by this class (a DeviceClass of an earlier class of the name is written over).
  const std::string classUid = Get("gpuclass a100-dra")["metadata"]["uid"];
  const auto owned = [&](const json& object) {
    return selects(object) &&
           object["metadata"].value("ownerReferences", json::array()).size() == 1 &&
           object["metadata"]["ownerReferences"][0].value("uid", "") == classUid;
  };
  ASSERT_TRUE(WaitFor([&] { return owned(Get(name)); })) << Logs();
  EXPECT_EQ(Get(name)["metadata"]["labels"]["gpu.cozystack.io/class"], "a100-dra");

  Kubectl("patch " + name +
          " --type merge -p '{\"spec\":{\"selectors\":[{\"cel\":{\"expression\":\"true\"}}]}}'");
  ASSERT_TRUE(WaitFor([&] { return owned(Get(name)); })) << "put back\n" << Logs();

  Kubectl("delete gpuclass a100-dra --wait=false");
  ASSERT_TRUE(WaitFor([&] { return Get(name).is_null(); }, 20s)) << Logs();
}

// C19, D21: an order of a dra class is Bound on the node whose ResourceSlice has a GPU of its PCI
// ID that no device plugin advertises, and the leader writes its claim (that many of the class's
// devices on that node, tolerating the catalog's taint); the order deleted, its claim goes.
TEST_F(ControllerEndToEnd, D21_ABoundOrderOfADraClassGetsItsClaim) {
  DraNode("n1");
  StartReplica("replica-a", {"--enable-gpu"});
  Apply(DraClass("a100-dra"));
  json order = Device("held");
  order["spec"]["className"] = "a100-dra";
  Apply(order);
  ASSERT_TRUE(WaitFor([&] {
    const json device = Get("gpudevice held", Tenant());
    return device.is_object() &&
           device.value("status", json::object()).value("nodeName", "") == "n1";
  })) << Logs();
  ASSERT_TRUE(WaitFor([&] { return Get("resourceclaim held", Tenant()).is_object(); })) << Logs();
  const json claim = Get("resourceclaim held", Tenant());
  ASSERT_EQ(claim["spec"]["devices"]["requests"].size(), 1U);
  EXPECT_EQ(claim["spec"]["devices"]["requests"][0]["name"], "gpu-0");
  const json& request = claim["spec"]["devices"]["requests"][0]["exactly"];
  EXPECT_EQ(request["deviceClassName"], "a100-dra.gpu.cozystack.io");
  EXPECT_EQ(request["count"], 1);
  EXPECT_EQ(request["selectors"][0]["cel"]["expression"],
            "device.attributes[\"gpu.cozystack.io\"].id.startsWith(\"n1/\")");
  EXPECT_EQ(request["tolerations"][0]["key"], "gpu.cozystack.io/catalog");
  EXPECT_EQ(claim["metadata"]["ownerReferences"][0]["uid"],
            Get("gpudevice held", Tenant())["metadata"]["uid"]);

  Kubectl("-n " + Tenant() + " delete gpudevice held --wait=false");
  ASSERT_TRUE(WaitFor([&] { return Get("resourceclaim held", Tenant()).is_null(); }, 20s))
      << Logs();
}

TEST_F(ControllerEndToEnd, D13_D16_ReleasedDeviceAndItsRecordStayUntilTheVmiEnds) {
  GpuNode("n1", 2);  // with GPUs on the binder keeps what it places only on a real node
  StartReplica("replica-a", {"--enable-gpu"});
  Apply(Class("a100"));
  Apply(Vmi("vm1"));
  Apply(Device("d1", {{"team", "blue"}}));
  WaitProtected("d1");
  PatchStatus("d1", {{"phase", "Bound"},
                     {"nodeName", "n1"},
                     {"attachment", {{"vmiName", "vm1"}, {"vmiUID", VmiUid("vm1")}}}});
  // D16: one record, under a monitor whose selector is the reserved key.
  ASSERT_TRUE(WaitFor([&] { return Get("workload gpudevice-d1", Tenant()).is_object(); }))
      << Logs();
  const json record = Get("workload gpudevice-d1", Tenant());
  EXPECT_EQ(record["metadata"]["labels"]["workloads.cozystack.io/monitor"], "cozy-gpu-usage");
  EXPECT_FALSE(record["metadata"]["labels"].contains("team"));  // tenant labels stay out
  EXPECT_EQ(record["metadata"]["ownerReferences"][0]["name"], "d1");
  EXPECT_EQ(record["status"]["resources"]["gpu.cozystack.io/a100"], "1");
  EXPECT_EQ(record["status"]["operational"], true);
  const json monitor = Get("workloadmonitor cozy-gpu-usage", Tenant());
  EXPECT_EQ(monitor["spec"]["selector"], (json{{"gpu.cozystack.io/usage-monitor", "true"}}));
  // A tenant's labels, even the monitor's own key, do not reach the record.
  Kubectl("-n " + Tenant() +
          " label gpudevice d1 workloads.cozystack.io/monitor=evil team=red --overwrite");
  ASSERT_TRUE(WaitForPasses("replica-a", "reconciler")) << Logs();
  EXPECT_EQ(Get("workload gpudevice-d1", Tenant())["metadata"]["labels"],
            record["metadata"]["labels"]);

  // D13: released while the VMI runs: device, binding and record stay.
  Kubectl("-n " + Tenant() + " delete gpudevice d1 --wait=false");
  ASSERT_TRUE(WaitForPasses("replica-a", "reconciler", 2)) << Logs();
  const json released = Get("gpudevice d1", Tenant());
  ASSERT_TRUE(released.is_object()) << Logs();
  EXPECT_TRUE(released["metadata"].contains("deletionTimestamp"));
  EXPECT_EQ(released["status"]["nodeName"], "n1");
  EXPECT_TRUE(Get("workload gpudevice-d1", Tenant()).is_object());
  EXPECT_NE(Metrics("replica-a").find("gpu_controller_waiting{for=\"vmi-in-use\"} 1"),
            std::string::npos);

  Kubectl("-n " + Tenant() + " delete vmi vm1");
  ASSERT_TRUE(WaitFor([&] { return Get("gpudevice d1", Tenant()).is_null(); })) << Logs();
  EXPECT_TRUE(Get("workload gpudevice-d1", Tenant()).is_null());
  ASSERT_TRUE(WaitFor([&] { return Get("workloadmonitor cozy-gpu-usage", Tenant()).is_null(); }))
      << Logs();
}

// C11 and C12 end to end: the reconciler reads the VMI a pod claims (its controller owner
// reference) by name and asks it for the launcher proof, status.activePods holding the pod's
// UID. The proven launcher's GPU is its device's, billed by the device's record alone; a pod
// owned by and named for the same VMI but not listed, and a pod of the raw name with no VMI,
// each get a record of their own, owned by the pod; a record goes with what it was for.
TEST_F(ControllerEndToEnd, C11_C12_ARawNamePodsGpusAreRecordedAndOnlyAProvenLauncherIsCovered) {
  GpuNode("n1", 4);
  StartReplica("replica-a", {"--enable-gpu"});
  Apply(Class("a100"));
  Apply(Vmi("vm1"));
  Apply(Device("d1"));
  WaitProtected("d1");
  const std::string vmiUid = VmiUid("vm1");
  PatchStatus("d1", {{"phase", "Bound"},
                     {"nodeName", "n1"},
                     {"attachment", {{"vmiName", "vm1"}, {"vmiUID", vmiUid}}}});
  const std::string resource =
      testing::GpuClassObject("a100")["spec"]["source"]["devicePlugin"]["resourceName"];
  auto pod = [&](const std::string& name, bool ownedByVm1) {
    json object = {
        {"apiVersion", "v1"},
        {"kind", "Pod"},
        {"metadata", {{"name", name}, {"namespace", Tenant()}}},
        {"spec",
         {{"nodeName", "n1"},
          {"containers",
           {{{"name", "compute"},
             {"image", "busybox"},
             {"resources", {{"requests", {{resource, "1"}}}, {"limits", {{resource, "1"}}}}}}}}}}};
    if (ownedByVm1) {
      object["metadata"]["labels"] = {{"kubevirt.io", "virt-launcher"},
                                      {"vm.kubevirt.io/name", "vm1"}};
      object["metadata"]["ownerReferences"] = {{{"apiVersion", "kubevirt.io/v1"},
                                                {"kind", "VirtualMachineInstance"},
                                                {"name", "vm1"},
                                                {"uid", vmiUid},
                                                {"controller", true}}};
    }
    Apply(object);
    Kubectl("-n " + Tenant() + " patch pod " + name +
            " --subresource=status --type=merge -p '{\"status\":{\"phase\":\"Running\"}}'");
    return Get("pod " + name, Tenant())["metadata"].value("uid", "");
  };
  const std::string launcherUid = pod("virt-launcher-vm1-abcde", true);
  const std::string impostorUid = pod("virt-launcher-vm1-fake1", true);
  const std::string rawUid = pod("raw", false);
  // KubeVirt lists its launcher, and only it, in the VMI's status.
  Kubectl("-n " + Tenant() + " patch vmi vm1 --type=merge -p " +
          ShellQuote(json{
              {"status",
               {{"nodeName", "n1"}, {"phase", "Running"}, {"activePods", {{launcherUid, "n1"}}}}}}
                         .dump()));

  // Each written, and rewritten operational once its pod is seen Running (a pod's change asks
  // for a pass within a second).
  ASSERT_TRUE(WaitFor([&] {
    for (const char* name : {"gpupod-virt-launcher-vm1-fake1", "gpupod-raw"}) {
      const json record = Get(std::string("workload ") + name, Tenant());
      if (!record.is_object() || record["status"].value("operational", false) != true) {
        return false;
      }
    }
    return true;
  })) << Logs();
  for (const auto& [name, uid] : {std::pair{std::string("virt-launcher-vm1-fake1"), impostorUid},
                                  std::pair{std::string("raw"), rawUid}}) {
    const json record = Get("workload gpupod-" + name, Tenant());
    EXPECT_EQ(record["status"]["resources"], (json{{resource, "1"}})) << name;
    EXPECT_EQ(record["status"]["type"], "raw") << name;
    EXPECT_EQ(record["status"]["operational"], true) << name;
    EXPECT_EQ(record["metadata"]["ownerReferences"][0]["kind"], "Pod") << name;
    EXPECT_EQ(record["metadata"]["ownerReferences"][0]["uid"], uid) << name;
    EXPECT_EQ(record["metadata"]["labels"]["workloads.cozystack.io/monitor"], "cozy-gpu-usage");
  }
  EXPECT_TRUE(Get("workload gpudevice-d1", Tenant()).is_object());
  // A pass that would record the launcher has run.
  ASSERT_TRUE(WaitForPasses("replica-a", "reconciler")) << Logs();
  EXPECT_TRUE(Get("workload gpupod-virt-launcher-vm1-abcde", Tenant()).is_null())
      << "the proven launcher's GPU was billed twice\n"
      << Logs();

  // The impostor gone, its record goes (the reconciler's delete; on a real cluster the garbage
  // collector may come first).
  Kubectl("-n " + Tenant() + " delete pod virt-launcher-vm1-fake1 --grace-period=0 --force");
  ASSERT_TRUE(WaitFor([&] {
    return Get("workload gpupod-virt-launcher-vm1-fake1", Tenant()).is_null();
  })) << Logs();
  EXPECT_TRUE(Get("workload gpupod-raw", Tenant()).is_object());
}

// D19: a tenant that adds a finalizer of its own to a Bound device and deletes it keeps the
// object, but not its GPUs unbilled: the units are released (the device no longer Bound, so the
// model no longer counts them held) before its usage record goes, and the record goes before
// our finalizer. The tenant's finalizer stays theirs.
TEST_F(ControllerEndToEnd, D19_ATenantsOwnFinalizerNeverKeepsUnitsWithoutTheirRecord) {
  GpuNode("n1", 2);
  StartReplica("replica-a", {"--enable-gpu"});
  Apply(Class("a100"));
  Apply(Device("d1"));
  WaitProtected("d1");
  ASSERT_TRUE(WaitFor([&] { return Phase("d1") == "Bound"; })) << Logs();
  ASSERT_TRUE(WaitFor([&] { return Get("workload gpudevice-d1", Tenant()).is_object(); }))
      << Logs();
  Kubectl(
      "-n " + Tenant() +
      " patch gpudevice d1 --type=json -p "
      "'[{\"op\":\"add\",\"path\":\"/metadata/finalizers/-\",\"value\":\"example.com/hold\"}]'");
  Kubectl("-n " + Tenant() + " delete gpudevice d1 --wait=false");
  // Our finalizer comes off; the tenant's keeps the object, which holds no unit.
  ASSERT_TRUE(WaitFor([&] {
    const json device = Get("gpudevice d1", Tenant());
    return device.is_object() &&
           !HasFinalizer(device, std::string("gpu.cozystack.io/device-protection"));
  })) << Logs();
  const json kept = Get("gpudevice d1", Tenant());
  EXPECT_NE(kept["status"].value("phase", ""), "Bound") << kept.dump();
  EXPECT_FALSE(kept["status"].contains("nodeName") && kept["status"]["nodeName"].is_string())
      << kept.dump();
  EXPECT_TRUE(Get("workload gpudevice-d1", Tenant()).is_null());
  // Every write, in order: the release, then the record's delete, then our finalizer.
  long release = -1, recordDelete = -1, finalizer = -1;
  const auto requests = Requests();
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& request = requests[i];
    if (request.status >= 300) continue;
    if (request.method == "PATCH" && request.path.ends_with("/gpudevices/d1/status") &&
        request.body.find("\"nodeName\":null") != std::string::npos && release < 0) {
      release = static_cast<long>(i);
    } else if (request.method == "DELETE" && request.path.ends_with("/workloads/gpudevice-d1")) {
      recordDelete = static_cast<long>(i);
    } else if (request.method == "PATCH" && request.path.ends_with("/gpudevices/d1") &&
               request.body.find("example.com/hold") != std::string::npos &&
               request.body.find(std::string("gpu.cozystack.io/device-protection")) ==
                   std::string::npos) {
      finalizer = static_cast<long>(i);
    }
  }
  EXPECT_GE(release, 0) << Logs();
  EXPECT_GT(recordDelete, release);
  EXPECT_GT(finalizer, recordDelete);
  Kubectl("-n " + Tenant() +
          " patch gpudevice d1 --type=merge -p '{\"metadata\":{\"finalizers\":null}}'");
  ASSERT_TRUE(WaitFor([&] { return Get("gpudevice d1", Tenant()).is_null(); })) << Logs();
}

// D13 with GPUs off: no VMI cache (KubeVirt may not even be watched), so the reconciler asks
// for the attached VMI by name. While it runs, the released device and its binding stay; once
// it is gone (seen at the next resync, as nothing watches VMIs), the device goes.
TEST_F(ControllerEndToEnd, D13_WithGpusOffAReleasedDeviceStaysWhileItsVmiRuns) {
  StartReplica("replica-a");
  Apply(Class("a100"));
  Apply(Vmi("vm1"));
  Apply(Device("d1"));
  WaitProtected("d1");
  PatchStatus("d1", {{"phase", "Bound"},
                     {"nodeName", "n1"},
                     {"attachment", {{"vmiName", "vm1"}, {"vmiUID", VmiUid("vm1")}}}});
  Kubectl("-n " + Tenant() + " delete gpudevice d1 --wait=false");
  ASSERT_TRUE(WaitForPasses("replica-a", "reconciler", 2)) << Logs();  // two resyncs
  const json released = Get("gpudevice d1", Tenant());
  ASSERT_TRUE(released.is_object()) << Logs();
  EXPECT_TRUE(released["metadata"].contains("deletionTimestamp"));
  EXPECT_EQ(released["status"]["nodeName"], "n1");
  EXPECT_EQ(released["status"]["attachment"]["vmiName"], "vm1");
  EXPECT_NE(Metrics("replica-a").find("gpu_controller_waiting{for=\"vmi-in-use\"} 1"),
            std::string::npos)
      << Metrics("replica-a");
  Kubectl("-n " + Tenant() + " delete vmi vm1");
  ASSERT_TRUE(WaitFor([&] { return Get("gpudevice d1", Tenant()).is_null(); })) << Logs();
}

// G7 with GPUs off: the VMI is read by name, and a read that answers the plain 404
// of a kind that is not served (KubeVirt's API in an upgrade, its CRD gone) is a gap in
// discovery, not an ended VMI. The pass skips the attachment, logs and counts it as failed; a
// running VM keeps its device and a released device stays. Only the API server's own NotFound
// for the VMI frees them.
TEST_F(ControllerEndToEnd, G7_WithGpusOffAnUnservedVmiKindNeverDetachesARunningVm) {
  StartReplica("replica-a");
  Apply(Class("a100"));
  Apply(Vmi("vm1"));
  Apply(Device("d1"));
  Apply(Device("d2"));
  WaitProtected("d1");
  WaitProtected("d2");
  const std::string uid = VmiUid("vm1");
  for (const std::string name : {"d1", "d2"}) {
    PatchStatus(name, {{"phase", "Bound"},
                       {"nodeName", "n1"},
                       {"attachment", {{"vmiName", "vm1"}, {"vmiUID", uid}}}});
  }
  fake::Fault gap;
  gap.pathPrefix = "/apis/kubevirt.io";
  gap.status = 404;
  Fake().AddFault(gap);
  Kubectl("-n " + Tenant() + " delete gpudevice d2 --wait=false");
  ASSERT_TRUE(WaitFor([&] {
    return Log("replica-a").find("reconcile pass skipped attachments whose VMI cannot be told") !=
           std::string::npos;
  })) << Logs();
  ASSERT_TRUE(WaitForPasses("replica-a", "reconciler", 2)) << Logs();  // two resyncs
  const json d1 = Get("gpudevice d1", Tenant());
  EXPECT_EQ(d1["status"]["attachment"]["vmiName"], "vm1") << Logs();
  EXPECT_EQ(d1["status"]["attachment"]["vmiUID"], uid);
  const json d2 = Get("gpudevice d2", Tenant());
  ASSERT_TRUE(d2.is_object()) << Logs();
  EXPECT_EQ(d2["status"]["nodeName"], "n1");
  EXPECT_EQ(d2["status"]["attachment"]["vmiName"], "vm1");
  const std::string metrics = Metrics("replica-a");
  EXPECT_NE(metrics.find("gpu_controller_waiting{for=\"vmi-unknown\"} 2"), std::string::npos)
      << metrics;
  EXPECT_EQ(metrics.find("gpu_controller_reconcile_failures_total 0\n"), std::string::npos)
      << metrics;
  EXPECT_NE(Log("replica-a").find("VirtualMachineInstance is not served"), std::string::npos)
      << Logs();
  // The kind is back and the VM still runs: nothing changes. Once it ends, both are freed.
  Fake().ClearFaults();
  // A pass that told both attachments' VMI (it runs) has applied what it planned.
  ASSERT_TRUE(WaitFor(
      [&] { return Metric("replica-a", "gpu_controller_waiting{for=\"vmi-unknown\"}") == 0; }, 30s))
      << Metrics("replica-a");
  EXPECT_EQ(Get("gpudevice d1", Tenant())["status"]["attachment"]["vmiUID"], uid);
  EXPECT_TRUE(Get("gpudevice d2", Tenant()).is_object());
  Kubectl("-n " + Tenant() + " delete vmi vm1");
  ASSERT_TRUE(WaitFor([&] { return Get("gpudevice d2", Tenant()).is_null(); })) << Logs();
  ASSERT_TRUE(WaitFor([&] {
    return !Get("gpudevice d1", Tenant())["status"].contains("attachment");
  })) << Logs();
}

TEST_F(ControllerEndToEnd, D14_TemplateDeviceGoesWithItsVmiAndAHeldOrderStays) {
  GpuNode("n1", 2);  // with GPUs on the binder keeps what it places only on a real node
  StartReplica("replica-a", {"--enable-gpu"});
  Apply(Class("a100"));
  Apply(Vmi("vm1"));
  Apply(Device("vm1-gpu", {{"gpu.cozystack.io/template-device", "true"}}));
  Apply(Device("held"));
  WaitProtected("vm1-gpu");
  WaitProtected("held");
  const std::string uid = VmiUid("vm1");
  for (const std::string name : {"vm1-gpu", "held"}) {
    PatchStatus(name, {{"phase", "Bound"},
                       {"nodeName", "n1"},
                       {"attachment", {{"vmiName", "vm1"}, {"vmiUID", uid}}}});
  }
  ASSERT_TRUE(WaitForPasses("replica-a", "reconciler")) << Logs();
  EXPECT_TRUE(Get("gpudevice vm1-gpu", Tenant()).is_object());  // its VMI runs

  Kubectl("-n " + Tenant() + " delete vmi vm1");
  ASSERT_TRUE(WaitFor([&] { return Get("gpudevice vm1-gpu", Tenant()).is_null(); })) << Logs();
  ASSERT_TRUE(WaitFor([&] {
    return !Get("gpudevice held", Tenant())["status"].contains("attachment");
  })) << Logs();
  const json held = Get("gpudevice held", Tenant());
  EXPECT_FALSE(held["metadata"].contains("deletionTimestamp"));
  EXPECT_EQ(held["status"]["nodeName"], "n1");  // still held, on its node
}

TEST_F(ControllerEndToEnd, D18_AttachmentWithoutItsVmiIsClearedAfterTheGrace) {
  GpuNode("n1", 2);  // with GPUs on the binder keeps what it places only on a real node
  StartReplica("replica-a", {"--enable-gpu", "--attachment-grace", "4s"});
  Apply(Class("a100"));
  Apply(Device("ghost"));
  Apply(Device("in-time"));
  WaitProtected("ghost");
  WaitProtected("in-time");
  const std::string now = api::FormatTime(std::chrono::system_clock::now());
  PatchStatus("ghost", {{"phase", "Bound"},
                        {"nodeName", "n1"},
                        {"attachment", {{"vmiName", "never"}, {"attachedAt", now}}}});
  PatchStatus("in-time", {{"phase", "Bound"},
                          {"nodeName", "n1"},
                          {"attachment", {{"vmiName", "vm2"}, {"attachedAt", now}}}});
  Apply(Vmi("vm2"));
  // The VMI that appeared is matched: its UID is recorded.
  ASSERT_TRUE(WaitFor([&] {
    return Get("gpudevice in-time", Tenant())["status"]["attachment"].value("vmiUID", "") ==
           VmiUid("vm2");
  })) << Logs();
  // The other waits out its grace, then is cleared.
  ASSERT_TRUE(WaitFor(
      [&] { return !Get("gpudevice ghost", Tenant())["status"].contains("attachment"); }, 15s))
      << Logs();
  EXPECT_TRUE(Get("gpudevice in-time", Tenant())["status"].contains("attachment"));
  EXPECT_NE(Log("replica-a").find("did not appear within the attachment grace"), std::string::npos);
}

TEST_F(ControllerEndToEnd, G8_LeaderCutOffStepsDownTheOtherLeadsAndNothingIsWrittenTwice) {
  const std::vector<std::string> fast = {"--lease-duration", "6s", "--renew-deadline", "4s",
                                         "--retry-period",   "1s"};
  // replica-a reaches the API server through a proxy the test can cut, like a partition.
  testing::TcpProxy proxy(ApiPort());
  StartReplica("replica-a", fast, proxy.port());
  ASSERT_TRUE(WaitFor([&] { return Holder() == "replica-a"; }, 15s)) << Logs();
  StartReplica("replica-b", fast);
  Apply(Class("a100"));
  ASSERT_TRUE(WaitFor([&] {
    return HasFinalizer(Get("gpuclass a100"), "gpu.cozystack.io/class-protection");
  })) << Logs();

  // The leader's connections are reset and new ones refused: it cannot renew, steps down after
  // its renew deadline, and the standby takes the Lease once it has aged a lease duration.
  proxy.Cut();
  const auto cut = std::chrono::steady_clock::now();
  ASSERT_TRUE(WaitFor(
      [&] { return Metrics("replica-a").find("gpu_controller_leader 0") != std::string::npos; },
      10s))
      << Logs();
  ASSERT_TRUE(WaitFor([&] { return Holder() == "replica-b"; }, 15s)) << Logs();
  for (int i = 0; i < 5; ++i) Apply(Device("d" + std::to_string(i)));
  for (int i = 0; i < 5; ++i) WaitProtected("d" + std::to_string(i));

  // The connection comes back: the old leader stays a standby while the Lease is renewed.
  proxy.Restore();
  const auto restored = std::chrono::steady_clock::now();
  // Evidence that it has tried as a candidate since: two reads of the Lease (a retry period
  // apart), each finding it held and renewed by replica-b.
  ASSERT_TRUE(WaitFor(
      [&] {
        int leaseReads = 0;
        for (const auto& request : Requests()) {
          leaseReads += request.bearerToken == "replica-a" && request.received > restored &&
                        request.path.find("/leases/gpu-controller") != std::string::npos;
        }
        return leaseReads >= 2;
      },
      15s))
      << Logs();
  EXPECT_EQ(Holder(), "replica-b");
  EXPECT_NE(Metrics("replica-a").find("gpu_controller_leader 0"), std::string::npos);
  EXPECT_NE(Log("replica-a").find("stopped leading"), std::string::npos);

  // Each device's finalizer was written once, by the leader of the moment; the cut-off replica
  // wrote nothing after the cut, nor once it was back.
  std::map<std::string, int> finalizerWrites;
  int readsAfterRestore = 0;
  for (const auto& request : Requests()) {
    if (request.bearerToken == "replica-a" && request.received > cut) ++readsAfterRestore;
    if (request.method == "GET" || request.status >= 300) continue;
    if (request.bearerToken == "replica-a" && request.path.find("/leases/") == std::string::npos) {
      EXPECT_LT(request.received, cut) << request.method << " " << request.path;
    }
    if (request.method == "PATCH" && request.path.find("/gpudevices/d") != std::string::npos &&
        request.body.find("device-protection") != std::string::npos) {
      ++finalizerWrites[request.path];
      EXPECT_EQ(request.bearerToken, "replica-b") << request.path;
    }
  }
  EXPECT_GT(readsAfterRestore, 0);  // it did come back (it reads the Lease as a candidate)
  EXPECT_EQ(finalizerWrites.size(), 5u);
  for (const auto& [path, count] : finalizerWrites) EXPECT_EQ(count, 1) << path;
}

// docs/security.md, "Hardening done": a leader that can no longer renew its Lease makes no write
// attempt past the instant the Lease lets it lead until (the start of its last successful renewal
// plus the renew deadline), though the API server keeps asking it to try again (429,
// Retry-After 2 s, which the client honours for up to 3 retries): the reconciler's retries are
// bounded by the lease, and leadership is read again before every attempt.
TEST_F(ControllerEndToEnd, G8_ALeaderThatCannotRenewMakesNoWriteAttemptPastItsLease) {
  const std::vector<std::string> fast = {"--lease-duration", "6s", "--renew-deadline", "4s",
                                         "--retry-period",   "1s"};
  StartReplica("replica-a", fast);
  ASSERT_TRUE(WaitFor([&] { return Holder() == "replica-a"; }, 15s)) << Logs();
  ASSERT_TRUE(WaitFor([&] {  // its first pass has run
    return Get("configmap cozy-gpu-settings", "cozy-system").is_object();
  })) << Logs();
  const std::string leases = "/apis/coordination.k8s.io/";
  fake::Fault busy = fake::Fault::Answer(429, -1, "PATCH", 2);
  busy.pathPrefix = "/apis/gpu.cozystack.io/v1alpha1/gpuclasses";
  Fake().AddFault(busy);
  fake::Fault cut = fake::Fault::Answer(503, -1, "PUT");  // every renewal fails from now on
  cut.pathPrefix = leases;
  Fake().AddFault(cut);
  Apply(Class("a100"));  // its finalizer: the reconciler's write, answered 429 each time
  ASSERT_TRUE(
      WaitFor([&] { return Log("replica-a").find("stopped leading") != std::string::npos; }, 10s))
      << Logs();
  // A retry the client would have made past the lease comes within 3 × 2 s of an attempt. Kept
  // a sleep: what it waits for is the absence of a retry the server's Retry-After paces, and
  // no counter of the client's retries exists (a reconciler pass counts only once it ends).
  std::this_thread::sleep_for(7s);

  // It led until at most its last renewal's arrival plus the renew deadline (4 s).
  std::chrono::steady_clock::time_point renewed{};
  for (const auto& request : Requests()) {
    if (request.bearerToken == "replica-a" && request.path.starts_with(leases) &&
        request.method != "GET" && request.status > 0 && request.status < 300) {
      renewed = std::max(renewed, request.received);
    }
  }
  ASSERT_NE(renewed, std::chrono::steady_clock::time_point{}) << "no renewal of replica-a's";
  int attempts = 0;
  for (const auto& request : Requests()) {
    if (request.bearerToken != "replica-a" || request.method == "GET" ||
        request.path.starts_with(leases)) {
      continue;
    }
    attempts += request.path.find("/gpuclasses/a100") != std::string::npos;
    EXPECT_LT(request.received, renewed + 4s)
        << request.method << " " << request.path << " "
        << std::chrono::duration<double>(request.received - renewed).count()
        << " s after the last renewal";
  }
  EXPECT_GE(attempts, 1) << "it never tried the write while it led";
  Fake().ClearFaults();
}

TEST_F(ControllerEndToEnd, D1_D2_TwoOrdersRaceForTheLastUnitAndOnlyTheLeaderPlaces) {
  GpuNode("n1", 1);
  Apply(Class("a100"));
  StartReplica("replica-a", {"--enable-gpu"});
  ASSERT_TRUE(WaitFor([&] { return Holder() == "replica-a"; })) << Logs();
  StartReplica("replica-b", {"--enable-gpu"});
  // Both orders in one apply: their events reach the binder together or one after the other.
  const std::filesystem::path file = Path("orders.yaml");
  std::ofstream(file) << Device("first").dump() << "\n" << Device("second").dump() << "\n";
  Kubectl("apply -f " + ShellQuote(file.string()));
  ASSERT_TRUE(WaitFor([&] { return Phase("first") == "Bound" || Phase("second") == "Bound"; }))
      << Logs();
  // A pass that follows must not book the unit again.
  ASSERT_TRUE(WaitForPasses("replica-a", "binder")) << Logs();
  // The standby runs no pass at all (and the wait above can fail: it does on a replica that
  // does not pass).
  EXPECT_FALSE(WaitForPasses("replica-b", "reconciler", 1, 2s));
  const int bound = (Phase("first") == "Bound") + (Phase("second") == "Bound");
  EXPECT_EQ(bound, 1) << Get("gpudevices", Tenant()).dump(2);
  const auto writes = PlacementWrites();
  EXPECT_EQ(writes.size(), 1u);  // one write for one bound device
  // Not even a refused attempt from the standby: it never tries.
  for (const auto& write : PlacementWrites(true)) {
    EXPECT_EQ(write.bearerToken, "replica-a") << write.path << " " << write.status;
  }
  EXPECT_NE(Metrics("replica-a").find("gpu_controller_binder_decisions_total{action=\"bind\"}"),
            std::string::npos);
}

// docs/controller.md, "The binder": a placement write the server refuses for what the device is (a
// hoster's policy answering 422) holds that device off alone: the other order is bound, the refused
// write is sent again after 1 s, then 2 s (not every 50 ms, and not holding every later decision),
// the held device shows in the metrics, and it is bound once the server takes its write.
TEST_F(ControllerEndToEnd, APlacementWriteTheServerRefusesBacksOffItsDeviceAlone) {
  GpuNode("n1", 2);
  Apply(Class("a100"));
  const std::string refusedPath =
      "/apis/gpu.cozystack.io/v1alpha1/namespaces/" + Tenant() + "/gpudevices/first/status";
  fake::Fault refused = fake::Fault::Answer(422, -1, "PATCH");
  refused.pathPrefix = refusedPath;
  Fake().AddFault(refused);
  StartReplica("replica-a", {"--enable-gpu"});
  ASSERT_TRUE(WaitFor([&] { return Holder() == "replica-a"; })) << Logs();
  const std::filesystem::path file = Path("orders.yaml");
  std::ofstream(file) << Device("first").dump() << "\n" << Device("second").dump() << "\n";
  Kubectl("apply -f " + ShellQuote(file.string()));
  ASSERT_TRUE(WaitFor([&] { return Phase("second") == "Bound"; })) << Logs();
  // Each try with the version it was planned from: the reconciler's finalizer write changes
  // the device after the first, and a changed device is tried at once.
  auto attempts = [&] {
    std::vector<std::pair<std::chrono::steady_clock::time_point, std::string>> at;
    const std::regex version("\"resourceVersion\":\"([0-9]+)\"");
    for (const auto& request : Requests()) {
      std::smatch match;
      if (request.method == "PATCH" && request.path == refusedPath &&
          std::regex_search(request.body, match, version)) {
        at.emplace_back(request.received, match[1]);
      }
    }
    return at;
  };
  ASSERT_TRUE(WaitFor([&] { return attempts().size() >= 3; }, 20s)) << Logs();
  const auto tries = attempts();
  int sameVersion = 0;
  for (size_t i = 1; i < tries.size(); ++i) {
    if (tries[i].second != tries[i - 1].second) continue;
    ++sameVersion;
    EXPECT_GE(tries[i].first - tries[i - 1].first, 900ms)
        << "try " << i + 1 << " came "
        << std::chrono::duration_cast<std::chrono::milliseconds>(tries[i].first -
                                                                 tries[i - 1].first)
               .count()
        << " ms after the one before, from the same version";
  }
  EXPECT_GE(sameVersion, 1);
  EXPECT_NE(Phase("first"), "Bound");
  std::string metrics;
  ASSERT_TRUE(WaitFor([&] {
    metrics = Metrics("replica-a");
    return metrics.find("gpu_controller_binder_backoff_devices 1\n") != std::string::npos;
  })) << metrics;
  EXPECT_EQ(metrics.find("gpu_controller_binder_held_off_total 0\n"), std::string::npos) << metrics;

  Fake().ClearFaults();
  ASSERT_TRUE(WaitFor([&] { return Phase("first") == "Bound"; }, 20s)) << Logs();
  EXPECT_TRUE(WaitFor([&] {
    return Metrics("replica-a").find("gpu_controller_binder_backoff_devices 0\n") !=
           std::string::npos;
  }));
}

TEST_F(ControllerEndToEnd, D3_ADelayedDeviceWatchAndTwoRequestsForTheLastUnitBindOne) {
  GpuNode("n1", 0);  // no room yet: both orders wait, unplaced
  Apply(Class("a100"));
  StartReplica("replica-a", {"--enable-gpu"});
  Apply(Device("d1"));
  Apply(Device("d2"));
  WaitProtected("d1");
  WaitProtected("d2");
  AskToBind("d1", "r1");
  ASSERT_TRUE(WaitFor([&] { return Answered("d1", "r1"); })) << Logs();
  // Reads past the cache so far: a leader that took the Lease while the reconciler's finalizer
  // writes were landing reads those devices once to settle (D3); none of them is this test's.
  // A marked device is read each pass until a pass finds the cache showing the server's version:
  // two whole passes with the cache live settle them, so none is read past from here on for
  // that (the resync asks for a pass every second).
  ASSERT_TRUE(WaitForPasses("replica-a", "binder", 2)) << Logs();
  const size_t requestsBefore = Fake().Requests().size();
  // Conflicts before the stall are not this test's: the binder's first writes (each order told
  // why it waits, docs/controller.md "Why an order waits") may race the reconciler's finalizers.
  const std::string conflicts = "gpu_controller_binder_conflicts_total";
  const double conflictsBefore = Metric("replica-a", conflicts);
  // The device watch stalls for 6 s: the controller's device cache is frozen meanwhile (the
  // GPUNode watch is not).
  StallDeviceWatches(6s);
  // A unit frees up: the binder binds d1 (the older order), a write its frozen cache cannot see.
  GpuNode("n1", 1);
  ASSERT_TRUE(WaitFor([&] { return Phase("d1") == "Bound"; }, 5s)) << Logs();
  // A second request for the last unit, and another pass while the cache still shows d1 Pending.
  AskToBind("d2", "r2");
  Kubectl("label node n1 touched=yes");
  Fake().ClearFaults();
  ASSERT_TRUE(WaitFor([&] { return Answered("d2", "r2"); }, 20s)) << Logs();
  EXPECT_EQ(Phase("d1"), "Bound");
  EXPECT_EQ(Phase("d2"), "");
  EXPECT_EQ(Get("gpudevice d2", Tenant())["status"]["bindResponse"]["result"], "Failed");
  // The pass during the stall read d1 past the cache, from the API server's answer to the
  // bind (no GET): it did not plan from the stale view.
  const std::string metrics = Metrics("replica-a");
  EXPECT_EQ(metrics.find("gpu_controller_binder_own_write_answers_total 0\n"), std::string::npos)
      << metrics;
  const std::vector<fake::LoggedRequest> requests = Fake().Requests();
  int readsOfD1 = 0;
  for (size_t i = requestsBefore; i < requests.size(); ++i) {
    if (requests[i].method == "GET" && requests[i].bearerToken == "replica-a" &&
        requests[i].path.ends_with("/gpudevices/d1")) {
      ++readsOfD1;
    }
  }
  EXPECT_EQ(readsOfD1, 0) << "d1 was read past the cache with a GET\n" << metrics;
  EXPECT_EQ(Metric("replica-a", conflicts), conflictsBefore)
      << "a write planned from the stale view\n"
      << metrics;
  EXPECT_EQ(PlacementWrites().size(), 1u);
}

// D3 across a leader change: the new leader's device cache lags a move the last leader wrote.
// Planned from that cache alone, the moved device still holds its old unit and the new unit
// it took looks free, so the waiting order would be bound there too: one unit booked twice.
TEST_F(ControllerEndToEnd, D3_ANewLeaderWhoseCacheLagsTheLastLeadersMoveBooksNoUnitTwice) {
  GpuNode("n1", 1);
  GpuNode("n2", 0);
  Apply(Class("a100"));  // onCordon Move, the CRD's default
  StartReplica("replica-a", {"--enable-gpu"});
  ASSERT_TRUE(WaitFor([&] { return Holder() == "replica-a"; })) << Logs();
  StartReplica("replica-b", {"--enable-gpu"});
  Apply(Device("d1"));
  ASSERT_TRUE(WaitFor([&] { return Phase("d1") == "Bound"; })) << Logs();
  Apply(Device("d2"));  // no room: it waits
  WaitProtected("d2");
  // Both replicas' caches show d1 on n1 and d2 waiting: each holds d2, created after d1's
  // placement was written, and a watch delivers in order.
  for (const std::string replica : {"replica-a", "replica-b"}) {
    ASSERT_TRUE(WaitFor([&] {
      return Metric(replica, "gpu_controller_cache_objects{cache=\"gpudevices\"}") == 2;
    })) << Metrics(replica);
  }
  ASSERT_EQ(NodeOf("d1"), "n1");
  StallDeviceWatches(10s);  // both replicas' device caches freeze
  // n1 is cordoned, then n2 gains a unit: the leader moves d1 to n2 (d2 still has no room).
  Kubectl("cordon n1");
  // The leader's binder has seen the cordon (its condition written) before n2 gains the unit.
  ASSERT_TRUE(WaitFor([&] {
    for (const auto& condition : Get("gpunode n1")["status"].value("conditions", json::array())) {
      if (condition["type"] == "TakesBinds") return condition["reason"] == "Cordoned";
    }
    return false;
  })) << Logs();
  GpuNode("n2", 1);
  ASSERT_TRUE(WaitFor([&] { return NodeOf("d1") == "n2"; }, 5s)) << Logs();
  // The leader goes; the standby leads with a cache still showing d1 on n1.
  StopReplica("replica-a");
  ASSERT_TRUE(WaitFor([&] { return Holder() == "replica-b"; }, 10s)) << Logs();
  Kubectl("uncordon n1");  // n1 takes binds again: d2 has room there, and only there
  ASSERT_TRUE(WaitFor([&] { return Phase("d2") == "Bound"; }, 8s)) << Logs();
  EXPECT_EQ(NodeOf("d1"), "n2");
  EXPECT_EQ(NodeOf("d2"), "n1") << "d2 was booked onto the unit d1 holds";
  Fake().ClearFaults();
  EXPECT_NE(Log("replica-b").find("binder read the devices from the API server"), std::string::npos)
      << Log("replica-b");
}

// docs/security.md, "Hardening done": one GPUDevice that does not decode (here `spec.className:
// total`, which the model refuses, stored before the CRD refused it too) must not stop the binder.
// A new leader's list of every device (D3) skips and counts it, as the caches do, and binds the
// rest.
TEST_F(ControllerEndToEnd, D3_AnUndecodableDeviceIsSkippedAndTheNewLeaderBindsTheRest) {
  GpuNode("n1", 2);
  Apply(Class("a100"));
  json bad = Device("bad");
  bad["spec"]["className"] = "total";
  Fake().Seed(bad);
  Apply(Device("good"));
  StartReplica("replica-a", {"--enable-gpu"});
  ASSERT_TRUE(WaitFor([&] { return Phase("good") == "Bound"; }, 15s)) << Logs();
  ASSERT_TRUE(WaitFor([&] {
    return Metrics("replica-a").find("gpu_controller_binder_undecodable_total 1\n") !=
           std::string::npos;
  })) << Log("replica-a");
  EXPECT_NE(Log("replica-a").find("binder skipped a GPUDevice it cannot decode"),
            std::string::npos);
  EXPECT_NE(Log("replica-a").find(Tenant() + "/bad"), std::string::npos) << Log("replica-a");
  // A bind request is answered as well.
  Apply(Device("asked"));
  AskToBind("asked", "r1");
  ASSERT_TRUE(WaitFor([&] {
    return Get("gpudevice asked", Tenant())["status"]
               .value("bindResponse", json::object())
               .value("result", "") == "Succeeded";
  })) << Logs();
}

// docs/security.md, "Hardening done": a large cluster gets ready. 20,000 pods of about 1 KB each
// are a list far over the client's 16 MiB response cap in one piece: the pod cache lists in pages
// of 500 (as client-go's reflector), and a list the server refuses (403) is logged, naming the
// cache, while it retries. Every pod is read; the cache keeps the tenth that asks for an extended
// resource. The replica's resident memory is printed for docs/benchmarks.md.
// G13: 76 pods of 240 KB (annotations, as last-applied configurations and managed fields grow on
// real clusters) are 17.8 MiB in one page of 500, over the client's 16 MiB cap: the controller
// stayed unready, its log saying only "response body is longer than 16777216 bytes". The page is
// asked for again with half as many pods until it fits; the controller becomes ready and says so.
TEST_F(ControllerEndToEnd, G13_ListPagesOverTheResponseCapAreHalvedAndTheControllerGetsReady) {
  const std::string padding(240 * 1000, 'x');
  json list = {{"apiVersion", "v1"}, {"kind", "List"}, {"items", json::array()}};
  for (int i = 0; i < 76; ++i) {
    list["items"].push_back({{"apiVersion", "v1"},
                             {"kind", "Pod"},
                             {"metadata",
                              {{"name", "heavy-" + std::to_string(i)},
                               {"namespace", Tenant()},
                               {"annotations", {{"example.com/padding", padding}}}}},
                             {"spec", {{"containers", {{{"name", "c"}, {"image", "busybox"}}}}}}});
  }
  std::ofstream(Path("heavy.json")) << list.dump();
  Kubectl("create --validate=false -f " + ShellQuote(Path("heavy.json").string()));
  StartReplica("replica-a", {"--enable-gpu"});
  ASSERT_TRUE(ReadyWithin("replica-a", 60s)) << Log("replica-a").substr(0, 4000);
  const std::string log = Log("replica-a");
  EXPECT_NE(log.find("cache list page over the response cap; asking for smaller pages"),
            std::string::npos)
      << log.substr(0, 4000);
  if (Real()) return;  // the audit log need not record a request whose answer was cut off
  std::vector<std::string> limits;
  for (const auto& request : Requests()) {
    if (request.method != "GET" || request.path != "/api/v1/pods" ||
        request.query.find("watch") != std::string::npos) {
      continue;
    }
    const size_t at = request.query.find("limit=");
    if (at != std::string::npos) {
      limits.push_back(request.query.substr(at + 6, request.query.find('&', at) - at - 6));
    }
  }
  ASSERT_GE(limits.size(), 4u);
  EXPECT_EQ(std::vector<std::string>(limits.begin(), limits.begin() + 4),
            (std::vector<std::string>{"500", "250", "125", "62"}));
}

TEST_F(ControllerEndToEnd, TwentyThousandPodsAreListedInPagesAndAFailingListIsLogged) {
  const std::string padding(900, 'x');
  for (int i = 0; i < 20000; ++i) {
    Fake().Seed({{"apiVersion", "v1"},
                 {"kind", "Pod"},
                 {"metadata",
                  {{"name", "p" + std::to_string(i)},
                   {"namespace", "busy-" + std::to_string(i % 50)},
                   {"annotations", {{"example.com/padding", padding}}}}},
                 {"spec",
                  {{"nodeName", "node-" + std::to_string(i % 500)},
                   {"containers",
                    {{{"name", "c"},
                      {"image", "busybox"},
                      {"resources",
                       {{"requests", i % 10 == 0 ? json{{"example.com/gpu", "1"}}
                                                 : json{{"cpu", "100m"}}}}}}}}}},
                 {"status", {{"phase", "Running"}}}});
  }
  fake::Fault refused = fake::Fault::Answer(403, 2, "GET");  // RBAC not yet granted
  refused.pathPrefix = "/api/v1/pods";
  Fake().AddFault(refused);
  StartReplica("replica-a", {"--enable-gpu"});
  ASSERT_TRUE(ReadyWithin("replica-a", 90s)) << Log("replica-a").substr(0, 4000);
  const std::string log = Log("replica-a");
  EXPECT_NE(log.find("cache cannot list or watch"), std::string::npos) << log.substr(0, 4000);
  EXPECT_NE(log.find("cache=pods"), std::string::npos) << log.substr(0, 4000);
  const std::string metrics = Metrics("replica-a");
  EXPECT_NE(metrics.find("gpu_controller_cache_objects{cache=\"pods\"} 2000\n"), std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("gpu_controller_cache_ignored_changes_total{cache=\"pods\"} 18000\n"),
            std::string::npos)
      << metrics;
  int pages = 0;
  for (const auto& request : Requests()) {
    if (request.method != "GET" || request.path != "/api/v1/pods" || request.status != 200 ||
        request.query.find("watch") != std::string::npos) {
      continue;
    }
    EXPECT_NE(request.query.find("limit=500"), std::string::npos) << request.query;
    ++pages;
  }
  EXPECT_GE(pages, 40);  // 20,000 / 500
  std::ifstream status("/proc/" + std::to_string(replicas_["replica-a"]) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.starts_with("VmRSS:"))
      std::cout << "replica with 20,000 pods read, 2,000 of them kept: " << line << "\n";
  }
}

// D4: a bind request that comes while a pass is in flight queues a pass of its own that only
// answers requests, ahead of the full pass also due. The pass in flight places "slowpoke", whose
// placement write the fake holds for 4 s; meanwhile a bind request comes and "other" is ordered
// (its write held 4 s too). The request is answered by an answers-only pass (the binder's count
// of passes by kind says so; with every pass a full one it stays 0), before other is placed.
TEST_F(ControllerEndToEnd, D4_ABindRequestIsAnsweredWhileAPassWaitsOnASlowPlacementWrite) {
  GpuNode("n1", 3);
  Apply(Class("a100"));
  StartReplica("replica-a", {"--enable-gpu"});
  Apply(Device("wanted"));
  ASSERT_TRUE(WaitFor([&] { return Phase("wanted") == "Bound"; })) << Logs();
  const std::string devices =
      "/apis/gpu.cozystack.io/v1alpha1/namespaces/" + Tenant() + "/gpudevices/";
  for (const char* held : {"slowpoke", "other"}) {
    fake::Fault slow;
    slow.method = "PATCH";
    slow.pathPrefix = devices + held + "/status";
    slow.latencyMs = 4000;
    Fake().AddFault(slow);
  }
  Apply(Device("slowpoke"));  // an order: the next pass places it, and its write waits 4 s
  ASSERT_TRUE(WaitFor(
      [&] {
        // The fake logs a request when it reads it, before the fault's wait.
        for (const auto& request : Requests()) {
          if (request.method == "PATCH" && request.path == devices + "slowpoke/status") return true;
        }
        return false;
      },
      5s))
      << Logs();
  const std::string answersPasses = "gpu_controller_binder_passes_total{kind=\"answers\"}";
  const double answersBefore = std::max(0.0, Metric("replica-a", answersPasses));  // -1: none
  // What the VMI webhook does: a bind request in the status of a device it attaches.
  AskToBind("wanted", "req-1", api::FormatTime(std::chrono::system_clock::now()));
  Apply(Device("other"));
  ASSERT_TRUE(WaitFor([&] { return Answered("wanted", "req-1"); }, 15s)) << Logs();
  EXPECT_NE(Phase("other"), "Bound") << "other was placed before the request was answered";
  // The pass that answered was answers-only (counted once it ends; the page is rendered at each
  // scrape).
  EXPECT_TRUE(WaitFor([&] { return Metric("replica-a", answersPasses) > answersBefore; }, 3s))
      << Metrics("replica-a") << Log("replica-a");
  const json answered = Get("gpudevice wanted", Tenant());
  EXPECT_EQ(answered["status"]["bindResponse"]["result"], "Succeeded");
  EXPECT_EQ(answered["status"]["nodeName"], "n1");
  EXPECT_TRUE(
      WaitFor([&] { return Phase("slowpoke") == "Bound" && Phase("other") == "Bound"; }, 15s))
      << Logs();
}

TEST_F(ControllerEndToEnd, D9_ARequestThatCannotBePlacedIsRefusedWithTheModelsReasonAndOneEvent) {
  GpuNode("n1", 1);
  Apply(Class("a100"));
  StartReplica("replica-a", {"--enable-gpu"});
  Apply(Device("held"));
  ASSERT_TRUE(WaitFor([&] { return Phase("held") == "Bound"; })) << Logs();
  Apply(Device("late"));
  AskToBind("late", "req-2");
  ASSERT_TRUE(WaitFor([&] { return Answered("late", "req-2"); })) << Logs();
  const json refused = Get("gpudevice late", Tenant())["status"];
  EXPECT_EQ(refused["bindResponse"]["result"], "Failed");
  EXPECT_EQ(refused["bindResponse"]["reason"], "Refused");
  EXPECT_FALSE(refused["bindResponse"].value("message", "").empty());
  EXPECT_FALSE(refused.contains("nodeName"));
  // The tenant sees why in Events regarding the device, once, however many passes refuse it.
  ASSERT_TRUE(WaitForPasses("replica-a", "binder", 2)) << Logs();  // each refuses it again
  const json events = Get("events.events.k8s.io", Tenant());
  int refusals = 0, bound = 0;
  for (const auto& event : events["items"]) {
    if (event["regarding"]["name"] == "late" && event["reason"] == "Refused") {
      ++refusals;
      EXPECT_EQ(event["type"], "Warning");
      EXPECT_EQ(event["note"], refused["bindResponse"]["message"]);
      EXPECT_EQ(event["reportingController"], "gpu.cozystack.io/gpu-controller");
    }
    bound += event["regarding"]["name"] == "held" && event["reason"] == "Bound";
  }
  EXPECT_EQ(refusals, 1) << events.dump(2);
  EXPECT_EQ(bound, 1);
}

TEST_F(ControllerEndToEnd, G5_G6_G7_KubeVirtAbsentThenServedThenGoneWhileAttached) {
  for (const char* crd : {"virtualmachineinstances.kubevirt.io", "virtualmachines.kubevirt.io",
                          "kubevirts.kubevirt.io"}) {
    Fake().DeleteCrd(crd);
  }
  GpuNode("n1", 2);
  Apply(Class("a100"));
  StartReplica("replica-a", {"--enable-gpu"});
  // G5: without KubeVirt's kinds, placement runs, and no KubeVirt object is read: the only
  // kubevirt.io requests are discovery's (the group's version, which answers 404).
  Apply(Device("d1"));
  ASSERT_TRUE(WaitFor([&] { return Phase("d1") == "Bound"; })) << Logs();
  // Since then, discovery has asked again (every 500 ms) and a reconciler pass has run: a
  // KubeVirt read either would make is in the log by now.
  const auto bound = std::chrono::steady_clock::now();
  ASSERT_TRUE(WaitForPasses("replica-a", "reconciler")) << Logs();
  ASSERT_TRUE(WaitFor([&] {
    for (const auto& request : Requests()) {
      if (request.received > bound && request.path == "/apis/kubevirt.io/v1") return true;
    }
    return false;
  })) << Logs();
  int discoveryReads = 0;
  for (const auto& request : Requests()) {
    if (request.path.starts_with("/apis/kubevirt.io")) {
      EXPECT_EQ(request.path, "/apis/kubevirt.io/v1") << request.method << " " << request.query;
      ++discoveryReads;
    }
  }
  EXPECT_GT(discoveryReads, 0);  // it did ask whether the kinds are served
  // G6: the kinds appear; their watches start without a restart.
  for (const char* file :
       {"kubevirt.io_virtualmachineinstances.yaml", "kubevirt.io_kubevirts.yaml"}) {
    Kubectl("apply -f " + ShellQuote(testing::TestCrdFile(file).string()));
  }
  ASSERT_TRUE(WaitFor([&] {
    return Log("replica-a").find("VirtualMachineInstance cache state=started") !=
               std::string::npos &&
           Log("replica-a").find("KubeVirt cache state=started") != std::string::npos;
  })) << Logs();
  Apply(Vmi("vm1"));
  PatchStatus("d1", {{"attachment", {{"vmiName", "vm1"}, {"vmiUID", VmiUid("vm1")}}}});
  ASSERT_TRUE(WaitForPasses("replica-a", "reconciler")) << Logs();
  EXPECT_TRUE(Get("gpudevice d1", Tenant())["status"].contains("attachment"));
  // G7: discovery stops showing the kind while d1 is attached (KubeVirt's API in an upgrade:
  // every kubevirt.io request answers 404, the VMIs themselves untouched). A gap in discovery is
  // not an ended VMI: the pass fails, and nothing is detached or moved.
  fake::Fault gap;
  gap.pathPrefix = "/apis/kubevirt.io";
  gap.status = 404;
  Fake().AddFault(gap);
  ASSERT_TRUE(WaitFor([&] {
    return Log("replica-a").find("VirtualMachineInstances cannot be read while") !=
           std::string::npos;
  })) << Logs()
      << Get("gpudevice d1", Tenant()).dump(2);
  // Passes that cannot read VMIs have run: neither detached (the reconciler) nor moved (the
  // binder).
  ASSERT_TRUE(WaitForPasses("replica-a", "binder+reconciler")) << Logs();
  const json d1 = Get("gpudevice d1", Tenant());
  EXPECT_EQ(d1["status"]["phase"], "Bound");
  EXPECT_EQ(d1["status"]["attachment"]["vmiName"], "vm1");
  // The kind is back: placement resumes, and the running VM keeps its device.
  Fake().ClearFaults();
  Apply(Device("d2"));
  ASSERT_TRUE(WaitFor([&] { return Phase("d2") == "Bound"; })) << Logs();
  EXPECT_EQ(Get("gpudevice d1", Tenant())["status"]["attachment"]["vmiName"], "vm1");
}

// G4: with GPUs on, readiness waits for the caches that need no KubeVirt (here the
// Nodes, which the API server refuses to list for a while) and never for KubeVirt (its CRDs are
// absent throughout). Liveness is unaffected; once the Nodes list, the replica is ready.
TEST_F(ControllerEndToEnd, G4_ReadinessWaitsForANonKubeVirtCacheButNeverForKubeVirt) {
  for (const char* crd : {"virtualmachineinstances.kubevirt.io", "virtualmachines.kubevirt.io",
                          "kubevirts.kubevirt.io"}) {
    Fake().DeleteCrd(crd);
  }
  GpuNode("n1", 2);
  Apply(Class("a100"));
  fake::Fault refuse;
  refuse.pathPrefix = "/api/v1/nodes";
  refuse.status = 403;
  Fake().AddFault(refuse);
  StartReplica("replica-a", {"--enable-gpu"});
  const std::string base = "http://127.0.0.1:" + std::to_string(ports_["replica-a"]);
  const auto code = [&](const char* path) {
    return testing::RunCommand("curl -s -o /dev/null -w '%{http_code}' " + base + path).out;
  };
  ASSERT_TRUE(WaitFor([&] { return code("/healthz") == "200"; })) << Logs();
  ASSERT_TRUE(WaitFor([&] { return Log("replica-a").find("cache=nodes") != std::string::npos; }))
      << Logs();
  // The readiness of four ticks (1 s each). Kept a sleep: readiness is what is asserted, it is
  // set once a tick, and no counter tells a tick that changed nothing from none.
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(code("/readyz"), "503") << Logs();
    EXPECT_EQ(code("/healthz"), "200");
    std::this_thread::sleep_for(1s);
  }
  Fake().ClearFaults();
  EXPECT_TRUE(WaitFor([&] { return code("/readyz") == "200"; }, 15s)) << Logs();
  // Ready without KubeVirt: its kinds were never served.
  EXPECT_EQ(Log("replica-a").find("VirtualMachineInstance cache state=started"), std::string::npos);
}

TEST_F(ControllerEndToEnd, D5_D6_ALostSetWinsTheLastUnitAndNewOrdersGoToTheFullestNode) {
  GpuNode("n1", 2);
  GpuNode("n2", 2);
  Apply(Class("a100"));
  // Before the controller starts: one order held on n1, one Lost (its node failed), one new
  // order, and a VM whose two devices fit only on two different nodes.
  Apply(Device("held"));
  PatchStatus("held", {{"phase", "Bound"}, {"nodeName", "n1"}});
  Apply(Device("filler"));
  PatchStatus("filler", {{"phase", "Bound"}, {"nodeName", "n2"}});
  Apply(Device("lost"));
  PatchStatus("lost", {{"phase", "Lost"}});
  Apply(Device("new"));
  StartReplica("replica-a", {"--enable-gpu"});
  // One unit is free on each node: the Lost set is rebound before the new order takes a unit,
  // then the new order goes to the fullest node with room (never spreading to a fresh one).
  ASSERT_TRUE(WaitFor([&] { return Phase("lost") == "Bound" && Phase("new") == "Bound"; }))
      << Logs() << Get("gpudevices", Tenant()).dump(2);
  EXPECT_EQ(Get("gpudevice lost", Tenant())["status"]["nodeName"], "n1");  // the fuller, by name
  EXPECT_EQ(Get("gpudevice new", Tenant())["status"]["nodeName"], "n2");
  std::string placed;
  for (const auto& write : PlacementWrites()) placed += write.path + " ";
  EXPECT_LT(placed.find("/lost/"), placed.find("/new/")) << placed;  // Lost first
}

TEST_F(ControllerEndToEnd, D9_AVmsTwoDevicesThatFitOnlyOnDifferentNodesAreRefusedTogether) {
  GpuNode("n1", 1);
  GpuNode("n2", 1);
  Apply(Class("a100"));
  // As the VMI webhook leaves them: both attached to one VMI, each with a bind request.
  Apply(Vmi("vm2"));
  for (const std::string name : {"a", "b"}) {
    Apply(Device(name));
    PatchStatus(
        name, {{"attachment", {{"vmiName", "vm2"}, {"vmiUID", VmiUid("vm2")}}},
               {"bindRequest", {{"id", "req-" + name}, {"requestedAt", "2026-12-01T00:00:00Z"}}}});
  }
  StartReplica("replica-a", {"--enable-gpu"});
  ASSERT_TRUE(WaitFor([&] { return Answered("a", "req-a") && Answered("b", "req-b"); })) << Logs();
  for (const std::string name : {"a", "b"}) {
    const json status = Get("gpudevice " + name, Tenant())["status"];
    EXPECT_EQ(status["bindResponse"]["result"], "Failed") << name;
    EXPECT_FALSE(status.contains("nodeName")) << name;
  }
  EXPECT_TRUE(PlacementWrites().empty());  // answers only, no unit booked
}

TEST_F(ControllerEndToEnd, D10_ACordonMovesASetOnlyWithRoomElsewhereAndNeverAStayClass) {
  GpuNode("n1", 1);
  GpuNode("n2", 1);
  Apply(Class("a100"));
  json stay = Class("t4");
  stay["spec"]["onCordon"] = "Stay";
  Apply(stay);
  Apply(Device("moves"));
  PatchStatus("moves", {{"phase", "Bound"}, {"nodeName", "n1"}});
  StartReplica("replica-a", {"--enable-gpu"});
  ASSERT_TRUE(WaitFor([&] {
    return HasFinalizer(Get("gpudevice moves", Tenant()), "gpu.cozystack.io/device-protection");
  })) << Logs();
  // Cordon n1: n2 has room, so the set moves.
  Kubectl("cordon n1");
  ASSERT_TRUE(WaitFor([&] {
    return Get("gpudevice moves", Tenant())["status"].value("nodeName", "") == "n2";
  })) << Logs();
  // Cordon n2 as well: nowhere else has room, so the set stays where it is, Bound, and a bind
  // request for it is answered Succeeded in place (the pod webhook pins the VM there).
  Kubectl("cordon n2");
  ASSERT_TRUE(WaitForPasses("replica-a", "binder")) << Logs();
  EXPECT_EQ(Get("gpudevice moves", Tenant())["status"]["nodeName"], "n2");
  EXPECT_EQ(Phase("moves"), "Bound");
  AskToBind("moves", "req-c");
  ASSERT_TRUE(WaitFor([&] { return Answered("moves", "req-c"); })) << Logs();
  EXPECT_EQ(Get("gpudevice moves", Tenant())["status"]["bindResponse"]["result"], "Succeeded");
  EXPECT_EQ(Get("gpudevice moves", Tenant())["status"]["nodeName"], "n2");
  // Each GPUNode says whether it takes binds, and why not; written once per change.
  ASSERT_TRUE(WaitFor([&] {
    for (const auto& condition : Get("gpunode n1")["status"].value("conditions", json::array())) {
      if (condition["type"] == "TakesBinds") return condition["reason"] == "Cordoned";
    }
    return false;
  })) << Logs();
  json takesBinds;
  const json cordoned = Get("gpunode n1");
  for (const auto& condition : cordoned["status"]["conditions"]) takesBinds = condition;
  EXPECT_EQ(takesBinds["status"], "False");
  EXPECT_NE(takesBinds.value("message", "").find("cordon"), std::string::npos) << takesBinds;
  const std::string version = Get("gpunode n1")["metadata"]["resourceVersion"];
  // Passes go on; an unchanged condition is not written.
  ASSERT_TRUE(WaitForPasses("replica-a", "binder")) << Logs();
  EXPECT_EQ(Get("gpunode n1")["metadata"]["resourceVersion"], version);
  // Each condition write replaces the list it was built from, so it is conditional on that
  // version (docs/security.md): another writer's condition in between makes it a 409, not a loss.
  int conditionWrites = 0;
  for (const auto& request : Requests()) {
    if (request.method != "PATCH" || request.path.find("/gpunodes/") == std::string::npos ||
        request.body.find("TakesBinds") == std::string::npos) {
      continue;
    }
    ++conditionWrites;
    const json body = json::parse(request.body, nullptr, false);
    EXPECT_FALSE(body.value("metadata", json::object()).value("resourceVersion", "").empty())
        << request.body;
  }
  EXPECT_GE(conditionWrites, 2);
  // A class with onCordon Stay keeps its node even when another has room.
  Kubectl("uncordon n1");
  json stays = Device("stays");
  stays["spec"]["className"] = "t4";
  Apply(stays);
  PatchStatus("stays", {{"phase", "Bound"}, {"nodeName", "n2"}});
  ASSERT_TRUE(WaitForPasses("replica-a", "binder")) << Logs();
  EXPECT_EQ(Get("gpudevice stays", Tenant())["status"]["nodeName"], "n2");
  const json uncordoned = Get("gpunode n1");
  for (const auto& condition : uncordoned["status"]["conditions"]) {
    if (condition["type"] == "TakesBinds") {
      EXPECT_EQ(condition["status"], "True");  // uncordoned
      EXPECT_EQ(condition["reason"], "Eligible");
    }
  }
}

// C7, D5 (docs/controller.md, "NotReady is not gone"): a node that is NotReady for a moment (a
// kubelet restart, a network blip) keeps the GPUs held on it for the grace (--not-ready-grace,
// measured from the Ready condition's lastTransitionTime); a VM start meanwhile is refused with the
// reason rather than pinned to a node its launcher cannot reach; once the grace has run out the
// held set moves.
TEST_F(ControllerEndToEnd, C7_D5_ANotReadyNodeKeepsItsHeldGpusForTheGraceThenTheyMove) {
  GpuNode("n1", 1);
  GpuNode("n2", 0);
  Apply(Class("a100"));
  StartReplica("replica-a", {"--enable-gpu", "--not-ready-grace", "8s"});
  ASSERT_TRUE(WaitFor([&] { return Holder() == "replica-a"; })) << Logs();
  Apply(Device("held"));
  ASSERT_TRUE(WaitFor([&] { return Phase("held") == "Bound"; })) << Logs();
  ASSERT_EQ(NodeOf("held"), "n1");
  GpuNode("n2", 1);  // room elsewhere, so only the grace keeps the set on n1
  const json notReady = {
      {"status",
       {{"conditions",
         {{{"type", "Ready"},
           {"status", "False"},
           {"reason", "KubeletNotReady"},
           {"message", "container runtime is down"},
           {"lastHeartbeatTime", api::FormatTime(std::chrono::system_clock::now())},
           {"lastTransitionTime", api::FormatTime(std::chrono::system_clock::now())}}}}}}};
  Kubectl("patch node n1 --subresource=status --type=merge -p " + ShellQuote(notReady.dump()));
  // Passes that saw the node NotReady have run (the bound stays under the 8 s grace: a wait
  // that ran past it would fail the assertion below, never pass it).
  ASSERT_TRUE(WaitForPasses("replica-a", "binder", 2, 6s)) << Logs();
  EXPECT_EQ(NodeOf("held"), "n1") << "moved within the grace\n" << Logs();
  EXPECT_EQ(Phase("held"), "Bound");
  AskToBind("held", "req-nr", api::FormatTime(std::chrono::system_clock::now()));
  ASSERT_TRUE(WaitFor([&] { return Answered("held", "req-nr"); })) << Logs();
  const json response = Get("gpudevice held", Tenant())["status"]["bindResponse"];
  // n2 has room: the start moves the set there rather than wait on n1.
  EXPECT_EQ(response["result"], "Succeeded") << response;
  EXPECT_EQ(NodeOf("held"), "n2") << response;

  // The same on n2 with no room elsewhere: the start is refused, the set stays held on n2 for
  // the grace, and moves once it has run out and n1 is Ready again.
  Apply(testing::ReadyNode("n1"));
  Kubectl("patch node n1 --subresource=status --type=merge -p " +
          ShellQuote(json{{"status", testing::ReadyNode("n1")["status"]}}.dump()));
  Kubectl("cordon n1");
  json n2NotReady = notReady;
  n2NotReady["status"]["conditions"][0]["lastTransitionTime"] =
      api::FormatTime(std::chrono::system_clock::now());
  Kubectl("patch node n2 --subresource=status --type=merge -p " + ShellQuote(n2NotReady.dump()));
  // The binder has seen n1 cordoned and n2 NotReady before the start is asked for.
  ASSERT_TRUE(WaitForPasses("replica-a", "binder", 1, 6s)) << Logs();
  AskToBind("held", "req-nr2", api::FormatTime(std::chrono::system_clock::now()));
  ASSERT_TRUE(WaitFor([&] { return Answered("held", "req-nr2"); })) << Logs();
  const json refused = Get("gpudevice held", Tenant())["status"]["bindResponse"];
  EXPECT_EQ(refused["result"], "Failed") << refused;
  EXPECT_NE(refused.value("message", "").find("node n2 is not Ready"), std::string::npos)
      << refused;
  EXPECT_EQ(NodeOf("held"), "n2");
  EXPECT_EQ(Phase("held"), "Bound");
  Kubectl("uncordon n1");
  ASSERT_TRUE(WaitFor([&] { return NodeOf("held") == "n1"; }, 15s))
      << "the grace ran out and n1 takes binds\n"
      << Logs();
}

TEST_F(ControllerEndToEnd, D17_KubeVirtsTableJoinsTheSettingsNameSet) {
  Apply({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "kubevirt"}}}});
  StartReplica("replica-a", {"--enable-gpu", "--gpu-resource-names", "nvidia.com/A"});
  Apply(Class("a100"));
  auto names = [&] {
    const json settings = Get("configmap cozy-gpu-settings", "cozy-system");
    return settings.is_object() ? settings["data"].value("resourceNames", "") : "";
  };
  ASSERT_TRUE(WaitFor([&] { return names() == "nvidia.com/A,nvidia.com/GA100"; }))
      << names() << Logs();
  // An NVIDIA PCI entry and a mediated entry join; another vendor's PCI entry (a ConnectX VF)
  // does not.
  Apply({{"apiVersion", "kubevirt.io/v1"},
         {"kind", "KubeVirt"},
         {"metadata", {{"name", "kubevirt"}, {"namespace", "kubevirt"}}},
         {"spec",
          {{"configuration",
            {{"permittedHostDevices",
              {{"pciHostDevices",
                {{{"pciVendorSelector", "10DE:20B5"}, {"resourceName", "nvidia.com/PCI_X"}},
                 {{"pciVendorSelector", "15B3:101E"}, {"resourceName", "mellanox.com/VF"}}}},
               {"mediatedDevices",
                {{{"mdevNameSelector", "NVIDIA A2-4Q"},
                  {"resourceName", "nvidia.com/MDEV_Y"}}}}}}}}}}});
  ASSERT_TRUE(WaitFor([&] {
    return names() == "nvidia.com/A,nvidia.com/GA100,nvidia.com/MDEV_Y,nvidia.com/PCI_X";
  })) << names()
      << Logs();
}

TEST_F(ControllerEndToEnd, D1_ALeaderChangeInTheMiddleOfAPassWritesEachPlacementOnce) {
  GpuNode("n1", 64);
  Apply(Class("a100"));
  // No webhook drain: a leader stopped with SIGTERM keeps placing while its webhooks drain
  // (docs/controller.md, "How a replica starts and stops"), and this pass would end first.
  StartReplica("replica-a", {"--enable-gpu", "--shutdown-delay", "0s"});
  ASSERT_TRUE(WaitFor([&] { return Holder() == "replica-a"; })) << Logs();
  StartReplica("replica-b", {"--enable-gpu"});
  // Every placement write takes 600 ms, so a pass over 30 new orders takes seconds even with
  // the binder's writes eight at a time (Binder::kWriters): four rounds, 2.4 s.
  fake::Fault slow;
  slow.method = "PATCH";
  slow.pathPrefix = "/apis/gpu.cozystack.io/v1alpha1/namespaces/" + Tenant() + "/gpudevices/";
  slow.latencyMs = 600;
  Fake().AddFault(slow);
  const std::filesystem::path file = Path("orders.yaml");
  {
    std::ofstream out(file);
    for (int i = 0; i < 30; ++i) out << Device("o" + std::to_string(i)).dump() << "\n";
  }
  Kubectl("apply -f " + ShellQuote(file.string()));
  // The leader's first writes have been answered: its pass is in its second round of writes.
  ASSERT_TRUE(WaitFor([&] {
    for (const auto& write : PlacementWrites()) {
      if (write.status > 0) return true;
    }
    return false;
  })) << Logs();
  StopReplica("replica-a");  // mid-pass: it stops writing, releases, the standby goes on
  ASSERT_TRUE(WaitFor(
      [&] {
        for (int i = 0; i < 30; ++i) {
          if (Phase("o" + std::to_string(i)) != "Bound") return false;
        }
        return true;
      },
      30s))
      << Logs();
  std::map<std::string, int> perDevice;
  std::chrono::steady_clock::time_point lastOfA{},
      firstOfB = std::chrono::steady_clock::time_point::max();
  for (const auto& write : PlacementWrites()) ++perDevice[write.path];
  for (const auto& write : PlacementWrites(true)) {  // attempts too: who tried to write, when
    if (write.bearerToken == "replica-a") lastOfA = std::max(lastOfA, write.received);
    if (write.bearerToken == "replica-b") firstOfB = std::min(firstOfB, write.received);
  }
  EXPECT_EQ(perDevice.size(), 30u);
  for (const auto& [path, count] : perDevice) EXPECT_EQ(count, 1) << path;
  ASSERT_NE(lastOfA, std::chrono::steady_clock::time_point{}) << "the leader placed nothing";
  ASSERT_NE(firstOfB, std::chrono::steady_clock::time_point::max()) << "the standby placed nothing";
  EXPECT_LT(lastOfA, firstOfB);  // never two writers at once
}

// C12: one reader of the launcher proof, whichever way the VMI arrives: in a listed snapshot
// (simulate, the binder's list), from the cache the controller's replicas keep (a watch), and
// from a read of the named VMI (usage records, GPUs off). Each gives LauncherIndex the same VMI,
// so the same pod is the launcher and an impostor (owner reference and labels set, but not in
// status.activePods) is not, on every path.
TEST(LauncherReaderC12, ListCacheAndNamedReadGiveTheSameAnswer) {
  fake::FakeApiServerOptions options;
  options.crdPaths = {testing::TestCrdDir()};
  fake::FakeApiServer server(options);
  server.Start();
  const json vmi = {{"apiVersion", "kubevirt.io/v1"},
                    {"kind", "VirtualMachineInstance"},
                    {"metadata", {{"name", "vm1"}, {"namespace", Tenant()}, {"uid", "vmi-uid"}}},
                    {"spec", {{"domain", {{"devices", json::object()}}}}},
                    {"status", {{"nodeName", "n1"}, {"activePods", {{"launcher-uid", "n1"}}}}}};
  server.Seed({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", Tenant()}}}});
  const json stored = server.Seed(vmi);

  auto answer = [](const model::VirtualMachineInstance& read) {
    const model::SharedVector<model::VirtualMachineInstance> vmis = {read};
    const model::LauncherIndex index(vmis);
    model::Pod launcher;
    launcher.namespaceName = Tenant();
    launcher.name = "virt-launcher-vm1-abcde";
    launcher.uid = "launcher-uid";
    launcher.nodeName = "n1";
    launcher.phase = "Running";
    model::Pod impostor = launcher;
    impostor.name = "virt-launcher-vm1-fake1";
    impostor.uid = "impostor-uid";
    const auto* found = index.LauncherOf(launcher);
    return std::make_pair(found ? found->name : std::string("none"),
                          index.LauncherOf(impostor) == nullptr);
  };

  // A listed snapshot.
  const model::Snapshot snapshot =
      controller::DecodeSnapshotList({{"kind", "List"}, {"items", json::array({stored})}});
  ASSERT_EQ(snapshot.vmis.size(), 1u);
  // The cache, over a real list and watch.
  kube::ClientConfig config;
  config.server = server.url();
  kube::Client client(config);
  kube::Cache<model::VirtualMachineInstance> cache(
      client, "/apis/kubevirt.io/v1/virtualmachineinstances", controller::VmiFromJson);
  cache.Start();
  ASSERT_TRUE(WaitFor([&] { return cache.Synced(); }));
  const auto cached = cache.Get(Tenant() + "/vm1");
  ASSERT_TRUE(cached);
  // A read of the named VMI.
  const model::VirtualMachineInstance named = controller::VmiFromJson(
      client.Get("/apis/kubevirt.io/v1/namespaces/" + Tenant() + "/virtualmachineinstances/vm1"));

  const auto expected = std::make_pair(std::string("vm1"), true);
  EXPECT_EQ(answer(snapshot.vmis[0]), expected);
  EXPECT_EQ(answer(*cached), expected);
  EXPECT_EQ(answer(named), expected);
  EXPECT_EQ(cached->creationTimestamp, named.creationTimestamp);
  EXPECT_FALSE(named.creationTimestamp.empty());
  cache.Stop();
  server.Stop();
}

// The samples of a /metrics page whose names start with `prefix`, by name and labels as the
// page writes them.
std::map<std::string, double> Samples(const std::string& page, const std::string& prefix) {
  std::map<std::string, double> samples;
  std::istringstream lines(page);
  for (std::string line; std::getline(lines, line);) {
    if (!line.starts_with(prefix)) continue;
    const size_t space = line.rfind(' ');
    samples[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return samples;
}

// docs/controller.md, "Catalog metrics": for one cluster, every figure of the leader's
// gpu_catalog_* families is what `kubectl gpu catalog -o json` and `kubectl gpu nodes -o json`
// print, or (the orders) what the GPUDevices say; the standby exports none of them, and only the
// leader has a binder pass that succeeded.
TEST_F(ControllerEndToEnd, TheLeadersCatalogMetricsAreWhatKubectlGpuPrints) {
  // n1 takes binds; n2 is cordoned, n3 tainted; the GPUNode ghost has no Node.
  GpuNode("n1", 4);
  GpuNode("n2", 2);
  GpuNode("n3", 1);
  Kubectl("cordon n2");
  Kubectl("taint nodes n3 gpu=reserved:NoSchedule");
  Apply({{"apiVersion", "gpu.cozystack.io/v1alpha1"},
         {"kind", "GPUNode"},
         {"metadata", {{"name", "ghost"}}}});
  Kubectl("patch gpunode ghost --subresource=status --type=merge -p " +
          ShellQuote(json{{"status", testing::GpuNodeStatus(2)}}.dump()));
  Apply(Class("a100"));
  // Two tenants: the test's holds 2 units, the other 1; an order of 3 finds no room (n1 has 4).
  const std::string other = Tenant() + "-b";
  Apply({{"apiVersion", "v1"},
         {"kind", "Namespace"},
         {"metadata",
          {{"name", other},
           {"labels",
            {{"cozy-gpu-e2e", "tenant"}, {std::string(api::kTenantNamespaceLabel), "true"}}}}}});
  Apply(Device("a1"));
  Apply(Device("a2"));
  json otherDevice = Device("b1");
  otherDevice["metadata"]["namespace"] = other;
  Apply(otherDevice);
  json big = Device("big");
  big["spec"]["count"] = 3;
  Apply(big);
  const std::vector<std::string> flags = {"--enable-gpu", "--catalog-tenant-series", "1"};
  StartReplica("replica-a", flags);
  StartReplica("replica-b", flags);
  ASSERT_TRUE(WaitFor([&] {
    return Phase("a1") == "Bound" && Phase("a2") == "Bound" && !Holder().empty() &&
           Get("gpudevice b1", other)["status"].value("phase", "") == "Bound";
  })) << Logs();
  const std::string leader = Holder();
  const std::string standby = leader == "replica-a" ? "replica-b" : "replica-a";

  const auto plugin = [&](const std::string& command) {
    const auto result = testing::RunCommand(
        std::string(KUBECTL_GPU) + " " + command + " -o json --controller-namespace cozy-system" +
        " --kubeconfig " + ShellQuote(Path("kubeconfig").string()));
    EXPECT_EQ(result.exitCode, 0) << command << ": " << result.err;
    return result.exitCode == 0 ? json::parse(result.out) : json();
  };
  // What each figure must be, as `kubectl gpu` and the GPUDevices say it now; compared with the
  // page of a pass begun after they were read (the cluster is settled, but a real one's nodes
  // may still change under it: read again until they agree, or say how they differ).
  std::string differences;
  std::map<std::string, double> expected;
  std::map<std::string, double> page;
  for (int attempt = 0; attempt < 5; ++attempt) {
    expected.clear();
    const json catalog = plugin("catalog");
    const json nodes = plugin("nodes");
    const json devices = Get("gpudevices -A");
    ASSERT_TRUE(devices.is_object());
    const auto label = [](const std::string& key, const std::string& value) {
      return key + "=\"" + value + "\"";
    };
    for (const json& c : catalog["classes"]) {
      const std::string of = "{" + label("class", c["name"].get<std::string>()) + "}";
      expected["gpu_catalog_class_units" + of] = c["units"].get<double>();
      expected["gpu_catalog_class_units_held" + of] = c["used"].get<double>();
      expected["gpu_catalog_class_units_free" + of] = c["free"].get<double>();
      expected["gpu_catalog_class_orders_pending" + of] = 0;
    }
    for (const json& node : nodes["nodes"]) {
      const std::string name = node["name"].get<std::string>();
      expected["gpu_catalog_node_takes_binds{" + label("node", name) + "}"] =
          node["takesBinds"].get<bool>() ? 1 : 0;
      expected["gpu_catalog_node_orders_bound{" + label("node", name) + "}"] = 0;
    }
    std::map<std::string, double> held;  // by namespace
    for (const json& device : devices["items"]) {
      const json status = device.value("status", json::object());
      const std::string phase = status.value("phase", "Pending");
      if (phase == "Pending") {
        expected["gpu_catalog_class_orders_pending{" +
                 label("class", device["spec"]["className"].get<std::string>()) + "}"] += 1;
      } else if (phase == "Bound") {
        expected["gpu_catalog_node_orders_bound{" + label("node", status.value("nodeName", "")) +
                 "}"] += 1;
        held[device["metadata"]["namespace"].get<std::string>()] +=
            device["spec"]["count"].get<double>();
      }
    }
    // --catalog-tenant-series 1: the test's tenant (2 units) has its series, the other is summed.
    EXPECT_EQ(held, (std::map<std::string, double>{{Tenant(), 2}, {other, 1}}));
    expected["gpu_catalog_tenant_units_held{" + label("namespace", Tenant()) + "," +
             label("class", "a100") + "}"] = 2;
    expected["gpu_catalog_tenant_units_held{" + label("namespace", "_other") + "," +
             label("class", "a100") + "}"] = 1;
    // The model's reasons as the fixed labels.
    for (const auto& [node, reason] : std::map<std::string, std::string>{
             {"n2", "cordoned"}, {"n3", "tainted"}, {"ghost", "no_node"}}) {
      expected["gpu_catalog_node_not_taking_binds{" + label("node", node) + "," +
               label("reason", reason) + "}"] = 1;
    }
    ASSERT_TRUE(WaitForPasses(leader, "binder"));
    page = Samples(Metrics(leader), "gpu_catalog_");
    const double oldest = page["gpu_catalog_class_oldest_pending_seconds{class=\"a100\"}"];
    page.erase("gpu_catalog_class_oldest_pending_seconds{class=\"a100\"}");
    differences.clear();
    for (const auto& [sample, value] : expected) {
      const auto found = page.find(sample);
      if (found == page.end() || found->second != value) {
        differences += sample + ": kubectl gpu " + std::to_string(value) + ", /metrics " +
                       (found == page.end() ? "none" : std::to_string(found->second)) + "\n";
      }
    }
    for (const auto& [sample, value] : page) {
      if (!expected.contains(sample)) differences += sample + " on /metrics only\n";
    }
    // The order of 3 has waited since its creationTimestamp (whole seconds).
    const auto created =
        api::ParseTime(Get("gpudevice big", Tenant())["metadata"].value("creationTimestamp", ""));
    ASSERT_TRUE(created.has_value());
    const double waited =
        std::chrono::duration<double>(std::chrono::system_clock::now() - *created).count();
    if (oldest <= 0 || oldest > waited + 1 || oldest < waited - 5) {
      differences += "oldest pending " + std::to_string(oldest) + " s, the order waited " +
                     std::to_string(waited) + " s\n";
    }
    if (differences.empty()) break;
  }
  EXPECT_EQ(differences, "") << Logs();
  // What this cluster shows, so the comparison above compared something.
  EXPECT_EQ(page["gpu_catalog_class_units{class=\"a100\"}"], 7);
  EXPECT_EQ(page["gpu_catalog_class_units_held{class=\"a100\"}"], 3);
  EXPECT_EQ(page["gpu_catalog_class_units_free{class=\"a100\"}"], 1);
  EXPECT_EQ(page["gpu_catalog_class_orders_pending{class=\"a100\"}"], 1);
  EXPECT_EQ(page["gpu_catalog_node_orders_bound{node=\"n1\"}"], 3);
  EXPECT_EQ(page["gpu_catalog_node_takes_binds{node=\"n1\"}"], 1);
  // The standby exports no catalog family, and has had no binder pass to succeed.
  const std::string standbyPage = Metrics(standby);
  EXPECT_EQ(standbyPage.find("\ngpu_catalog_"), std::string::npos) << standbyPage;
  EXPECT_EQ(Metric(standby, "gpu_controller_binder_last_success_timestamp_seconds"), 0);
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_NEAR(Metric(leader, "gpu_controller_binder_last_success_timestamp_seconds"), now, 30);
}

}  // namespace
}  // namespace cozy::e2e
