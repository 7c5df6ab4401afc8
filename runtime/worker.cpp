#include "runtime/worker.h"

#include "runtime/log.h"
#include "runtime/thread_name.h"

namespace cozy::runtime {

Worker::Worker(std::string name) : name_(std::move(name)), thread_([this] { Main(); }) {}

Worker::~Worker() { Stop(); }

void Worker::Run(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) {
      return;
    }
    jobs_.push_back(std::move(job));
  }
  wake_.notify_one();
}

void Worker::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    jobs_.clear();
  }
  wake_.notify_one();
  if (thread_.joinable()) {
    thread_.join();
  }
}

void Worker::Main() {
  NameThisThread(name_);
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wake_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
    if (stopping_) {
      return;
    }
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    try {
      job();
    } catch (const std::exception& error) {
      LogError("a background job failed", {{"worker", name_}, {"reason", error.what()}});
    } catch (...) {
      LogError("a background job failed", {{"worker", name_}, {"reason", "unknown exception"}});
    }
    lock.lock();
  }
}

}  // namespace cozy::runtime
