// The daemon's loop, in process: a fixture host, the fake kubelet over a real socket, the
// kernel's own uevents, and a recording publisher in place of the API server.
#include "agent/daemon.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include <httplib.h>

#include "agent/metrics.h"
#include "agent/sources/pod_resources.h"
#include "agent/sources/publish.h"
#include "runtime/log.h"
#include "test/fakes/fake_kubelet.h"
#include "test/support/fixture_host.h"
#include "test/support/real_uevent.h"

namespace cozy::agent {
namespace {

using namespace std::chrono_literals;

class RecordingPublisher : public StatusPublisher {
 public:
  struct Shared {
    std::mutex mutex;
    std::condition_variable changed;
    std::vector<nlohmann::json> published;
    int failuresToGo = 0;
    int waitsToGo = 0;  // ReadyIn() answers "not yet" this many times
    int failures = 0;
    int attempts = 0;
    int invalidations = 0;
  };
  explicit RecordingPublisher(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
  std::optional<std::chrono::milliseconds> ReadyIn() override {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    if (shared_->waitsToGo > 0) {
      --shared_->waitsToGo;
      return 40ms;
    }
    return std::nullopt;
  }
  PublishAttempt Publish(const nlohmann::json& status) override {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    if (shared_->failuresToGo > 0) {
      --shared_->failuresToGo;
      ++shared_->failures;
      return {PublishAttempt::Outcome::kFailed, 50ms, 0};
    }
    ++shared_->attempts;
    if (!shared_->published.empty() && shared_->published.back() == status) {
      return {PublishAttempt::Outcome::kUnchanged, 0ms, 0};
    }
    shared_->published.push_back(status);
    shared_->changed.notify_all();
    return {PublishAttempt::Outcome::kWritten, 0ms, 1};
  }
  void Invalidate() override {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    ++shared_->invalidations;
  }

 private:
  std::shared_ptr<Shared> shared_;
};

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override { runtime::Logger::Get().SetSinkForTesting(&logLines_); }
  void TearDown() override {
    Stop();
    runtime::Logger::Get().SetSinkForTesting(nullptr);
  }

  // With udevSource set, pod-resources is read only at start, so every later rescan is the
  // device events' doing.
  void Start(const testing::FixtureHost& host, const std::string& udevSource = "off",
             const std::string& healthAddress = "off",
             const std::function<void(DaemonOptions&)>& tweak = nullptr) {
    DaemonOptions options;
    options.nodeName = "gpu-node-1";
    options.scan.root = host.root().string();
    options.scan.pciIdsPath = testing::FixturePciIds().string();
    options.podResources.endpoint = "unix://" + (socketDir_.path() / "kubelet.sock").string();
    options.podResources.callTimeout = 300ms;
    options.podResourcesSchedule.interval = 100ms;
    options.podResourcesSchedule.firstBackoff = 100ms;
    options.podResourcesSchedule.maxBackoff = 200ms;
    options.debounce = 100ms;
    options.udevSource = udevSource;
    options.healthAddress = healthAddress;
    options.version = "test";
    if (udevSource != "off") {
      options.podResourcesSchedule.interval = 1h;
      options.podResourcesSchedule.firstBackoff = 1h;
      options.podResourcesSchedule.maxBackoff = 1h;
    }
    if (tweak) tweak(options);
    daemon_ =
        std::make_unique<Daemon>(std::move(options), std::make_unique<RecordingPublisher>(shared_));
    thread_ = std::thread([this] { exitCode_ = daemon_->Run(); });
  }

  void Stop() {
    if (thread_.joinable()) {
      daemon_->Stop();
      thread_.join();
    }
  }

  // Waits (bounded) until at least `count` statuses were published; returns them.
  std::vector<nlohmann::json> WaitForPublishes(size_t count,
                                               std::chrono::milliseconds limit = 10s) {
    std::unique_lock<std::mutex> lock(shared_->mutex);
    shared_->changed.wait_for(lock, limit, [&] { return shared_->published.size() >= count; });
    return shared_->published;
  }
  size_t PublishCount() {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    return shared_->published.size();
  }

  static nlohmann::json Device(const nlohmann::json& status, const std::string& address) {
    for (const auto& device : status["devices"]) {
      if (device["pciAddress"] == address) {
        return device;
      }
    }
    return {};
  }

  testing::TempDir socketDir_;
  fakes::FakeKubelet kubelet_;
  std::shared_ptr<RecordingPublisher::Shared> shared_ =
      std::make_shared<RecordingPublisher::Shared>();
  std::unique_ptr<Daemon> daemon_;
  std::thread thread_;
  int exitCode_ = -1;
  std::vector<std::string> logLines_;
};

fakes::Scenario A100Scenario(bool held) {
  fakes::Scenario scenario;
  scenario.allocatable = {{"nvidia.com/A100", {"40"}, std::vector<int64_t>{0}},
                          {"nvidia.com/A100", {"90"}, std::vector<int64_t>{1}}};
  if (held) {
    scenario.pods = {{"tenant-a",
                      "virt-launcher-vm1",
                      {{"compute", {{"nvidia.com/A100", {"40"}, std::nullopt}}}}}};
  }
  return scenario;
}

TEST_F(DaemonTest, FirstPassPublishesOnceAndASteadyStateWritesNothing) {
  const testing::FixtureHost host("a100-vfio");
  kubelet_.Start((socketDir_.path() / "kubelet.sock").string(), A100Scenario(false));
  Start(host);
  const auto published = WaitForPublishes(1);
  ASSERT_EQ(published.size(), 1U);
  EXPECT_EQ(published[0]["resourceNames"], nlohmann::json::array({"nvidia.com/A100"}));
  EXPECT_FALSE(published[0].contains("conditions"));
  // pod-resources is read every 100 ms meanwhile; nothing changes, nothing is published.
  std::this_thread::sleep_for(1s);
  EXPECT_EQ(PublishCount(), 1U);
  EXPECT_GE(kubelet_.Calls().list, 3);
  Stop();
  EXPECT_EQ(exitCode_, 0);
}

// The sources are the runnables of a runtime::Manager (docs/runtime.md): a kubelet slower than the
// startup wait leaves pod-resources unsynced, the first pass goes ahead at the deadline naming
// what the manager still waits for, and kubelet's answer when it comes is one more publish.
TEST_F(DaemonTest, AFirstPassAtTheStartupDeadlineNamesTheSourceStillAwaited) {
  const testing::FixtureHost host("a100-vfio");
  fakes::Scenario slow = A100Scenario(false);
  slow.delay = 1500ms;
  kubelet_.Start((socketDir_.path() / "kubelet.sock").string(), slow);
  Start(host, "off", "off", [](DaemonOptions& options) {
    options.startupWait = 200ms;
    options.podResources.callTimeout = 5s;
  });
  const auto first = WaitForPublishes(1);
  ASSERT_EQ(first.size(), 1U);
  EXPECT_FALSE(first[0].contains("resourceNames") && !first[0]["resourceNames"].empty())
      << "published before kubelet answered: " << first[0].dump();
  const auto both = WaitForPublishes(2);
  ASSERT_EQ(both.size(), 2U);
  EXPECT_EQ(both[1]["resourceNames"], nlohmann::json::array({"nvidia.com/A100"}));
  Stop();
  bool named = false;
  for (const std::string& line : logLines_) {
    if (line.find("first pass without every source's first answer") != std::string::npos) {
      named = line.find("waiting=pod-resources") != std::string::npos &&
              line.find("device events") == std::string::npos;
    }
  }
  EXPECT_TRUE(named) << ::testing::PrintToString(logLines_);
}

TEST_F(DaemonTest, KubeletAnswerChangesArePublishedOnce) {
  const testing::FixtureHost host("a100-vfio");
  kubelet_.Start((socketDir_.path() / "kubelet.sock").string(), A100Scenario(false));
  Start(host);
  ASSERT_EQ(WaitForPublishes(1).size(), 1U);
  kubelet_.SetScenario(A100Scenario(true));  // a VM starts on 3b:00.0
  const auto published = WaitForPublishes(2);
  ASSERT_EQ(published.size(), 2U);
  EXPECT_EQ(Device(published[1], "0000:3b:00.0")["allocated"], 1);
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(PublishCount(), 2U);
}

TEST_F(DaemonTest, KubeletGoneKeepsTheLastCountsInsteadOfZeros) {
  const testing::FixtureHost host("a100-vfio");
  kubelet_.Start((socketDir_.path() / "kubelet.sock").string(), A100Scenario(true));
  Start(host);
  ASSERT_EQ(WaitForPublishes(1).size(), 1U);
  kubelet_.Stop();  // kubelet restarts: no socket for a while
  std::this_thread::sleep_for(1s);
  EXPECT_EQ(PublishCount(), 1U);  // stale counts equal the last ones: nothing to write
  bool warned = false;
  for (const auto& line : logLines_) {
    warned = warned || line.find("keeping the last counts, stale") != std::string::npos;
  }
  EXPECT_TRUE(warned);
}

TEST_F(DaemonTest, PodPhaseChangeReReadsPodResources) {
  const testing::FixtureHost host("a100-vfio");
  kubelet_.Start((socketDir_.path() / "kubelet.sock").string(), A100Scenario(true));
  Start(host);
  const auto first = WaitForPublishes(1);
  ASSERT_EQ(Device(first[0], "0000:3b:00.0")["allocated"], 1);
  // The pod watch reports the VM's pod Succeeded; kubelet 1.32/1.33 still lists it (A7).
  daemon_->PostPodPhases({{"tenant-a/virt-launcher-vm1", "Succeeded"}});
  const auto published = WaitForPublishes(2);
  ASSERT_EQ(published.size(), 2U);
  EXPECT_EQ(Device(published[1], "0000:3b:00.0")["allocated"], 0);
}

TEST_F(DaemonTest, ARateLimitedPublishWaitsOnTheLoopAndIsNoFailure) {
  const testing::FixtureHost host("a100-vfio");
  shared_->waitsToGo = 2;
  Start(host);
  const auto published = WaitForPublishes(1);
  ASSERT_EQ(published.size(), 1U);
  std::this_thread::sleep_for(200ms);
  Stop();
  EXPECT_EQ(PublishCount(), 1U);
  EXPECT_EQ(daemon_->counters().publishWaits, 2);
  EXPECT_EQ(daemon_->counters().publishFailures, 0);
  EXPECT_EQ(daemon_->counters().publishes, 1);
}

TEST_F(DaemonTest, TransientPublishFailuresAreRetriedUntilWritten) {
  const testing::FixtureHost host("a100-vfio");
  shared_->failuresToGo = 3;
  Start(host);
  const auto published = WaitForPublishes(1);
  ASSERT_EQ(published.size(), 1U);
  EXPECT_EQ(shared_->failures, 3);
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(PublishCount(), 1U);
}

TEST_F(DaemonTest, RealKernelUeventRescansAFixtureChangeWithinTheDebounceWindow) {
  const auto uevent = testing::WritableUevent();
  if (!uevent || !testing::EmitUevent(*uevent)) {
    GTEST_SKIP() << testing::kNoRealUevents;
  }
  testing::FixtureHost host("a100-vfio");
  Start(host, "kernel");
  ASSERT_EQ(WaitForPublishes(1).size(), 1U);
  // Rebind 3b:00.0 from vfio-pci to nvidia in the fixture, then let the kernel announce a change.
  const auto device = host.root() / "sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0";
  std::filesystem::remove(device / "driver");
  std::filesystem::create_directories(host.root() / "sys/bus/pci/drivers/nvidia");
  std::filesystem::create_symlink("../../../../bus/pci/drivers/nvidia", device / "driver");
  ASSERT_TRUE(testing::EmitUevent(*uevent));
  const auto published = WaitForPublishes(2, 5s);
  ASSERT_EQ(published.size(), 2U) << "no rescan after a real uevent";
  EXPECT_EQ(Device(published[1], "0000:3b:00.0")["driver"], "nvidia");
  Stop();
  EXPECT_GE(daemon_->counters().deviceEvents, 1);
  EXPECT_GE(daemon_->counters().debouncedRescans, 1);
}

TEST_F(DaemonTest, ABurstOfRealUeventsCollapsesIntoFewRescans) {
  const auto uevent = testing::WritableUevent();
  if (!uevent || !testing::EmitUevent(*uevent)) {
    GTEST_SKIP() << testing::kNoRealUevents;
  }
  const testing::FixtureHost host("a100-vfio");
  Start(host, "kernel");
  ASSERT_EQ(WaitForPublishes(1).size(), 1U);
  std::this_thread::sleep_for(300ms);
  const auto before = std::chrono::steady_clock::now();
  for (int i = 0; i < 200; ++i) {
    testing::EmitUevent(*uevent);
  }
  const auto burst = std::chrono::steady_clock::now() - before;
  std::this_thread::sleep_for(400ms);
  Stop();
  const DaemonCounters& counters = daemon_->counters();
  EXPECT_GE(counters.deviceEvents, 200);
  // One rescan per debounce window the burst touched, at most.
  const auto windows = static_cast<int64_t>(burst / 100ms) + 2;
  EXPECT_LE(counters.debouncedRescans, windows) << "burst took " << (burst / 1ms) << " ms";
  EXPECT_GE(counters.debouncedRescans, 1);
}

TEST_F(DaemonTest, HealthReadinessAndMetricsThatPromtoolAccepts) {
  const testing::FixtureHost host("a100-vfio");
  kubelet_.Start((socketDir_.path() / "kubelet.sock").string(), A100Scenario(true));
  Start(host, "off", "127.0.0.1:0");
  ASSERT_EQ(WaitForPublishes(1).size(), 1U);
  int port = 0;
  for (int i = 0; i < 50 && port == 0; ++i) {
    port = daemon_->healthPort();
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_GT(port, 0);
  httplib::Client client("127.0.0.1", port);
  const auto healthz = client.Get("/healthz");
  ASSERT_TRUE(healthz);
  EXPECT_EQ(healthz->status, 200);
  const auto readyz = client.Get("/readyz");
  ASSERT_TRUE(readyz);
  EXPECT_EQ(readyz->status, 200);
  // The write finishes on the publisher's thread; the metrics show it by the next heartbeat.
  auto metrics = client.Get("/metrics");
  for (int i = 0;
       i < 40 && metrics &&
       metrics->body.find("gpu_agent_publishes_total{result=\"written\"} 1") == std::string::npos;
       ++i) {
    std::this_thread::sleep_for(50ms);
    metrics = client.Get("/metrics");
  }
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_NE(metrics->body.find("gpu_agent_devices{health=\"Healthy\"} 2"), std::string::npos)
      << metrics->body;
  EXPECT_NE(metrics->body.find("gpu_agent_publishes_total{result=\"written\"} 1"),
            std::string::npos);
  EXPECT_NE(metrics->body.find("gpu_agent_pod_resources_fetches_total{result=\"ok\"}"),
            std::string::npos);
  EXPECT_NE(metrics->body.find("gpu_agent_scan_duration_seconds_count"), std::string::npos);
  // Prometheus' own linter on the exposition.
  const auto file = socketDir_.path() / "metrics.txt";
  std::ofstream(file) << metrics->body;
  const auto lint =
      testing::RunCommand("promtool check metrics < " + testing::ShellQuote(file.string()));
  EXPECT_EQ(lint.exitCode, 0) << lint.out << lint.err;
  EXPECT_EQ(lint.out + lint.err, "") << "promtool found problems";
}

// The pod-resources source on its own loop: its reads are a runtime::PassLoop's passes.
class PodResourcesReads {
 public:
  PodResourcesReads(const std::string& endpoint, FetchSchedule schedule)
      : source_(Options(endpoint), schedule) {
    loop_.Post([this] { source_.Start(loop_, [](std::string_view, bool) {}); });
    thread_ = std::thread([this] { loop_.Run(); });
  }
  ~PodResourcesReads() {
    loop_.RequestExit(0);
    thread_.join();
  }
  PodResourcesReads(const PodResourcesReads&) = delete;
  PodResourcesReads& operator=(const PodResourcesReads&) = delete;

  template <class F>
  auto On(F work) {
    std::promise<decltype(work())> result;
    loop_.Post([&] { result.set_value(work()); });
    return result.get_future().get();
  }
  int64_t Fetches() {
    return On([this] { return source_.fetches(); });
  }
  int64_t Answers() {
    return On([this] {
      int64_t answers = 0;
      for (const auto& [state, count] : source_.results()) answers += count;
      return answers;
    });
  }
  void Refresh(bool force) {
    On([this, force] {
      source_.Refresh(force);
      return 0;
    });
  }
  // Waits (bounded) until `count` reads were answered.
  bool WaitForAnswers(int64_t count, std::chrono::milliseconds limit = 5s) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (Answers() < count) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(10ms);
    }
    return true;
  }

 private:
  static podresources::ClientOptions Options(const std::string& endpoint) {
    podresources::ClientOptions options;
    options.endpoint = endpoint;
    options.callTimeout = 3s;
    return options;
  }
  runtime::Loop loop_;
  PodResourcesSource source_;
  std::thread thread_;
};

// With an interval and a backoff of an hour, every read after the first is a trigger's: a pod
// change reads at once, a backoff holds every trigger but a forced one (kubelet rate-limits the
// API), a trigger during a read that fails waits for the backoff too, and one during a read that
// is answered is the read right after it, the backoff before it over.
TEST(PodResourcesSource, TriggersReadAtOnceAndTheBackoffHoldsAllButAForcedOne) {
  testing::TempDir socketDir;
  const std::string socket = (socketDir.path() / "kubelet.sock").string();
  fakes::FakeKubelet kubelet;
  kubelet.Start(socket, A100Scenario(false));
  FetchSchedule schedule;
  schedule.interval = 1h;
  schedule.firstBackoff = 1h;
  schedule.maxBackoff = 1h;
  schedule.jitter = 0;
  PodResourcesReads reads("unix://" + socket, schedule);
  ASSERT_TRUE(reads.WaitForAnswers(1));
  reads.Refresh(false);  // a pod changed
  ASSERT_TRUE(reads.WaitForAnswers(2)) << "a pod change waited for the interval";

  fakes::Scenario limited = A100Scenario(false);
  limited.getAllocatableResources = fakes::Behaviour::kResourceExhausted;
  limited.list = fakes::Behaviour::kResourceExhausted;
  kubelet.SetScenario(limited);
  reads.Refresh(false);
  ASSERT_TRUE(reads.WaitForAnswers(3));
  reads.Refresh(false);
  reads.Refresh(false);
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(reads.Fetches(), 3) << "a trigger did not wait for the backoff";

  limited.delay = 800ms;
  kubelet.SetScenario(limited);
  reads.Refresh(true);
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(reads.Fetches(), 4) << "a forced read waited for the backoff";
  reads.Refresh(true);  // during the read, which fails
  reads.Refresh(false);
  ASSERT_TRUE(reads.WaitForAnswers(4));
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(reads.Fetches(), 4) << "a trigger during a failed read went past the backoff";

  fakes::Scenario slow = A100Scenario(true);
  slow.delay = 800ms;
  kubelet.SetScenario(slow);
  reads.Refresh(true);
  std::this_thread::sleep_for(200ms);
  reads.Refresh(false);  // during the read, which is answered
  ASSERT_TRUE(reads.WaitForAnswers(6)) << "a trigger during an answered read was lost";
  EXPECT_EQ(reads.Fetches(), 6);
}

TEST(Metrics, HistogramBucketsAreCumulative) {
  MetricsSnapshot snapshot;
  snapshot.scanDuration.Observe(0.003);
  snapshot.scanDuration.Observe(0.2);
  snapshot.scanDuration.Observe(5.0);
  EXPECT_EQ(snapshot.scanDuration.count(), 3);
  const std::string text = RenderMetrics(snapshot);
  EXPECT_NE(text.find("gpu_agent_scan_duration_seconds_bucket{le=\"0.001\"} 0"), std::string::npos);
  EXPECT_NE(text.find("gpu_agent_scan_duration_seconds_bucket{le=\"0.005\"} 1"), std::string::npos);
  EXPECT_NE(text.find("gpu_agent_scan_duration_seconds_bucket{le=\"0.25\"} 2"), std::string::npos);
  EXPECT_NE(text.find("gpu_agent_scan_duration_seconds_bucket{le=\"1\"} 2"), std::string::npos);
  EXPECT_NE(text.find("gpu_agent_scan_duration_seconds_bucket{le=\"+Inf\"} 3"), std::string::npos);
}

}  // namespace
}  // namespace cozy::agent
