// bench_api_requests: what `gpu-agent run` asks of the API server, counted from the fake API
// server's request log: a steady state, and churn (a VM pod starting and stopping), next to
// what a 60-second full rewrite (node-feature-discovery's default) would send.
//
//   build/test/bench/bench_api_requests [steady-seconds] [churn-cycles]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "fixtures/sysfs/fixture_builder.h"
#include "test/fakes/fake_apiserver.h"
#include "test/fakes/fake_kubelet.h"
#include "test/support/agent_process.h"

namespace {

using namespace std::chrono_literals;
using nlohmann::json;

struct Counts {
  int reads = 0;
  int writes = 0;
  int watches = 0;
};

Counts Count(const std::vector<cozy::fake::LoggedRequest>& requests) {
  Counts counts;
  for (const auto& request : requests) {
    if (request.query.find("watch=1") != std::string::npos ||
        request.query.find("watch=true") != std::string::npos) {
      ++counts.watches;
    } else if (request.method == "GET") {
      ++counts.reads;
    } else {
      ++counts.writes;
    }
  }
  return counts;
}

cozy::fakes::Scenario Kubelet(bool vmRunning) {
  cozy::fakes::Scenario scenario;
  scenario.allocatable = {{"nvidia.com/A100", {"40"}, std::vector<int64_t>{0}},
                          {"nvidia.com/A100", {"90"}, std::vector<int64_t>{1}}};
  if (vmRunning) {
    scenario.pods = {
        {"tenant-a", "virt-launcher-vm1", {{"compute", {{"nvidia.com/A100", {"40"}, {}}}}}}};
  }
  return scenario;
}

}  // namespace

int main(int argc, char** argv) {
  const int steadySeconds = argc > 1 ? std::atoi(argv[1]) : 30;
  const int churnCycles = argc > 2 ? std::atoi(argv[2]) : 5;
  char pattern[] = "/tmp/bench-api.XXXXXX";
  const std::filesystem::path work = ::mkdtemp(pattern);
  cozy::fixtures::BuildTree(
      cozy::fixtures::LoadSpec(COZY_SOURCE_DIR "/fixtures/sysfs/specs/a100-vfio.json"),
      work / "root");

  cozy::fake::FakeApiServerOptions options;
  options.crdPaths = {std::filesystem::path(COZY_SOURCE_DIR) / "charts/gpu/templates/crds"};
  cozy::fake::FakeApiServer server(options);
  server.Start();
  server.Seed({{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", "n1"}}}});
  std::ofstream(work / "kubeconfig") << server.Kubeconfig("agent");
  cozy::fakes::FakeKubelet kubelet;
  kubelet.Start((work / "kubelet.sock").string(), Kubelet(false));

  cozy::testing::AgentProcess agent;
  // Default intervals: pod-resources 10 s, resync 10 min.
  agent.Start(
      {"run", "--node-name", "n1", "--kubeconfig", (work / "kubeconfig").string(), "--sysfs-root",
       (work / "root").string(), "--pod-resources", "unix://" + (work / "kubelet.sock").string(),
       "--udev-source", "off", "--health-addr", "off"},
      "/dev/null");

  std::this_thread::sleep_for(3s);  // start-up: create + first patch
  const Counts startup = Count(server.Requests());
  server.ClearRequests();
  std::this_thread::sleep_for(std::chrono::seconds(steadySeconds));
  const Counts steady = Count(server.Requests());
  server.ClearRequests();

  // Churn: a VM pod starts (kubelet lists its device, the API shows it Running), then stops.
  server.Seed({{"apiVersion", "v1"},
               {"kind", "Pod"},
               {"metadata", {{"name", "virt-launcher-vm1"}, {"namespace", "tenant-a"}}},
               {"spec", {{"nodeName", "n1"}}},
               {"status", {{"phase", "Running"}}}});
  for (int cycle = 0; cycle < churnCycles; ++cycle) {
    kubelet.SetScenario(Kubelet(true));
    std::this_thread::sleep_for(12s);  // one pod-resources interval and then some
    kubelet.SetScenario(Kubelet(false));
    std::this_thread::sleep_for(12s);
  }
  const Counts churn = Count(server.Requests());
  agent.Stop();
  kubelet.Stop();
  server.Stop();
  std::filesystem::remove_all(work);

  const double steadyPerHour = 3600.0 / steadySeconds;
  std::printf("start-up: %d writes, %d reads, %d watches opened\n", startup.writes, startup.reads,
              startup.watches);
  std::printf("steady state, %d s: %d writes, %d reads, %d watches opened\n", steadySeconds,
              steady.writes, steady.reads, steady.watches);
  std::printf("  per hour: %.0f writes, %.0f reads, %.0f watch (re)opens\n",
              steady.writes * steadyPerHour, steady.reads * steadyPerHour,
              steady.watches * steadyPerHour);
  const double writesPerCycle = static_cast<double>(churn.writes) / churnCycles;
  std::printf("churn, %d pod start/stop cycles: %d writes (%.1f per cycle), %d reads\n",
              churnCycles, churn.writes, writesPerCycle, churn.reads);
  std::printf("  per hour at one start/stop per minute: %.0f writes\n", writesPerCycle * 60);
  std::printf(
      "60 s full rewrite (node-feature-discovery's default): 60 writes per hour, "
      "each the whole object, whether anything changed or not\n");
  std::printf("ratio steady-state writes / full rewrite: %.2f\n",
              steady.writes * steadyPerHour / 60.0);
  return 0;
}
