#include "runtime/metrics.h"

#include <cstdio>

namespace cozy::runtime {

std::string MetricNumber(double value) {
  char buffer[64];
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

}  // namespace cozy::runtime
