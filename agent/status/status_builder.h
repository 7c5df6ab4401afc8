// Turns a HostScan (and, once known, the device plugins' units) into the GPUNode object the
// agent publishes: pure, so `scan` and `run` produce the same value.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "agent/status/units.h"
#include "sysfs/host_scan.h"

namespace cozy::agent {

// One GPUNode `status.devices[]` entry per GPU function, sorted by PCI address, and the
// status-level `resourceNames` and `unplaced`. Without `units` (kubelet has not answered) the
// fields that depend on pod-resources (resourceNames, unplaced, and each device's resources,
// allocatable, allocated, health) are left out: unknown is not zero.
nlohmann::json BuildDeviceStatus(const sysfs::PciFunction& function,
                                 const FunctionUnits* units = nullptr);
nlohmann::json BuildStatus(const sysfs::HostScan& scan, const UnitReport* units = nullptr);

// The whole object as `scan -o json` prints it: apiVersion, kind, metadata.name, status.
nlohmann::json BuildGpuNode(const std::string& nodeName, const nlohmann::json& status);

}  // namespace cozy::agent
