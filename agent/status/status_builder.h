// Turns a HostScan (and, once known, the device plugins' units) into the GPUNode object the
// agent publishes: pure, so `scan` and `run` produce the same value.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "agent/status/units.h"
#include "sysfs/host_scan.h"

namespace cozy::agent {

// `status.staleUnits`: kubelet has failed for a while and the counts are from its last answer.
struct StaleUnits {
  std::string since;    // RFC 3339, that answer's time
  std::string kubelet;  // the state kubelet is in now
  bool operator==(const StaleUnits&) const = default;
};

// One GPUNode `status.devices[]` entry per GPU function, sorted by PCI address, and the
// status-level `resourceNames` and `unplaced`. Without `units` (kubelet has not answered) the
// fields that depend on pod-resources (resourceNames, unplaced, and each device's resources,
// allocatable, allocated, health) are left out: unknown is not zero.
nlohmann::json BuildDeviceStatus(const sysfs::PciFunction& function,
                                 const FunctionUnits* units = nullptr);
nlohmann::json BuildStatus(const sysfs::HostScan& scan, const UnitReport* units = nullptr,
                           const StaleUnits* stale = nullptr);

// The whole object as `scan` prints it: apiVersion, kind, metadata.name, status.
nlohmann::json BuildGpuNode(const std::string& nodeName, nlohmann::json status);

// BuildGpuNode(nodeName, BuildStatus(scan, units, stale)) as its dump(2) prints it, and a
// newline, written as it is read without building the document (`scan -o json`).
std::string RenderGpuNodeJson(const std::string& nodeName, const sysfs::HostScan& scan,
                              const UnitReport* units = nullptr, const StaleUnits* stale = nullptr);
// The same text handed to `write` in pieces of about 64 KiB as it is written (`scan -o json`):
// one buffer's pages instead of the whole document's. A throw mid-way (invalid UTF-8 in a
// name, as dump() throws) leaves the pieces already written.
void PrintGpuNodeJson(const std::function<void(std::string_view)>& write,
                      const std::string& nodeName, const sysfs::HostScan& scan,
                      const UnitReport* units = nullptr, const StaleUnits* stale = nullptr);

}  // namespace cozy::agent
