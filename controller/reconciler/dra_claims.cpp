// The ResourceClaim of each Bound GPUDevice of a dra class (docs/dra.md, "The claims"): the
// binder decides the node and the units, the claim asks kube-scheduler for that many of the
// class's devices on that node, and only this claim may take them (it tolerates the catalog's
// taint, F20).
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

// What a claim was written for: its class, node and count. The spec is immutable, so this
// annotation on the stored claim says whether it still asks for what the device holds.
constexpr std::string_view kClaimForAnnotation = "gpu.cozystack.io/claim-for";

std::string ClaimFor(const api::GpuDevice& device) {
  return device.spec.className + "/" + device.status.nodeName.value_or("") + "/" +
         std::to_string(device.spec.count);
}

bool Reserved(const nlohmann::json& claim) {
  const auto status = claim.find("status");
  return status != claim.end() && status->is_object() &&
         !status->value("reservedFor", nlohmann::json::array()).empty();
}

bool Current(const nlohmann::json& stored, const api::GpuDevice& device) {
  const nlohmann::json& metadata = stored.at("metadata");
  const nlohmann::json annotations = metadata.value("annotations", nlohmann::json::object());
  const nlohmann::json owners = metadata.value("ownerReferences", nlohmann::json::array());
  return annotations.value(std::string(kClaimForAnnotation), std::string()) == ClaimFor(device) &&
         !owners.empty() && owners[0].value("uid", std::string()) == device.metadata.uid;
}

}  // namespace

nlohmann::json DraClaim(const api::GpuDevice& device) {
  const std::string driver(api::kDraDriver);
  const std::string node = device.status.nodeName.value_or("");
  // One device of the class on the node the binder placed the device on (its ids are
  // "<node>/<PCI address>"), tolerating the catalog's taint.
  const nlohmann::json exactly = {{"deviceClassName", DraDeviceClassName(device.spec.className)},
                                  {"allocationMode", "ExactCount"},
                                  {"count", 1},
                                  {"selectors",
                                   {{{"cel",
                                      {{"expression", "device.attributes[\"" + driver + "\"]." +
                                                          std::string(api::kDraIdAttribute) +
                                                          ".startsWith(\"" + node + "/\")"}}}}}},
                                  {"tolerations",
                                   {{{"key", std::string(api::kCatalogTaintKey)},
                                     {"operator", "Exists"},
                                     {"effect", std::string(api::kCatalogTaintEffect)}}}}};
  nlohmann::json requests = nlohmann::json::array();
  for (int64_t i = 0; i < device.spec.count; ++i) {
    requests.push_back({{"name", api::DraClaimRequestName(i)}, {"exactly", exactly}});
  }
  return {{"apiVersion", kResourceClaims.ApiVersion()},
          {"kind", "ResourceClaim"},
          {"metadata",
           {{"name", device.metadata.name},
            {"namespace", device.metadata.namespaceName},
            {"labels",
             {{std::string(api::kDraClaimLabel), std::string(api::kDraClaimLabelValue)},
              {"app.kubernetes.io/managed-by", "gpu-controller"}}},
            {"annotations", {{std::string(kClaimForAnnotation), ClaimFor(device)}}},
            {"ownerReferences",
             {{{"apiVersion", api::kApiVersion},
               {"kind", api::kGpuDeviceKind},
               {"name", device.metadata.name},
               {"uid", device.metadata.uid},
               {"controller", true}}}}}},
          {"spec", {{"devices", {{"requests", std::move(requests)}}}}}};
}

controller::Plan DraClaims::Plan(const ReconcileInput& input) const {
  controller::Plan plan;
  std::map<std::string, bool> dra;  // class name -> sells through DRA
  for (const auto& gpuClass : input.classes) dra[gpuClass->metadata.name] = gpuClass->IsDra();
  std::map<std::string, const nlohmann::json*> stored;  // "namespace/name"
  for (const JsonPtr& claim : *input.draClaims) {
    const nlohmann::json& metadata = claim->at("metadata");
    stored[metadata.value("namespace", std::string()) + "/" +
           metadata.value("name", std::string())] = claim.get();
  }
  std::set<std::string> wanted;
  for (const auto& device : input.devices) {
    const auto isDra = dra.find(device->spec.className);
    if (isDra == dra.end() || !isDra->second || device->Phase() != api::DevicePhase::kBound ||
        device->status.nodeName.value_or("").empty() || device->metadata.uid.empty()) {
      continue;
    }
    const std::string key = device->metadata.namespaceName + "/" + device->metadata.name;
    const auto have = stored.find(key);
    const Target target = InNamespace("ResourceClaim", kResourceClaims,
                                      device->metadata.namespaceName, device->metadata.name);
    if (have == stored.end()) {
      wanted.insert(key);
      plan.actions.push_back(
          ApplyAction("create-device-claim", target, DraClaim(*device), nullptr,
                      "GPUDevice " + key + " is Bound on " + *device->status.nodeName));
    } else if (Current(*have->second, *device)) {
      wanted.insert(key);
    }
    // Otherwise written for another node, count or device: its spec cannot change, so it goes
    // below and the next pass writes the new one.
  }
  for (const auto& [key, claim] : stored) {
    if (wanted.contains(key)) continue;
    if (Reserved(*claim)) continue;  // a pod holds it: it goes once the pod is gone
    const nlohmann::json& metadata = claim->at("metadata");
    plan.actions.push_back(DeleteAction(
        "delete-device-claim",
        InNamespace("ResourceClaim", kResourceClaims, metadata.value("namespace", std::string()),
                    metadata.value("name", std::string())),
        *claim, "no Bound device of a dra class asks for it as it is"));
  }
  return plan;
}

}  // namespace cozy::controller
