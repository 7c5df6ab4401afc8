// Retry pacing shared by the client, the informer and the publisher: exponential backoff with
// jitter, and a client-side token-bucket rate limit (client-go's defaults, research §3).
#pragma once

#include <mutex>

#include "kube/clock.h"

namespace cozy::kube {

struct BackoffPolicy {
  Duration initial = std::chrono::milliseconds(800);  // client-go reflector's start
  Duration cap = std::chrono::seconds(30);
  double factor = 2.0;
  // Each delay is stretched by up to this fraction, at random: 1.0 spreads a restarted fleet
  // over [d, 2d) so it does not hammer a recovering API server in lock step.
  double jitter = 1.0;
};

// One failing operation's backoff. Next() gives the wait before the next try and grows the
// base; Reset() after a success starts over.
class Backoff {
 public:
  explicit Backoff(BackoffPolicy policy = {}, RandomSource random = DefaultRandomSource());
  Duration Next();
  void Reset();
  int Failures() const { return failures_; }

 private:
  BackoffPolicy policy_;
  RandomSource random_;
  Duration current_;
  int failures_ = 0;
};

// Token bucket: `qps` tokens a second, at most `burst` saved up. Acquire() waits (through the
// time source) until a token is there; client-go's default is 5 qps, burst 10.
class RateLimiter {
 public:
  RateLimiter(double qps, int burst, TimeSource& time);
  void Acquire();
  // How long Acquire would wait now, without taking a token.
  Duration Delay();

 private:
  void Refill(TimePoint now);
  double qps_;
  double burst_;
  TimeSource& time_;
  std::mutex mutex_;
  double tokens_;
  TimePoint last_;
};

}  // namespace cozy::kube
