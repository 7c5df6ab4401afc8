#include "runtime/pass_scheduler.h"

#include <algorithm>
#include <utility>

namespace cozy::runtime {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

PassScheduler::PassScheduler(Loop& loop, const std::string& name, std::function<bool()> start)
    : start_(std::move(start)), timer_(loop.AddTimer(name, [this] { Fire(); })) {}

void PassScheduler::ArmAt(TimePoint due) {
  const TimePoint now = steady_clock::now();
  if (timer_.Armed() && due_ <= due) return;  // never pushed back
  timer_.Arm(std::chrono::ceil<milliseconds>(std::max(due, now) - now));
  due_ = due;
}

void PassScheduler::Ask(milliseconds within) {
  if (stopped_) return;
  within = std::max(within, milliseconds(0));
  if (running_) {
    again_ = again_ ? std::min(*again_, within) : within;
    return;
  }
  const TimePoint now = steady_clock::now();
  ArmAt(within == milliseconds(0) ? now : std::max(now + within, hold_));
}

void PassScheduler::Fire() {
  if (stopped_) return;
  if (running_) {
    again_ = milliseconds(0);
    return;
  }
  running_ = start_();
}

void PassScheduler::Finished(std::optional<milliseconds> retry) {
  running_ = false;
  if (stopped_) return;
  if (retry) {
    hold_ = steady_clock::now() + *retry;
    // The retry replaces what was armed (nothing, while the pass ran).
    timer_.Cancel();
    ArmAt(hold_);
  } else {
    hold_ = {};  // it went through: the hold-off of a failed one before it is over
  }
  if (again_) {
    const milliseconds within = *again_;
    again_.reset();
    Ask(within);
  }
}

void PassScheduler::Stop() {
  stopped_ = true;
  timer_.Cancel();
  again_.reset();
}

}  // namespace cozy::runtime
