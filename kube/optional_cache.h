// A cache of a kind that may come and go with its CRD (KubeVirt's, Cozystack's): started once
// discovery says the kind is served, dropped when it says it is not, so a reinstalled CRD is
// listed anew without a restart. A discovery that fails or has not answered changes nothing:
// the cache keeps what it has. Readers take a shared pointer and keep it for their pass, so a
// cache dropped meanwhile lives until its last reader lets go (and leaves its loop then).
#pragma once

#include <functional>
#include <memory>
#include <mutex>

#include "kube/cache.h"
#include "kube/discovery.h"

namespace cozy::kube {

template <class T>
class OptionalCache {
 public:
  // Makes the cache, with its change filter and callback set, not yet started.
  using Factory = std::function<std::shared_ptr<Cache<T>>()>;
  // Its caches run on `loop` (nullptr: each on a loop of its own), which outlives this.
  explicit OptionalCache(Factory factory, InformerLoop* loop = nullptr)
      : factory_(std::move(factory)), loop_(loop) {}

  // Follows discovery's word on the kind; returns whether the cache started or went.
  bool Follow(Served served) {
    std::shared_ptr<Cache<T>> gone;
    {
      std::lock_guard lock(mutex_);
      if (served == Served::kServed && !cache_) {
        cache_ = factory_();
        cache_->Start(loop_);
        return true;
      }
      if (served == Served::kNotServed && cache_) {
        gone = std::move(cache_);
      }
    }
    return gone != nullptr;  // the last holder's release stops it
  }
  // The cache while the kind is served; nullptr otherwise. Any thread.
  std::shared_ptr<Cache<T>> Get() const {
    std::lock_guard lock(mutex_);
    return cache_;
  }
  // Drops the cache and stops it now (the daemon's stop).
  void Stop() {
    std::shared_ptr<Cache<T>> gone;
    {
      std::lock_guard lock(mutex_);
      gone = std::move(cache_);
    }
    if (gone) gone->Stop();
  }

 private:
  Factory factory_;
  InformerLoop* loop_;
  mutable std::mutex mutex_;
  std::shared_ptr<Cache<T>> cache_;
};

}  // namespace cozy::kube
