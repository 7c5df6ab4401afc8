// GPUClass (cluster-scoped): one offer of the hoster's catalog. Field names are the contract
// the CRD, the webhooks and the binder share.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "api/meta.h"

namespace cozy::api {

enum class GpuMode { kPassthrough, kVgpu };
// What a held device does when its node is cordoned: move if another node has room (Move), or
// keep its node (Stay).
enum class OnCordon { kMove, kStay };

std::string_view ToString(GpuMode mode);
std::string_view ToString(OnCordon onCordon);

struct DevicePluginSource {
  std::string resourceName;  // e.g. nvidia.com/GA100_A100_PCIE_80GB
  bool operator==(const DevicePluginSource&) const = default;
};

// The GPUs gpu-agent publishes in its nodes' ResourceSlices (driver api::kDraDriver) whose PCI
// vendor and device IDs match, delivered through Dynamic Resource Allocation (docs/dra.md).
struct DraSource {
  std::string pciVendorSelector;  // "VVVV:DDDD", hex in any case: KubeVirt's notation
  bool operator==(const DraSource&) const = default;
};

// A union: exactly one member (B5). A dra class has an empty devicePlugin.
struct GpuClassSource {
  DevicePluginSource devicePlugin;
  std::optional<DraSource> dra;
  bool operator==(const GpuClassSource&) const = default;
};

struct GpuClassSpec {
  std::string vendor;
  std::string model;
  GpuMode mode = GpuMode::kPassthrough;
  std::optional<std::string> profile;  // vGPU profile, e.g. "A100-40C"
  std::optional<std::string> memory;   // a quantity, e.g. "80Gi"
  // Unset is resolved by the model (ResolveMaxCount): the CRD has no default because the
  // default depends on the mode.
  std::optional<int64_t> maxCount;
  GpuClassSource source;
  std::optional<LabelSelector> nodeSelector;
  OnCordon onCordon = OnCordon::kMove;  // the CRD's default
  // Taints of the nodes this class's GPUs sit on that its launchers tolerate (docs/install.md, "GPU
  // nodes behind a taint"): the binder places the class's orders on nodes these tolerate, and the
  // pod webhook adds them to every launcher it pins, so a tainted GPU pool takes orders and starts
  // VMs.
  std::vector<Toleration> tolerations;
  bool operator==(const GpuClassSpec&) const = default;
};

struct GpuClass {
  ObjectMeta metadata;
  GpuClassSpec spec;

  // The device plugin's resource name; empty for a dra class.
  const std::string& ResourceName() const { return spec.source.devicePlugin.resourceName; }
  bool IsDra() const { return spec.source.dra.has_value(); }
  // What the model counts the class's units under (and names in its reasons): the resource
  // name, or for a dra class "DRA GPUs vvvv:dddd" (lower case), which no pod can request (a
  // resource name has no blank), shared by the dra classes of one PCI ID.
  std::string UnitsName() const;
  bool operator==(const GpuClass&) const = default;
};

// The name the model counts the units of dra classes of that PCI ID under ("VVVV:DDDD", any
// case): "DRA GPUs vvvv:dddd".
std::string DraUnitsName(std::string_view pciVendorSelector);

// Decodes and checks what the CRD checks (name, enums, the source union, the resource name,
// maxCount >= 1, memory a quantity). Throws DecodeError naming the field.
GpuClass GpuClassFromJson(const nlohmann::json& object);
nlohmann::json ToJson(const GpuClass& gpuClass);

}  // namespace cozy::api
