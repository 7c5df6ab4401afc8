// Turns a HostScan (and, once known, the device plugins' units) into the GPUNode object the
// agent publishes: pure, so `scan` and `run` produce the same value.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "sysfs/host_scan.h"

namespace cozy::agent {

// One GPUNode `status.devices[]` entry per GPU function, sorted by PCI address. Fields that
// depend on pod-resources (resources, allocatable, allocated, health) are left out here:
// unknown is not zero.
nlohmann::json BuildDeviceStatus(const sysfs::PciFunction& function);
nlohmann::json BuildStatus(const sysfs::HostScan& scan);

// The whole object as `scan -o json` prints it: apiVersion, kind, metadata.name, status.
nlohmann::json BuildGpuNode(const std::string& nodeName, const nlohmann::json& status);

}  // namespace cozy::agent
