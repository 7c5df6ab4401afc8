// The node's pods as the agent sees them: phases by "namespace/name". A finished pod's devices
// are free even while kubelet still lists them (A7), so the pass needs the phases.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "agent/sources/source.h"
#include "agent/status/pod_phases.h"
#include "kube/client.h"
#include "kube/informer.h"
#include "kube/informer_loop.h"

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

// The node's pods from the API server (list + watch, field selector spec.nodeName), on an
// informer loop of its own (kube/informer_loop.h, thread `pod-watch`) that sleeps on the watch's
// socket: no periodic poll, and a LIST that takes 9 s in a brownout holds a thread of its own
// (`l:pods`), never the loop.
class ApiPodWatch : public PodWatch, private kube::LoopMember {
 public:
  ApiPodWatch(kube::Client& client, const std::string& nodeName);
  ~ApiPodWatch() override;
  void Start(runtime::Loop& loop, Changed changed) override;
  bool Settled() const override { return settled_; }
  const PodPhases& Phases() const override { return phases_; }

 private:
  Next Step(kube::TimePoint now, bool mayList) override;
  bool ListDue(kube::TimePoint now) const override { return informer_.ListDue(now); }
  std::string LoopName() const override { return "pods"; }
  // After a step: posts the phases to the daemon's loop when they changed, and once the watch
  // settled.
  void Report();

  kube::Client& client_;
  kube::Informer informer_;
  // The steps' state (one step at a time, on the informer loop or a list's thread).
  runtime::Loop* events_ = nullptr;
  Changed changed_;
  std::string lastError_;
  bool reportedSettled_ = false;
  PodPhases last_;
  bool eventsSinceRead_ = true;  // the cache changed since phases were read
  // Loop-thread state, updated by posted work.
  PodPhases phases_;
  bool settled_ = false;
  std::unique_ptr<kube::InformerLoop> watching_;  // last: stopped before the rest goes
};

// The client settings the daemon uses: no retries inside a call (the publisher and the
// informer schedule their own) and timeouts, so a hung API server holds a worker for a bounded
// time only.
kube::ClientOptions LoopClientOptions();

}  // namespace cozy::agent
