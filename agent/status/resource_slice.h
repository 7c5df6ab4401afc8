// The node's GPUs as Dynamic Resource Allocation devices (docs/dra.md): the devices of the
// ResourceSlice gpu-agent publishes for driver gpu.cozystack.io when `--resource-slices` is on.
// Pure over a scan, like the GPUNode status, so `scan` and `run` build the same devices.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "sysfs/host_scan.h"

namespace cozy::agent {

// "0000:3b:00.0" -> "pci-0000-3b-00-0": a device name is a DNS label.
std::string SliceDeviceName(const sysfs::PciAddress& address);

// The PCIe root complex of a function as Kubernetes' standard attribute
// resource.kubernetes.io/pcieRoot spells it ("pci0000:3a"), from the function's real sysfs path
// (.../sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0). nullopt when the path names none (a
// function behind no root complex, such as a VMD domain's, or an unreadable link).
std::optional<std::string> PcieRoot(std::string_view sysfsPath);

// The devices the slice offers, sorted by name: one per GPU function bound to a vfio driver, the
// functions a passthrough class may sell (PFs and VFs). Each carries the standard attributes
// resource.kubernetes.io/pciBusID and pcieRoot, the driver's own id ("<node>/<PCI address>"),
// vendorID, deviceID, model (pci.ids, when known and at most 64 bytes), numaNode, iommuGroup,
// iommuGroupViable and physicalFunction (VFs) when known, and the catalog's NoSchedule taint.
nlohmann::json SliceDevices(const sysfs::HostScan& scan, std::string_view nodeName);

// The whole ResourceSlice object for `devices`: named after the node (SliceName), on the node,
// pool = node name at `generation`, one slice in the pool, owned by the Node (uid `nodeUid`).
nlohmann::json ResourceSliceObject(std::string_view nodeName, std::string_view nodeUid,
                                   const nlohmann::json& devices, int64_t generation);
std::string SliceName(std::string_view nodeName);

// What of a slice's devices the agent decides, for comparing what the server holds with what
// the agent would write: the server adds a taint's timeAdded, which the agent never sends.
nlohmann::json ComparableDevices(const nlohmann::json& devices);

}  // namespace cozy::agent
