// The names of the catalog's Dynamic Resource Allocation driver (the GPUClass source member
// `dra`, docs/dra.md): what gpu-agent publishes in its node's ResourceSlice and what the
// controller's DeviceClass and claims select on. Defined once, for both programs and the chart.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace cozy::api {

// The driver name of every ResourceSlice the agent publishes and of its kubelet plugin; also the
// domain of the driver's own device attributes (`gpu.cozystack.io/id`, ...).
inline constexpr std::string_view kDraDriver = "gpu.cozystack.io";
inline constexpr std::string_view kResourceGroup = "resource.k8s.io";
inline constexpr std::string_view kResourceVersion = "v1";
inline constexpr std::string_view kResourceSlicePlural = "resourceslices";

// The device taint on every published device: only the claims the binder writes tolerate it, so
// nothing but the catalog can allocate a catalog GPU (docs/dra.md, "Only the catalog allocates").
inline constexpr std::string_view kCatalogTaintKey = "gpu.cozystack.io/catalog";
inline constexpr std::string_view kCatalogTaintEffect = "NoSchedule";

// The attribute that names a device across the cluster ("<node>/<PCI address>"): a PCI address
// is unique on one node only, and a claim's selector must pin exactly one device.
inline constexpr std::string_view kDraIdAttribute = "id";
// The standard attribute with the function's PCI address, and the driver's own vendor and device
// IDs (4 lower-case hex digits): what a dra class's pciVendorSelector is matched against.
inline constexpr std::string_view kPciBusIdAttribute = "resource.kubernetes.io/pciBusID";
inline constexpr std::string_view kVendorIdAttribute = "vendorID";
inline constexpr std::string_view kDeviceIdAttribute = "deviceID";
inline constexpr std::string_view kResourceClaimPlural = "resourceclaims";
inline constexpr std::string_view kDeviceClassPlural = "deviceclasses";

// The DeviceClass gpu-controller keeps for each dra GPUClass (docs/dra.md, "The DeviceClass"):
// named "<class>.gpu.cozystack.io", labelled with its class's name, which the controller's watch
// selects its own by.
inline constexpr std::string_view kDeviceClassSuffix = ".gpu.cozystack.io";
inline constexpr std::string_view kDeviceClassClassLabel = "gpu.cozystack.io/class";

// The ResourceClaim gpu-controller writes for each Bound GPUDevice of a dra class (docs/dra.md,
// "The claims"): named as the device, in its namespace, owned by it, and marked with this label
// (a constant value: a device's name can exceed what a label value holds). It has one request per
// GPU, "gpu-0", "gpu-1", ...: KubeVirt gives a VM one device per `gpus` entry, and each entry
// names one request, which must have allocated exactly one device.
inline constexpr std::string_view kDraClaimLabel = "gpu.cozystack.io/device-claim";
inline constexpr std::string_view kDraClaimLabelValue = "true";
inline constexpr std::string_view kDraClaimRequestPrefix = "gpu-";
// The claim's request of GPU `index` (0-based): "gpu-<index>".
inline std::string DraClaimRequestName(int64_t index) {
  return std::string(kDraClaimRequestPrefix) + std::to_string(index);
}

}  // namespace cozy::api
