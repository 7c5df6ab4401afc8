#include "runtime/worker_pool.h"

#include <utility>

#include "runtime/thread_name.h"

namespace cozy::runtime {

WorkerPool::WorkerPool(std::string threadName, size_t capacity)
    : threadName_(std::move(threadName)), capacity_(capacity) {}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard lock(mutex_);
    closing_ = true;
  }
  work_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

void WorkerPool::Submit(std::function<void()> job) {
  {
    std::lock_guard lock(mutex_);
    jobs_.push_back(std::move(job));
    if (idle_ == 0 && threads_.size() < capacity_) {
      threads_.emplace_back([this] { Main(); });
    }
  }
  work_.notify_one();
}

void WorkerPool::WaitUntil(const std::function<bool()>& ready) {
  std::unique_lock lock(mutex_);
  ended_.wait(lock, ready);
}

void WorkerPool::WaitIdle() {
  std::unique_lock lock(mutex_);
  ended_.wait(lock, [this] { return jobs_.empty() && running_ == 0; });
}

size_t WorkerPool::Threads() const {
  std::lock_guard lock(mutex_);
  return threads_.size();
}

void WorkerPool::Main() {
  NameThisThread(threadName_);
  std::unique_lock lock(mutex_);
  for (;;) {
    ++idle_;
    work_.wait(lock, [this] { return closing_ || !jobs_.empty(); });
    --idle_;
    if (jobs_.empty()) return;  // closing, and nothing left
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    ++running_;
    lock.unlock();
    job();
    job = nullptr;  // what it holds goes before the job counts as ended
    lock.lock();
    --running_;
    ended_.notify_all();
  }
}

}  // namespace cozy::runtime
