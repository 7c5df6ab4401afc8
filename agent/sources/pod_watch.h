// The node's pods as the agent sees them: phases by "namespace/name". A finished pod's devices
// are free even while kubelet still lists them (A7), so the pass needs the phases.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "agent/sources/source.h"
#include "agent/status/pod_phases.h"
#include "kube/client.h"
#include "kube/informer.h"

namespace cozy::agent {

class PodWatch : public Source {
 public:
  std::string_view Name() const override { return "pod watch"; }
  // Loop thread: the phases as of the last change reported.
  virtual const PodPhases& Phases() const = 0;
};

// Phases given once (the test-only --pod-phases): settled from the start, never changing.
class FixedPodPhases : public PodWatch {
 public:
  explicit FixedPodPhases(PodPhases phases) : phases_(std::move(phases)) {}
  void Start(runtime::Loop& /*loop*/, Changed /*changed*/) override {}
  const PodPhases& Phases() const override { return phases_; }

 private:
  PodPhases phases_;
};

// The node's pods from the API server (list + watch, field selector spec.nodeName), on a
// thread of its own: a LIST that takes 9 s in a brownout holds that thread, never the loop.
class ApiPodWatch : public PodWatch {
 public:
  ApiPodWatch(kube::Client& client, const std::string& nodeName);
  ~ApiPodWatch() override;
  void Start(runtime::Loop& loop, Changed changed) override;
  bool Settled() const override { return settled_; }
  const PodPhases& Phases() const override { return phases_; }

 private:
  void Main(runtime::Loop& loop, Changed changed);

  kube::Informer informer_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  bool eventsSinceRead_ = true;  // the watch thread's: the cache changed since phases were read
  // Loop-thread state, updated by posted work.
  PodPhases phases_;
  bool settled_ = false;
};

// The client settings the daemon uses: no retries inside a call (the publisher and the
// informer schedule their own) and timeouts, so a hung API server holds a worker for a bounded
// time only.
kube::ClientOptions LoopClientOptions();

}  // namespace cozy::agent
