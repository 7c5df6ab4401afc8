// Retry pacing shared by the client, the informer and the publisher: exponential backoff with
// jitter, and a client-side token-bucket rate limit (client-go's defaults, research §3).
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <string>

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

// Per-object backoff: the rate limiter of client-go's work queue
// (ItemExponentialFailureRateLimiter), for a pass that writes many objects. Each key that fails
// waits a delay of its own that grows with its failures in a row; a success forgets it; one
// failing object never holds back the others, and the rest of a pass goes on without it.
//
// A failure may name the version it was tried from (a 409: the write was planned from a stale
// read). The key is then held off only while it is planned from that same version: once the
// cache shows a newer one, the write goes at once.
//
// Not thread-safe: one pass at a time owns it (the reconciler's worker).
class KeyedBackoff {
 public:
  explicit KeyedBackoff(BackoffPolicy policy, RandomSource random = DefaultRandomSource());

  // `key` failed at `now` (tried from `version`; "" holds it off whatever it is planned from).
  // Returns when it may be tried again.
  TimePoint Failed(const std::string& key, TimePoint now, const std::string& version = "");
  // `key` was written: its next failure starts over at the initial delay.
  void Succeeded(const std::string& key);
  // Whether a write of `key`, planned from `version`, waits at `now`.
  bool HeldOff(const std::string& key, TimePoint now, const std::string& version = "") const;
  // The earliest instant a key held off now may be tried again (none: nothing is held off).
  std::optional<TimePoint> NextRetry(TimePoint now) const;
  // Forgets keys that have not failed for a whole cap past their retry (an object deleted, or
  // one no pass plans any more), so the map does not grow with every object that ever failed.
  void Prune(TimePoint now);

  int Failures(const std::string& key) const;
  size_t HeldCount(TimePoint now) const;  // keys held off at `now`
  size_t Size() const { return entries_.size(); }

 private:
  struct Entry {
    Backoff backoff;
    TimePoint retryAt;
    std::string version;  // "" : held off whatever version is planned
  };
  BackoffPolicy policy_;
  RandomSource random_;
  std::map<std::string, Entry> entries_;
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
