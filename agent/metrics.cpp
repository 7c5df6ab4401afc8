#include "agent/metrics.h"

namespace cozy::agent {

namespace {

// A family by label whose samples are a map's entries; its HELP and TYPE show while it is empty.
void SetEach(runtime::MetricsScrape& scrape, runtime::MetricFamily& family,
             const std::map<std::string, int64_t>& counts) {
  scrape.Show(family);
  for (const auto& [label, count] : counts) {
    scrape.Set(family, {label}, static_cast<double>(count));
  }
}

}  // namespace

AgentMetrics::AgentMetrics(runtime::MetricsRegistry& registry)
    : info_(registry.Gauge("gpu_agent_info", "Build information of the running gpu-agent.",
                           {"version"})),
      scans_(registry.Counter("gpu_agent_scans_total", "Discovery passes over sysfs.")),
      scanDuration_(registry.HistogramFamily(
          "gpu_agent_scan_duration_seconds",
          "Time one discovery pass took, sysfs and unit counting included.",
          {kScanDurationBuckets.begin(), kScanDurationBuckets.end()})),
      deviceEvents_(registry.Counter("gpu_agent_device_events_total",
                                     "Kernel or udev device events received (pci, mdev, vfio).")),
      deviceRescans_(registry.Counter("gpu_agent_device_rescans_total",
                                      "Rescans that device events asked for, after debouncing.")),
      podResourcesFetches_(registry.Counter("gpu_agent_pod_resources_fetches_total",
                                            "Reads of kubelet's pod-resources API, by result.",
                                            {"result"})),
      unitsKnown_(registry.Gauge("gpu_agent_units_known",
                                 "1 once kubelet has answered: units are known (possibly stale).")),
      unitsStale_(registry.Gauge("gpu_agent_units_stale",
                                 "1 while kubelet cannot answer and the last counts are kept.")),
      publishes_(registry.Counter(
          "gpu_agent_publishes_total",
          "GPUNode publish attempts, by result: written (the object changed), unchanged "
          "(nothing to write), failed, waited (postponed by the client-side rate limit).",
          {"result"})),
      slicePublishes_(
          registry.Counter("gpu_agent_resourceslice_publishes_total",
                           "ResourceSlice publish attempts (--resource-slices), by result, as "
                           "gpu_agent_publishes_total.",
                           {"result"})),
      draClaims_(registry.Counter(
          "gpu_agent_dra_claims_total",
          "Claims kubelet asked the DRA plugin to prepare or unprepare (--resource-slices), by "
          "result: prepared, prepareFailed, unprepared, unprepareFailed.",
          {"result"})),
      callbackFailures_(registry.Counter(
          "gpu_agent_loop_callback_failures_total",
          "Event-loop callbacks that threw; each is logged and the loop goes on.")),
      devices_(registry.Gauge("gpu_agent_devices", "GPU functions of this node, by health.",
                              {"health"})),
      resolverMisses_(registry.Gauge("gpu_agent_resolver_misses",
                                     "Device-plugin IDs that name no GPU function now, by reason.",
                                     {"reason"})),
      sysfsProblems_(
          registry.Gauge("gpu_agent_sysfs_problems",
                         "Files the last scan could not read or parse (each logged once).")),
      dbusConnected_(registry.Gauge(
          "gpu_agent_dbus_connected",
          "1 while the agent owns io.cozystack.GPUAgent1 on its bus (--dbus), else 0.")),
      httpRequests_(registry.Counter(
          "gpu_agent_http_requests_total",
          "Requests to this health and metrics server, by outcome: answered, rejected "
          "(wrong method, too large, malformed), timedOut (too slow), overflowed (closed past "
          "the connection cap).",
          {"outcome"})) {}

void AgentMetrics::Collect(runtime::MetricsScrape& scrape, const MetricsSnapshot& snapshot) {
  scrape.Set(info_, {snapshot.version}, 1);
  scrape.Set(scans_, static_cast<double>(snapshot.scans));
  scrape.SetHistogram(scanDuration_, snapshot.scanDuration);
  scrape.Set(deviceEvents_, static_cast<double>(snapshot.deviceEvents));
  scrape.Set(deviceRescans_, static_cast<double>(snapshot.deviceRescans));
  SetEach(scrape, podResourcesFetches_, snapshot.podResourcesResults);
  scrape.Set(unitsKnown_, snapshot.unitsKnown ? 1 : 0);
  scrape.Set(unitsStale_, snapshot.podResourcesStale ? 1 : 0);
  SetEach(scrape, publishes_, snapshot.publishes);
  SetEach(scrape, slicePublishes_, snapshot.slicePublishes);
  SetEach(scrape, draClaims_, snapshot.draClaims);
  scrape.Set(callbackFailures_, static_cast<double>(snapshot.callbackFailures));
  SetEach(scrape, devices_, snapshot.devicesByHealth);
  SetEach(scrape, resolverMisses_, snapshot.ignoredDeviceIds);
  scrape.Set(sysfsProblems_, static_cast<double>(snapshot.sysfsProblems));
  scrape.Set(dbusConnected_, snapshot.dbusConnected ? 1 : 0);
  SetEach(scrape, httpRequests_, snapshot.httpConnections);
}

std::string RenderMetrics(const MetricsSnapshot& snapshot) {
  runtime::MetricsRegistry registry;
  AgentMetrics metrics(registry);
  registry.AddCollector([&](runtime::MetricsScrape& scrape) { metrics.Collect(scrape, snapshot); });
  return registry.Render();
}

}  // namespace cozy::agent
