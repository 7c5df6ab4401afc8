// The runnables of a daemon, started in one order and stopped in the reverse (docs/controller.md,
// "How a replica starts and stops"): each has a name, a start and a stop, and may say whether it
// has synced (a cache that has listed) and whether the daemon's readiness waits for it. Start and
// stop orders are no longer two hand-kept lists that must mirror each other, and readiness is
// derived, not re-listed.
//
// Leader-only work (the controller's reconciler and binder) says so (needsLease): it starts and
// stops with the rest, and Lead() tells it when the replica takes the lead. It is not otherwise
// gated here: each checks the lease before every pass and every write (one leadership handle,
// kube::Leadership), and a lost lease ends that work, not the process (docs/controller.md, "The
// lease"). controller-runtime's manager exits on a lost lease; a replica here stays up and keeps
// answering webhooks from its warm caches as a follower.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace cozy::runtime {

class Manager {
 public:
  struct Runnable {
    std::string name;
    std::function<void()> start;
    std::function<void()> stop;
    std::function<bool()> synced;  // empty: synced once started
    bool gatesReadiness = false;   // Ready() waits for it
    bool needsLease = false;       // it works only while the replica leads
    std::function<void()> lead;    // needsLease: the replica is taking the lead (Lead)
  };

  // Only before Start (std::logic_error after).
  void Add(Runnable runnable);
  // One that is synced once started and does not gate readiness (a server, discovery).
  void Add(std::string name, std::function<void()> start, std::function<void()> stop);
  // Starts each in the order added. A start that throws stops the ones already started, in
  // reverse, and the exception goes on to the caller.
  void Start();
  // Stops what was started, in reverse; once. A stop that throws is logged and the rest go on.
  void Stop();

  // Any thread, from Start on (the elector starts before the parts that lead, and may take the
  // lead before they have started), as the replica takes the lead and before its leadership
  // turns on: each runnable that needs the Lease is told, in order, started or not yet.
  void Lead() const;

  // Any thread (the webhooks ask while the loop starts the rest): every runnable that gates
  // readiness has synced, and every runnable has started (none has stopped).
  bool Ready() const;
  // The names of those that gate readiness and have not synced, in order (what /readyz lacks).
  std::vector<std::string> Waiting() const;
  std::vector<std::string> Names() const;

 private:
  std::vector<Runnable> runnables_;
  std::atomic<size_t> started_{0};  // runnables_[0, started_) are running
  std::atomic<bool> begun_{false};
};

}  // namespace cozy::runtime
