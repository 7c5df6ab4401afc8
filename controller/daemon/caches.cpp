#include "controller/daemon/caches.h"

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
namespace {

const kube::GroupVersionResource kVmiResource = kVmis.Resource();
const kube::GroupVersionResource kWorkloadResource = kWorkloads.Resource();
const kube::GroupVersionResource kKubeVirtResource = kKubeVirts.Resource();
const kube::GroupVersionResource kMonitorResource = kWorkloadMonitors.Resource();

}  // namespace

ClusterCaches::ClusterCaches(kube::Client& client, kube::Discovery& discovery, CacheOptions options,
                             Changed changed)
    : loop_("informers", client.time()),
      vmis(Optional(kVmiCache, Readers::kBoth,
                    kube::Cache<model::VirtualMachineInstance>::WhenValueDiffers()),
           &loop_),
      records(Optional(kUsageRecordCache, Readers::kReconciler), &loop_),
      kubevirt(Optional(kKubeVirtCache, Readers::kBoth), &loop_),
      monitors(Optional(kUsageMonitorCache, Readers::kReconciler), &loop_),
      client_(client),
      discovery_(discovery),
      options_(std::move(options)),
      changed_(std::move(changed)) {
  for (const auto& resource :
       {kVmiResource, kKubeVirtResource, kWorkloadResource, kMonitorResource}) {
    discovery_.Track(resource);
  }
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

bool ClusterCaches::FollowDiscovery() {
  using runtime::LogFields;
  bool moved = false;
  if (options_.enableGpu && kubevirt.Follow(discovery_.IsServed(kKubeVirtResource))) {
    runtime::LogInfo("KubeVirt cache",
                     LogFields{{"state", kubevirt.Get() ? "started" : "stopped"}});
    moved = true;
  }
  if (options_.enableGpu && vmis.Follow(discovery_.IsServed(kVmiResource))) {
    runtime::LogInfo("VirtualMachineInstance cache",
                     LogFields{{"state", vmis.Get() ? "started" : "stopped"}});
    moved = true;
  }
  const kube::Served workloads = discovery_.IsServed(kWorkloadResource);
  const kube::Served monitorsServed = discovery_.IsServed(kMonitorResource);
  const kube::Served recordState =
      workloads == kube::Served::kServed && monitorsServed == kube::Served::kServed
          ? kube::Served::kServed
          : (workloads == kube::Served::kNotServed || monitorsServed == kube::Served::kNotServed
                 ? kube::Served::kNotServed
                 : kube::Served::kNotSynced);
  const bool recordsMoved = records.Follow(recordState);
  const bool monitorsMoved = monitors.Follow(recordState);
  if (recordsMoved || monitorsMoved) {
    runtime::LogInfo("usage-record caches",
                     LogFields{{"state", records.Get() ? "started" : "stopped"}});
    moved = true;
  }
  return moved;
}

void ClusterCaches::StopOptional() {
  vmis.Stop();
  kubevirt.Stop();
  records.Stop();
  monitors.Stop();
}

bool ClusterCaches::FillSnapshot(model::Snapshot& snapshot) const {
  for (const auto& item : Get(kNamespaceCache).List()) snapshot.namespaces.push_back(*item);
  for (const auto& item : Get(kQuotaCache).List()) snapshot.quotas.push_back(*item);
  // The caches' own objects, shared (a pointer each, none copied).
  snapshot.nodes = model::SharedVector<model::Node>::Sharing(Get(kNodeCache).List());
  // The cache keeps only the pods that can count in a decision (kPodCache).
  snapshot.pods = model::SharedVector<model::Pod>::Sharing(Get(kPodCache).List());
  snapshot.gpuNodes =
      model::SharedVector<api::GpuNodeInventory>::Sharing(Get(kGpuNodeCache).List());
  for (const auto& item : Get(kClassCache).List()) snapshot.classes.push_back(*item);
  bool vmisKnown = false;
  if (discovery_.IsServed(kVmiResource) == kube::Served::kServed) {
    if (auto cache = vmis.Get(); cache && cache->Synced()) {
      vmisKnown = true;
      snapshot.vmis = model::SharedVector<model::VirtualMachineInstance>::Sharing(cache->List());
    }
  }
  snapshot.permittedHostDevices = PermittedHostDevices();
  snapshot.settings.resourceNames = options_.gpuResourceNames;
  snapshot.settings.notReadyGraceSeconds =
      std::chrono::duration_cast<std::chrono::seconds>(options_.notReadyGrace).count();
  snapshot.now = api::FormatTime(std::chrono::system_clock::now());
  return vmisKnown;
}

model::PermittedHostDevices ClusterCaches::PermittedHostDevices() const {
  if (auto cache = kubevirt.Get(); cache && cache->Synced()) {
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

  const auto recordCache = records.Get();
  const auto monitorCache = monitors.Get();
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
  return input;
}

VmiLookup ClusterCaches::VmiLookupForPass() const {
  if (options_.enableGpu) {
    return VmiLookupFromCache(discovery_.State(kVmiResource), vmis.Get());
  }
  return VmiLookupByReading(client_, discovery_.IsServed(kVmiResource));
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
