// bench_event_latency: how long a device change takes to reach the API server through the real
// kernel path. `gpu-agent run` (default debounce, kernel uevent source) watches a fixture host
// and publishes to the fake API server; each round changes the fixture (a driver rebind), then
// writes "change" to a real PCI device's uevent file, and times the write to the PATCH the
// fake API server receives. The same rounds with SIGHUP as the trigger are the peer: SIGHUP
// rescans at once (no debounce, no netlink), so it is the cost of scan, status and PATCH alone,
// and the difference is what the event path adds (the debounce window, by design, and the
// netlink hop).
//
//   build/test/bench/bench_event_latency [rounds]     (root; needs a writable /sys)
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "test/fakes/fake_apiserver.h"
#include "test/support/agent_process.h"
#include "test/support/fixture_host.h"
#include "test/support/real_uevent.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr char kStatusPath[] = "/apis/gpu.cozystack.io/v1alpha1/gpunodes/n1/status";

size_t SuccessfulPatches(const cozy::fake::FakeApiServer& server, Clock::time_point* last) {
  size_t count = 0;
  for (const auto& request : server.Requests()) {
    if (request.method == "PATCH" && request.path == kStatusPath && request.status > 0 &&
        request.status < 300) {
      ++count;
      if (last != nullptr) {
        *last = request.received;
      }
    }
  }
  return count;
}

double Percentile(std::vector<double> values, double fraction) {
  std::sort(values.begin(), values.end());
  const auto index = static_cast<size_t>(fraction * static_cast<double>(values.size() - 1) + 0.5);
  return values[index];
}

struct Figures {
  std::vector<double> latenciesMs;
  int extraPatches = 0;  // more than one PATCH for one change
  int missed = 0;        // no PATCH within 5 s
};

// Rebinds 0000:af:00.0 between vfio-pci and nvidia: every round changes the published status.
void FlipDriver(const cozy::testing::FixtureHost& host, int round) {
  const auto device = host.root() / "sys/devices/pci0000:ae/0000:ae:00.0/0000:af:00.0";
  std::filesystem::remove(device / "driver");
  std::filesystem::create_symlink(round % 2 == 0 ? "../../../../bus/pci/drivers/nvidia"
                                                 : "../../../../bus/pci/drivers/vfio-pci",
                                  device / "driver");
}

Figures Measure(const cozy::testing::FixtureHost& host, cozy::fake::FakeApiServer& server,
                int rounds, int firstRound, const std::function<void()>& trigger) {
  Figures figures;
  for (int round = 0; round < rounds; ++round) {
    const size_t before = SuccessfulPatches(server, nullptr);
    FlipDriver(host, firstRound + round);
    const auto start = Clock::now();
    trigger();
    Clock::time_point arrived{};
    const auto deadline = start + 5s;
    while (SuccessfulPatches(server, &arrived) == before && Clock::now() < deadline) {
      std::this_thread::sleep_for(200us);
    }
    if (SuccessfulPatches(server, &arrived) == before) {
      ++figures.missed;
      continue;
    }
    figures.latenciesMs.push_back(
        std::chrono::duration<double, std::milli>(arrived - start).count());
    // Let a second patch for the same change show itself, and keep the rounds under the API
    // client's rate limit (5 writes a second, as client-go): a device event is rare, and what
    // is timed here is the event path, not the limiter's queue.
    std::this_thread::sleep_for(250ms);
    figures.extraPatches += static_cast<int>(SuccessfulPatches(server, nullptr) - before - 1);
  }
  return figures;
}

void Print(const char* name, const Figures& figures) {
  if (figures.latenciesMs.empty()) {
    std::printf("%-34s no patch arrived (%d missed)\n", name, figures.missed);
    return;
  }
  std::printf("%-34s p50 %7.2f ms  p99 %7.2f ms  max %7.2f ms  (%zu rounds, %d missed, %d extra)\n",
              name, Percentile(figures.latenciesMs, 0.5), Percentile(figures.latenciesMs, 0.99),
              *std::max_element(figures.latenciesMs.begin(), figures.latenciesMs.end()),
              figures.latenciesMs.size(), figures.missed, figures.extraPatches);
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 200;
  const auto uevent = cozy::testing::WritableUevent();
  if (!uevent || !cozy::testing::EmitUevent(*uevent)) {
    std::printf("bench_event_latency: skipped: %s\n", cozy::testing::kNoRealUevents);
    return 0;
  }
  const cozy::testing::FixtureHost host("a100-vfio");
  std::filesystem::create_directories(host.root() / "sys/bus/pci/drivers/nvidia");
  const cozy::testing::TempDir work;

  cozy::fake::FakeApiServerOptions options;
  options.crdPaths = {cozy::testing::SourceDir() / "charts/gpu/templates/crds"};
  cozy::fake::FakeApiServer server(options);
  server.Start();
  server.Seed({{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", "n1"}}}});
  std::ofstream(work.path() / "kubeconfig") << server.Kubeconfig();

  cozy::testing::AgentProcess agent;
  agent.Start(
      {"run", "--node-name", "n1", "--kubeconfig", (work.path() / "kubeconfig").string(),
       "--sysfs-root", host.root().string(), "--pci-ids", cozy::testing::FixturePciIds().string(),
       "--pod-resources", "unix://" + (work.path() / "no-kubelet.sock").string(), "--udev-source",
       "kernel", "--health-addr", "off"},
      work.path() / "agent.log");
  const auto deadline = Clock::now() + 15s;
  while (SuccessfulPatches(server, nullptr) == 0 && Clock::now() < deadline) {
    // The first write creates the object; the status follows as a PATCH.
    std::this_thread::sleep_for(10ms);
  }
  if (SuccessfulPatches(server, nullptr) == 0) {
    std::fprintf(stderr, "bench_event_latency: the agent never published:\n%s\n",
                 agent.Log().c_str());
    return 1;
  }
  std::this_thread::sleep_for(300ms);

  const Figures kernel =
      Measure(host, server, rounds, 0, [&] { cozy::testing::EmitUevent(*uevent); });
  const Figures sighup = Measure(host, server, rounds, rounds, [&] { agent.Signal(SIGHUP); });
  agent.Stop();

  std::printf("event -> PATCH latency, default debounce (50 ms), a100-vfio fixture host\n");
  Print("real kernel uevent (netlink)", kernel);
  Print("SIGHUP (peer: no udev hop)", sighup);
  if (!kernel.latenciesMs.empty() && !sighup.latenciesMs.empty()) {
    const double overhead =
        Percentile(kernel.latenciesMs, 0.5) - 50.0 - Percentile(sighup.latenciesMs, 0.5);
    std::printf("kernel p50 - debounce - SIGHUP p50 %.2f ms (the netlink hop and timer slack)\n",
                overhead);
    std::printf("kernel p99 / goal (100 ms) %.2f\n", Percentile(kernel.latenciesMs, 0.99) / 100.0);
  }
  return 0;
}
