// Reads a Kubernetes List (what `kubectl get ns,resourcequotas,nodes,pods,gpunodes,gpuclasses,
// gpudevices,vmi -A -o json` prints, optionally with the KubeVirt object and the settings
// ConfigMap) into the model's snapshot. Items of other kinds are skipped.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "controller/model/snapshot.h"

namespace cozy::controller {

// A malformed item: the message names the item, the object and the field, e.g.
// `items[3] (GPUClass a100): spec.maxCount: must be at least 1`.
class SnapshotError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

model::Snapshot DecodeSnapshotList(const nlohmann::json& list);

// One VirtualMachineInstance as the model reads it, from a list item, a watch event or a GET
// alike: the one reader of status.activePods, the launcher proof (C12). Throws
// api::DecodeError naming the field.
model::VirtualMachineInstance VmiFromJson(const nlohmann::json& object);

// The other kinds of the snapshot, one object each, as the caches of `gpu-controller run` decode
// them: the same readers `simulate` uses, so the binder and `simulate` read a cluster alike.
model::Namespace NamespaceFromJson(const nlohmann::json& object);
model::ResourceQuota QuotaFromJson(const nlohmann::json& object);
model::Node NodeFromJson(const nlohmann::json& object);
model::Pod PodFromJson(const nlohmann::json& object);
model::PermittedHostDevices KubeVirtFromJson(const nlohmann::json& object);
// DRA (docs/dra.md): gpu-agent's ResourceSlices and the claims allocated its devices.
model::ResourceSlice ResourceSliceFromJson(const nlohmann::json& object);
model::ResourceClaim ResourceClaimFromJson(const nlohmann::json& object);

// A comma-separated list of resource names (the settings ConfigMap's `resourceNames`, the
// --gpu-resource-names flag): each trimmed of blanks, empty ones dropped.
std::vector<std::string> SplitResourceNames(const std::string& text);

}  // namespace cozy::controller
