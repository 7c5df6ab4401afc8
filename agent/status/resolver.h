// Resolution of device-plugin device IDs to PCI functions, by the ID's shape alone (DESIGN
// §4.3): never by knowing which plugin sent it. Pure: a HostScan value in, addresses out.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sysfs/host_scan.h"
#include "sysfs/nvidia_procfs.h"
#include "sysfs/pci_address.h"

namespace cozy::agent {

enum class DeviceIdShape {
  kPciAddress,  // "0000:3b:00.0", "3B:00.0", NVML's "00000000:3B:00.0"
  kMdevUuid,    // 8-4-4-4-12 hex: a created mediated device
  kIommuGroup,  // decimal: an IOMMU group number (KubeVirt, NVIDIA kubevirt plugin < v1.5)
  kNvmlGpu,     // "GPU-<uuid>", optionally "::<replica>" (NVIDIA container plugin)
  kNvmlMig,     // "MIG-<uuid>" or legacy "MIG-GPU-<uuid>/<gi>/<ci>", optionally "::<replica>"
  kUnknown,     // anything else: "kvm0", "card0-1", "amdgpu_xcp_3", "", ...
};

std::string_view ToString(DeviceIdShape shape);

// A device ID taken apart by shape. Fields not of the shape keep their defaults.
struct DeviceId {
  DeviceIdShape shape = DeviceIdShape::kUnknown;
  sysfs::PciAddress address;  // kPciAddress
  std::string uuid;           // kMdevUuid: lower case. kNvmlGpu/kNvmlMig: the NVML UUID without
                              // the replica suffix, its hex lower-cased ("GPU-3b6c…")
  uint32_t iommuGroup = 0;    // kIommuGroup
  std::string parentGpuUuid;  // kNvmlMig in the legacy form: "GPU-<uuid>" of its parent
  std::optional<uint32_t> replica;  // kNvmlGpu/kNvmlMig: N of a "::N" time-slicing replica
};

// Never fails: what fits no shape is kUnknown. Decimal numbers are strict (no sign, no
// leading zero, fit in 32 bits) because sysfs names groups that way.
DeviceId ParseDeviceId(std::string_view id);

// "GPU-3B6C…" -> "GPU-3b6c…": the form NVML UUIDs are compared in. Returns "" when the text
// is not GPU-<something>.
std::string NormalizeNvmlGpuUuid(std::string_view uuid);

// NVML GPU UUID (normalised) -> the PCI function NVIDIA's driver reports it on (procfs).
using sysfs::NvmlGpuAddresses;

// Whether a kernel driver name is a VFIO driver: "vfio-pci", "nvgrace-gpu-vfio-pci",
// "vfio_mdev", "nvidia-vgpu-vfio", ... Only such functions hand a group to a VM.
bool IsVfioDriver(std::string_view driver);

enum class ResolutionKind {
  kFunctions,     // names one or more PCI functions (GPU or not)
  kNvmlUnplaced,  // NVML-shaped with no known function: counted under `unplaced`
  kNoMatch,       // a known shape naming nothing here (absent address, index, gone mdev)
  kUnknownShape,
};

struct Resolution {
  ResolutionKind kind = ResolutionKind::kUnknownShape;
  DeviceIdShape shape = DeviceIdShape::kUnknown;
  std::vector<sysfs::PciAddress> functions;  // kFunctions: sorted, unique
};

// Indexes a HostScan once, then resolves any number of IDs against it. Holds a reference to
// the HostScan, which must outlive the resolver; the NVML map is copied (a few entries).
class Resolver {
 public:
  explicit Resolver(const sysfs::HostScan& host, NvmlGpuAddresses nvmlGpus = {});

  // - PCI address: the function, if it exists.
  // - mdev UUID: its parent function (HostScan::mdevParents).
  // - decimal N: IOMMU group N counted only through members bound to a vfio driver (or
  //   NVIDIA VFs with a vGPU type set, VFIO devices of the nvidia driver), so plain indexes
  //   ("0", "1") do not read as groups; or, for an mdev's own group (KubeVirt's mdev plugin
  //   uses it as the ID), the mdev's parent.
  // - NVML: the function of the GPU UUID (or of a legacy MIG ID's parent GPU) when known.
  Resolution Resolve(std::string_view id) const;
  Resolution Resolve(const DeviceId& id) const;

 private:
  const sysfs::HostScan& host_;
  NvmlGpuAddresses nvmlGpus_;
  std::map<uint32_t, sysfs::PciAddress> mdevGroupParents_;
};

}  // namespace cozy::agent
