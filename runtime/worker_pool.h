// A pool of up to `capacity` threads for calls that block (docs/runtime.md, "One pool"): a thread
// is started as a job comes and finds none idle (or all at once, StartAll), and each takes the
// oldest job waiting. The threads live as long as the pool, so a part that sends a burst of
// requests every pass (the binder's placement writes) pays for its threads once, not once a
// pass, and a thread's malloc arena is never handed on (the informer loop's lists). A pool may
// bound the jobs that wait for a thread (TrySubmit says when it is full: the HTTP server's
// "busy"). The destructor lets every job handed over finish, then joins the threads; Stop drops
// the jobs still waiting instead.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace cozy::runtime {

class WorkerPool {
 public:
  // `threadName` names its threads (in top, /proc); `maxQueued` bounds the jobs waiting for a
  // thread that TrySubmit takes.
  WorkerPool(std::string threadName, size_t capacity,
             size_t maxQueued = std::numeric_limits<size_t>::max());
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Starts every thread now rather than as jobs come; throws std::system_error when one cannot
  // be made (the threads made so far stay).
  void StartAll();
  // Any thread. Dropped after Stop.
  void Submit(std::function<void()> job);
  // Any thread: false, and the job dropped, when `maxQueued` jobs wait already or after Stop.
  bool TrySubmit(std::function<void()> job);
  // Waits until `ready` holds; it is checked again each time a job ends.
  void WaitUntil(const std::function<bool()>& ready);
  // Waits until no job waits or runs: what the jobs handed over refer to may go after it.
  void WaitIdle();
  // Drops the jobs waiting, waits for the running ones and joins the threads; jobs handed over
  // later are dropped.
  void Stop();
  // Threads started so far.
  size_t Threads() const;
  // Jobs waiting for a thread, and jobs running.
  size_t Queued() const;
  size_t Running() const;
  size_t MaxQueued() const { return maxQueued_; }

 private:
  void Main();
  // Under the lock: queues the job and starts a thread if fewer are idle than jobs wait.
  void Queue(std::function<void()> job);

  const std::string threadName_;
  const size_t capacity_;
  const size_t maxQueued_;
  mutable std::mutex mutex_;
  std::condition_variable work_;
  std::condition_variable ended_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  size_t running_ = 0;
  bool closing_ = false;
  bool stopped_ = false;
};

}  // namespace cozy::runtime
