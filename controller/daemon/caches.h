// The cluster as a gpu-controller replica caches it, and what its passes and webhooks read from
// it: the model's snapshot (FillSnapshot), the reconciler's input (BuildInput), the webhooks'
// snapshot and model (Prepared). It is the controller's informer factory: a cache is made from
// its constant in the table of watched kinds (controller/watched.h) and found by it. daemon.cpp
// owns one, makes a cache of each kind of the table that does not follow discovery, wires its
// changes to the passes and runs it; the kinds that come and go with discovery are made and
// followed here (FollowDiscovery). This file knows nothing of passes, the loop or the Lease.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "api/gpuclass.h"
#include "api/gpudevice.h"
#include "api/gpunode_types.h"
#include "controller/daemon/daemon.h"
#include "controller/daemon/vmi_lookup.h"
#include "controller/kinds.h"
#include "controller/model/snapshot.h"
#include "controller/reconciler/plan.h"
#include "controller/watched.h"
#include "controller/webhook/webhooks.h"
#include "kube/cache.h"
#include "kube/client.h"
#include "kube/discovery.h"
#include "kube/optional_cache.h"

namespace cozy::controller {

// What the caches, and what is read from them, take of the flags: no more (CachesOf in
// daemon.cpp makes it from RunOptions), each default RunOptions's own.
struct CacheOptions {
  std::string namespaceName{RunOptions{}.namespaceName};  // --namespace: the settings' home
  bool enableGpu = RunOptions{}.enableGpu;  // the KubeVirt kinds and the pods are read
  std::vector<std::string> gpuResourceNames;
  bool rawNamesForbidden = RunOptions{}.rawNamesForbidden;
  std::chrono::milliseconds attachmentGrace = RunOptions{}.attachmentGrace;
  std::chrono::milliseconds notReadyGrace = RunOptions{}.notReadyGrace;
};

class ClusterCaches {
  // The thread every cache's watch is read on (docs/controller.md, "One thread for every watch"),
  // their lists each on a thread of its own. First: it outlives the caches.
  kube::InformerLoop loop_;

 public:
  // Who reads a cache: whose passes its changes wake (controller/watched.h).
  using Readers = controller::Readers;
  // Called on the informer loop (or a list worker) when something `Readers` read changed.
  using Changed = std::function<void(Readers)>;

  // `client` and `discovery` outlive this. The kinds that come and go (every `followsDiscovery`
  // kind of the table) report their changes through `changed`; the others are wired by the
  // daemon's Watch.
  ClusterCaches(kube::Client& client, kube::Discovery& discovery, CacheOptions options,
                Changed changed);
  ClusterCaches(const ClusterCaches&) = delete;
  ClusterCaches& operator=(const ClusterCaches&) = delete;

  // The cache of `watched`, made on the first ask (the same one after). Only while wiring,
  // before any cache starts: the set of caches is fixed from then on.
  template <class T>
  kube::Cache<T>& Make(const Watched<T>& watched) {
    auto& made = made_[&watched];
    if (!made) made = watched.Make(client_, options_.namespaceName);
    return static_cast<kube::Cache<T>&>(*made);
  }
  // The cache Make made of `watched`; std::logic_error when none was (a reader of a cache the
  // daemon's Watch did not make: a GPU-only kind with GPUs off). Any thread.
  template <class T>
  kube::Cache<T>& Get(const Watched<T>& watched) const {
    auto found = made_.find(&watched);
    if (found == made_.end()) {
      throw std::logic_error("no cache of " + watched.Name() + " is watched");
    }
    return static_cast<kube::Cache<T>&>(*found->second);
  }

  // Where the caches run: Make's are started on it by the daemon, the optional kinds' here.
  kube::InformerLoop& Loop() { return loop_; }

  // The GPUDevice indexes the binder (pending requests), the webhooks (a VMI's devices) and the
  // reconciler query. Before the caches start.
  void AddDeviceIndexes();

  // Loop thread: starts or stops the kinds that come and go as discovery now says they are
  // served (logged); returns whether any started or stopped (the passes then run again).
  bool FollowDiscovery();
  // Stops the kinds that come and go, whatever runs.
  void StopOptional();
  // Each of those that runs now, by name.
  template <class Visit>
  void ForEachOptional(Visit&& visit) const {
    ForEachWatched([&](const auto& watched) {
      if (!watched.followsDiscovery) return;
      if (auto cache = Running(watched)) visit(watched.Name(), *cache);
    });
  }
  // The cache of a kind that comes and goes while its kind is served; nullptr otherwise. Any
  // thread.
  template <class T>
  std::shared_ptr<kube::Cache<T>> Running(const Watched<T>& watched) const {
    return OptionalOf(watched).Get();
  }

  // Everything the model reads but the devices (each kind of the table into its snapshot
  // member), as the caches show it; returns whether the VMIs are known (their kind served and
  // its cache synced, G7). Any thread.
  bool FillSnapshot(model::Snapshot& snapshot) const;
  // Why the DRA units cannot be counted now (model::Snapshot::draUnknown), "" when they can:
  // both resource.k8s.io kinds served and both caches synced. Any thread.
  std::string DraUnknown() const;
  // KubeVirt's permittedHostDevices, while its cache runs and has its object; else empty.
  model::PermittedHostDevices PermittedHostDevices() const;
  // The reconciler's input for a pass now. The reconciler's worker.
  ReconcileInput BuildInput() const;
  // The webhooks' view: the snapshot with the devices, and the model built over it once (a model
  // that refuses the snapshot leaves its error instead). Any thread.
  // `previous` (the view this one replaces, or null) lends the model what both share.
  std::shared_ptr<const webhook::Prepared> Prepared(const webhook::Prepared* previous) const;
  // The GPUDevices as the cache holds them now: the cache's own objects, none copied (a
  // pointer each), and the very list of the call before while the cache has not changed since
  // (a pod's change renews the webhooks' view without even that; docs/controller.md, "What each
  // webhook reads"). Any thread.
  model::SharedVector<api::GpuDevice> DevicesNow() const;

 private:
  // The factory of a kind that comes and goes: its cache made from `watched`, its changes
  // (those its `matters` lets through) reported through `changed_` as its readers'.
  template <class T>
  typename kube::OptionalCache<T>::Factory Optional(const Watched<T>& watched) {
    return [this, &watched] {
      std::shared_ptr<kube::Cache<T>> cache = watched.Make(client_, options_.namespaceName);
      cache->SetOnChange([this, readers = watched.readers] { changed_(readers); });
      return cache;
    };
  }
  // The OptionalCache of a kind that comes and goes (made in the constructor).
  template <class T>
  kube::OptionalCache<T>& OptionalOf(const Watched<T>& watched) const {
    return *static_cast<kube::OptionalCache<T>*>(optional_.at(&watched).get());
  }
  // The cache of a kind that comes and goes, when it runs, has listed and its objects are known
  // (knownOnlyWhileServed: discovery says served); nullptr otherwise.
  template <class T>
  std::shared_ptr<kube::Cache<T>> Readable(const Watched<T>& watched) const {
    if (watched.knownOnlyWhileServed &&
        discovery_.IsServed(watched.kind.Resource()) != kube::Served::kServed) {
      return nullptr;
    }
    auto cache = Running(watched);
    return cache && cache->Synced() ? cache : nullptr;
  }
  // Discovery's word on a kind that comes and goes: with `servedWith`, served only while both are.
  template <class T>
  kube::Served ServedNow(const Watched<T>& watched) const;
  // How this pass tells whether a VMI exists (controller/daemon/vmi_lookup.h).
  VmiLookup VmiLookupForPass() const;

  kube::Client& client_;
  kube::Discovery& discovery_;
  const CacheOptions options_;
  Changed changed_;
  // The caches Make made, by their constant.
  std::map<const void*, std::unique_ptr<kube::CacheBase>> made_;
  // The devices as the cache held them at `devicesVersion_`, shared by the webhooks' snapshots
  // of every state since in which only other kinds changed (DevicesNow).
  mutable std::mutex devicesMutex_;
  mutable std::optional<uint64_t> devicesVersion_;
  mutable model::SharedVector<api::GpuDevice> devices_;
  // The kinds that come and go, an OptionalCache<T> each, by their constant. Last: its caches'
  // changes call `changed_`.
  std::map<const void*, std::shared_ptr<void>> optional_;
};

}  // namespace cozy::controller
