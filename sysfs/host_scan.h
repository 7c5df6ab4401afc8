// The agent's view of a node's PCI functions read from a sysfs root: a plain value that the
// resolver, the status builder and the CLI consume without further I/O.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sysfs/pci_address.h"

namespace cozy::sysfs {

// One mdev type offered by a parent (`mdev_supported_types/<type>`).
struct MdevType {
  std::string type;  // directory name, e.g. "nvidia-231"
  std::string name;  // `name` file, e.g. "GRID T4-2Q"; empty when unreadable
  std::optional<int64_t> availableInstances;
  std::optional<int64_t> maxInstances;  // `max_instance=` of `description`, when present
  std::string deviceApi;
};

// One created mediated device (`sys/bus/mdev/devices/<uuid>`).
struct Mdev {
  std::string uuid;                    // lower case
  std::optional<std::string> type;     // basename of `mdev_type`; absent until the link exists
  std::optional<uint32_t> iommuGroup;  // the mdev's own group
  std::optional<std::string> driver;
};

// NVIDIA's per-VF vendor-specific VFIO files (`<VF>/nvidia/`, kernel 6.8+).
struct VgpuTypeEntry {
  std::string id;    // numeric type id as text, e.g. "1561"
  std::string name;  // e.g. "NVIDIA L40S-4Q"
};
struct NvidiaVgpu {
  std::optional<std::string> currentType;  // absent while current_vgpu_type reads 0
  std::vector<VgpuTypeEntry> creatableTypes;
};

struct SriovInfo {
  uint32_t totalVfs = 0;
  uint32_t numVfs = 0;
};

struct PciFunction {
  PciAddress address;
  uint16_t vendorId = 0;
  uint16_t deviceId = 0;
  std::optional<uint16_t> subsystemVendorId;
  std::optional<uint16_t> subsystemDeviceId;
  uint32_t classCode = 0;  // 24 bits: base class, subclass, prog-if
  std::string vendorName;  // from pci.ids; empty when unknown (never guessed)
  std::string deviceName;
  std::optional<std::string> driver;           // basename of the `driver` link
  std::optional<uint32_t> iommuGroup;          // basename of the `iommu_group` link
  std::optional<int32_t> numaNode;             // absent when the kernel says -1 or has no NUMA
  std::optional<PciAddress> physicalFunction;  // VFs only
  std::optional<SriovInfo> sriov;              // SR-IOV capable PFs only
  std::vector<MdevType> mdevTypes;             // sorted by type
  std::vector<Mdev> mdevs;                     // sorted by uuid
  std::optional<NvidiaVgpu> vgpu;
  bool isGpu = false;
  // Whether every other function of the IOMMU group is on a vfio driver, pci-stub or no driver
  // (bridges aside). Absent without a group. Computed for GPU functions.
  std::optional<bool> iommuGroupViable;
  std::string sysfsPath;              // the function's directory under the root (real path)
  std::vector<std::string> problems;  // what could not be read, each naming file and reason

  bool IsBridge() const { return (classCode >> 8) == 0x0604; }
};

// A problem that concerns the scan rather than one readable function: an entry of
// `sys/bus/pci/devices` that is not an address, a function whose identity cannot be read, ...
struct ScanProblem {
  std::string path;     // relative to the root
  std::string message;  // one line, for people
};

struct HostScan {
  std::string root;                    // the sysfs root that was scanned
  std::vector<PciFunction> functions;  // every readable PCI function, sorted by address
  std::vector<ScanProblem> problems;   // functions left out and why
  // IOMMU group -> member functions (from each function's `iommu_group` link), sorted.
  std::map<uint32_t, std::vector<PciAddress>> iommuGroups;
  // Created mdevs by uuid (lower case) -> parent function.
  std::map<std::string, PciAddress> mdevParents;
  // True when any mdev was found without its `mdev_type` link (it appears after `bind`): the
  // daemon retries shortly.
  bool mdevLinksPending = false;

  const PciFunction* Find(const PciAddress& address) const;
  std::vector<const PciFunction*> Gpus() const;
};

}  // namespace cozy::sysfs
