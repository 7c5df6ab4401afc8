#include "controller/daemon/caches.h"

#include <type_traits>
#include <utility>
#include <vector>

#include "api/keys.h"
#include "api/time.h"
#include "controller/binder/binder.h"
#include "controller/model/model.h"
#include "controller/model/readers.h"
#include "controller/snapshot_json.h"
#include "runtime/log.h"

namespace cozy::controller {

ClusterCaches::ClusterCaches(kube::Client& client, kube::Discovery& discovery, CacheOptions options,
                             Changed changed)
    : loop_("informers", client.time()),
      client_(client),
      discovery_(discovery),
      options_(std::move(options)),
      changed_(std::move(changed)) {
  ForEachWatched([this](const auto& watched) {
    if (!watched.followsDiscovery) return;
    using T = typename std::remove_cvref_t<decltype(watched)>::Object;
    optional_[&watched] = std::make_shared<kube::OptionalCache<T>>(Optional(watched), &loop_);
    discovery_.Track(watched.kind.Resource());
  });
}

void ClusterCaches::AddDeviceIndexes() {
  kube::Cache<api::GpuDevice>& devices = Make(kDeviceCache);
  devices.AddIndex(
      "class", [](const api::GpuDevice& d) { return std::vector<std::string>{d.spec.className}; });
  devices.AddIndex("node", [](const api::GpuDevice& d) {
    return d.status.nodeName ? std::vector<std::string>{*d.status.nodeName}
                             : std::vector<std::string>{};
  });
  devices.AddIndex("namespace", [](const api::GpuDevice& d) {
    return std::vector<std::string>{d.metadata.namespaceName};
  });
  devices.AddIndex("vmi", [](const api::GpuDevice& d) {
    return d.status.attachment ? std::vector<std::string>{d.metadata.namespaceName + "/" +
                                                          d.status.attachment->vmiName}
                               : std::vector<std::string>{};
  });
  devices.AddIndex("pending", [](const api::GpuDevice& d) {
    return d.RequestPending() ? std::vector<std::string>{"pending"} : std::vector<std::string>{};
  });
}

template <class T>
kube::Served ClusterCaches::ServedNow(const Watched<T>& watched) const {
  const kube::Served own = discovery_.IsServed(watched.kind.Resource());
  if (watched.servedWith == nullptr) return own;
  const kube::Served with = discovery_.IsServed(watched.servedWith->Resource());
  if (own == kube::Served::kServed && with == kube::Served::kServed) return kube::Served::kServed;
  if (own == kube::Served::kNotServed || with == kube::Served::kNotServed) {
    return kube::Served::kNotServed;
  }
  return kube::Served::kNotSynced;
}

bool ClusterCaches::FollowDiscovery() {
  bool moved = false;
  ForEachWatched([this, &moved](const auto& watched) {
    if (!watched.followsDiscovery || (watched.gpuOnly && !options_.enableGpu)) return;
    auto& optional = OptionalOf(watched);
    if (optional.Follow(ServedNow(watched))) {
      runtime::LogInfo(std::string(watched.objectKind) + " cache",
                       runtime::LogFields{{"state", optional.Get() ? "started" : "stopped"}});
      moved = true;
    }
  });
  return moved;
}

void ClusterCaches::StopOptional() {
  ForEachWatched([this](const auto& watched) {
    if (watched.followsDiscovery) OptionalOf(watched).Stop();
  });
}

bool ClusterCaches::FillSnapshot(model::Snapshot& snapshot) const {
  ForEachWatched([this, &snapshot](const auto& watched) {
    if (!InSnapshot(watched) || watched.readerFillsSnapshot) return;
    if (!watched.followsDiscovery) {
      FillSnapshotMember(snapshot, watched, Get(watched).List());
    } else if (auto cache = Readable(watched)) {
      FillSnapshotMember(snapshot, watched, cache->List());
    }
  });
  snapshot.settings.resourceNames = options_.gpuResourceNames;
  snapshot.settings.notReadyGraceSeconds =
      std::chrono::duration_cast<std::chrono::seconds>(options_.notReadyGrace).count();
  snapshot.now = api::FormatTime(std::chrono::system_clock::now());
  snapshot.draUnknown = DraUnknown();
  return Readable(kVmiCache) != nullptr;
}

std::string ClusterCaches::DraUnknown() const {
  if (!options_.enableGpu) return "this replica runs without --enable-gpu, which reads them";
  for (const Kind* kind : {&kResourceSlices, &kResourceClaims}) {
    const kube::Served served = discovery_.IsServed(kind->Resource());
    if (served != kube::Served::kServed) {
      return std::string(kind->plural) + " of " + kind->ApiVersion() + " " +
             (served == kube::Served::kNotServed ? "are not served by the API server"
              : served == kube::Served::kFailing ? "cannot be told served: discovery fails"
                                                 : "are not known served yet");
    }
  }
  if (Readable(kResourceSliceCache) == nullptr || Readable(kResourceClaimCache) == nullptr) {
    return "this replica has not read the ResourceSlices and ResourceClaims yet";
  }
  return "";
}

model::PermittedHostDevices ClusterCaches::PermittedHostDevices() const {
  if (auto cache = Readable(kKubeVirtCache)) {
    const auto all = cache->List();
    if (!all.empty()) return *all.front();
  }
  return {};
}

ReconcileInput ClusterCaches::BuildInput() const {
  ReconcileInput input;
  input.now = std::chrono::system_clock::now();
  input.attachmentGrace =
      std::chrono::duration_cast<std::chrono::seconds>(options_.attachmentGrace);
  input.classes = Get(kClassCache).List();
  input.devices = Get(kDeviceCache).List();
  input.vmis = VmiLookupForPass();

  const auto recordCache = Running(kUsageRecordCache);
  const auto monitorCache = Running(kUsageMonitorCache);
  if (recordCache && monitorCache && recordCache->Synced() && monitorCache->Synced()) {
    input.usageRecords = true;
    // Pods are watched with GPUs on only: without, their records are left as they are.
    if (options_.enableGpu && Get(kPodCache).Synced()) {
      input.podRecords = true;
      input.pods = Get(kPodCache).List();
    }
    for (const auto& record : recordCache->List()) {
      input.records[kube::ObjectKey(*record)] = record;
    }
    for (const auto& monitor : monitorCache->List()) {
      input.monitors[monitor->at("metadata").value("namespace", std::string())] = monitor;
    }
  }

  ReconcileInput::Settings settings;
  if (auto object =
          Get(kSettingsCache)
              .Get(options_.namespaceName + "/" + std::string(api::kSettingsConfigMapName))) {
    settings.stored = *object;
  }
  settings.gpuNodes =
      model::SharedVector<api::GpuNodeInventory>::Sharing(Get(kGpuNodeCache).List());
  settings.permitted = PermittedHostDevices();
  input.settings = std::move(settings);
  if (auto cache = Readable(kDeviceClassCache)) input.deviceClasses = cache->List();
  if (auto cache = Readable(kDraClaimCache)) input.draClaims = cache->List();
  return input;
}

VmiLookup ClusterCaches::VmiLookupForPass() const {
  if (options_.enableGpu) {
    return VmiLookupFromCache(discovery_.State(kVmis.Resource()), Running(kVmiCache));
  }
  return VmiLookupByReading(client_, discovery_.IsServed(kVmis.Resource()));
}

model::SharedVector<api::GpuDevice> ClusterCaches::DevicesNow() const {
  const kube::Cache<api::GpuDevice>& cache = Get(kDeviceCache);
  const uint64_t version = cache.Version();  // before the List: a change after it shows next time
  std::lock_guard lock(devicesMutex_);
  if (devicesVersion_ != version) {
    devices_ = model::SharedVector<api::GpuDevice>::Sharing(cache.List());
    devicesVersion_ = version;
  }
  return devices_;
}

std::shared_ptr<const webhook::Prepared> ClusterCaches::Prepared(
    const webhook::Prepared* previous) const {
  auto prepared = std::make_shared<webhook::Prepared>();
  prepared->snapshot.devices = DevicesNow();
  FillSnapshot(prepared->snapshot);
  prepared->gpuResourceNames = model::EffectiveGpuResourceNames(
      prepared->snapshot.settings, prepared->snapshot.gpuNodes,
      prepared->snapshot.permittedHostDevices, prepared->snapshot.classes);
  prepared->rawNamesForbidden = options_.rawNamesForbidden;
  try {
    prepared->model = std::make_unique<model::Model>(
        prepared->snapshot, previous != nullptr ? previous->model.get() : nullptr);
  } catch (const std::exception& error) {
    prepared->modelError = error.what();
  }
  return prepared;
}

}  // namespace cozy::controller
