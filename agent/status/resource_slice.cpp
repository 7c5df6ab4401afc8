#include "agent/status/resource_slice.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <regex>

#include "api/dra.h"

namespace cozy::agent {
using nlohmann::json;

namespace {

// DRA caps a string attribute at 64 bytes (resource.k8s.io/v1 DeviceAttribute).
constexpr size_t kMaxStringAttribute = 64;

std::string Hex4(uint16_t value) {
  char text[5];
  std::snprintf(text, sizeof text, "%04x", value);
  return text;
}

// Passthrough functions: on a vfio driver (vfio-pci or a vendor's variant), and not NVIDIA's
// vendor vGPU VFs, which need a vGPU type chosen first (a later step, docs/dra.md).
bool Passthrough(const sysfs::PciFunction& function) {
  return function.driver && function.driver->find("vfio") != std::string::npos && !function.vgpu;
}

json StringAttribute(std::string value) { return {{"string", std::move(value)}}; }
json IntAttribute(int64_t value) { return {{"int", value}}; }

}  // namespace

std::string SliceDeviceName(const sysfs::PciAddress& address) {
  std::string name = "pci-" + address.ToString();
  std::replace_if(
      name.begin(), name.end(), [](char c) { return c == ':' || c == '.'; }, '-');
  return name;
}

std::optional<std::string> PcieRoot(std::string_view sysfsPath) {
  static const std::regex root("/sys/devices/(pci[0-9a-f]{4}:[0-9a-f]{2})/");
  std::match_results<std::string_view::const_iterator> match;
  if (!std::regex_search(sysfsPath.begin(), sysfsPath.end(), match, root)) {
    return std::nullopt;
  }
  return match[1].str();
}

json SliceDevices(const sysfs::HostScan& scan, std::string_view nodeName) {
  json devices = json::array();
  for (const sysfs::PciFunction* function : scan.Gpus()) {
    if (!Passthrough(*function)) continue;
    const std::string address = function->address.ToString();
    json attributes = {
        {std::string(api::kPciBusIdAttribute), StringAttribute(address)},
        {std::string(api::kDraIdAttribute), StringAttribute(std::string(nodeName) + "/" + address)},
        {std::string(api::kVendorIdAttribute), StringAttribute(Hex4(function->vendorId))},
        {std::string(api::kDeviceIdAttribute), StringAttribute(Hex4(function->deviceId))},
    };
    if (auto root = PcieRoot(function->sysfsPath)) {
      attributes["resource.kubernetes.io/pcieRoot"] = StringAttribute(*root);
    }
    if (!function->deviceName.empty() && function->deviceName.size() <= kMaxStringAttribute) {
      attributes["model"] = StringAttribute(function->deviceName);
    }
    if (function->numaNode) attributes["numaNode"] = IntAttribute(*function->numaNode);
    if (function->iommuGroup) attributes["iommuGroup"] = IntAttribute(*function->iommuGroup);
    if (function->iommuGroupViable) {
      attributes["iommuGroupViable"] = {{"bool", *function->iommuGroupViable}};
    }
    if (function->physicalFunction) {
      attributes["physicalFunction"] = StringAttribute(function->physicalFunction->ToString());
    }
    devices.push_back(
        {{"name", SliceDeviceName(function->address)},
         {"attributes", std::move(attributes)},
         {"taints", json::array({{{"key", std::string(api::kCatalogTaintKey)},
                                  {"effect", std::string(api::kCatalogTaintEffect)}}})}});
  }
  std::sort(devices.begin(), devices.end(),
            [](const json& a, const json& b) { return a["name"] < b["name"]; });
  return devices;
}

std::string SliceName(std::string_view nodeName) {
  return std::string(nodeName) + "-" + std::string(api::kDraDriver);
}

json ResourceSliceObject(std::string_view nodeName, std::string_view nodeUid, const json& devices,
                         int64_t generation) {
  return {
      {"apiVersion", std::string(api::kResourceGroup) + "/" + std::string(api::kResourceVersion)},
      {"kind", "ResourceSlice"},
      {"metadata",
       {{"name", SliceName(nodeName)},
        {"ownerReferences", json::array({{{"apiVersion", "v1"},
                                          {"kind", "Node"},
                                          {"name", std::string(nodeName)},
                                          {"uid", std::string(nodeUid)},
                                          {"controller", true}}})}}},
      {"spec",
       {{"driver", std::string(api::kDraDriver)},
        {"nodeName", std::string(nodeName)},
        {"pool",
         {{"name", std::string(nodeName)}, {"generation", generation}, {"resourceSliceCount", 1}}},
        {"devices", devices}}}};
}

json ComparableDevices(const json& devices) {
  json comparable = devices.is_array() ? devices : json::array();
  for (json& device : comparable) {
    if (!device.is_object() || !device.contains("taints") || !device["taints"].is_array()) continue;
    for (json& taint : device["taints"]) {
      if (taint.is_object()) taint.erase("timeAdded");
    }
  }
  return comparable;
}

}  // namespace cozy::agent
