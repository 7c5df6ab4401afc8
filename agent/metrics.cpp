#include "agent/metrics.h"

#include <cstdio>

namespace cozy::agent {
namespace {

std::string Number(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.9g", value);
  return buffer;
}

class Writer {
 public:
  void Family(const std::string& name, const std::string& type, const std::string& help) {
    out_ += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void Sample(const std::string& name, const std::string& labels, double value) {
    out_ += name + (labels.empty() ? "" : "{" + labels + "}") + " " + Number(value) + "\n";
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

std::string Label(const std::string& key, const std::string& value) {
  return key + "=\"" + value + "\"";
}

}  // namespace

void ScanDurationHistogram::Observe(double seconds) {
  for (size_t i = 0; i < kScanDurationBuckets.size(); ++i) {
    if (seconds <= kScanDurationBuckets[i]) {
      ++buckets[i];
    }
  }
  ++count;
  sum += seconds;
}

std::string RenderMetrics(const MetricsSnapshot& snapshot) {
  Writer out;
  out.Family("gpu_agent_info", "gauge", "Build information of the running gpu-agent.");
  out.Sample("gpu_agent_info", Label("version", snapshot.version), 1);

  out.Family("gpu_agent_scans_total", "counter", "Discovery passes over sysfs.");
  out.Sample("gpu_agent_scans_total", "", static_cast<double>(snapshot.scans));

  out.Family("gpu_agent_scan_duration_seconds", "histogram",
             "Time one discovery pass took, sysfs and unit counting included.");
  for (size_t i = 0; i < kScanDurationBuckets.size(); ++i) {
    out.Sample("gpu_agent_scan_duration_seconds_bucket",
               Label("le", Number(kScanDurationBuckets[i])),
               static_cast<double>(snapshot.scanDuration.buckets[i]));
  }
  out.Sample("gpu_agent_scan_duration_seconds_bucket", Label("le", "+Inf"),
             static_cast<double>(snapshot.scanDuration.count));
  out.Sample("gpu_agent_scan_duration_seconds_sum", "", snapshot.scanDuration.sum);
  out.Sample("gpu_agent_scan_duration_seconds_count", "",
             static_cast<double>(snapshot.scanDuration.count));

  out.Family("gpu_agent_device_events_total", "counter",
             "Kernel or udev device events received (pci, mdev, vfio).");
  out.Sample("gpu_agent_device_events_total", "", static_cast<double>(snapshot.deviceEvents));
  out.Family("gpu_agent_device_rescans_total", "counter",
             "Rescans that device events asked for, after debouncing.");
  out.Sample("gpu_agent_device_rescans_total", "", static_cast<double>(snapshot.deviceRescans));

  out.Family("gpu_agent_pod_resources_fetches_total", "counter",
             "Reads of kubelet's pod-resources API, by result.");
  for (const auto& [state, count] : snapshot.podResourcesResults) {
    out.Sample("gpu_agent_pod_resources_fetches_total", Label("result", state),
               static_cast<double>(count));
  }
  out.Family("gpu_agent_units_known", "gauge",
             "1 once kubelet has answered: units are known (possibly stale).");
  out.Sample("gpu_agent_units_known", "", snapshot.unitsKnown ? 1 : 0);
  out.Family("gpu_agent_units_stale", "gauge",
             "1 while kubelet cannot answer and the last counts are kept.");
  out.Sample("gpu_agent_units_stale", "", snapshot.podResourcesStale ? 1 : 0);

  out.Family("gpu_agent_patches_total", "counter", "GPUNode writes, by result.");
  out.Sample("gpu_agent_patches_total", Label("result", "success"),
             static_cast<double>(snapshot.patchesSucceeded));
  out.Sample("gpu_agent_patches_total", Label("result", "failure"),
             static_cast<double>(snapshot.patchesFailed));

  out.Family("gpu_agent_devices", "gauge", "GPU functions of this node, by health.");
  for (const auto& [health, count] : snapshot.devicesByHealth) {
    out.Sample("gpu_agent_devices", Label("health", health), static_cast<double>(count));
  }

  out.Family("gpu_agent_resolver_misses", "gauge",
             "Device-plugin IDs that name no GPU function now, by reason.");
  for (const auto& [reason, count] : snapshot.ignoredDeviceIds) {
    out.Sample("gpu_agent_resolver_misses", Label("reason", reason), static_cast<double>(count));
  }

  out.Family("gpu_agent_sysfs_problems", "gauge",
             "Files the last scan could not read or parse (each logged once).");
  out.Sample("gpu_agent_sysfs_problems", "", static_cast<double>(snapshot.sysfsProblems));

  out.Family("gpu_agent_dbus_connected", "gauge",
             "1 while the agent owns io.cozystack.GPUAgent1 on its bus (--dbus), else 0.");
  out.Sample("gpu_agent_dbus_connected", "", snapshot.dbusConnected ? 1 : 0);
  return out.Take();
}

}  // namespace cozy::agent
