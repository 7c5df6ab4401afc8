// The agent's Prometheus metrics: its families, declared once on the daemon's registry
// (runtime/metrics.h), filled at each scrape from a plain value the loop thread reads.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>

#include "runtime/metrics.h"

namespace cozy::agent {

// Scan durations in seconds; upper bounds of the histogram's buckets (+Inf is implied).
inline constexpr std::array<double, 8> kScanDurationBuckets = {0.001, 0.005, 0.01, 0.025,
                                                               0.05,  0.1,   0.25, 1.0};

struct MetricsSnapshot {
  std::string version;
  int64_t scans = 0;
  runtime::Histogram scanDuration{{kScanDurationBuckets.begin(), kScanDurationBuckets.end()}};
  int64_t deviceEvents = 0;
  int64_t deviceRescans = 0;  // debounced rescans that device events asked for
  int64_t podResourcesFetches = 0;
  std::map<std::string, int64_t> podResourcesResults;  // by state: ok, socketAbsent, ...
  bool podResourcesStale = false;
  bool unitsKnown = false;
  // Publish attempts by result: written (the object changed), unchanged (nothing to write),
  // failed, waited (the client-side rate limit postponed it).
  std::map<std::string, int64_t> publishes;
  // The same for the node's ResourceSlice (`--resource-slices`); empty without.
  std::map<std::string, int64_t> slicePublishes;
  // The kubelet plugin's claims by outcome: prepared, prepareFailed, unprepared, unprepareFailed.
  std::map<std::string, int64_t> draClaims;
  int64_t callbackFailures = 0;                     // loop callbacks that threw
  std::map<std::string, int64_t> devicesByHealth;   // Healthy, Unhealthy, Unadvertised, Unknown
  std::map<std::string, int64_t> ignoredDeviceIds;  // unknownShape, noMatch, notGpu
  int64_t sysfsProblems = 0;
  bool dbusConnected = false;
  // The health server's connections by outcome: answered, rejected (405, 413, ...), timedOut,
  // overflowed (closed to make room past the connection cap).
  std::map<std::string, int64_t> httpConnections;
};

// The agent's families on `registry`; Collect fills them from a snapshot, at each scrape.
class AgentMetrics {
 public:
  explicit AgentMetrics(runtime::MetricsRegistry& registry);
  void Collect(runtime::MetricsScrape& scrape, const MetricsSnapshot& snapshot);

 private:
  runtime::MetricFamily& info_;
  runtime::MetricFamily& scans_;
  runtime::MetricFamily& scanDuration_;
  runtime::MetricFamily& deviceEvents_;
  runtime::MetricFamily& deviceRescans_;
  runtime::MetricFamily& podResourcesFetches_;
  runtime::MetricFamily& unitsKnown_;
  runtime::MetricFamily& unitsStale_;
  runtime::MetricFamily& publishes_;
  runtime::MetricFamily& slicePublishes_;
  runtime::MetricFamily& draClaims_;
  runtime::MetricFamily& callbackFailures_;
  runtime::MetricFamily& devices_;
  runtime::MetricFamily& resolverMisses_;
  runtime::MetricFamily& sysfsProblems_;
  runtime::MetricFamily& dbusConnected_;
  runtime::MetricFamily& httpRequests_;
};

// The page a registry of the agent's families renders for `snapshot` (tests).
std::string RenderMetrics(const MetricsSnapshot& snapshot);

}  // namespace cozy::agent
