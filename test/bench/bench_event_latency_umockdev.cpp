// Event-to-patch latency through umockdev: the built `gpu-agent run` on a umockdev testbed (its
// /sys under the preload), one uevent per round after a sysfs change that alters the status,
// timed from the emit to the PATCH's arrival in the fake API server's log (before the server
// has answered it). Prints percentiles per
// --debounce setting; the 1 ms setting shows what the pipeline itself costs.
//
//   bench_event_latency_umockdev [ROUNDS] [DEBOUNCE...]     (default: 200 50ms 1ms)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "fixtures/sysfs/fixture_builder.h"
#include "test/support/umockdev_replay.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

double Percentile(std::vector<double> values, double fraction) {
  std::sort(values.begin(), values.end());
  const auto index = static_cast<size_t>(fraction * static_cast<double>(values.size() - 1) + 0.5);
  return values[std::min(index, values.size() - 1)];
}

// The agent's PATCH reached the server (logged on arrival, before the server answers it).
bool PatchArrived(cozy::testing::UmockdevReplay& replay) {
  for (const auto& request : replay.server().Requests()) {
    if (request.method == "PATCH" && request.path.size() > 7 &&
        request.path.compare(request.path.size() - 7, 7, "/status") == 0) {
      return true;
    }
  }
  return false;
}

int Measure(int rounds, const std::string& debounce) {
  cozy::testing::UmockdevReplay replay(
      cozy::fixtures::LoadSpec(cozy::testing::SpecPath("umockdev-replay")));
  cozy::testing::ReplayOptions options;
  options.debounce = debounce;
  if (!replay.Start(options)) {
    std::fprintf(stderr, "the agent did not start:\n%s\n", replay.AgentLog().c_str());
    return 1;
  }
  // The T4's mdev type: available_instances alternates, so every round changes the status.
  const std::string device = "/sys/devices/pci0000:5d/0000:5d:00.0/0000:5e:00.0";
  const std::string file =
      device.substr(1) + "/mdev_supported_types/nvidia-231/available_instances";
  std::vector<double> latencies;
  for (int round = 0; round < rounds; ++round) {
    replay.server().ClearRequests();
    replay.Write(file, round % 2 == 0 ? "7\n" : "8\n");
    const auto sent = Clock::now();
    replay.Uevent(device, "change");
    while (!PatchArrived(replay)) {
      if (Clock::now() - sent > 10s) {
        std::fprintf(stderr, "no patch within 10 s in round %d:\n%s\n", round,
                     replay.AgentLog().c_str());
        return 1;
      }
      std::this_thread::sleep_for(100us);
    }
    latencies.push_back(std::chrono::duration<double, std::milli>(Clock::now() - sent).count());
    // Let the server answer, and the API client's rate limiter (client-go's 5 requests a
    // second, burst 10) earn back the token this round spent: back to back, rounds would
    // measure the limiter's 200 ms spacing instead of the event path.
    // Every 2 ms: the latency benchmark's resolution.
    if (!cozy::testing::WaitFor([&] { return !replay.StatusPatches().empty(); }, 10s,
                                std::chrono::milliseconds(2))) {
      std::fprintf(stderr, "the server never answered the patch of round %d\n", round);
      return 1;
    }
    std::this_thread::sleep_for(250ms);
  }
  double sum = 0;
  for (double latency : latencies) {
    sum += latency;
  }
  std::printf(
      "debounce %-6s rounds %d  p50 %7.2f ms  p90 %7.2f ms  p99 %7.2f ms  max %7.2f ms  "
      "mean %7.2f ms\n",
      debounce.c_str(), rounds, Percentile(latencies, 0.5), Percentile(latencies, 0.9),
      Percentile(latencies, 0.99), *std::max_element(latencies.begin(), latencies.end()),
      sum / static_cast<double>(latencies.size()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string unusable = cozy::testing::EnterUmockdevPreload(argv);
  if (!unusable.empty() || !cozy::testing::UmockdevUnusableReason().empty()) {
    std::fprintf(stderr, "cannot replay events: %s\n",
                 cozy::testing::UmockdevUnusableReason().c_str());
    return 77;
  }
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 200;
  std::vector<std::string> debounces;
  for (int i = 2; i < argc; ++i) {
    debounces.emplace_back(argv[i]);
  }
  if (debounces.empty()) {
    debounces = {"50ms", "1ms"};
  }
  std::printf(
      "event -> PATCH through umockdev (umockdev_testbed_uevent to the fake API server's "
      "log), gpu-agent run --udev-source auto\n");
  for (const std::string& debounce : debounces) {
    if (const int result = Measure(rounds, debounce); result != 0) {
      return result;
    }
  }
  return 0;
}
