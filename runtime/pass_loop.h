// The passes of a daemon's part, one loop type for all of them (docs/runtime.md, "One pass
// loop"): asked for on the loop thread and run one at a time through a PassScheduler (debounced,
// single-flight), each on a worker thread of the loop's own, its result handed back to the loop
// thread. The owner gives the pass to run when one is due (or none, when none may start now) and
// what to do with its result, which ends the pass (Finished); the loop has the rest: the
// scheduler, the worker, the hand-back and the stop. The controller's reconciler and binder both
// run on one, and so do the agent's reads of kubelet's pod-resources API.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "runtime/loop.h"
#include "runtime/pass_scheduler.h"
#include "runtime/worker.h"

namespace cozy::runtime {

template <class Result>
class PassLoop {
 public:
  // Loop thread, when a pass is due: the pass to run on the worker, or an empty function when
  // none may start now (not leading, caches not synced: what makes one runnable again asks
  // again).
  using Begin = std::function<std::function<Result()>()>;
  // Loop thread: what came of a pass; it calls Finished (with the hold-off it wants).
  using Done = std::function<void(Result)>;

  // `name` names the scheduler's timer; `workerName` the worker thread (in logs, top).
  PassLoop(Loop& loop, std::string name, std::string workerName, Begin begin, Done done)
      : loop_(loop),
        name_(std::move(name)),
        begin_(std::move(begin)),
        done_(std::move(done)),
        worker_(std::move(workerName)) {}
  PassLoop(const PassLoop&) = delete;
  PassLoop& operator=(const PassLoop&) = delete;

  // Loop thread, before or as the loop runs: passes may start from now on.
  void Start() {
    scheduler_ = std::make_unique<PassScheduler>(loop_, name_, [this] { return StartPass(); });
  }
  // Loop thread: a pass no later than `within` from now (PassScheduler::Ask). Nothing before
  // Start or after Stop.
  void Ask(std::chrono::milliseconds within) {
    if (scheduler_ && !stopping_) scheduler_->Ask(within);
  }
  // Loop thread, from Done: the pass has ended (PassScheduler::Finished).
  void Finished(std::optional<std::chrono::milliseconds> retry = std::nullopt) {
    if (scheduler_) scheduler_->Finished(retry);
  }
  // Loop thread: no pass starts after this; the one in flight finishes (its owner has made it
  // stop writing) and is waited for.
  void Stop() {
    stopping_ = true;
    if (scheduler_) scheduler_->Stop();
    worker_.Stop();
  }
  bool Stopping() const { return stopping_; }
  // Loop thread: a pass is in flight (asks now are one more pass after it).
  bool Running() const { return scheduler_ && scheduler_->Running(); }
  bool Started() const { return scheduler_ != nullptr; }

 private:
  bool StartPass() {
    if (stopping_) return false;
    std::function<Result()> pass = begin_();
    if (!pass) return false;
    worker_.Run([this, pass = std::move(pass)] {
      Result result = pass();
      loop_.Post([this, result = std::move(result)]() mutable { done_(std::move(result)); });
    });
    return true;
  }

  Loop& loop_;
  std::string name_;
  Begin begin_;
  Done done_;
  std::unique_ptr<PassScheduler> scheduler_;  // from Start
  bool stopping_ = false;
  Worker worker_;  // declared last: joined before the rest goes
};

}  // namespace cozy::runtime
