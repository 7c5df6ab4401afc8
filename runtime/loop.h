// The event loop every cozy-gpu daemon runs on: sd-event underneath, with owned, typed sources.
// Each source is a move-only handle that holds its callback and releases its sd-event source when
// it goes out of scope, so no daemon keeps raw sd_event_source pointers or tells its timers apart
// by comparing them. Every callback runs inside a guard: an exception is logged with the source's
// name and never leaves the loop (sd-event is C; an exception through it would terminate).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

struct sd_event;
struct sd_event_source;
struct signalfd_siginfo;

namespace cozy::runtime {

class Loop;

namespace detail {
struct SourceState;
// Releases a source's state; one released from inside its own callback (a connection dropped
// while handling its socket) is freed when that callback returns.
struct SourceStateDeleter {
  void operator()(SourceState* state) const;
};
using SourceStatePtr = std::unique_ptr<SourceState, SourceStateDeleter>;
}  // namespace detail

// An owned sd-event source: disabled and released when the handle is destroyed or reset.
class Source {
 public:
  Source();
  ~Source();
  Source(Source&& other) noexcept;
  Source& operator=(Source&& other) noexcept;
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;

  explicit operator bool() const { return state_ != nullptr; }
  void Reset();
  const std::string& name() const;

 protected:
  explicit Source(detail::SourceStatePtr state);
  detail::SourceStatePtr state_;
  friend class Loop;
};

// A one-shot timer on CLOCK_MONOTONIC with 1 ms accuracy (sd-event's default of 250 ms made a
// 100 ms debounce fire up to 350 ms late). Created disarmed; Arm() (re)starts it.
class Timer : public Source {
 public:
  Timer() = default;
  void Arm(std::chrono::milliseconds delay);
  void Cancel();
  bool Armed() const;

 private:
  using Source::Source;
  friend class Loop;
};

// A file descriptor the loop watches for `events` (EPOLLIN, EPOLLOUT, ...). The fd stays the
// caller's.
class Io : public Source {
 public:
  Io() = default;
  void SetEvents(uint32_t events);

 private:
  using Source::Source;
  friend class Loop;
};

// A signal delivered through signalfd on the loop, never as an asynchronous handler.
class Signal : public Source {
 public:
  Signal() = default;

 private:
  using Source::Source;
  friend class Loop;
};

// A child process the loop reaps; the callback gets its exit status.
class Child : public Source {
 public:
  Child() = default;

 private:
  using Source::Source;
  friend class Loop;
};

// Thrown by Loop's constructor and Add* when sd-event refuses (out of fds, a bad argument).
class LoopError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Loop {
 public:
  Loop();
  ~Loop();
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;

  // The callbacks run on the loop thread. `name` appears in the log when the callback throws.
  Timer AddTimer(std::string name, std::function<void()> fire);
  Io AddIo(std::string name, int fd, uint32_t events, std::function<void(uint32_t events)> ready);
  // Blocks `signo` for the calling thread (call before starting other threads) and delivers it
  // on the loop.
  Signal AddSignal(int signo, std::function<void(const signalfd_siginfo&)> received);
  // Blocks SIGCHLD for the calling thread; `exited` gets the exit code, or 128 + the signal.
  Child AddChild(std::string name, pid_t pid, std::function<void(int status)> exited);

  // Thread-safe: runs `work` on the loop thread soon, in the order posted.
  void Post(std::function<void()> work);

  // Sends WATCHDOG=1 at half of WatchdogSec when systemd asks for it (WATCHDOG_USEC): the
  // watchdog is fed while the loop turns, and starves when a callback holds it.
  void EnableWatchdog();

  // Runs until Exit(); returns the exit code given to Exit (or 1 when the loop failed).
  int Run();
  // Loop thread: leaves Run() after the current callback. Other threads: RequestExit.
  void Exit(int code = 0);
  void RequestExit(int code = 0) {
    Post([this, code] { Exit(code); });
  }

  // Callbacks that threw, since the start.
  int64_t callbackFailures() const { return callbackFailures_; }

  // For libraries that attach to sd-event themselves; prefer the typed sources.
  sd_event* raw() const { return event_; }

 private:
  static int OnPosted(sd_event_source* source, int fd, uint32_t events, void* self);
  friend struct detail::SourceState;

  sd_event* event_ = nullptr;
  int postedFd_ = -1;
  Io posted_;
  std::mutex postedMutex_;
  std::vector<std::function<void()>> postedWork_;
  int64_t callbackFailures_ = 0;
};

// sd_notify(3) for the service manager: "READY=1", "STOPPING=1", "STATUS=...". A no-op outside
// systemd.
void Notify(std::string_view state);

}  // namespace cozy::runtime
