// A pool of up to `capacity` threads for calls that block (docs/runtime.md): a thread is started
// as a job comes and none is idle, and each takes the oldest job waiting. The threads live as
// long as the pool, so a part that sends a burst of requests every pass (the binder's placement
// writes) pays for its threads once, not once a pass. The destructor lets every job handed over
// finish, then joins the threads.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace cozy::runtime {

class WorkerPool {
 public:
  // `threadName` names its threads (in top, /proc).
  WorkerPool(std::string threadName, size_t capacity);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Any thread.
  void Submit(std::function<void()> job);
  // Waits until `ready` holds; it is checked again each time a job ends.
  void WaitUntil(const std::function<bool()>& ready);
  // Waits until no job waits or runs: what the jobs handed over refer to may go after it.
  void WaitIdle();
  // Threads started so far.
  size_t Threads() const;

 private:
  void Main();

  const std::string threadName_;
  const size_t capacity_;
  mutable std::mutex mutex_;
  std::condition_variable work_;
  std::condition_variable ended_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  size_t running_ = 0;
  bool closing_ = false;
};

}  // namespace cozy::runtime
