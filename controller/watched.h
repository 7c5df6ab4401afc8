// Every kind a gpu-controller replica watches, each declared once (docs/controller.md, "Adding a
// watched kind"): one `Watched<T>` constant and its line in `ForEachWatched`. A constant names the
// kind's API path (controller/kinds.h), its decode (which keeps only what the controller's readers
// read; the cache keeps no raw JSON beside it), the model snapshot's member its objects fill, who
// reads it (whose passes its changes wake), whether it comes and goes with discovery, and what its
// cache keeps, skims and asks the API server for. Everything that reads kinds comes from this
// table: the daemon's caches and their wiring (ClusterCaches, daemon.cpp), `simulate`'s snapshot
// reader (DecodeSnapshotList), `kubectl gpu`'s reads, and the chart RBAC's test.
#pragma once

#include <chrono>
#include <concepts>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/gpuclass.h"
#include "api/gpudevice.h"
#include "api/gpunode_types.h"
#include "api/keys.h"
#include "api/usage_record.h"
#include "controller/kinds.h"
#include "controller/model/model.h"
#include "controller/model/readers.h"
#include "controller/model/snapshot.h"
#include "controller/snapshot_json.h"
#include "kube/cache.h"
#include "kube/client.h"
#include "kube/json_stream.h"

namespace cozy::controller {

// Who reads a kind: whose passes its changes wake. kNone: a change only the webhooks' snapshot
// shows (a pod the binder's quiet room absorbs).
enum class Readers { kReconciler, kBinder, kBoth, kNone };

// Where a kind's objects go in the model's snapshot: nowhere (the model does not read it), a list
// (shared with the cache, or copied), or one value (the first object, e.g. KubeVirt's).
template <class T>
using SnapshotMember = std::variant<std::monostate, model::SharedVector<T> model::Snapshot::*,
                                    std::vector<T> model::Snapshot::*, T model::Snapshot::*>;

// A change filter that lets through only a change its readers would read (kube::Cache's
// WhenValueDiffers, as a plain function).
template <std::equality_comparable T>
bool ValueDiffers(const T* before, const T* after) {
  return before == nullptr || after == nullptr || !(*before == *after);
}

template <class T>
struct Watched {
  using Object = T;
  Kind kind{};
  // The kind of its objects, as a List's items name it (`simulate`'s file, `kubectl gpu`).
  std::string_view objectKind{};
  T (*decode)(const nlohmann::json&) = nullptr;
  // The snapshot's member its objects fill (simulate, kubectl gpu, ClusterCaches::FillSnapshot).
  SnapshotMember<T> snapshot{};
  // The devices: each reader of the caches puts them in its snapshot its own way
  // (ClusterCaches::DevicesNow, the binder's read past the cache), FillSnapshot does not.
  bool readerFillsSnapshot = false;
  Readers readers = Readers::kBoth;
  // Watched only with --enable-gpu.
  bool gpuOnly = false;
  // Comes and goes with its kind being served (ClusterCaches::FollowDiscovery), and then, with
  // `servedWith`, only while that kind is served too; never gates readiness (G4).
  bool followsDiscovery = false;
  const Kind* servedWith = nullptr;
  // G7: its objects are known only while discovery says the kind is served (not while it fails).
  bool knownOnlyWhileServed = false;
  // Only the changes this lets through wake its readers; none: every change.
  bool (*matters)(const T* before, const T* after) = nullptr;
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

  // Its cache, not started, with its keep and change filter; `controllerNamespace` is --namespace.
  // Lists in pages of 500.
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
    if (matters != nullptr) cache->SetChangeFilter(matters);
    return cache;
  }
};

// Always.
inline const Watched<api::GpuClass> kClassCache{.kind = kGpuClasses,
                                                .objectKind = api::kGpuClassKind,
                                                .decode = api::GpuClassFromJson,
                                                .snapshot = &model::Snapshot::classes};
inline const Watched<api::GpuDevice> kDeviceCache{.kind = kGpuDevices,
                                                  .objectKind = api::kGpuDeviceKind,
                                                  .decode = api::GpuDeviceFromJson,
                                                  .snapshot = &model::Snapshot::devices,
                                                  .readerFillsSnapshot = true};
inline const Watched<api::GpuNodeInventory> kGpuNodeCache{.kind = kGpuNodes,
                                                          .objectKind = api::kGpuNodeKind,
                                                          .decode = api::GpuNodeInventoryFromJson,
                                                          .snapshot = &model::Snapshot::gpuNodes};
// G11: the settings object alone. The snapshot's settings come from the flags (`simulate` reads
// them from the ConfigMap in its file, DecodeSnapshotList).
inline const Watched<nlohmann::json> kSettingsCache{
    .kind = kConfigMaps,
    .objectKind = "ConfigMap",
    .decode = kube::IdentityDecode,
    .readers = Readers::kReconciler,
    .name = "settings",
    .inControllerNamespace = true,
    .fieldSelector = "metadata.name=" + std::string(api::kSettingsConfigMapName)};

// With --enable-gpu: what the binder's model reads besides the GPU objects, each change filtered
// to those the model reads something different in (docs/controller.md, "Who wakes for a change").
inline const Watched<model::Namespace> kNamespaceCache{.kind = kNamespaces,
                                                       .objectKind = "Namespace",
                                                       .decode = NamespaceFromJson,
                                                       .snapshot = &model::Snapshot::namespaces,
                                                       .readers = Readers::kBinder,
                                                       .gpuOnly = true,
                                                       .matters = ValueDiffers<model::Namespace>};
inline const Watched<model::ResourceQuota> kQuotaCache{
    .kind = kResourceQuotas,
    .objectKind = "ResourceQuota",
    .decode = QuotaFromJson,
    .snapshot = &model::Snapshot::quotas,
    .readers = Readers::kBinder,
    .gpuOnly = true,
    .matters = ValueDiffers<model::ResourceQuota>};
inline const Watched<model::Node> kNodeCache{.kind = kNodes,
                                             .objectKind = "Node",
                                             .decode = NodeFromJson,
                                             .snapshot = &model::Snapshot::nodes,
                                             .readers = Readers::kBinder,
                                             .gpuOnly = true,
                                             .matters = ValueDiffers<model::Node>};
// Only the pods that can count in a decision (model::PodAsksForExtendedResources; a model test
// shows the others change none): a tenth of a cluster's pods or fewer. The others cost a skim of
// their events and nothing more: no document, no decode, no memory, no index, no pass
// (docs/controller.md, "Who wakes for a change"). Which changes matter is the daemon's
// PodChanges (controller/daemon/view.h). The reconciler reads them for their usage records (C11).
inline const Watched<model::Pod> kPodCache{.kind = kPods,
                                           .objectKind = "Pod",
                                           .decode = PodFromJson,
                                           .snapshot = &model::Snapshot::pods,
                                           .gpuOnly = true,
                                           .keep = model::PodAsksForExtendedResources,
                                           .skim = model::PodKeyIsExtendedResource,
                                           .batch = std::chrono::milliseconds(250)};

// While their kinds are served (ClusterCaches::FollowDiscovery).
inline const Watched<model::VirtualMachineInstance> kVmiCache{
    .kind = kVmis,
    .objectKind = "VirtualMachineInstance",
    .decode = VmiFromJson,
    .snapshot = &model::Snapshot::vmis,
    .gpuOnly = true,
    .followsDiscovery = true,
    .knownOnlyWhileServed = true,
    .matters = ValueDiffers<model::VirtualMachineInstance>};
inline const Watched<model::PermittedHostDevices> kKubeVirtCache{
    .kind = kKubeVirts,
    .objectKind = "KubeVirt",
    .decode = KubeVirtFromJson,
    .snapshot = &model::Snapshot::permittedHostDevices,
    .gpuOnly = true,
    .followsDiscovery = true};
// Cozystack's usage records and their monitor: both caches while both kinds are served.
inline const Watched<nlohmann::json> kUsageRecordCache{
    .kind = kWorkloads,
    .objectKind = api::kWorkloadKind,
    .decode = kube::IdentityDecode,
    .readers = Readers::kReconciler,
    .followsDiscovery = true,
    .servedWith = &kWorkloadMonitors,
    .labelSelector =
        std::string(api::kWorkloadMonitorNameLabel) + "=" + std::string(api::kUsageMonitorName)};
inline const Watched<nlohmann::json> kUsageMonitorCache{
    .kind = kWorkloadMonitors,
    .objectKind = api::kWorkloadMonitorKind,
    .decode = kube::IdentityDecode,
    .readers = Readers::kReconciler,
    .followsDiscovery = true,
    .servedWith = &kWorkloads,
    .fieldSelector = "metadata.name=" + std::string(api::kUsageMonitorName)};

// DRA (docs/dra.md), while resource.k8s.io/v1 is served: gpu-agent's slices, where a dra
// class's units are, and the claims allocated its devices, which hold them.
inline const Watched<model::ResourceSlice> kResourceSliceCache{
    .kind = kResourceSlices,
    .objectKind = "ResourceSlice",
    .decode = ResourceSliceFromJson,
    .snapshot = &model::Snapshot::resourceSlices,
    .readers = Readers::kBinder,
    .gpuOnly = true,
    .followsDiscovery = true,
    .knownOnlyWhileServed = true,
    .matters = ValueDiffers<model::ResourceSlice>,
    .fieldSelector = "spec.driver=" + std::string(api::kDraDriver)};
inline const Watched<model::ResourceClaim> kResourceClaimCache{
    .kind = kResourceClaims,
    .objectKind = "ResourceClaim",
    .decode = ResourceClaimFromJson,
    .snapshot = &model::Snapshot::resourceClaims,
    .readers = Readers::kBinder,
    .gpuOnly = true,
    .followsDiscovery = true,
    .knownOnlyWhileServed = true,
    .matters = ValueDiffers<model::ResourceClaim>,
    .keep = [](const model::ResourceClaim& claim) { return !claim.devices.empty(); }};

// The DeviceClasses the reconciler keeps for the dra classes (its own, by their label).
inline const Watched<nlohmann::json> kDeviceClassCache{
    .kind = kDeviceClasses,
    .objectKind = "DeviceClass",
    .decode = kube::IdentityDecode,
    .readers = Readers::kReconciler,
    .gpuOnly = true,
    .followsDiscovery = true,
    .knownOnlyWhileServed = true,
    .labelSelector = std::string(api::kDeviceClassClassLabel)};

// The claims the reconciler writes for Bound devices of dra classes (its own, by their label).
inline const Watched<nlohmann::json> kDraClaimCache{
    .kind = kResourceClaims,
    .objectKind = "ResourceClaim",
    .decode = kube::IdentityDecode,
    .readers = Readers::kReconciler,
    .gpuOnly = true,
    .followsDiscovery = true,
    .knownOnlyWhileServed = true,
    .name = "dra-claims",
    .labelSelector = std::string(api::kDraClaimLabel)};

// The table: every watched kind, in the order a replica starts their caches.
template <class Visit>
void ForEachWatched(Visit&& visit) {
  visit(kClassCache);
  visit(kDeviceCache);
  visit(kGpuNodeCache);
  visit(kSettingsCache);
  visit(kNamespaceCache);
  visit(kQuotaCache);
  visit(kNodeCache);
  visit(kPodCache);
  visit(kVmiCache);
  visit(kKubeVirtCache);
  visit(kResourceSliceCache);
  visit(kResourceClaimCache);
  visit(kDeviceClassCache);
  visit(kDraClaimCache);
  visit(kUsageRecordCache);
  visit(kUsageMonitorCache);
}

// Whether the model reads the kind (it has a snapshot member).
template <class T>
bool InSnapshot(const Watched<T>& watched) {
  return !std::holds_alternative<std::monostate>(watched.snapshot);
}

// One object of the kind into the snapshot: appended to its list, or its one value.
template <class T>
void AddToSnapshot(model::Snapshot& snapshot, const Watched<T>& watched, T object) {
  std::visit(
      [&](auto member) {
        using Member = decltype(member);
        if constexpr (std::is_same_v<Member, T model::Snapshot::*>) {
          snapshot.*member = std::move(object);
        } else if constexpr (!std::is_same_v<Member, std::monostate>) {
          (snapshot.*member).push_back(std::move(object));
        }
      },
      watched.snapshot);
}

// A cache's objects into the snapshot: a shared list shares them (a pointer each, none copied), a
// plain list copies them, one value is the first (none: the default).
template <class T>
void FillSnapshotMember(model::Snapshot& snapshot, const Watched<T>& watched,
                        const std::vector<std::shared_ptr<const T>>& objects) {
  std::visit(
      [&](auto member) {
        using Member = decltype(member);
        if constexpr (std::is_same_v<Member, model::SharedVector<T> model::Snapshot::*>) {
          snapshot.*member = model::SharedVector<T>::Sharing(objects);
        } else if constexpr (std::is_same_v<Member, std::vector<T> model::Snapshot::*>) {
          for (const auto& object : objects) (snapshot.*member).push_back(*object);
        } else if constexpr (std::is_same_v<Member, T model::Snapshot::*>) {
          snapshot.*member = objects.empty() ? T{} : *objects.front();
        }
      },
      watched.snapshot);
}

}  // namespace cozy::controller
