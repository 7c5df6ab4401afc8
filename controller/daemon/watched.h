// The caches a gpu-controller replica keeps, one constant each (docs/controller.md, "The caches and
// the wiring"): which kind, decoded how (each decode keeps only what the controller's readers read,
// and the cache keeps no raw JSON beside it), which of its objects the cache keeps, and what its
// watch asks the API server for. The daemon's Watch line takes one and makes its cache, wired to
// whoever reads it; the kinds that come and go with discovery are made from theirs (ClusterCaches).
// Readers find a cache by its constant (ClusterCaches::Get). Adding a watched kind is a constant
// here and a Watch line (docs/controller.md, "Adding a watched kind").
#pragma once

#include <memory>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "api/gpuclass.h"
#include "api/gpudevice.h"
#include "api/gpunode_types.h"
#include "api/keys.h"
#include "api/usage_record.h"
#include "controller/kinds.h"
#include "controller/model/model.h"
#include "controller/model/readers.h"
#include "controller/snapshot_json.h"
#include "kube/cache.h"
#include "kube/client.h"
#include "kube/json_stream.h"

namespace cozy::controller {

template <class T>
struct Watched {
  Kind kind{};
  T (*decode)(const nlohmann::json&) = nullptr;
  // The cache's name in gpu_controller_cache_*{cache} and the logs; empty: the kind's plural.
  std::string name{};
  // Only these objects are kept (kube::Cache::SetKeep); none: all.
  bool (*keep)(const T&) = nullptr;
  // Skims the watch's events of what `keep` drops (kube::InformerOptions::skim): no JSON
  // document, no decode.
  kube::SkimWants skim{};
  // Only the controller's namespace (--namespace), and only what these select.
  bool inControllerNamespace = false;
  std::string fieldSelector{};
  std::string labelSelector{};
  // Its watch's events read at most once per this time (kube::InformerOptions::batch).
  kube::Duration batch{};

  std::string Name() const { return name.empty() ? std::string(kind.plural) : name; }

  // Its cache, not started; `controllerNamespace` is --namespace. Lists in pages of 500.
  std::unique_ptr<kube::Cache<T>> Make(kube::Client& client,
                                       const std::string& controllerNamespace) const {
    kube::InformerOptions options;
    options.fieldSelector = fieldSelector;
    options.labelSelector = labelSelector;
    options.skim = skim;
    options.batch = batch;
    auto cache = std::make_unique<kube::Cache<T>>(
        client, kind.Path(inControllerNamespace ? controllerNamespace : ""), decode,
        std::move(options));
    if (keep != nullptr) cache->SetKeep(keep);
    return cache;
  }
};

// Always.
inline const Watched<api::GpuClass> kClassCache{.kind = kGpuClasses,
                                                .decode = api::GpuClassFromJson};
inline const Watched<api::GpuDevice> kDeviceCache{.kind = kGpuDevices,
                                                  .decode = api::GpuDeviceFromJson};
inline const Watched<api::GpuNodeInventory> kGpuNodeCache{.kind = kGpuNodes,
                                                          .decode = api::GpuNodeInventoryFromJson};
// G11: the settings object alone.
inline const Watched<nlohmann::json> kSettingsCache{
    .kind = kConfigMaps,
    .decode = kube::IdentityDecode,
    .name = "settings",
    .inControllerNamespace = true,
    .fieldSelector = "metadata.name=" + std::string(api::kSettingsConfigMapName)};

// With --enable-gpu: what the binder's model reads besides the GPU objects.
inline const Watched<model::Namespace> kNamespaceCache{.kind = kNamespaces,
                                                       .decode = NamespaceFromJson};
inline const Watched<model::ResourceQuota> kQuotaCache{.kind = kResourceQuotas,
                                                       .decode = QuotaFromJson};
inline const Watched<model::Node> kNodeCache{.kind = kNodes, .decode = NodeFromJson};
// Only the pods that can count in a decision (model::PodAsksForExtendedResources; a model test
// shows the others change none): a tenth of a cluster's pods or fewer. The others cost a skim of
// their events and nothing more: no document, no decode, no memory, no index, no pass
// (docs/controller.md, "Who wakes for a change").
inline const Watched<model::Pod> kPodCache{.kind = kPods,
                                           .decode = PodFromJson,
                                           .keep = model::PodAsksForExtendedResources,
                                           .skim = model::PodKeyIsExtendedResource,
                                           .batch = std::chrono::milliseconds(250)};

// While their kinds are served (ClusterCaches::FollowDiscovery).
inline const Watched<model::VirtualMachineInstance> kVmiCache{.kind = kVmis, .decode = VmiFromJson};
inline const Watched<model::PermittedHostDevices> kKubeVirtCache{.kind = kKubeVirts,
                                                                 .decode = KubeVirtFromJson};
inline const Watched<nlohmann::json> kUsageRecordCache{
    .kind = kWorkloads,
    .decode = kube::IdentityDecode,
    .labelSelector =
        std::string(api::kWorkloadMonitorNameLabel) + "=" + std::string(api::kUsageMonitorName)};
inline const Watched<nlohmann::json> kUsageMonitorCache{
    .kind = kWorkloadMonitors,
    .decode = kube::IdentityDecode,
    .fieldSelector = "metadata.name=" + std::string(api::kUsageMonitorName)};

}  // namespace cozy::controller
