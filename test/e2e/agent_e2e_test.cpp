// End to end: `gpu-agent run` as a process on a fixture host, the fake kubelet over a real unix
// socket, and the fake API server over HTTP, read through its request log (DESIGN §4.5).
// A7, A8, A9: finished pods hold nothing; only the agent's own fields and node are written.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "test/e2e/agent_fixture.h"
#include "test/fakes/fake_apiserver.h"
#include "test/fakes/fake_kubelet.h"
#include "test/support/agent_process.h"
#include "test/support/fixture_host.h"
#include "test/support/process.h"

namespace cozy {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using testing::WaitFor;

const std::string kGpuNodes = "/apis/gpu.cozystack.io/v1alpha1/gpunodes";

bool IsWrite(const fake::LoggedRequest& request) {
  return request.method == "POST" || request.method == "PUT" || request.method == "PATCH" ||
         request.method == "DELETE";
}

class AgentEndToEnd : public AgentOnFakeCluster {
 protected:
  void SetUp() override {
    AgentOnFakeCluster::SetUp();
    SeedNode("n2", "22222222-2222-2222-2222-222222222222");
    // Another node's GPUNode, which this agent must never touch (A9).
    server_->Seed({{"apiVersion", "gpu.cozystack.io/v1alpha1"},
                   {"kind", "GPUNode"},
                   {"metadata", {{"name", "n2"}}},
                   {"status", {{"devices", json::array()}, {"summary", {{"gpus", 0}}}}}});
  }

  void StartAgent() {
    otherNodeBefore_ = GpuNode("n2");
    AgentOnFakeCluster::StartAgent();
  }

  std::string AgentLog() const { return agent_.Log(); }

  std::vector<fake::LoggedRequest> Writes() const {
    std::vector<fake::LoggedRequest> writes;
    for (const auto& request : server_->Requests()) {
      if (IsWrite(request) && request.status < 300) {
        writes.push_back(request);
      }
    }
    return writes;
  }

  // Waits until the agent has read kubelet's pod-resources `reads` more times (every 200 ms
  // here): each read's counts are compared with what was published, so the reads are the
  // agent's passes, and a write one would cause has been offered by the read after it.
  bool WaitForPodResourcesReads(int64_t reads) {
    const int64_t from = kubelet_.Calls().list;
    return WaitFor([&] { return kubelet_.Calls().list >= from + reads; }, 10s);
  }
  json otherNodeBefore_;
};

TEST_F(AgentEndToEnd, A8_A9_FirstStartCreatesAndPatchesOnceThenSteadyStateWritesNothing) {
  StartAgent();
  ASSERT_TRUE(WaitFor([&] { return Published(); })) << AgentLog();
  // Steady state: passes go on (pod-resources is read every 200 ms) and write nothing.
  ASSERT_TRUE(WaitForPodResourcesReads(3)) << AgentLog();
  const auto writes = Writes();
  ASSERT_EQ(writes.size(), 2U) << AgentLog();
  EXPECT_EQ(writes[0].method, "POST");
  EXPECT_EQ(writes[0].path, kGpuNodes);
  EXPECT_EQ(writes[1].method, "PATCH");
  EXPECT_EQ(writes[1].path, kGpuNodes + "/n1/status");
  EXPECT_EQ(writes[1].contentType, "application/merge-patch+json");
  EXPECT_EQ(writes[1].body.find("conditions"), std::string::npos);
  for (const auto& request : server_->Requests()) {
    EXPECT_EQ(request.path.find("/gpunodes/n2"), std::string::npos) << request.path;
    EXPECT_EQ(request.bearerToken, "agent-token");
  }
  const json node = GpuNode("n1");
  EXPECT_EQ(node["metadata"]["ownerReferences"][0]["kind"], "Node");
  EXPECT_EQ(node["metadata"]["ownerReferences"][0]["uid"],
            server_->Object("v1", "nodes", "", "n1")["metadata"]["uid"]);
  EXPECT_EQ(node["status"]["resourceNames"], json::array({"nvidia.com/GA100_A100_PCIE_40GB"}));
  EXPECT_EQ(node["status"]["summary"],
            (json{{"gpus", 2}, {"healthy", 2}, {"allocatable", 2}, {"allocated", 1}}));
  EXPECT_EQ(GpuNode("n2"), otherNodeBefore_);  // untouched, resourceVersion and all
}

// The node's ResourceSlice (docs/dra.md): published once with --resource-slices on, written again
// only when its devices change, and put back when someone deletes it (kubelet deletes its node's
// slices whenever it starts).
TEST_F(AgentEndToEnd, A10_A11_TheResourceSliceIsWrittenOnlyWhenItsDevicesChangeAndIsRepaired) {
  const std::string slices = "/apis/resource.k8s.io/v1/resourceslices";
  auto slice = [&] {
    return server_->Object("resource.k8s.io/v1", "resourceslices", "", "n1-gpu.cozystack.io");
  };
  auto generation = [&] {
    const json object = slice();
    return object.is_object() ? object["spec"]["pool"]["generation"].get<int>() : 0;
  };
  // The agent's writes of slices that were stored (a dry run is not).
  auto sliceWrites = [&] {
    std::vector<fake::LoggedRequest> writes;
    for (const auto& request : Writes()) {
      if (request.path.rfind(slices, 0) == 0 && request.bearerToken == "agent-token" &&
          request.query.find("dryRun") == std::string::npos) {
        writes.push_back(request);
      }
    }
    return writes;
  };
  const int healthPort = testing::FreePort();
  healthAddress_ = "127.0.0.1:" + std::to_string(healthPort);
  // No kubelet plugin directory of the host's: the plugin registers in a temporary one.
  AgentOnFakeCluster::StartAgent({"--resource-slices", "on", "--kubelet-dir",
                                  (directory_.path() / "kubelet").string(), "--cdi-dir",
                                  (directory_.path() / "cdi").string()});
  ASSERT_TRUE(WaitFor([&] { return generation() == 1 && Published(); })) << AgentLog();
  EXPECT_TRUE(std::filesystem::is_socket(directory_.path() /
                                         "kubelet/plugins_registry/gpu.cozystack.io-reg.sock"))
      << AgentLog();
  ASSERT_TRUE(WaitForPodResourcesReads(3)) << AgentLog();  // passes after it write nothing
  ASSERT_EQ(sliceWrites().size(), 1U) << AgentLog();
  EXPECT_EQ(sliceWrites()[0].method, "POST");
  json object = slice();
  EXPECT_EQ(object["spec"]["nodeName"], "n1");
  EXPECT_EQ(object["spec"]["driver"], "gpu.cozystack.io");
  EXPECT_EQ(object["spec"]["devices"].size(), 2U);
  EXPECT_EQ(object["metadata"]["ownerReferences"][0]["uid"],
            server_->Object("v1", "nodes", "", "n1")["metadata"]["uid"]);

  // af:00.0 leaves vfio-pci: one PUT, the pool's next generation, one device left.
  server_->ClearRequests();
  Rebind("0000:af:00.0", "nvidia");
  agent_.Signal(SIGHUP);
  ASSERT_TRUE(WaitFor([&] { return generation() == 2; })) << AgentLog();
  ASSERT_TRUE(WaitForPodResourcesReads(3)) << AgentLog();
  ASSERT_EQ(sliceWrites().size(), 1U) << AgentLog();
  EXPECT_EQ(sliceWrites()[0].method, "PUT");
  EXPECT_EQ(slice()["spec"]["devices"].size(), 1U);

  // Deleted behind its back: the watch sees it go, and the agent creates it again.
  server_->ClearRequests();
  testing::RunCommand("curl -s -X DELETE " + server_->url() + slices + "/n1-gpu.cozystack.io");
  ASSERT_TRUE(WaitFor([&] { return generation() == 3; })) << AgentLog();
  EXPECT_EQ(slice()["spec"]["devices"].size(), 1U);
  EXPECT_NE(AgentLog().find("ResourceSlice deleted"), std::string::npos) << AgentLog();
  ASSERT_TRUE(WaitForPodResourcesReads(3)) << AgentLog();
  EXPECT_EQ(sliceWrites().size(), 1U) << AgentLog();  // the create, nothing after it
  // Three writes, and the rest of the passes found nothing to write.
  const std::string metrics =
      testing::RunCommand("curl -s -m 2 http://127.0.0.1:" + std::to_string(healthPort) +
                          "/metrics")
          .out;
  EXPECT_NE(metrics.find("gpu_agent_resourceslice_publishes_total{result=\"written\"} 3"),
            std::string::npos)
      << metrics;
}

TEST_F(AgentEndToEnd, BinderConditionsSurviveAndAFixtureChangeAfterSighupIsOnePatch) {
  StartAgent();
  ASSERT_TRUE(WaitFor([&] { return Published(); })) << AgentLog();
  // The binder writes its conditions (A8: the agent never sends that key).
  fake::FakeApiServer& server = *server_;
  testing::RunCommand(
      "curl -s -X PATCH -H 'Content-Type: application/merge-patch+json' -d '" +
      json{{"status", {{"conditions", {{{"type", "Schedulable"}, {"status", "True"}}}}}}}.dump() +
      "' " + server.url() + kGpuNodes + "/n1/status");
  server_->ClearRequests();
  Rebind("0000:af:00.0", "nvidia");
  agent_.Signal(SIGHUP);
  ASSERT_TRUE(WaitFor([&] { return Device(GpuNode("n1"), "0000:af:00.0")["driver"] == "nvidia"; }))
      << AgentLog();
  ASSERT_TRUE(WaitForPodResourcesReads(3)) << AgentLog();  // passes after it write nothing
  const auto writes = Writes();
  ASSERT_EQ(writes.size(), 1U) << AgentLog();
  EXPECT_EQ(writes[0].method, "PATCH");
  const json patch = json::parse(writes[0].body);
  EXPECT_FALSE(patch["status"].contains("conditions"));
  EXPECT_FALSE(patch["status"].contains("resourceNames"));  // unchanged keys are not sent
  const json node = GpuNode("n1");
  EXPECT_EQ(node["status"]["conditions"][0]["type"], "Schedulable");
  // Group 90 no longer resolves: its only member left vfio (A3); a plugin advertised the
  // function earlier on this run, so it reads Unhealthy rather than Unadvertised (A5).
  EXPECT_EQ(Device(node, "0000:af:00.0")["health"], "Unhealthy");
  EXPECT_EQ(Device(node, "0000:af:00.0")["allocatable"], 0);
}

TEST_F(AgentEndToEnd, ApiDownAndThrottledThenRecoversAndPublishesOnce) {
  server_->AddFault(fake::Fault::Answer(503, 2));
  server_->AddFault(fake::Fault::Answer(429, 1, "", 1));
  StartAgent();
  ASSERT_TRUE(WaitFor([&] { return Published(); }, 20s)) << AgentLog();
  // Kept a sleep: a second patch would come from a retry the publisher's backoff paces, and
  // the agent's publish counts are on a health port this test does not know (127.0.0.1:0).
  std::this_thread::sleep_for(1s);
  size_t statusPatches = 0;
  for (const auto& write : Writes()) {
    statusPatches += write.path == kGpuNodes + "/n1/status" ? 1U : 0U;
  }
  EXPECT_EQ(statusPatches, 1U);
  EXPECT_NE(AgentLog().find("cannot publish GPUNode; retrying with backoff"), std::string::npos);
}

TEST_F(AgentEndToEnd, MissingCrdAtStartThenPublishesOnceTheCrdIsAdded) {
  // A server without the GPUNode CRD answers the plain-text 404 for the resource path.
  server_->DeleteCrd("gpunodes.gpu.cozystack.io");
  StartAgent();
  // The attempt has been made, and failed.
  ASSERT_TRUE(
      WaitFor([&] { return AgentLog().find("cannot publish GPUNode") != std::string::npos; }, 10s))
      << AgentLog();
  EXPECT_FALSE(Published());
  EXPECT_NE(AgentLog().find("cannot publish GPUNode"), std::string::npos) << AgentLog();
  // The agent is alive meanwhile: it answered its first pass.
  EXPECT_NE(AgentLog().find("inventory"), std::string::npos);
  const auto applied = testing::RunCommand(
      "kubectl --kubeconfig " + testing::ShellQuote((directory_.path() / "kubeconfig").string()) +
      " apply -f " +
      testing::ShellQuote(
          (testing::SourceDir() / "charts/gpu/templates/crds/gpunodes.yaml").string()));
  // kubectl is the real client here (scripts/install-deps.sh installs one).
  ASSERT_EQ(applied.exitCode, 0) << applied.err;
  ASSERT_TRUE(WaitFor([&] { return Published(); }, 20s)) << AgentLog();
}

TEST_F(AgentEndToEnd, A7_SucceededPodStillListedByKubeletHoldsNoUnit) {
  // kubelet 1.32/1.33 still list a finished pod with its device; the watch knows it Succeeded.
  server_->Seed({{"apiVersion", "v1"},
                 {"kind", "Pod"},
                 {"metadata", {{"name", "virt-launcher-vm1-x7k2p"}, {"namespace", "tenant-a"}}},
                 {"spec", {{"nodeName", "n1"}}},
                 {"status", {{"phase", "Succeeded"}}}});
  StartAgent();
  ASSERT_TRUE(WaitFor([&] { return Published(); })) << AgentLog();
  ASSERT_TRUE(WaitFor([&] { return Device(GpuNode("n1"), "0000:3b:00.0")["allocated"] == 0; }))
      << GpuNode("n1").dump(2) << AgentLog();
  EXPECT_EQ(GpuNode("n1")["status"]["summary"]["allocated"], 0);
  // The pod watch sees it Running again: pod-resources is re-read and the unit counts.
  const auto patched = testing::RunCommand(
      "curl -s -o /dev/null -w '%{http_code}' -X PATCH -H "
      "'Content-Type: application/merge-patch+json' -d '{\"status\":{\"phase\":\"Running\"}}' " +
      server_->url() + "/api/v1/namespaces/tenant-a/pods/virt-launcher-vm1-x7k2p/status");
  ASSERT_EQ(patched.out, "200");
  ASSERT_TRUE(WaitFor([&] { return Device(GpuNode("n1"), "0000:3b:00.0")["allocated"] == 1; }))
      << AgentLog();
}

TEST_F(AgentEndToEnd, KubectlShowsThePrinterColumns) {
  StartAgent();
  ASSERT_TRUE(WaitFor([&] { return Published(); })) << AgentLog();
  const auto result = testing::RunCommand(
      "kubectl --kubeconfig " + testing::ShellQuote((directory_.path() / "kubeconfig").string()) +
      " get gpunodes");
  if (result.exitCode == 127) {
    GTEST_SKIP() << "kubectl is not installed";
  }
  ASSERT_EQ(result.exitCode, 0) << result.err;
  EXPECT_TRUE(std::regex_search(
      result.out, std::regex(R"(NAME\s+GPUS\s+HEALTHY\s+ALLOCATABLE\s+ALLOCATED\s+AGE)")))
      << result.out;
  EXPECT_TRUE(std::regex_search(result.out, std::regex(R"(n1\s+2\s+2\s+2\s+1\s+)"))) << result.out;
}

TEST_F(AgentEndToEnd, SigtermStopsCleanly) {
  StartAgent();
  ASSERT_TRUE(WaitFor([&] { return Published(); })) << AgentLog();
  StopAgent();
  EXPECT_TRUE(WIFEXITED(exitStatus_) && WEXITSTATUS(exitStatus_) == 0) << exitStatus_;
  EXPECT_NE(AgentLog().find("gpu-agent stopped"), std::string::npos);
}

}  // namespace
}  // namespace cozy
