// One thread that reads every cache's watch (docs/kubernetes.md, "One thread for every cache's
// watch"), as client-go's shared informers share one process: a daemon's caches sleep together in
// one poll(2) over all their watch sockets and timers, and each is stepped only when its socket has
// something or its timer is due.
//
// A list is the exception. It is a blocking request (a relist of 100,000 pods takes seconds), so
// it never runs on the shared thread: a member whose list is due is handed to a list worker for
// that one step, and the shared thread goes on reading the other members' watches meanwhile. A
// VM start's answer that waits for a GPUDevice event never waits behind a relist of pods. While a
// member is out on its list the loop does not touch it; it comes back with its new watch open.
//
// The list workers are a runtime::WorkerPool (docs/runtime.md, "One pool"): its threads are
// made as lists need them (as many as ran at once, one per member at most) and kept, idle, for
// the relists that follow. They are never let go while the loop lives: a thread
// that ends hands its malloc arena, which holds the objects its list decoded, to the next thread
// made (the binder's, a writer's), whose allocations then fall among the cache's objects. Lists
// on threads that ended after each made the binder's passes 20-30 % slower at 5,000 nodes
// (docs/benchmarks.md).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kube/clock.h"
#include "kube/watch.h"
#include "runtime/worker_pool.h"

namespace cozy::kube {

// What the loop steps: a cache over its informer. Its calls come from one thread at a time (the
// loop's, or a list worker's), never two at once.
class LoopMember {
 public:
  struct Next {
    TimePoint at;                         // step again by then at the latest
    std::vector<WatchStream::Fd> wakeOn;  // sockets whose activity steps it sooner
  };
  virtual ~LoopMember() = default;
  // One step at `now`. With mayList false, a list that falls due is left for a step with it
  // (ListDue() then says so).
  virtual Next Step(TimePoint now, bool mayList) = 0;
  // The next step would list: the loop hands it to a list worker.
  virtual bool ListDue(TimePoint now) const = 0;
  // Names its list's thread ("l:" and this, within Linux's 15 bytes).
  virtual std::string LoopName() const = 0;
};

class InformerLoop {
 public:
  // `threadName` names the shared thread; `time` is the clock of every member's client (an
  // injected clock moves only when slept on, so there a wait is capped at 100 ms of real time).
  InformerLoop(std::string threadName, TimeSource& time);
  // Waits for lists in flight, then ends the list workers; members still in it are dropped.
  ~InformerLoop();
  InformerLoop(const InformerLoop&) = delete;
  InformerLoop& operator=(const InformerLoop&) = delete;

  // Steps `member` from now on (its first step at once); the thread starts with the first.
  void Add(LoopMember& member);
  // Steps it no more; waits for its step or list in flight (at most the client's request
  // timeout). Never from a member's own step.
  void Remove(LoopMember& member);

  // Times the shared thread has woken (a poll that returned, a timer due, an Add or a Remove).
  uint64_t Wakeups() const;
  // Lists handed to list workers, so far.
  uint64_t Lists() const;
  // List workers made, so far (as many as lists ran at once).
  size_t ListWorkers() const;

 private:
  struct Entry {
    LoopMember* member;
    LoopMember::Next next;
    bool ready = true;  // its socket had something, or it is new: step it now
    bool busy = false;  // stepped (or listing) now, outside the lock
  };
  void Run();
  // A list worker's job: lists the member whose list waits longest, if one still does.
  void ListOne();
  void Wake();

  std::string threadName_;
  TimeSource& time_;
  const bool realClock_;
  int wake_ = -1;  // eventfd: Add, Remove, a finished list and the destructor wake the poll
  mutable std::mutex mutex_;
  std::condition_variable idle_;  // an entry's busy went false
  std::list<Entry> entries_;
  std::deque<Entry*> toList_;  // busy entries whose list a worker has yet to take
  bool stopping_ = false;
  uint64_t wakeups_ = 0;
  uint64_t lists_ = 0;
  std::thread thread_;
  runtime::WorkerPool listWorkers_;  // a job for each list handed over
};

}  // namespace cozy::kube
