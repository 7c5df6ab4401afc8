#include "kube/backoff.h"

#include <algorithm>
#include <cmath>

namespace cozy::kube {

Backoff::Backoff(BackoffPolicy policy, RandomSource random)
    : policy_(policy), random_(std::move(random)), current_(policy.initial) {}

Duration Backoff::Next() {
  Duration base = std::min(current_, policy_.cap);
  auto stretched = static_cast<double>(base.count()) * (1.0 + policy_.jitter * random_());
  auto grown = static_cast<double>(current_.count()) * policy_.factor;
  current_ = Duration(
      static_cast<Duration::rep>(std::min(grown, static_cast<double>(policy_.cap.count()))));
  ++failures_;
  return Duration(static_cast<Duration::rep>(stretched));
}

void Backoff::Reset() {
  current_ = policy_.initial;
  failures_ = 0;
}

RateLimiter::RateLimiter(double qps, int burst, TimeSource& time)
    : qps_(qps), burst_(std::max(1, burst)), time_(time), tokens_(burst_), last_(time.Now()) {}

void RateLimiter::Refill(TimePoint now) {
  if (now > last_) {
    double seconds = std::chrono::duration<double>(now - last_).count();
    tokens_ = std::min(burst_, tokens_ + seconds * qps_);
    last_ = now;
  }
}

Duration RateLimiter::Delay() {
  std::lock_guard lock(mutex_);
  if (qps_ <= 0) return Duration::zero();
  Refill(time_.Now());
  if (tokens_ >= 1.0) return Duration::zero();
  return std::chrono::duration_cast<Duration>(
      std::chrono::duration<double>((1.0 - tokens_) / qps_));
}

void RateLimiter::Acquire() {
  if (qps_ <= 0) return;  // unlimited
  std::unique_lock lock(mutex_);
  Refill(time_.Now());
  // Take the token now (possibly going negative) so concurrent callers queue up in order,
  // then sleep off the debt outside the lock.
  tokens_ -= 1.0;
  if (tokens_ >= 0.0) return;
  auto wait = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(-tokens_ / qps_));
  lock.unlock();
  time_.SleepFor(wait);
}

}  // namespace cozy::kube
