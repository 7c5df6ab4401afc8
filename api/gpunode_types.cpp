#include "api/gpunode_types.h"

#include "api/json_field.h"

namespace cozy::api {

GpuNodeInventory GpuNodeInventoryFromJson(const nlohmann::json& object) {
  const JsonField root(object, "");
  GpuNodeInventory inventory;
  inventory.nodeName = root.Require("metadata").Require("name").AsString();
  if (object.contains("metadata") && object["metadata"].is_object()) {
    inventory.resourceVersion = object["metadata"].value("resourceVersion", "");
  }
  const std::optional<JsonField> status = root.Find("status");
  if (!status) {
    return inventory;  // created by the agent, not yet published
  }
  if (std::optional<JsonField> names = status->Find("resourceNames")) {
    inventory.resourceNames = names->AsStringList();
  }
  if (std::optional<JsonField> conditions = status->Find("conditions")) {
    inventory.conditions = ConditionsFromJson(*conditions);
  }
  if (std::optional<JsonField> devices = status->Find("devices")) {
    for (const JsonField& item : devices->AsArray()) {
      InventoryDevice device;
      device.pciAddress = item.Require("pciAddress").AsString();
      device.allocatable = item.OptionalInt("allocatable").value_or(0);
      device.allocated = item.OptionalInt("allocated").value_or(0);
      device.health = item.StringOr("health", "");
      if (std::optional<JsonField> resources = item.Find("resources")) {
        for (const JsonField& resource : resources->AsArray()) {
          InventoryResource entry;
          entry.name = resource.Require("name").AsString();
          const JsonField allocatable = resource.Require("allocatable");
          entry.allocatable = allocatable.AsInt();
          if (entry.allocatable < 0) {
            allocatable.Fail("must not be negative");
          }
          entry.allocated = resource.OptionalInt("allocated").value_or(0);
          device.resources.push_back(std::move(entry));
        }
      }
      inventory.devices.push_back(std::move(device));
    }
  }
  return inventory;
}

}  // namespace cozy::api
