// A thread that runs jobs one at a time, in the order given: where a daemon's blocking calls
// (an API request that takes 9 s in a brownout, a gRPC call to a hung kubelet) go, so the loop
// thread never waits on them. Results travel back with Loop::Post.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace cozy::runtime {

class Worker {
 public:
  explicit Worker(std::string name);
  // Stops: the job running now finishes (blocking calls carry their own timeouts), queued ones
  // are dropped.
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Thread-safe. A job that throws is logged with the worker's name; the worker goes on.
  void Run(std::function<void()> job);
  void Stop();

 private:
  void Main();

  std::string name_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace cozy::runtime
