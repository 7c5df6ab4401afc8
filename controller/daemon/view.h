// What a replica's passes and webhooks read of its caches (docs/controller.md, "What each replica
// runs"): the binder's source, the reconciler's and the webhooks' cluster, over ClusterCaches and
// the manager's readiness. It counts the caches' changes (Generation), wakes whoever waits for
// one, and keeps the webhooks' prepared snapshot and model for the state it was built at. The
// daemon wires the caches to it; it knows nothing of the loop, the Lease or the passes.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "controller/binder/loop.h"
#include "controller/daemon/caches.h"
#include "controller/reconciler/loop.h"
#include "controller/webhook/webhooks.h"
#include "kube/cache.h"
#include "runtime/manager.h"

namespace cozy::controller {

class ClusterView : public webhook::ClusterSource, public BinderSource, public ReconcilerSource {
 public:
  // Both outlive this; readiness is the manager's (every runnable started, every cache that
  // gates it synced).
  ClusterView(const ClusterCaches& caches, const runtime::Manager& manager)
      : caches_(caches), manager_(manager) {}

  // While wiring: a cache the reconciler's passes wait for.
  void ReconcilerReads(const kube::CacheBase& cache) { reconcilerReads_.push_back(&cache); }
  // Any thread: the caches changed; the next Prepare builds again and waiters wake.
  void Changed();

  // ReconcilerSource, for the reconciler's loop.
  bool ReconcilerCachesSynced() const override;
  ReconcileInput BuildInput() const override { return caches_.BuildInput(); }

  // BinderSource, for the binder's loop.
  bool BinderCachesSynced() const override { return manager_.Ready(); }
  bool AnyUnansweredRequest() const override;
  std::vector<std::shared_ptr<const api::GpuDevice>> CachedDevices() const override;
  std::shared_ptr<const api::GpuDevice> CachedDevice(const std::string& key) const override;
  bool FillSnapshot(model::Snapshot& snapshot) const override {
    return caches_.FillSnapshot(snapshot);
  }

  // webhook::ClusterSource, on the webhook server's threads (Generation and WaitForChange are
  // BinderSource's too, on the binder's worker).
  bool Synced() const override { return manager_.Ready(); }
  uint64_t Generation() const override { return generation_.load(); }
  void WaitForChange(uint64_t seen, std::chrono::steady_clock::time_point until) const override;
  std::shared_ptr<const webhook::Prepared> Prepare() override;
  std::shared_ptr<const api::GpuDevice> Device(const std::string& ns,
                                               const std::string& name) const override;
  std::vector<std::shared_ptr<const api::GpuDevice>> AttachedTo(
      const std::string& ns, const std::string& vmiName) const override;

 private:
  const ClusterCaches& caches_;
  const runtime::Manager& manager_;
  std::vector<const kube::CacheBase*> reconcilerReads_;
  std::atomic<uint64_t> generation_{0};
  // Signalled with each change, for the webhooks waiting on the binder's answer.
  mutable std::mutex changedMutex_;
  mutable std::condition_variable changed_;
  // The webhooks' view: the snapshot and model for one state of the caches, built again when a
  // cache changed.
  std::mutex preparedMutex_;
  std::shared_ptr<const webhook::Prepared> prepared_;
  uint64_t preparedGeneration_ = 0;
};

// The pods cache's filter, of two steps (docs/controller.md, "Who wakes for a change"). A change
// the model reads nothing different in (model::PodChangeMatters) is taken quietly. Of the others,
// those the binder's quiet room absorbs (the last full pass decided only held keeps, and the
// pod's units fit in its node's room) still renew the webhooks' snapshot, whose budgets and room
// count the pod, but wake no binder pass. Matters runs for each change of a step, and TakeStep
// after them, on the thread that steps the pods cache (the informer loop's, or a list worker's
// while the cache lists; never two at once).
class PodChanges {
 public:
  // `room`: the binder's (null with GPUs off: every change that matters wakes the binder).
  explicit PodChanges(QuietRoom* room) : room_(room) {}
  bool Matters(const model::Pod* before, const model::Pod* after);
  // Who the step's changes wake: nobody when the room absorbed them all, else the binder.
  ClusterCaches::Readers TakeStep();

 private:
  QuietRoom* room_;
  bool absorbed_ = false;
  bool wakeBinder_ = false;
};

}  // namespace cozy::controller
