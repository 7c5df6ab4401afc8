// Prometheus text exposition (format 0.0.4) for any daemon: a writer for families and samples
// and a fixed-bucket histogram. Each program renders its own metrics from a plain value with
// these, and hands the text to the health server.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cozy::runtime {

class MetricsWriter {
 public:
  // `type`: counter, gauge or histogram.
  void Family(std::string_view name, std::string_view type, std::string_view help);
  // `labels` as Label() makes them, comma-joined; empty for none.
  void Sample(std::string_view name, std::string_view labels, double value);
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// key="value", the value escaped as the format asks (backslash, quote, newline).
std::string Label(std::string_view key, std::string_view value);
// A sample value: a whole number below 1e15 in full, any other in %.9g.
std::string MetricNumber(double value);

// The process's own figures under the names Prometheus's client libraries give them, so that a
// hoster's dashboards for any exporter read ours: process_cpu_seconds_total (user and system
// CPU of every thread the process ran, ended ones included, to the nanosecond: the clock
// CLOCK_PROCESS_CPUTIME_ID, not /proc's 10 ms ticks), process_resident_memory_bytes,
// process_virtual_memory_bytes, process_open_fds and process_max_fds. A figure the kernel does
// not give is left out, never written as zero.
void WriteProcessMetrics(MetricsWriter& out);

// Observations counted into buckets with fixed upper bounds (+Inf implied).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  // The _bucket, _sum and _count samples under `name` (the Family line is the caller's).
  void Write(MetricsWriter& out, std::string_view name) const;
  int64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> buckets_;  // cumulative
  int64_t count_ = 0;
  double sum_ = 0;
};

}  // namespace cozy::runtime
