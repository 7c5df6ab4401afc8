// Time for the Kubernetes client: a clock that can also wait, so retries, backoff, the token
// reload period and the rate limit run on injected time in tests (milliseconds, not minutes).
#pragma once

#include <chrono>
#include <functional>
#include <mutex>
#include <vector>

namespace cozy::kube {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;
using Duration = std::chrono::nanoseconds;

class TimeSource {
 public:
  virtual ~TimeSource() = default;
  virtual TimePoint Now() = 0;
  // Blocks the caller for `duration` (a fake advances its time instead).
  virtual void SleepFor(Duration duration) = 0;
};

// The real steady clock; the process-wide default.
class SystemTimeSource final : public TimeSource {
 public:
  TimePoint Now() override { return Clock::now(); }
  void SleepFor(Duration duration) override;
};
TimeSource& DefaultTimeSource();

// Manual time for tests: SleepFor advances Now and records the wait instead of blocking.
class FakeTimeSource final : public TimeSource {
 public:
  TimePoint Now() override;
  void SleepFor(Duration duration) override;
  void Advance(Duration duration);
  std::vector<Duration> Sleeps() const;

 private:
  mutable std::mutex mutex_;
  TimePoint now_ = TimePoint{} + std::chrono::hours(1);
  std::vector<Duration> sleeps_;
};

// Uniform random numbers in [0, 1) for jitter; injectable so tests can pin the jitter.
using RandomSource = std::function<double()>;
RandomSource DefaultRandomSource();

}  // namespace cozy::kube
