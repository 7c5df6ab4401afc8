// soak_agent: the daemon for a few minutes under everything a node throws at it, then checked.
//
//   build/test/soak/soak_agent [seconds]        (default 180; not in the default test suite)
//
// The agent's log is left in ./soak-agent.log.
//
// `gpu-agent run` watches a fixture host and publishes to the fake API server while, at once:
// a storm of real kernel uevents (a write of "change" to a real PCI device's uevent file every
// 2 ms; SIGHUP every 20 ms where this machine cannot do that), the fixture's second GPU rebound
// between vfio-pci and nvidia every 700 ms, the fake kubelet flapping (gone, hung, refusing,
// rate limiting, a VM starting and stopping) every 1.5 s, and the fake API server failing
// writes with 500, 503 and 429, cutting connections and dropping or expiring watches every
// second. Then the chaos stops and the program checks, exiting 1 if any fails:
//   - the agent is alive the whole time and stops cleanly on SIGTERM;
//   - the published status equals what a fresh `gpu-agent scan` of the same host and kubelet
//     reports (no write lost);
//   - every successful PATCH changed the object (no write duplicated), and replaying them gives
//     the stored status;
//   - memory did not grow: RSS at the end within 2 MiB of RSS after warm-up.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "test/fakes/fake_apiserver.h"
#include "test/fakes/fake_kubelet.h"
#include "test/support/agent_process.h"
#include "test/support/fixture_host.h"
#include "test/support/real_uevent.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr char kLog[] = "soak-agent.log";
constexpr char kStatusPath[] = "/apis/gpu.cozystack.io/v1alpha1/gpunodes/n1/status";
const char* const kAgentFields[] = {"resourceNames", "devices", "unplaced", "summary"};

json AgentOwned(const json& status) {
  json owned = json::object();
  for (const char* field : kAgentFields) {
    if (status.is_object() && status.contains(field)) {
      owned[field] = status[field];
    }
  }
  return owned;
}

// Rebinds 0000:af:00.0 atomically (a new link renamed over the old one), as the kernel's
// unbind+bind would look to a reader that comes late.
void SetDriver(const std::filesystem::path& root, bool nvidia) {
  const auto device = root / "sys/devices/pci0000:ae/0000:ae:00.0/0000:af:00.0";
  const auto staged = device / ".driver.new";
  std::filesystem::remove(staged);
  std::filesystem::create_symlink(
      nvidia ? "../../../../bus/pci/drivers/nvidia" : "../../../../bus/pci/drivers/vfio-pci",
      staged);
  std::filesystem::rename(staged, device / "driver");
}

struct Check {
  std::string name;
  bool ok;
  std::string detail;
};

}  // namespace

int main(int argc, char** argv) {
  const int seconds = argc > 1 ? std::atoi(argv[1]) : 180;
  const cozy::testing::FixtureHost host("a100-vfio");
  std::filesystem::create_directories(host.root() / "sys/bus/pci/drivers/nvidia");
  const cozy::testing::TempDir work;
  const std::string socket = (work.path() / "kubelet.sock").string();
  const auto scenario = cozy::fakes::LoadScenario(
      (cozy::testing::SourceDir() / "fixtures/kubelet/a100-kubevirt-pci.json").string());

  cozy::fake::FakeApiServerOptions options;
  options.crdPaths = {cozy::testing::SourceDir() / "charts/gpu/templates/crds"};
  options.bookmarkInterval = 500ms;
  cozy::fake::FakeApiServer server(options);
  server.Start();
  server.Seed({{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", "n1"}}}});
  std::ofstream(work.path() / "kubeconfig") << server.Kubeconfig();
  cozy::fakes::FakeKubelet kubelet;
  kubelet.Start(socket, scenario);

  const auto uevent = cozy::testing::WritableUevent();
  const bool realUevents = uevent && cozy::testing::EmitUevent(*uevent);
  cozy::testing::AgentProcess agent;
  std::filesystem::remove(kLog);
  agent.Start({"run", "--node-name", "n1", "--kubeconfig", (work.path() / "kubeconfig").string(),
               "--sysfs-root", host.root().string(), "--pci-ids",
               cozy::testing::FixturePciIds().string(), "--pod-resources", "unix://" + socket,
               "--pod-resources-interval", "200ms", "--pod-resources-timeout", "300ms",
               "--udev-source", realUevents ? "kernel" : "off", "--health-addr", "off"},
              kLog);
  std::printf("soak: %d s, %s, agent pid %d, log %s\n", seconds,
              realUevents
                  ? "real kernel uevents"
                  : ("SIGHUP storm (" + std::string(cozy::testing::kNoRealUevents) + ")").c_str(),
              static_cast<int>(agent.pid()), kLog);
  std::fflush(stdout);

  std::atomic<bool> stop{false};
  std::atomic<long> events{0};
  std::atomic<long> driverFlips{0};
  std::atomic<long> kubeletFlaps{0};
  std::atomic<long> apiFaults{0};
  std::thread storm([&] {
    while (!stop) {
      if (realUevents) {
        cozy::testing::EmitUevent(*uevent);
        std::this_thread::sleep_for(2ms);
      } else {
        agent.Signal(SIGHUP);
        std::this_thread::sleep_for(20ms);
      }
      ++events;
    }
  });
  std::thread rebinder([&] {
    bool nvidia = false;
    while (!stop) {
      std::this_thread::sleep_for(700ms);
      nvidia = !nvidia;
      SetDriver(host.root(), nvidia);
      ++driverFlips;
    }
    SetDriver(host.root(), false);
  });
  std::thread kubeletChaos([&] {
    std::mt19937 random(7);
    while (!stop) {
      std::this_thread::sleep_for(1500ms);
      cozy::fakes::Scenario next = scenario;
      switch (random() % 6) {
        case 0:
          kubelet.Stop();  // the socket goes away, as when kubelet restarts
          std::this_thread::sleep_for(500ms);
          kubelet.Start(socket, scenario);
          break;
        case 1:
          next.list = cozy::fakes::Behaviour::kHang;
          break;
        case 2:
          next.getAllocatableResources = cozy::fakes::Behaviour::kUnavailable;
          break;
        case 3:
          next.list = cozy::fakes::Behaviour::kResourceExhausted;
          break;
        case 4:
          next.pods.clear();  // the VM stopped
          break;
        default:
          break;  // healthy again
      }
      kubelet.SetScenario(next);
      ++kubeletFlaps;
    }
    kubelet.SetScenario(scenario);
  });
  std::thread apiChaos([&] {
    std::mt19937 random(11);
    while (!stop) {
      std::this_thread::sleep_for(1s);
      // Each second one kind of trouble, replacing the last (faults are counted per request;
      // left alone they would pile up while the agent backs off).
      server.ClearFaults();
      switch (random() % 6) {
        case 0:
          server.AddFault(cozy::fake::Fault::Answer(500, 2, "PATCH"));
          break;
        case 1:
          server.AddFault(cozy::fake::Fault::Answer(429, 2, "PATCH", 1));
          break;
        case 2:
          server.AddFault(cozy::fake::Fault::Drop(1, "PATCH"));
          break;
        case 3:
          server.DropWatches();
          break;
        case 4:
          server.ExpireWatches();
          break;
        default:
          server.AddFault(cozy::fake::Fault::Answer(503, 1));
          break;
      }
      ++apiFaults;
    }
    server.ClearFaults();
  });

  // RSS every 5 s; the baseline is taken after the first fifth (warm caches, grown buffers).
  std::vector<long> rss;
  bool alive = true;
  const auto start = Clock::now();
  long baseline = -1;
  while (Clock::now() - start < std::chrono::seconds(seconds)) {
    std::this_thread::sleep_for(5s);
    if (!agent.Alive()) {
      alive = false;
      break;
    }
    rss.push_back(agent.RssKiB());
    if (baseline < 0 && Clock::now() - start >= std::chrono::seconds(seconds) / 5) {
      baseline = rss.back();
    }
  }
  stop = true;
  storm.join();
  rebinder.join();
  kubeletChaos.join();
  apiChaos.join();
  server.ClearFaults();

  // Quiet: kubelet healthy, the fixture back on vfio-pci. The agent finds its way back on its
  // own (pod-resources backoff is at most 60 s), no SIGHUP.
  const std::string scanCommand =
      cozy::testing::ShellQuote(cozy::testing::GpuAgentBinary().string()) + " scan --sysfs-root " +
      cozy::testing::ShellQuote(host.root().string()) + " --pci-ids " +
      cozy::testing::ShellQuote(cozy::testing::FixturePciIds().string()) +
      " --node-name n1 --pod-resources unix://" + socket + " -o json 2>/dev/null";
  json expected;
  json stored;
  const auto quietStart = Clock::now();
  bool converged = false;
  while (alive && Clock::now() - quietStart < 90s) {
    const auto scanned = cozy::testing::RunCommand(scanCommand);
    expected = AgentOwned(json::parse(scanned.out, nullptr, false).value("status", json::object()));
    stored = AgentOwned(
        server.Object("gpu.cozystack.io/v1alpha1", "gpunodes", "", "n1").value("status", json()));
    if (!expected.empty() && stored == expected) {
      converged = true;
      break;
    }
    std::this_thread::sleep_for(500ms);
  }
  const double convergeSeconds = std::chrono::duration<double>(Clock::now() - quietStart).count();
  const long finalRss = agent.RssKiB();
  const long peakRss = agent.PeakRssKiB();
  alive = alive && agent.Alive();
  const int exitStatus = agent.Stop();

  // Replay the successful status writes: each must change the object, and together they
  // must give what is stored.
  json replayed = json::object();
  int patches = 0;
  int duplicates = 0;
  int failedWrites = 0;
  for (const auto& request : server.Requests()) {
    if (request.method != "PATCH" || request.path != kStatusPath) {
      continue;
    }
    if (request.status <= 0 || request.status >= 300) {
      ++failedWrites;
      continue;
    }
    ++patches;
    json before = replayed;
    replayed.merge_patch(json::parse(request.body).value("status", json::object()));
    if (replayed == before) {
      ++duplicates;
    }
  }

  const std::vector<Check> checks = {
      {"agent alive throughout", alive, ""},
      {"clean exit on SIGTERM", WIFEXITED(exitStatus) && WEXITSTATUS(exitStatus) == 0,
       "wait status " + std::to_string(exitStatus)},
      {"published status equals a fresh scan", converged,
       converged ? "after " + std::to_string(convergeSeconds) + " s quiet"
                 : "stored " + stored.dump() + "\n   scan " + expected.dump()},
      {"no duplicated write", duplicates == 0,
       std::to_string(duplicates) + " of " + std::to_string(patches) +
           " successful PATCHes changed nothing"},
      {"replayed writes give the stored status", AgentOwned(replayed) == stored, ""},
      {"memory did not grow", baseline > 0 && finalRss > 0 && finalRss - baseline <= 2048,
       "RSS " + std::to_string(baseline) + " KiB after warm-up, " + std::to_string(finalRss) +
           " KiB at the end, peak " + std::to_string(peakRss) + " KiB"},
  };
  std::printf(
      "chaos: %ld device events, %ld driver flips, %ld kubelet flaps, %ld API faults; %d "
      "successful status PATCHes, %d failed or cut\n",
      events.load(), driverFlips.load(), kubeletFlaps.load(), apiFaults.load(), patches,
      failedWrites);
  std::printf("RSS samples (KiB):");
  for (long sample : rss) {
    std::printf(" %ld", sample);
  }
  std::printf("\n");
  bool ok = true;
  for (const auto& check : checks) {
    std::printf("%s %s%s%s\n", check.ok ? "PASS" : "FAIL", check.name.c_str(),
                check.detail.empty() ? "" : ": ", check.detail.c_str());
    ok = ok && check.ok;
  }
  if (!ok) {
    std::printf("agent log: %s\n", kLog);
    const std::string log = agent.Log();
    std::printf("%s\n", log.substr(log.size() > 4000 ? log.size() - 4000 : 0).c_str());
  }
  kubelet.Stop();
  server.Stop();
  return ok ? 0 : 1;
}
