// The part of a GPUNode's status (DESIGN §4.2) that the controller reads: per GPU function, the
// units each device-plugin resource makes of it. The agent writes the whole status; this is the
// reader's view and ignores fields it does not need.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/meta.h"

namespace cozy::api {

// `status.devices[].resources[]`: what one device plugin makes of one function.
struct InventoryResource {
  std::string name;
  int64_t allocatable = 0;  // healthy units kubelet lists; an mdev parent serves several
  int64_t allocated = 0;
  bool operator==(const InventoryResource&) const = default;
};

// `status.devices[]`: one GPU PCI function.
struct InventoryDevice {
  std::string pciAddress;
  std::vector<InventoryResource> resources;
  int64_t allocatable = 0;
  int64_t allocated = 0;
  std::string health;  // Healthy | Unhealthy | Unadvertised
  bool operator==(const InventoryDevice&) const = default;
};

// A GPUNode as the controller reads it; its name is the node's.
struct GpuNodeInventory {
  std::string nodeName;
  std::string resourceVersion;             // metadata.resourceVersion: the binder's condition
                                           // write is conditional on it
  std::vector<std::string> resourceNames;  // status.resourceNames
  std::vector<InventoryDevice> devices;    // status.devices
  std::vector<Condition> conditions;       // status.conditions: the binder's
  bool operator==(const GpuNodeInventory&) const = default;
};

// Reads metadata.name and the status fields above; throws DecodeError naming the field.
GpuNodeInventory GpuNodeInventoryFromJson(const nlohmann::json& object);

}  // namespace cozy::api
