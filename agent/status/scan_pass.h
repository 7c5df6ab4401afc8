// One discovery pass, written once for `gpu-agent scan` and `gpu-agent run`: read the host
// (sysfs and NVIDIA's procfs), count units from what kubelet last said, and build the GPUNode
// status with its typed counts. Pure apart from reading the host: the daemon decides what to do
// with the result (log, publish, retry), the scan command prints it.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/status/pod_phases.h"
#include "agent/status/status_builder.h"
#include "agent/status/units_tracker.h"
#include "sysfs/host_scan.h"
#include "sysfs/nvidia_procfs.h"
#include "sysfs/scanner.h"

namespace cozy::agent {

// The status as numbers, for logs, sd_notify and metrics: never read back from the JSON.
struct StatusCounts {
  int64_t gpus = 0;
  bool unitsKnown = false;
  bool unitsStale = false;  // kubelet failed since its last answer: counts are that answer's
  // Healthy, Unhealthy, Unadvertised; every function is Unknown while units are unknown.
  std::map<std::string, int64_t> byHealth{
      {"Healthy", 0}, {"Unhealthy", 0}, {"Unadvertised", 0}, {"Unknown", 0}};
  // unknownShape, noMatch, notGpu: device-plugin IDs that name no GPU function now.
  std::map<std::string, int64_t> ignoredDeviceIds;
  bool operator==(const StatusCounts&) const = default;
};

struct PassOptions {
  // Past this much time without an answer from kubelet, the status carries `staleUnits` (since
  // when its counts are). Unset: never (a one-shot scan).
  std::optional<std::chrono::milliseconds> staleAfter;
  std::chrono::system_clock::time_point now = std::chrono::system_clock::now();
  // Build `status` as a document. A one-shot scan that prints JSON leaves it out and prints
  // from `units` and `stale` (RenderGpuNodeJson) instead.
  bool document = true;
  // Also build the devices of this node's ResourceSlice (`--resource-slices`, docs/dra.md).
  std::optional<std::string> sliceNode;
};

struct PassResult {
  nlohmann::json status;  // the GPUNode status, as published and printed; null without `document`
  std::optional<UnitReport> units;  // what the status counts; absent while unknown
  std::optional<StaleUnits> stale;
  StatusCounts counts;
  // What could not be read, one line each naming the file and the reason, sorted.
  std::vector<std::string> problems;
  // An mdev without its type link (it appears after `bind`): worth looking again shortly.
  bool mdevLinksPending = false;
  // With PassOptions::sliceNode: the ResourceSlice's devices (SliceDevices); else null.
  nlohmann::json sliceDevices;
};

// What the host says: sysfs and NVIDIA's procfs. Throws sysfs::RootError when the root holds
// no sysfs at all.
struct HostReading {
  sysfs::HostScan scan;
  sysfs::NvidiaGpuUuids nvidia;
};
HostReading ReadHost(const sysfs::ScanOptions& scan);

// The pass over a reading: units counted, status built.
PassResult BuildPass(const HostReading& host, UnitsTracker& units, const PodPhases& podPhases,
                     const PassOptions& options = {});

// ReadHost, then BuildPass. Throws sysfs::RootError as ReadHost.
PassResult RunScanPass(const sysfs::ScanOptions& scan, UnitsTracker& units,
                       const PodPhases& podPhases, const PassOptions& options = {});

// "2026-12-01T13:42:01Z": RFC 3339 in UTC, whole seconds, as Kubernetes writes times.
std::string Rfc3339(std::chrono::system_clock::time_point time);

}  // namespace cozy::agent
