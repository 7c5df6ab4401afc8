// The agent's Prometheus metrics (text exposition format 0.0.4), rendered from a plain value.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>

namespace cozy::agent {

// Scan durations in seconds; upper bounds of the histogram's buckets (+Inf is implied).
inline constexpr std::array<double, 8> kScanDurationBuckets = {0.001, 0.005, 0.01, 0.025,
                                                               0.05,  0.1,   0.25, 1.0};

struct ScanDurationHistogram {
  std::array<int64_t, kScanDurationBuckets.size()> buckets{};  // cumulative counts
  int64_t count = 0;
  double sum = 0;
  void Observe(double seconds);
};

struct MetricsSnapshot {
  std::string version;
  int64_t scans = 0;
  ScanDurationHistogram scanDuration;
  int64_t deviceEvents = 0;
  int64_t deviceRescans = 0;  // debounced rescans that device events asked for
  int64_t podResourcesFetches = 0;
  std::map<std::string, int64_t> podResourcesResults;  // by state: ok, socketAbsent, ...
  bool podResourcesStale = false;
  bool unitsKnown = false;
  int64_t patchesSucceeded = 0;
  int64_t patchesFailed = 0;
  std::map<std::string, int64_t> devicesByHealth;   // Healthy, Unhealthy, Unadvertised, Unknown
  std::map<std::string, int64_t> ignoredDeviceIds;  // unknownShape, noMatch, notGpu
  int64_t sysfsProblems = 0;
  bool dbusConnected = false;
};

std::string RenderMetrics(const MetricsSnapshot& snapshot);

}  // namespace cozy::agent
