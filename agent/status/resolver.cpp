#include "agent/status/resolver.h"

#include <algorithm>
#include <utility>

#include "sysfs/attributes.h"
#include "sysfs/nvidia_procfs.h"

namespace cozy::agent {
namespace {

// Strict decimal as sysfs prints numbers: no sign, no leading zero, fits in 32 bits.
std::optional<uint32_t> ParseDecimal(std::string_view text) {
  if (text.empty() || text.size() > 10 || (text.size() > 1 && text[0] == '0')) {
    return std::nullopt;
  }
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') {
      return std::nullopt;
    }
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  if (value > UINT32_MAX) {
    return std::nullopt;
  }
  return static_cast<uint32_t>(value);
}

DeviceId ParseNvml(std::string_view id) {
  DeviceId parsed;
  // Replicas are "<uuid>::<n>", split on the first "::" as the NVIDIA plugin does.
  const size_t separator = id.find("::");
  std::string_view base = id.substr(0, separator);
  if (separator != std::string_view::npos) {
    const auto replica = ParseDecimal(id.substr(separator + 2));
    if (!replica) {
      return parsed;
    }
    parsed.replica = replica;
  }
  if (base.starts_with("GPU-")) {
    if (!sysfs::IsNvmlUuidBody(base.substr(4))) {
      return DeviceId{};
    }
    parsed.shape = DeviceIdShape::kNvmlGpu;
    parsed.uuid = "GPU-" + sysfs::ToLower(base.substr(4));
    return parsed;
  }
  if (base.starts_with("MIG-GPU-")) {
    // Legacy MIG form of old drivers: MIG-GPU-<gpu uuid>/<gi>/<ci>; it names its parent.
    const std::string_view rest = base.substr(8);
    const size_t slash = rest.find('/');
    if (slash == std::string_view::npos || !sysfs::IsNvmlUuidBody(rest.substr(0, slash))) {
      return DeviceId{};
    }
    const std::string_view instances = rest.substr(slash + 1);
    const size_t secondSlash = instances.find('/');
    if (secondSlash == std::string_view::npos || !ParseDecimal(instances.substr(0, secondSlash)) ||
        !ParseDecimal(instances.substr(secondSlash + 1))) {
      return DeviceId{};
    }
    parsed.shape = DeviceIdShape::kNvmlMig;
    parsed.parentGpuUuid = "GPU-" + sysfs::ToLower(rest.substr(0, slash));
    parsed.uuid = "MIG-" + parsed.parentGpuUuid + std::string(rest.substr(slash));
    return parsed;
  }
  if (base.starts_with("MIG-")) {
    if (!sysfs::IsNvmlUuidBody(base.substr(4))) {
      return DeviceId{};
    }
    parsed.shape = DeviceIdShape::kNvmlMig;
    parsed.uuid = "MIG-" + sysfs::ToLower(base.substr(4));
    return parsed;
  }
  return DeviceId{};
}

// Whether a group member is one a VM can be given, which is what a group-number ID means:
// bound to a VFIO driver, or an NVIDIA SR-IOV VF with a vGPU type set, which on kernel 6.8+
// is a VFIO device served by the nvidia driver itself (KubeVirt's PCI plugin takes exactly
// these two). A GPU on the nvidia or amdgpu driver is not: its group number is no device ID.
bool HandsGroupToVm(const sysfs::PciFunction& function) {
  if (function.driver && IsVfioDriver(*function.driver)) {
    return true;
  }
  return function.physicalFunction && function.vgpu && function.vgpu->currentType;
}

}  // namespace

std::string_view ToString(DeviceIdShape shape) {
  switch (shape) {
    case DeviceIdShape::kPciAddress:
      return "pciAddress";
    case DeviceIdShape::kMdevUuid:
      return "mdevUuid";
    case DeviceIdShape::kIommuGroup:
      return "iommuGroup";
    case DeviceIdShape::kNvmlGpu:
      return "nvmlGpu";
    case DeviceIdShape::kNvmlMig:
      return "nvmlMig";
    case DeviceIdShape::kUnknown:
      return "unknown";
  }
  return "unknown";
}

DeviceId ParseDeviceId(std::string_view id) {
  DeviceId parsed;
  if (const auto group = ParseDecimal(id)) {
    parsed.shape = DeviceIdShape::kIommuGroup;
    parsed.iommuGroup = *group;
    return parsed;
  }
  if (sysfs::IsMdevUuid(id)) {
    parsed.shape = DeviceIdShape::kMdevUuid;
    parsed.uuid = sysfs::ToLower(id);
    return parsed;
  }
  if (id.starts_with("GPU-") || id.starts_with("MIG-")) {
    return ParseNvml(id);
  }
  if (const auto address = sysfs::ParsePciAddress(id)) {
    parsed.shape = DeviceIdShape::kPciAddress;
    parsed.address = *address;
    return parsed;
  }
  return parsed;
}

std::string NormalizeNvmlGpuUuid(std::string_view uuid) {
  const DeviceId parsed = ParseDeviceId(uuid);
  if (parsed.shape != DeviceIdShape::kNvmlGpu || parsed.replica) {
    return {};
  }
  return parsed.uuid;
}

bool IsVfioDriver(std::string_view driver) { return driver.find("vfio") != std::string_view::npos; }

Resolver::Resolver(const sysfs::HostScan& host, NvmlGpuAddresses nvmlGpus)
    : host_(host), nvmlGpus_(std::move(nvmlGpus)) {
  for (const auto& function : host_.functions) {
    for (const auto& mdev : function.mdevs) {
      // An mdev gets its own IOMMU group only from a VFIO mdev driver (vfio_mdev,
      // nvidia-vgpu-vfio); a driver name that says otherwise does not hand it to a VM.
      if (mdev.iommuGroup && (!mdev.driver || IsVfioDriver(*mdev.driver))) {
        mdevGroupParents_.emplace(*mdev.iommuGroup, function.address);
      }
    }
  }
}

Resolution Resolver::Resolve(std::string_view id) const { return Resolve(ParseDeviceId(id)); }

Resolution Resolver::Resolve(const DeviceId& id) const {
  Resolution resolution;
  resolution.shape = id.shape;
  resolution.kind = ResolutionKind::kNoMatch;
  auto place = [&resolution](const sysfs::PciAddress& address) {
    resolution.kind = ResolutionKind::kFunctions;
    resolution.functions.push_back(address);
  };
  switch (id.shape) {
    case DeviceIdShape::kPciAddress:
      if (host_.Find(id.address) != nullptr) {
        place(id.address);
      }
      break;
    case DeviceIdShape::kMdevUuid:
      if (const auto it = host_.mdevParents.find(id.uuid); it != host_.mdevParents.end()) {
        place(it->second);
      }
      break;
    case DeviceIdShape::kIommuGroup:
      if (const auto it = host_.iommuGroups.find(id.iommuGroup); it != host_.iommuGroups.end()) {
        for (const auto& member : it->second) {
          const sysfs::PciFunction* function = host_.Find(member);
          if (function != nullptr && HandsGroupToVm(*function)) {
            place(member);
          }
        }
      }
      if (const auto it = mdevGroupParents_.find(id.iommuGroup); it != mdevGroupParents_.end()) {
        place(it->second);
      }
      std::sort(resolution.functions.begin(), resolution.functions.end());
      resolution.functions.erase(
          std::unique(resolution.functions.begin(), resolution.functions.end()),
          resolution.functions.end());
      break;
    case DeviceIdShape::kNvmlGpu:
    case DeviceIdShape::kNvmlMig: {
      const std::string& gpu = id.shape == DeviceIdShape::kNvmlGpu ? id.uuid : id.parentGpuUuid;
      const auto it = gpu.empty() ? nvmlGpus_.end() : nvmlGpus_.find(gpu);
      if (it != nvmlGpus_.end()) {
        place(it->second);
      } else {
        resolution.kind = ResolutionKind::kNvmlUnplaced;
      }
      break;
    }
    case DeviceIdShape::kUnknown:
      resolution.kind = ResolutionKind::kUnknownShape;
      break;
  }
  return resolution;
}

}  // namespace cozy::agent
