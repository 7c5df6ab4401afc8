#include "kube/backoff.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <utility>

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

KeyedBackoff::KeyedBackoff(BackoffPolicy policy, RandomSource random)
    : policy_(policy), random_(std::move(random)) {}

TimePoint KeyedBackoff::Failed(const std::string& key, TimePoint now, const std::string& version) {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    it = entries_.emplace(key, Entry{Backoff(policy_, random_), now, version}).first;
  }
  it->second.retryAt = now + it->second.backoff.Next();
  it->second.version = version;
  return it->second.retryAt;
}

void KeyedBackoff::Succeeded(const std::string& key) { entries_.erase(key); }

bool KeyedBackoff::HeldOff(const std::string& key, TimePoint now,
                           const std::string& version) const {
  auto it = entries_.find(key);
  if (it == entries_.end() || now >= it->second.retryAt) return false;
  return it->second.version.empty() || it->second.version == version;
}

std::optional<TimePoint> KeyedBackoff::NextRetry(TimePoint now) const {
  std::optional<TimePoint> next;
  for (const auto& [key, entry] : entries_) {
    if (entry.retryAt > now && (!next || entry.retryAt < *next)) next = entry.retryAt;
  }
  return next;
}

void KeyedBackoff::Prune(TimePoint now) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    it = now - it->second.retryAt > policy_.cap ? entries_.erase(it) : std::next(it);
  }
}

int KeyedBackoff::Failures(const std::string& key) const {
  auto it = entries_.find(key);
  return it == entries_.end() ? 0 : it->second.backoff.Failures();
}

size_t KeyedBackoff::HeldCount(TimePoint now) const {
  size_t held = 0;
  for (const auto& [key, entry] : entries_) held += entry.retryAt > now ? 1U : 0U;
  return held;
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
