#include "runtime/worker_pool.h"

#include <utility>

#include "runtime/thread_name.h"

namespace cozy::runtime {

WorkerPool::WorkerPool(std::string threadName, size_t capacity, size_t maxQueued)
    : threadName_(std::move(threadName)), capacity_(capacity), maxQueued_(maxQueued) {}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard lock(mutex_);
    closing_ = true;
  }
  work_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

void WorkerPool::StartAll() {
  std::lock_guard lock(mutex_);
  while (threads_.size() < capacity_) threads_.emplace_back([this] { Main(); });
}

void WorkerPool::Queue(std::function<void()> job) {
  jobs_.push_back(std::move(job));
  // Counted, not "none idle": an idle thread woken for the job before this one has yet to take
  // it, so two jobs handed over at once find two threads.
  if (idle_ < jobs_.size() && threads_.size() < capacity_) {
    threads_.emplace_back([this] { Main(); });
  }
}

void WorkerPool::Submit(std::function<void()> job) {
  {
    std::lock_guard lock(mutex_);
    if (stopped_) return;
    Queue(std::move(job));
  }
  work_.notify_one();
}

bool WorkerPool::TrySubmit(std::function<void()> job) {
  {
    std::lock_guard lock(mutex_);
    if (stopped_ || jobs_.size() >= maxQueued_) return false;
    Queue(std::move(job));
  }
  work_.notify_one();
  return true;
}

void WorkerPool::WaitUntil(const std::function<bool()>& ready) {
  std::unique_lock lock(mutex_);
  ended_.wait(lock, ready);
}

void WorkerPool::WaitIdle() {
  std::unique_lock lock(mutex_);
  ended_.wait(lock, [this] { return jobs_.empty() && running_ == 0; });
}

void WorkerPool::Stop() {
  std::deque<std::function<void()>> dropped;
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(mutex_);
    stopped_ = true;
    closing_ = true;
    dropped.swap(jobs_);
    threads.swap(threads_);
  }
  work_.notify_all();
  dropped.clear();  // what they hold goes outside the lock
  for (std::thread& thread : threads) thread.join();
}

size_t WorkerPool::Threads() const {
  std::lock_guard lock(mutex_);
  return threads_.size();
}

size_t WorkerPool::Queued() const {
  std::lock_guard lock(mutex_);
  return jobs_.size();
}

size_t WorkerPool::Running() const {
  std::lock_guard lock(mutex_);
  return running_;
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
