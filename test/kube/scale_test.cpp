// A relist of 40,000 GPUDevices while the lease renews: the controller's typed cache over the
// chart's GPUDevice CRD relists the whole collection several times (the fake expires its
// watches), while a LeaderElector with client-go's timings holds the Lease and a reader on
// another thread queries the cache. The cache must come back to 40,000 objects each time, and
// the elector must stay leader with renewTime advancing at least once per renew deadline (the
// relists go on for two of them).
// Timings (seeding, the first sync, each relist, the reader's worst wait) are printed and
// recorded as test properties; only the renew-deadline bound is asserted.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <ctime>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "api/gpudevice.h"
#include "kube/cache.h"
#include "kube/leader_election.h"
#include "test/kube/kube_test_support.h"
#include "test/support/process.h"

namespace cozy::kube {
namespace {
using nlohmann::json;
using namespace std::chrono_literals;

#ifdef COZY_SANITIZED
constexpr int kDevices = 10000;  // a quarter under the sanitizers (test/kube/CMakeLists.txt)
#else
constexpr int kDevices = 40000;
#endif
constexpr int kNamespaces = 40;  // tenants, 1,000 devices each
constexpr int kNodes = 400;      // 100 devices bound to each
// At least this many relists, and relists for at least two renew deadlines, so that a Lease
// left unrenewed through them could not pass unseen.
constexpr int kMinRelists = 3;
constexpr int kMaxRelists = 40;
const std::string kLeasePath =
    "/apis/coordination.k8s.io/v1/namespaces/cozy-system/leases/gpu-controller";

double Seconds(Duration duration) { return std::chrono::duration<double>(duration).count(); }

std::string Numbered(const char* prefix, int number, int width) {
  char text[32];
  std::snprintf(text, sizeof text, "%s%0*d", prefix, width, number);
  return text;
}

json Namespace(const std::string& name) {
  return {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", name}}}};
}

json Device(int i) {
  return {{"apiVersion", "gpu.cozystack.io/v1alpha1"},
          {"kind", "GPUDevice"},
          {"metadata",
           {{"name", Numbered("gpu-", i, 5)},
            {"namespace", Numbered("tenant-", i % kNamespaces, 2)},
            {"labels", {{"gpu.cozystack.io/class", "a100"}}}}},
          {"spec", {{"className", "a100"}, {"count", 1}}},
          {"status", {{"phase", "Bound"}, {"nodeName", Numbered("node-", i % kNodes, 3)}}}};
}

// A MicroTime as the elector writes it (2026-01-02T03:04:05.678901Z).
std::optional<std::chrono::system_clock::time_point> ParseMicroTime(const std::string& text) {
  std::tm parts{};
  const char* rest = strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &parts);
  if (!rest) return std::nullopt;
  long micros = 0;
  if (*rest == '.' && std::sscanf(rest + 1, "%6ld", &micros) != 1) return std::nullopt;
  return std::chrono::system_clock::from_time_t(timegm(&parts)) + std::chrono::microseconds(micros);
}

TEST(Scale, RelistOfFortyThousandGpuDevicesWhileTheLeaseRenews) {
  fake::FakeApiServerOptions serverOptions;
  serverOptions.crdPaths = {testing::ChartCrdDir() / "gpu.cozystack.io_gpudevices.yaml"};
  fake::FakeApiServer server(serverOptions);
  // Seeded in-process (no HTTP, no validation): the namespaces first, as a cluster has them.
  server.Seed(Namespace("cozy-system"));
  for (int n = 0; n < kNamespaces; ++n) server.Seed(Namespace(Numbered("tenant-", n, 2)));
  const auto seedStart = Clock::now();
  for (int i = 0; i < kDevices; ++i) server.Seed(Device(i));
  const Duration seeding = Clock::now() - seedStart;
  server.Start();

  ClientOptions options = testing::TestClientOptions(DefaultTimeSource());
  options.maxResponseBytes = size_t{256} << 20;  // the list is about 15 MiB of JSON
  options.requestTimeout = 120s;
  Client client(testing::ConfigFor(server), options);

  // client-go's timings; the elector runs on its own thread with a client of its own.
  LeaderElectionOptions election;
  election.leaseNamespace = "cozy-system";
  election.leaseName = "gpu-controller";
  election.identity = "a";
  election.leaseDuration = 15s;
  election.renewDeadline = 10s;
  election.retryPeriod = 2s;
  std::mutex stopsMutex;
  std::vector<std::string> stops;
  election.onStoppedLeading = [&](const std::string& why) {
    std::lock_guard lock(stopsMutex);
    stops.push_back(why);
  };
  LeaderElector elector(client, election);
  elector.Start();
  ASSERT_TRUE(testing::WaitFor([&] { return elector.IsLeader(); }, 10s)) << elector.LastError();

  InformerOptions informer;
  informer.backoff = {100ms, 200ms, 2.0, 0.0};
  Cache<api::GpuDevice> devices(client, "/apis/gpu.cozystack.io/v1alpha1/gpudevices",
                                api::GpuDeviceFromJson, informer);
  devices.AddIndex("byNode", [](const api::GpuDevice& device) {
    return device.status.nodeName ? std::vector<std::string>{*device.status.nodeName}
                                  : std::vector<std::string>{};
  });

  // Leadership sampled all along; a reader asking the cache what is bound to one node.
  std::atomic<bool> done{false};
  std::atomic<int> notLeader{0};
  std::atomic<long long> worstReadMicros{0};
  std::atomic<long long> reads{0};
  std::thread monitor([&] {
    while (!done) {
      if (!elector.IsLeader()) ++notLeader;
      std::this_thread::sleep_for(5ms);
    }
  });
  std::thread reader([&] {
    int node = 0;
    while (!done) {
      const auto start = Clock::now();
      auto bound = devices.ByIndex("byNode", Numbered("node-", node++ % kNodes, 3));
      const auto waited =
          std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
      if (waited > worstReadMicros) worstReadMicros = waited;
      ++reads;
      std::this_thread::sleep_for(1ms);
    }
  });
  auto stopThreads = [&] {
    done = true;
    if (monitor.joinable()) monitor.join();
    if (reader.joinable()) reader.join();
  };

  const auto syncStart = Clock::now();
  devices.Start();
  const bool synced = testing::WaitFor([&] { return devices.Synced(); }, 120s);
  const Duration firstSync = Clock::now() - syncStart;
  if (!synced) stopThreads();
  ASSERT_TRUE(synced) << devices.LastError();
  EXPECT_EQ(devices.Size(), size_t{kDevices});
  EXPECT_EQ(devices.DecodeFailures(), 0) << devices.LastError();

  // The relists: a write moves the resourceVersion past the cache's, then every watch is
  // expired and the history compacted, so the informer relists whether or not its watch is
  // open yet.
  const auto windowStart = std::chrono::system_clock::now();
  const auto relistStart = Clock::now();
  std::vector<Duration> relists;
  for (int round = 0;
       round < kMaxRelists &&
       (round < kMinRelists || Clock::now() - relistStart < 2 * election.renewDeadline);
       ++round) {
    const int lists = devices.Stats().lists;
    const auto start = Clock::now();
    server.Seed({{"apiVersion", "v1"},
                 {"kind", "ConfigMap"},
                 {"metadata",
                  {{"name", "relist-" + std::to_string(round)}, {"namespace", "cozy-system"}}}});
    server.ExpireWatches();
    if (!testing::WaitFor([&] { return devices.Stats().lists > lists; }, 120s)) {
      ADD_FAILURE() << "relist " << round << " did not happen: " << devices.LastError();
      break;
    }
    relists.push_back(Clock::now() - start);
    EXPECT_EQ(devices.Size(), size_t{kDevices}) << "after relist " << round;
    EXPECT_EQ(devices.IndexKeys("byNode", "node-007").size(), size_t{kDevices / kNodes});
  }
  const auto windowEnd = std::chrono::system_clock::now();
  stopThreads();

  // (b) Leader all along, never stepped down.
  EXPECT_EQ(notLeader.load(), 0);
  {
    std::lock_guard lock(stopsMutex);
    EXPECT_TRUE(stops.empty()) << stops.front();
  }
  // The renewals the server accepted, by the renewTime they wrote: strictly advancing, and
  // none of the gaps across the relists (from the last renewal before them to the first after)
  // longer than the renew deadline.
  std::vector<std::chrono::system_clock::time_point> renewals;  // the create, then the PUTs
  for (const auto& request :
       testing::RequestsTo(server, "", kLeasePath.substr(0, kLeasePath.rfind('/')))) {
    if (request.method == "GET" || (request.status != 200 && request.status != 201)) continue;
    json body = json::parse(request.body, nullptr, false);
    auto time = ParseMicroTime(
        body.is_object() ? body.value("spec", json::object()).value("renewTime", std::string())
                         : std::string());
    if (time) renewals.push_back(*time);
  }
  ASSERT_FALSE(renewals.empty());
  EXPECT_TRUE(std::is_sorted(renewals.begin(), renewals.end()));
  EXPECT_EQ(std::adjacent_find(renewals.begin(), renewals.end()), renewals.end());
  auto first = std::upper_bound(renewals.begin(), renewals.end(), windowStart);
  if (first != renewals.begin()) --first;  // the last renewal before the relists
  std::vector<std::chrono::system_clock::time_point> across(first, renewals.end());
  across.push_back(windowEnd);
  std::chrono::system_clock::duration worstGap{};
  for (size_t i = 1; i < across.size(); ++i) {
    worstGap = std::max(worstGap, across[i] - across[i - 1]);
  }
  const int inWindow =
      static_cast<int>(std::count_if(renewals.begin(), renewals.end(), [&](const auto& time) {
        return time > windowStart && time <= windowEnd;
      }));
  EXPECT_LT(worstGap, election.renewDeadline)
      << "the Lease was not renewed for " << Seconds(worstGap) << " s during the relists";

  // Information, not assertions: how long it took.
  Duration longest{};
  double total = 0;
  std::string each;
  for (const auto& relist : relists) {
    longest = std::max(longest, relist);
    total += Seconds(relist);
    char text[16];
    std::snprintf(text, sizeof text, "%s%.2f", each.empty() ? "" : " ", Seconds(relist));
    each += text;
  }
  std::printf(
      "scale: seeded %d GPUDevices in %.2f s; first sync %.2f s; %zu relists: %s s (mean "
      "%.2f s); %d renewals in the %.1f s of relists, longest gap %.2f s; reader: %lld reads, "
      "worst wait %.1f ms\n",
      kDevices, Seconds(seeding), Seconds(firstSync), relists.size(), each.c_str(),
      relists.empty() ? 0.0 : total / static_cast<double>(relists.size()), inWindow,
      Seconds(windowEnd - windowStart), Seconds(worstGap), reads.load(),
      static_cast<double>(worstReadMicros.load()) / 1000.0);
  if (!elector.LastError().empty())
    std::printf("scale: elector's last error: %s\n", elector.LastError().c_str());
  ::testing::Test::RecordProperty("seed_seconds", std::to_string(Seconds(seeding)));
  ::testing::Test::RecordProperty("first_sync_seconds", std::to_string(Seconds(firstSync)));
  ::testing::Test::RecordProperty("relist_seconds_max", std::to_string(Seconds(longest)));
  ::testing::Test::RecordProperty("renewal_gap_seconds_max", std::to_string(Seconds(worstGap)));
  ::testing::Test::RecordProperty("reader_worst_wait_ms",
                                  std::to_string(static_cast<double>(worstReadMicros) / 1000.0));

  devices.Stop();
  elector.Stop();
  EXPECT_TRUE(elector.Released());
}

}  // namespace
}  // namespace cozy::kube
