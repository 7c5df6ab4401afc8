#include "controller/daemon/view.h"

#include <algorithm>

#include "controller/model/readers.h"
#include "controller/watched.h"

namespace cozy::controller {

void ClusterView::Changed() {
  {
    std::lock_guard lock(changedMutex_);
    ++generation_;
  }
  changed_.notify_all();
}

bool ClusterView::ReconcilerCachesSynced() const {
  return std::all_of(reconcilerReads_.begin(), reconcilerReads_.end(),
                     [](const kube::CacheBase* cache) { return cache->Synced(); });
}

bool ClusterView::AnyUnansweredRequest() const {
  return !caches_.Get(kDeviceCache).IndexKeys("pending", "pending").empty();
}

std::vector<std::shared_ptr<const api::GpuDevice>> ClusterView::CachedDevices() const {
  return caches_.Get(kDeviceCache).List();
}

std::shared_ptr<const api::GpuDevice> ClusterView::CachedDevice(const std::string& key) const {
  return caches_.Get(kDeviceCache).Get(key);
}

void ClusterView::WaitForChange(uint64_t seen, std::chrono::steady_clock::time_point until) const {
  std::unique_lock lock(changedMutex_);
  changed_.wait_until(lock, until, [&] { return generation_.load() != seen; });
}

std::shared_ptr<const webhook::Prepared> ClusterView::Prepare() {
  std::lock_guard lock(preparedMutex_);
  // Read the generation before the caches: a change during the build makes the next request
  // build again rather than keep a state older than it claims.
  const uint64_t generation = generation_.load();
  if (prepared_ && preparedGeneration_ == generation) return prepared_;
  // The view it replaces lends the new one's model what did not change (the nodes' tables, the
  // numbers of every device object both hold), and goes once that is built.
  const std::shared_ptr<const webhook::Prepared> previous = std::move(prepared_);
  prepared_ = caches_.Prepared(previous.get());
  preparedGeneration_ = generation;
  return prepared_;
}

std::shared_ptr<const api::GpuDevice> ClusterView::Device(const std::string& ns,
                                                          const std::string& name) const {
  return caches_.Get(kDeviceCache).Get(ns + "/" + name);
}

std::vector<std::shared_ptr<const api::GpuDevice>> ClusterView::AttachedTo(
    const std::string& ns, const std::string& vmiName) const {
  return caches_.Get(kDeviceCache).ByIndex("vmi", ns + "/" + vmiName);
}

bool PodChanges::Matters(const model::Pod* before, const model::Pod* after) {
  if (!model::PodChangeMatters(before, after)) return false;
  // Absorbed, or recorded for the pass in flight (which passes again if its room does not take
  // it): the webhooks' snapshot renews, no pass wakes now.
  if (room_ != nullptr && room_->Absorbs(before, after) != QuietRoom::Take::kRefused) {
    absorbed_ = true;
  } else {
    wakeBinder_ = true;
  }
  return true;
}

ClusterCaches::Readers PodChanges::TakeStep() {
  const bool absorbedOnly = absorbed_ && !wakeBinder_;
  absorbed_ = wakeBinder_ = false;
  return absorbedOnly ? ClusterCaches::Readers::kNone : ClusterCaches::Readers::kBinder;
}

}  // namespace cozy::controller
