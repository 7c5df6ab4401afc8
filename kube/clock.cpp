#include "kube/clock.h"

#include <memory>
#include <random>
#include <thread>

namespace cozy::kube {

void SystemTimeSource::SleepFor(Duration duration) { std::this_thread::sleep_for(duration); }

TimeSource& DefaultTimeSource() {
  static SystemTimeSource source;
  return source;
}

TimePoint FakeTimeSource::Now() {
  std::lock_guard lock(mutex_);
  return now_;
}

void FakeTimeSource::SleepFor(Duration duration) {
  std::lock_guard lock(mutex_);
  now_ += duration;
  sleeps_.push_back(duration);
}

void FakeTimeSource::Advance(Duration duration) {
  std::lock_guard lock(mutex_);
  now_ += duration;
}

std::vector<Duration> FakeTimeSource::Sleeps() const {
  std::lock_guard lock(mutex_);
  return sleeps_;
}

RandomSource DefaultRandomSource() {
  // One generator per source, seeded once: jitter needs spread between agents, not secrecy.
  auto generator = std::make_shared<std::mt19937_64>(std::random_device{}());
  auto mutex = std::make_shared<std::mutex>();
  return [generator, mutex] {
    std::lock_guard lock(*mutex);
    return std::uniform_real_distribution<double>(0.0, 1.0)(*generator);
  };
}

}  // namespace cozy::kube
