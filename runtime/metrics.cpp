#include "runtime/metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <utility>

namespace cozy::runtime {

std::string MetricNumber(double value) {
  char buffer[64];
  // A whole number (a count, a Unix time in seconds) in full: %.9g would write 1796567890 as
  // 1.79656789e+09, ten seconds off.
  if (std::isfinite(value) && value == std::trunc(value) && std::fabs(value) < 1e15) {
    std::snprintf(buffer, sizeof buffer, "%.0f", value);
    return buffer;
  }
  std::snprintf(buffer, sizeof buffer, "%.9g", value);
  return buffer;
}

std::string Label(std::string_view key, std::string_view value) {
  std::string label(key);
  label += "=\"";
  for (const char c : value) {
    if (c == '\\' || c == '"') {
      label += '\\';
      label += c;
    } else if (c == '\n') {
      label += "\\n";
    } else {
      label += c;
    }
  }
  label += '"';
  return label;
}

void MetricsWriter::Family(std::string_view name, std::string_view type, std::string_view help) {
  out_ += "# HELP ";
  out_ += name;
  out_ += ' ';
  out_ += help;
  out_ += "\n# TYPE ";
  out_ += name;
  out_ += ' ';
  out_ += type;
  out_ += '\n';
}

void MetricsWriter::Sample(std::string_view name, std::string_view labels, double value) {
  out_ += name;
  if (!labels.empty()) {
    out_ += '{';
    out_ += labels;
    out_ += '}';
  }
  out_ += ' ';
  out_ += MetricNumber(value);
  out_ += '\n';
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(bounds_.size(), 0) {}

void Histogram::Observe(double value) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (value <= bounds_[i]) {
      ++buckets_[i];
    }
  }
  ++count_;
  sum_ += value;
}

void Histogram::Write(MetricsWriter& out, std::string_view name) const {
  const std::string bucket = std::string(name) + "_bucket";
  for (size_t i = 0; i < bounds_.size(); ++i) {
    out.Sample(bucket, Label("le", MetricNumber(bounds_[i])), static_cast<double>(buckets_[i]));
  }
  out.Sample(bucket, Label("le", "+Inf"), static_cast<double>(count_));
  out.Sample(std::string(name) + "_sum", "", sum_);
  out.Sample(std::string(name) + "_count", "", static_cast<double>(count_));
}

namespace {

// Entries of /proc/self/fd but the directory handle that reads it; -1 when it cannot be read.
int OpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int count = 0;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count - 1;
}

}  // namespace

void WriteProcessMetrics(MetricsWriter& out) {
  timespec cpu{};
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu) == 0) {
    out.Family("process_cpu_seconds_total", "counter",
               "Total user and system CPU time spent in seconds.");
    out.Sample("process_cpu_seconds_total", "",
               static_cast<double>(cpu.tv_sec) + static_cast<double>(cpu.tv_nsec) / 1e9);
  }
  // /proc/self/statm: size and resident, in pages.
  std::ifstream statm("/proc/self/statm");
  double size = 0;
  double resident = 0;
  if (statm >> size >> resident) {
    const auto page = static_cast<double>(sysconf(_SC_PAGESIZE));
    out.Family("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.");
    out.Sample("process_virtual_memory_bytes", "", size * page);
    out.Family("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
    out.Sample("process_resident_memory_bytes", "", resident * page);
  }
  if (const int fds = OpenFds(); fds >= 0) {
    out.Family("process_open_fds", "gauge", "Number of open file descriptors.");
    out.Sample("process_open_fds", "", fds);
  }
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY) {
    out.Family("process_max_fds", "gauge", "Maximum number of open file descriptors.");
    out.Sample("process_max_fds", "", static_cast<double>(files.rlim_cur));
  }
}

namespace {

const char* TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

}  // namespace

MetricFamily::MetricFamily(std::string name, MetricType type, std::string help,
                           std::vector<std::string> labels, std::vector<double> buckets)
    : name_(std::move(name)),
      type_(type),
      help_(std::move(help)),
      labels_(std::move(labels)),
      buckets_(std::move(buckets)) {}

void MetricFamily::Check(const std::vector<std::string>& labelValues) const {
  if (type_ == MetricType::kHistogram) {
    throw std::logic_error("metric family " + name_ + " is a histogram: Observe, not Set");
  }
  if (labelValues.size() != labels_.size()) {
    throw std::logic_error("metric family " + name_ + " has " + std::to_string(labels_.size()) +
                           " labels, a sample gave " + std::to_string(labelValues.size()));
  }
}

double& MetricFamily::Slot(const std::vector<std::string>& labelValues) {
  for (auto& [values, value] : samples_.values) {
    if (values == labelValues) return value;
  }
  samples_.shown = true;
  return samples_.values.emplace_back(labelValues, 0.0).second;
}

void MetricFamily::Set(const std::vector<std::string>& labelValues, double value) {
  Check(labelValues);
  std::lock_guard<std::mutex> lock(mutex_);
  Slot(labelValues) = value;
}

void MetricFamily::Add(const std::vector<std::string>& labelValues, double delta) {
  Check(labelValues);
  std::lock_guard<std::mutex> lock(mutex_);
  Slot(labelValues) += delta;
}

void MetricFamily::Clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  samples_.values.clear();
  samples_.shown = false;
}

void MetricFamily::Observe(double value) {
  if (type_ != MetricType::kHistogram) {
    throw std::logic_error("metric family " + name_ + " is not a histogram");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (!samples_.histogram) samples_.histogram = std::make_unique<Histogram>(buckets_);
  samples_.shown = true;
  samples_.histogram->Observe(value);
}

void MetricFamily::SetHistogram(const Histogram& histogram) {
  if (type_ != MetricType::kHistogram) {
    throw std::logic_error("metric family " + name_ + " is not a histogram");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  samples_.histogram = std::make_unique<Histogram>(histogram);
  samples_.shown = true;
}

void MetricFamily::Replace(Samples samples) {
  std::lock_guard<std::mutex> lock(mutex_);
  samples_ = std::move(samples);
}

void MetricFamily::Render(MetricsWriter& out) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!samples_.shown) return;
  out.Family(name_, TypeName(type_), help_);
  if (samples_.histogram) samples_.histogram->Write(out, name_);
  for (const auto& [values, value] : samples_.values) {
    std::string labels;
    for (size_t i = 0; i < values.size(); ++i) {
      if (i > 0) labels += ',';
      labels += Label(labels_[i], values[i]);
    }
    out.Sample(name_, labels, value);
  }
}

void MetricsScrape::Set(MetricFamily& family, const std::vector<std::string>& labelValues,
                        double value) {
  family.Check(labelValues);
  MetricFamily::Samples& samples = samples_[&family];
  samples.values.emplace_back(labelValues, value);
  samples.shown = true;
}

void MetricsScrape::SetHistogram(MetricFamily& family, const Histogram& histogram) {
  if (family.type() != MetricType::kHistogram) {
    throw std::logic_error("metric family " + family.name() + " is not a histogram");
  }
  MetricFamily::Samples& samples = samples_[&family];
  samples.histogram = std::make_unique<Histogram>(histogram);
  samples.shown = true;
}

MetricFamily& MetricsRegistry::Declare(std::string name, MetricType type, std::string help,
                                       std::vector<std::string> labels,
                                       std::vector<double> buckets) {
  std::lock_guard<std::mutex> lock(familiesMutex_);
  if (byName_.count(name) != 0) {
    throw std::logic_error("metric family " + name + " declared twice");
  }
  MetricFamily& family = *families_.emplace_back(std::make_unique<MetricFamily>(
      name, type, std::move(help), std::move(labels), std::move(buckets)));
  byName_.emplace(std::move(name), &family);
  return family;
}

MetricFamily& MetricsRegistry::Find(std::string_view name) const {
  std::lock_guard<std::mutex> lock(familiesMutex_);
  const auto found = byName_.find(name);
  if (found == byName_.end()) {
    throw std::logic_error("metric family " + std::string(name) + " was not declared");
  }
  return *found->second;
}

MetricFamily& MetricsScrape::Find(std::string_view name) const {
  if (registry_ == nullptr) {
    throw std::logic_error("metric family " + std::string(name) + ": a scrape of no registry");
  }
  return registry_->Find(name);
}

MetricFamily& MetricsRegistry::Counter(std::string name, std::string help,
                                       std::vector<std::string> labels) {
  return Declare(std::move(name), MetricType::kCounter, std::move(help), std::move(labels), {});
}

MetricFamily& MetricsRegistry::Gauge(std::string name, std::string help,
                                     std::vector<std::string> labels) {
  return Declare(std::move(name), MetricType::kGauge, std::move(help), std::move(labels), {});
}

MetricFamily& MetricsRegistry::HistogramFamily(std::string name, std::string help,
                                               std::vector<double> buckets) {
  return Declare(std::move(name), MetricType::kHistogram, std::move(help), {}, std::move(buckets));
}

void MetricsRegistry::AddCollector(Collector collect, Post post) {
  std::lock_guard<std::mutex> lock(scrapeMutex_);
  collectors_.push_back({std::move(collect), std::move(post), {}});
}

// The families the scrape filled take its samples; those the collector filled last time and
// not now are hidden (a part that stopped, a map that emptied without Show).
void MetricsRegistry::Commit(PostedCollector& collector, MetricsScrape& scrape) {
  for (MetricFamily* family : collector.filled) {
    if (scrape.samples_.count(family) == 0) family->Replace({});
  }
  collector.filled.clear();
  for (auto& [family, samples] : scrape.samples_) {
    family->Replace(std::move(samples));
    collector.filled.push_back(family);
  }
}

void MetricsRegistry::Collect(PostedCollector& collector) const {
  if (!collector.post) {
    MetricsScrape scrape(this);
    collector.collect(scrape);
    Commit(collector, scrape);
    return;
  }
  // Shared with the posted work, which may run after this scrape gave up on it: it then fills a
  // scrape nobody reads.
  struct Pending {
    std::mutex mutex;
    std::condition_variable done;
    bool finished = false;
    MetricsScrape scrape;
  };
  auto pending = std::make_shared<Pending>();
  collector.post([pending, collect = collector.collect, registry = this] {
    MetricsScrape scrape(registry);
    collect(scrape);
    std::lock_guard<std::mutex> lock(pending->mutex);
    pending->scrape = std::move(scrape);
    pending->finished = true;
    pending->done.notify_all();
  });
  std::unique_lock<std::mutex> lock(pending->mutex);
  if (!pending->done.wait_for(lock, collectBound_, [&] { return pending->finished; })) return;
  Commit(collector, pending->scrape);
}

std::string MetricsRegistry::Render() const {
  std::lock_guard<std::mutex> scrapeLock(scrapeMutex_);
  for (PostedCollector& collector : collectors_) Collect(collector);
  std::vector<const MetricFamily*> families;
  {
    std::lock_guard<std::mutex> lock(familiesMutex_);
    for (const auto& family : families_) families.push_back(family.get());
  }
  MetricsWriter out;
  for (const MetricFamily* family : families) family->Render(out);
  return out.Take();
}

}  // namespace cozy::runtime
