// The binder at scale, through the fake API server: `gpu-controller run --enable-gpu` (the real
// program) over N nodes x 8 GPUs whose units are all held but R, then R orders with bind
// requests written at once. Prints: the time from the requests written to all answered, answers
// per second, API placement writes per bound device (goal: 1), writes in a quiet window (goal:
// 0), and, as the peer measured in the same process, the model's pass over the same cluster
// without any API (what the API, the caches and the process add is the ratio).
//
//   bench_binder [nodes=5000] [requests=1000] [quiet-seconds=60]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "controller/model/model.h"
#include "controller/snapshot_json.h"
#include "test/fakes/fake_apiserver.h"
#include "test/support/fixture_host.h"
#include "test/support/gpu_objects.h"
#include "test/support/process.h"

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
constexpr int kGpusPerNode = 8;
constexpr int kTenants = 100;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

json Node(int n) { return cozy::testing::ReadyNode("node-" + std::to_string(n)); }

json GpuNode(int n) {
  return cozy::testing::GpuNodeObject("node-" + std::to_string(n), kGpusPerNode);
}

json Device(int i, const std::string& node, const std::string& requestId) {
  json device = {{"apiVersion", "gpu.cozystack.io/v1alpha1"},
                 {"kind", "GPUDevice"},
                 {"metadata",
                  {{"name", "d" + std::to_string(i)},
                   {"namespace", "tenant-" + std::to_string(i % kTenants)},
                   {"finalizers", {"gpu.cozystack.io/device-protection"}}}},
                 {"spec", {{"className", "a100"}, {"count", 1}}}};
  if (!node.empty()) {
    device["status"] = {{"phase", "Bound"}, {"nodeName", node}};
  } else {
    device["status"] = {
        {"bindRequest", {{"id", requestId}, {"requestedAt", "2026-12-01T00:00:00Z"}}}};
  }
  return device;
}

}  // namespace

int main(int argc, char** argv) {
  const int nodes = argc > 1 ? std::atoi(argv[1]) : 5000;
  const int requests = argc > 2 ? std::atoi(argv[2]) : 1000;
  const int quietSeconds = argc > 3 ? std::atoi(argv[3]) : 60;
  const int held = nodes * kGpusPerNode - requests;  // every unit held but one per request
  char pattern[] = "/tmp/bench-binder.XXXXXX";
  const std::filesystem::path work = ::mkdtemp(pattern);

  cozy::fake::FakeApiServerOptions options;
  options.crdPaths = {std::filesystem::path(COZY_SOURCE_DIR) / "charts/gpu/templates/crds"};
  cozy::fake::FakeApiServer server(options);
  server.Start();
  json all = json::array();  // the same cluster for the model alone
  auto seed = [&](const json& object) {
    server.Seed(object);
    all.push_back(object);
  };
  const auto seeding = Clock::now();
  seed({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "cozy-system"}}}});
  for (int t = 0; t < kTenants; ++t) {
    seed({{"apiVersion", "v1"},
          {"kind", "Namespace"},
          {"metadata", {{"name", "tenant-" + std::to_string(t)}}}});
  }
  seed({{"apiVersion", "gpu.cozystack.io/v1alpha1"},
        {"kind", "GPUClass"},
        {"metadata", {{"name", "a100"}, {"finalizers", {"gpu.cozystack.io/class-protection"}}}},
        {"spec",
         {{"vendor", "nvidia"},
          {"model", "A100"},
          {"mode", "passthrough"},
          {"source", {{"devicePlugin", {{"resourceName", "nvidia.com/GA100"}}}}}}}});
  for (int n = 0; n < nodes; ++n) {
    seed(Node(n));
    seed(GpuNode(n));
  }
  // Held units fill the nodes in order, so the free ones are spread over the last nodes.
  for (int i = 0; i < held; ++i) {
    seed(Device(i, "node-" + std::to_string(i / kGpusPerNode), ""));
  }
  std::printf("seeded %d nodes x %d GPUs, %d held devices in %.1f s\n", nodes, kGpusPerNode, held,
              Seconds(Clock::now() - seeding));

  std::ofstream(work / "kubeconfig") << server.Kubeconfig("binder");
  const int port = cozy::testing::FreePort();
  // GPUs on means the admission webhooks serve too, which need a serving pair (never called
  // here): a self-signed one made by the openssl CLI.
  const auto certificate = cozy::testing::RunCommand(
      "mkdir -p " + cozy::testing::ShellQuote((work / "certs").string()) + " && cd " +
      cozy::testing::ShellQuote((work / "certs").string()) +
      " && openssl req -x509 -newkey rsa:2048 -nodes -keyout tls.key -out tls.crt -days 1"
      " -subj /CN=bench 2>/dev/null");
  if (certificate.exitCode != 0) {
    std::fprintf(stderr, "openssl could not make the webhooks' certificate: %s\n",
                 certificate.err.c_str());
    return 1;
  }
  pid_t controller = cozy::testing::Spawn(
      {GPU_CONTROLLER, "run", "--kubeconfig", (work / "kubeconfig").string(), "--identity", "bench",
       "--enable-gpu", "--health-addr", "127.0.0.1:" + std::to_string(port), "--qps", "0",
       "--webhook-addr", "127.0.0.1:0", "--webhook-cert-dir", (work / "certs").string()},
      work / "controller.log");
  const auto starting = Clock::now();
  const bool ready = cozy::testing::WaitFor(
      [&] {
        return cozy::testing::RunCommand("curl -sf http://127.0.0.1:" + std::to_string(port) +
                                         "/readyz >/dev/null")
                   .exitCode == 0;
      },
      std::chrono::minutes(5), std::chrono::milliseconds(200));
  if (!ready) {
    std::fprintf(stderr, "the controller did not get ready; see %s\n",
                 (work / "controller.log").c_str());
    return 1;
  }
  std::printf("controller ready (caches listed) in %.1f s\n", Seconds(Clock::now() - starting));
  // Its first full pass over the held set, before the requests: on taking the lead it lists
  // every device from the API server (D3) and writes each GPUNode's TakesBinds condition.
  const bool firstPass = cozy::testing::WaitFor(
      [&] {
        const std::string metrics =
            cozy::testing::RunCommand("curl -s http://127.0.0.1:" + std::to_string(port) +
                                      "/metrics")
                .out;
        return metrics.find("gpu_controller_binder_passes_total{kind=\"full\"}") !=
               std::string::npos;
      },
      std::chrono::minutes(5), std::chrono::milliseconds(200));
  if (!firstPass) {
    std::fprintf(stderr, "the binder made no pass; see %s\n", (work / "controller.log").c_str());
    return 1;
  }
  std::printf(
      "first full pass done %.1f s after start (a list of every device, every "
      "GPUNode's condition)\n",
      Seconds(Clock::now() - starting));
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the passes its writes trigger

  server.ClearRequests();
  const auto asked = Clock::now();
  for (int i = held; i < held + requests; ++i) {
    server.Seed(Device(i, "", "req-" + std::to_string(i)));
  }
  std::vector<bool> answered(static_cast<size_t>(requests), false);
  int left = requests;
  int bound = 0;
  const bool done = cozy::testing::WaitFor(
      [&] {
        for (int r = 0; r < requests; ++r) {
          if (answered[static_cast<size_t>(r)]) continue;
          const int i = held + r;
          const json device =
              server.Object("gpu.cozystack.io/v1alpha1", "gpudevices",
                            "tenant-" + std::to_string(i % kTenants), "d" + std::to_string(i));
          const json status = device.value("status", json::object());
          if (status.value("bindResponse", json::object()).value("id", "") ==
              "req-" + std::to_string(i)) {
            answered[static_cast<size_t>(r)] = true;
            --left;
            bound += status.value("phase", "") == "Bound";
          }
        }
        return left == 0;
      },
      std::chrono::minutes(10), std::chrono::milliseconds(20));
  const double answerSeconds = Seconds(Clock::now() - asked);
  int placementWrites = 0;
  for (const auto& request : server.Requests()) {
    if (request.method == "PATCH" && request.status < 300 && request.path.ends_with("/status") &&
        request.path.find("/gpudevices/") != std::string::npos) {
      ++placementWrites;
    }
  }
  std::printf("%d bind requests answered%s in %.2f s: %.0f answers/s, %d bound\n", requests - left,
              done ? "" : " (TIMED OUT)", answerSeconds, (requests - left) / answerSeconds, bound);
  std::printf("placement writes per bound device: %.2f (%d writes)\n",
              bound > 0 ? static_cast<double>(placementWrites) / bound : 0.0, placementWrites);

  // A quiet window: nothing changes, nothing should be written.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  server.ClearRequests();
  std::this_thread::sleep_for(std::chrono::seconds(quietSeconds));
  int quietWrites = 0;
  for (const auto& request : server.Requests()) {
    if (request.method != "GET" && request.path.find("/leases/") == std::string::npos) {
      ++quietWrites;
    }
  }
  std::printf("writes in a quiet %d s (the Lease's renewals aside): %d\n", quietSeconds,
              quietWrites);
  // The controller's own account of the burst.
  const std::string metrics =
      cozy::testing::RunCommand("curl -s http://127.0.0.1:" + std::to_string(port) + "/metrics")
          .out;
  for (const char* name :
       {"gpu_controller_binder_passes_total{kind=\"answers\"}",
        "gpu_controller_binder_passes_total{kind=\"full\"}",
        "gpu_controller_binder_pass_duration_seconds_sum",
        "gpu_controller_binder_device_reads_total", "gpu_controller_binder_conflicts_total"}) {
    const size_t found = metrics.find("\n" + std::string(name) + " ");
    const size_t at = found == std::string::npos ? found : found + 1;
    std::printf("  %s %s\n", name,
                at == std::string::npos
                    ? "0"
                    : metrics
                          .substr(at + std::string(name).size() + 1,
                                  metrics.find('\n', at) - at - std::string(name).size() - 1)
                          .c_str());
  }
  cozy::testing::Finish(controller);

  // The peer: the model's pass over the same cluster (the requests' devices included), no API.
  for (int i = held; i < held + requests; ++i) {
    all.push_back(Device(i, "", "req-" + std::to_string(i)));
  }
  const cozy::model::Snapshot snapshot =
      cozy::controller::DecodeSnapshotList({{"kind", "List"}, {"items", all}});
  std::vector<double> passes;
  size_t decisions = 0;
  for (int round = 0; round < 5; ++round) {
    const auto start = Clock::now();
    const cozy::model::Model model(snapshot);
    decisions = model.PlanPass().size();
    passes.push_back(Seconds(Clock::now() - start));
  }
  std::sort(passes.begin(), passes.end());
  std::printf("model pass without the API (median of 5): %.1f ms, %zu decisions\n",
              passes[2] * 1000, decisions);
  std::printf("answer time / model pass: %.0fx\n", answerSeconds / passes[2]);
  std::filesystem::remove_all(work);
  return done && quietWrites == 0 ? 0 : 1;
}
