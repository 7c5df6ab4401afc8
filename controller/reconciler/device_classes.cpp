// The DeviceClass of each dra GPUClass (docs/dra.md, "The DeviceClass"): what the binder's claims
// name, selecting gpu-agent's devices of the class's PCI ID.
#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <string>

#include "api/dra.h"
#include "api/keys.h"
#include "controller/reconciler/reconcilers.h"
#include "controller/reconciler/shared.h"

namespace cozy::controller {

using namespace reconciler;

namespace {

std::string Lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

// Whether the stored object already says what `desired` says: the class label, the owner and
// the selectors (the API server adds nothing to these).
bool Same(const nlohmann::json& stored, const nlohmann::json& desired) {
  const nlohmann::json& have = stored.at("metadata");
  const nlohmann::json& want = desired.at("metadata");
  const std::string label(api::kDeviceClassClassLabel);
  return have.value("labels", nlohmann::json::object()).value(label, std::string()) ==
             want.at("labels").at(label) &&
         have.value("ownerReferences", nlohmann::json::array()) ==
             want.value("ownerReferences", nlohmann::json::array()) &&
         stored.value("spec", nlohmann::json::object()) == desired.at("spec");
}

}  // namespace

std::string DraDeviceClassName(std::string_view className) {
  return std::string(className) + std::string(api::kDeviceClassSuffix);
}

nlohmann::json DraDeviceClass(const api::GpuClass& gpuClass) {
  const std::string selector = Lower(gpuClass.spec.source.dra->pciVendorSelector);
  const std::string driver(api::kDraDriver);
  // The driver first: CEL's && is false for another driver's device whatever its attributes,
  // so a device without the agent's attributes never makes the expression fail.
  const std::string expression = "device.driver == \"" + driver + "\" && device.attributes[\"" +
                                 driver + "\"]." + std::string(api::kVendorIdAttribute) + " == \"" +
                                 selector.substr(0, 4) + "\" && device.attributes[\"" + driver +
                                 "\"]." + std::string(api::kDeviceIdAttribute) + " == \"" +
                                 selector.substr(5) + "\"";
  nlohmann::json metadata = {{"name", DraDeviceClassName(gpuClass.metadata.name)},
                             {"labels",
                              {{std::string(api::kDeviceClassClassLabel), gpuClass.metadata.name},
                               {"app.kubernetes.io/managed-by", "gpu-controller"}}}};
  // Owned by its class: the garbage collector removes it with the class, if no pass does first.
  if (!gpuClass.metadata.uid.empty()) {
    metadata["ownerReferences"] = nlohmann::json::array({{{"apiVersion", api::kApiVersion},
                                                          {"kind", api::kGpuClassKind},
                                                          {"name", gpuClass.metadata.name},
                                                          {"uid", gpuClass.metadata.uid},
                                                          {"controller", true}}});
  }
  return {{"apiVersion", kDeviceClasses.ApiVersion()},
          {"kind", "DeviceClass"},
          {"metadata", std::move(metadata)},
          {"spec", {{"selectors", {{{"cel", {{"expression", expression}}}}}}}}};
}

controller::Plan DraDeviceClasses::Plan(const ReconcileInput& input) const {
  controller::Plan plan;
  std::map<std::string, const nlohmann::json*> stored;  // by name
  for (const JsonPtr& object : *input.deviceClasses) {
    stored[object->at("metadata").value("name", std::string())] = object.get();
  }
  std::set<std::string> wanted;  // the dra classes' DeviceClasses, by name
  for (const auto& gpuClass : input.classes) {
    if (!gpuClass->IsDra()) continue;
    const nlohmann::json desired = DraDeviceClass(*gpuClass);
    const std::string name = desired.at("metadata").at("name");
    wanted.insert(name);
    const auto have = stored.find(name);
    if (have != stored.end() && Same(*have->second, desired)) continue;
    plan.actions.push_back(
        ApplyAction("apply-device-class", InNamespace("DeviceClass", kDeviceClasses, "", name),
                    desired, have != stored.end() ? have->second : nullptr,
                    "GPUClass " + gpuClass->metadata.name + " is allocated through it"));
  }
  for (const auto& [name, object] : stored) {
    if (wanted.contains(name)) continue;
    plan.actions.push_back(DeleteAction("delete-device-class",
                                        InNamespace("DeviceClass", kDeviceClasses, "", name),
                                        *object, "no dra GPUClass is allocated through it"));
  }
  return plan;
}

}  // namespace cozy::controller
