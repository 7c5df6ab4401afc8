// One pass at a time, asked for from the loop thread: the debounced single-flight runner the
// controller's reconciler and its binder both run their passes through (docs/runtime.md), written
// once instead of once in each; the agent's debounced rescans too.
//
// An ask names how soon the pass must start. Asks while one is armed collapse into it, and a
// sooner ask pulls it forward (a later one never pushes it back). An ask while a pass runs is
// remembered: one more pass, as soon as the soonest such ask said, after the running one ends.
// A pass that failed may hold the next one off (Finished's `retry`): until then only an ask for
// now (0: a tenant waits on the answer) starts one sooner, and a pass that ends without a retry
// (one asked for now went through) ends the hold-off.
// The pass itself is the owner's: `start` runs on the loop thread when one is due, starts it
// (on a worker of the owner's) and says whether it did; its end comes back through Finished().
// A pass that runs on the loop thread inside `start` (the agent's scan pass) is over when
// `start` returns, which then returns false: nothing is left running, and no Finished() follows.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "runtime/loop.h"

namespace cozy::runtime {

class PassScheduler {
 public:
  // `start` returns whether a pass is left running: false when no pass can run now (not
  // leading, caches not synced; what makes one runnable again asks again) and when it ran to its
  // end on the loop thread.
  PassScheduler(Loop& loop, const std::string& name, std::function<bool()> start);
  PassScheduler(const PassScheduler&) = delete;
  PassScheduler& operator=(const PassScheduler&) = delete;

  // Loop thread: a pass no later than `within` from now (past a hold-off, unless `within` is 0).
  void Ask(std::chrono::milliseconds within);
  // Loop thread: the pass `start` started has ended. `retry`: run again after it, and hold off
  // every ask but one for now until then; without it, a hold-off from an earlier pass is over. A
  // pass asked for during the one that ended is armed.
  void Finished(std::optional<std::chrono::milliseconds> retry = std::nullopt);
  // Loop thread: no pass starts after this; one running ends as the owner lets it.
  void Stop();

  bool Running() const { return running_; }
  bool Armed() const { return timer_.Armed(); }

 private:
  using TimePoint = std::chrono::steady_clock::time_point;
  void ArmAt(TimePoint due);
  void Fire();

  std::function<bool()> start_;
  Timer timer_;
  TimePoint due_;                                   // while the timer is armed
  TimePoint hold_;                                  // no pass but one asked for now before this
  std::optional<std::chrono::milliseconds> again_;  // asked while a pass ran
  bool running_ = false;
  bool stopped_ = false;
};

}  // namespace cozy::runtime
