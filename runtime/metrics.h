// Prometheus text exposition (format 0.0.4) for any daemon: a registry of declared families
// that renders the page when it is scraped (docs/runtime.md, "Metrics registry"), the writer it
// renders with, and a fixed-bucket histogram.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
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

enum class MetricType { kCounter, kGauge, kHistogram };

// One family of a registry: declared once with its name, type, help and label names. Its
// samples are set where the figures change (Set, Add, Observe: thread-safe), or, for a family a
// collector fills, replaced at each scrape (MetricsScrape). A sample whose label values are not
// as many as the family's label names throws std::logic_error naming the family.
class MetricFamily {
 public:
  MetricFamily(std::string name, MetricType type, std::string help, std::vector<std::string> labels,
               std::vector<double> buckets);
  MetricFamily(const MetricFamily&) = delete;
  MetricFamily& operator=(const MetricFamily&) = delete;

  const std::string& name() const { return name_; }
  MetricType type() const { return type_; }

  // Counters and gauges. A sample first set is rendered after those set before it.
  void Set(double value) { Set({}, value); }
  void Set(const std::vector<std::string>& labelValues, double value);
  void Add(double delta = 1) { Add({}, delta); }
  void Add(const std::vector<std::string>& labelValues, double delta);
  // Drops every sample (a gauge by label whose label values come and go).
  void Clear();
  // Histograms (no labels): one observation, or the whole histogram as counted elsewhere.
  void Observe(double value);
  void SetHistogram(const Histogram& histogram);

  // Appends the family's HELP, TYPE and samples; a family never set (or not shown by its
  // collector at the last scrape) writes nothing.
  void Render(MetricsWriter& out) const;

 private:
  friend class MetricsScrape;
  friend class MetricsRegistry;
  struct Samples {
    std::vector<std::pair<std::vector<std::string>, double>> values;
    std::unique_ptr<Histogram> histogram;
    bool shown = false;
  };
  void Check(const std::vector<std::string>& labelValues) const;
  double& Slot(const std::vector<std::string>& labelValues);  // under mutex_
  void Replace(Samples samples);

  const std::string name_;
  const MetricType type_;
  const std::string help_;
  const std::vector<std::string> labels_;
  const std::vector<double> buckets_;
  mutable std::mutex mutex_;
  Samples samples_;
};

class MetricsRegistry;

// What a collector fills at one scrape: the samples of the families it sets, each of which
// replaces that family's samples once the collector has returned in time. A family is named by
// its handle or by its name; a name the registry did not declare throws std::logic_error.
class MetricsScrape {
 public:
  explicit MetricsScrape(const MetricsRegistry* registry = nullptr) : registry_(registry) {}

  void Set(MetricFamily& family, const std::vector<std::string>& labelValues, double value);
  void Set(MetricFamily& family, double value) { Set(family, {}, value); }
  void SetHistogram(MetricFamily& family, const Histogram& histogram);
  // The family's HELP and TYPE are written even when no sample of it is set (an empty map).
  void Show(MetricFamily& family) { samples_[&family].shown = true; }
  void Set(std::string_view name, const std::vector<std::string>& labelValues, double value) {
    Set(Find(name), labelValues, value);
  }
  void Set(std::string_view name, double value) { Set(Find(name), {}, value); }
  void SetHistogram(std::string_view name, const Histogram& histogram) {
    SetHistogram(Find(name), histogram);
  }
  void Show(std::string_view name) { Show(Find(name)); }

 private:
  friend class MetricsRegistry;
  MetricFamily& Find(std::string_view name) const;

  const MetricsRegistry* registry_;
  std::map<MetricFamily*, MetricFamily::Samples> samples_;
};

// The families of one daemon, rendered in the order declared when the health server is
// scraped. Figures read from a daemon's state come from collectors; a collector given a
// `post` runs where post sends it (the daemon's loop thread: Loop::Post) and the scrape waits
// for it at most `collectBound`: past that the page shows what that collector gave last.
class MetricsRegistry {
 public:
  using Collector = std::function<void(MetricsScrape&)>;
  using Post = std::function<void(std::function<void()>)>;

  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Throws std::logic_error naming the family when one of that name was declared before.
  MetricFamily& Counter(std::string name, std::string help, std::vector<std::string> labels = {});
  MetricFamily& Gauge(std::string name, std::string help, std::vector<std::string> labels = {});
  // `buckets`: for Observe; a histogram a collector sets (SetHistogram) brings its own.
  MetricFamily& HistogramFamily(std::string name, std::string help,
                                std::vector<double> buckets = {});
  // Without `post`, the collector runs on the scraping thread and must be thread-safe.
  void AddCollector(Collector collect, Post post = {});
  void SetCollectBound(std::chrono::milliseconds bound) { collectBound_ = bound; }

  // Runs the collectors, then writes every family. Thread-safe.
  std::string Render() const;
  // The family declared under `name`; throws std::logic_error naming it when there is none.
  MetricFamily& Find(std::string_view name) const;

 private:
  struct PostedCollector {
    Collector collect;
    Post post;
    std::vector<MetricFamily*> filled;  // by its last scrape that came back in time
  };
  MetricFamily& Declare(std::string name, MetricType type, std::string help,
                        std::vector<std::string> labels, std::vector<double> buckets);
  void Collect(PostedCollector& collector) const;
  static void Commit(PostedCollector& collector, MetricsScrape& scrape);

  // The families and their index; the families guard their own samples. A collector on another
  // thread finds families under this one while a scrape holds scrapeMutex_.
  mutable std::mutex familiesMutex_;
  std::vector<std::unique_ptr<MetricFamily>> families_;
  std::map<std::string, MetricFamily*, std::less<>> byName_;
  mutable std::mutex scrapeMutex_;  // one scrape at a time; the collectors
  mutable std::vector<PostedCollector> collectors_;
  std::chrono::milliseconds collectBound_{std::chrono::seconds(1)};
};

}  // namespace cozy::runtime
