#include "agent/metrics.h"

namespace cozy::agent {

using runtime::Label;

std::string RenderMetrics(const MetricsSnapshot& snapshot) {
  runtime::MetricsWriter out;
  out.Family("gpu_agent_info", "gauge", "Build information of the running gpu-agent.");
  out.Sample("gpu_agent_info", Label("version", snapshot.version), 1);

  out.Family("gpu_agent_scans_total", "counter", "Discovery passes over sysfs.");
  out.Sample("gpu_agent_scans_total", "", static_cast<double>(snapshot.scans));

  out.Family("gpu_agent_scan_duration_seconds", "histogram",
             "Time one discovery pass took, sysfs and unit counting included.");
  snapshot.scanDuration.Write(out, "gpu_agent_scan_duration_seconds");

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

  out.Family("gpu_agent_publishes_total", "counter",
             "GPUNode publish attempts, by result: written (the object changed), unchanged "
             "(nothing to write), failed, waited (postponed by the client-side rate limit).");
  for (const auto& [result, count] : snapshot.publishes) {
    out.Sample("gpu_agent_publishes_total", Label("result", result), static_cast<double>(count));
  }
  out.Family("gpu_agent_loop_callback_failures_total", "counter",
             "Event-loop callbacks that threw; each is logged and the loop goes on.");
  out.Sample("gpu_agent_loop_callback_failures_total", "",
             static_cast<double>(snapshot.callbackFailures));

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
  out.Family("gpu_agent_http_requests_total", "counter",
             "Requests to this health and metrics server, by outcome: answered, rejected "
             "(wrong method, too large, malformed), timedOut (too slow), overflowed (closed past "
             "the connection cap).");
  for (const auto& [outcome, count] : snapshot.httpConnections) {
    out.Sample("gpu_agent_http_requests_total", Label("outcome", outcome),
               static_cast<double>(count));
  }
  return out.Take();
}

}  // namespace cozy::agent
