#include "agent/status/scan_pass.h"

#include <algorithm>
#include <array>
#include <ctime>

#include "agent/status/resource_slice.h"
#include "agent/status/status_builder.h"
#include "api/time.h"

namespace cozy::agent {

std::string Rfc3339(std::chrono::system_clock::time_point time) { return api::FormatTime(time); }

HostReading ReadHost(const sysfs::ScanOptions& scan) {
  HostReading reading;
  reading.scan = sysfs::ScanHost(scan);
  reading.nvidia = sysfs::ReadNvidiaGpuUuids(scan.root);
  return reading;
}

PassResult RunScanPass(const sysfs::ScanOptions& scan, UnitsTracker& units,
                       const PodPhases& podPhases, const PassOptions& options) {
  return BuildPass(ReadHost(scan), units, podPhases, options);
}

PassResult BuildPass(const HostReading& host, UnitsTracker& units, const PodPhases& podPhases,
                     const PassOptions& options) {
  const sysfs::HostScan& scan = host.scan;
  const sysfs::NvidiaGpuUuids& nvidia = host.nvidia;
  PassResult result;
  if (options.sliceNode) result.sliceDevices = SliceDevices(scan, *options.sliceNode);
  result.mdevLinksPending = scan.mdevLinksPending;
  for (const auto& problem : scan.problems) {
    result.problems.push_back(problem.path + ": " + problem.message);
  }
  for (const auto& function : scan.functions) {
    result.problems.insert(result.problems.end(), function.problems.begin(),
                           function.problems.end());
  }
  for (const auto& problem : nvidia.problems) {
    result.problems.push_back(problem.path + ": " + problem.message);
  }
  std::sort(result.problems.begin(), result.problems.end());

  result.units = units.Count(scan, podPhases, nvidia.gpus);
  const std::optional<UnitReport>& report = result.units;

  // Stale counts say so, and since when, once kubelet has been silent for a while: a reader
  // tells them from fresh ones. Only while known: unknown units are absent, not stale.
  if (options.staleAfter && report && units.stale() && units.failingSince() &&
      options.now - *units.failingSince() >= *options.staleAfter) {
    result.stale = StaleUnits{Rfc3339(*units.lastAnswerAt()),
                              std::string(podresources::ToString(units.lastState()))};
  }
  if (options.document) {
    result.status =
        BuildStatus(scan, report ? &*report : nullptr, result.stale ? &*result.stale : nullptr);
  }

  StatusCounts& counts = result.counts;
  counts.gpus = static_cast<int64_t>(scan.Gpus().size());
  counts.unitsKnown = report.has_value();
  counts.unitsStale = units.stale();
  if (report) {
    for (const FunctionUnits& function : report->functions) {
      ++counts.byHealth[std::string(ToString(function.health))];
    }
    counts.ignoredDeviceIds = {{"unknownShape", report->ignored.unknownShape},
                               {"noMatch", report->ignored.noMatch},
                               {"notGpu", report->ignored.notGpu}};
  } else {
    counts.byHealth["Unknown"] = counts.gpus;
  }
  return result;
}

}  // namespace cozy::agent
