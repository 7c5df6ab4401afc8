#include "runtime/metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>

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

}  // namespace cozy::runtime
