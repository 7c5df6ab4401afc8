#include "agent/status/status_builder.h"

#include <array>
#include <cstdio>
#include <map>

#include "api/gpunode.h"

namespace cozy::agent {
namespace {

std::string Hex(uint32_t value, int digits) {
  std::array<char, 16> buffer{};
  std::snprintf(buffer.data(), buffer.size(), "%0*x", digits, value);
  return buffer.data();
}

}  // namespace

nlohmann::json BuildDeviceStatus(const sysfs::PciFunction& function, const FunctionUnits* units) {
  nlohmann::json device;
  device["pciAddress"] = function.address.ToString();
  device["vendorID"] = Hex(function.vendorId, 4);
  device["deviceID"] = Hex(function.deviceId, 4);
  if (function.subsystemVendorId && function.subsystemDeviceId) {
    device["subsystemVendorID"] = Hex(*function.subsystemVendorId, 4);
    device["subsystemDeviceID"] = Hex(*function.subsystemDeviceId, 4);
  }
  device["classCode"] = Hex(function.classCode, 6);
  if (!function.vendorName.empty()) {
    device["vendor"] = function.vendorName;
  }
  if (!function.deviceName.empty()) {
    device["model"] = function.deviceName;
  }
  if (function.driver) {
    device["driver"] = *function.driver;
  }
  if (function.iommuGroup) {
    device["iommuGroup"] = *function.iommuGroup;
    if (function.iommuGroupViable) {
      device["iommuGroupViable"] = *function.iommuGroupViable;
    }
  }
  if (function.numaNode) {
    device["numaNode"] = *function.numaNode;
  }
  if (function.physicalFunction) {
    device["physicalFunction"] = function.physicalFunction->ToString();
  }
  if (function.sriov) {
    device["sriov"] = {{"totalVFs", function.sriov->totalVfs}, {"numVFs", function.sriov->numVfs}};
  }
  if (!function.mdevTypes.empty()) {
    nlohmann::json types = nlohmann::json::array();
    for (const sysfs::MdevType& type : function.mdevTypes) {
      nlohmann::json entry = {{"type", type.type}};
      if (!type.name.empty()) {
        entry["name"] = type.name;
      }
      if (type.availableInstances) {
        entry["availableInstances"] = *type.availableInstances;
      }
      if (type.maxInstances) {
        entry["maxInstances"] = *type.maxInstances;
      }
      types.push_back(std::move(entry));
    }
    device["mdevTypes"] = std::move(types);
  }
  if (!function.mdevs.empty()) {
    nlohmann::json mdevs = nlohmann::json::array();
    for (const sysfs::Mdev& mdev : function.mdevs) {
      nlohmann::json entry = {{"uuid", mdev.uuid}};
      if (mdev.type) {
        entry["type"] = *mdev.type;
      }
      mdevs.push_back(std::move(entry));
    }
    device["mdevs"] = std::move(mdevs);
  }
  if (function.vgpu) {
    nlohmann::json vgpu = nlohmann::json::object();
    if (function.vgpu->currentType) {
      vgpu["currentType"] = *function.vgpu->currentType;
    }
    nlohmann::json creatable = nlohmann::json::array();
    for (const sysfs::VgpuTypeEntry& type : function.vgpu->creatableTypes) {
      creatable.push_back({{"id", type.id}, {"name", type.name}});
    }
    vgpu["creatableTypes"] = std::move(creatable);
    device["vgpu"] = std::move(vgpu);
  }
  if (units != nullptr) {
    nlohmann::json resources = nlohmann::json::array();
    for (const ResourceUnits& resource : units->resources) {
      resources.push_back({{"name", resource.name},
                           {"allocatable", resource.allocatable},
                           {"allocated", resource.allocated}});
    }
    if (!resources.empty()) {
      device["resources"] = std::move(resources);
    }
    device["allocatable"] = units->allocatable;
    device["allocated"] = units->allocated;
    device["health"] = ToString(units->health);
  }
  return device;
}

nlohmann::json BuildStatus(const sysfs::HostScan& scan, const UnitReport* units) {
  std::map<sysfs::PciAddress, const FunctionUnits*> unitsByAddress;
  if (units != nullptr) {
    for (const FunctionUnits& function : units->functions) {
      unitsByAddress[function.address] = &function;
    }
  }
  nlohmann::json devices = nlohmann::json::array();
  for (const sysfs::PciFunction* function : scan.Gpus()) {
    const auto found = unitsByAddress.find(function->address);
    devices.push_back(
        BuildDeviceStatus(*function, found == unitsByAddress.end() ? nullptr : found->second));
  }
  // Totals for kubectl's printer columns, which cannot count.
  nlohmann::json summary = {{"gpus", devices.size()}};
  if (units != nullptr) {
    int64_t healthy = 0;
    int64_t allocatable = 0;
    int64_t allocated = 0;
    for (const FunctionUnits& function : units->functions) {
      healthy += function.health == Health::kHealthy ? 1 : 0;
      allocatable += function.allocatable;
      allocated += function.allocated;
    }
    summary["healthy"] = healthy;
    summary["allocatable"] = allocatable;
    summary["allocated"] = allocated;
  }
  nlohmann::json status = {{"devices", std::move(devices)}, {"summary", std::move(summary)}};
  if (units != nullptr) {
    status["resourceNames"] = units->resourceNames;
    nlohmann::json unplaced = nlohmann::json::array();
    for (const UnplacedUnits& entry : units->unplaced) {
      unplaced.push_back({{"resourceName", entry.resourceName},
                          {"allocatable", entry.allocatable},
                          {"allocated", entry.allocated}});
    }
    status["unplaced"] = std::move(unplaced);
  }
  return status;
}

nlohmann::json BuildGpuNode(const std::string& nodeName, const nlohmann::json& status) {
  return {{"apiVersion", api::kApiVersion},
          {"kind", api::kGpuNodeKind},
          {"metadata", {{"name", nodeName}}},
          {"status", status}};
}

}  // namespace cozy::agent
