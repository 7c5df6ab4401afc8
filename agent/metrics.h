// The agent's Prometheus metrics (text exposition format 0.0.4), rendered from a plain value
// with the runtime's writer.
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
  int64_t callbackFailures = 0;                     // loop callbacks that threw
  std::map<std::string, int64_t> devicesByHealth;   // Healthy, Unhealthy, Unadvertised, Unknown
  std::map<std::string, int64_t> ignoredDeviceIds;  // unknownShape, noMatch, notGpu
  int64_t sysfsProblems = 0;
  bool dbusConnected = false;
  // The health server's connections by outcome: answered, rejected (405, 413, ...), timedOut,
  // overflowed (closed to make room past the connection cap).
  std::map<std::string, int64_t> httpConnections;
};

std::string RenderMetrics(const MetricsSnapshot& snapshot);

}  // namespace cozy::agent
