#include "runtime/loop.h"

#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <systemd/sd-daemon.h>
#include <systemd/sd-event.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>

#include "runtime/log.h"

namespace cozy::runtime {

namespace detail {

// What one handle owns: its sd-event source and its callback. Heap-allocated so that the
// pointer sd-event holds as userdata stays valid when the handle moves.
struct SourceState {
  Loop* loop = nullptr;
  sd_event_source* source = nullptr;
  std::string name;
  std::function<void()> fire;
  std::function<void(uint32_t)> ready;
  std::function<void(const signalfd_siginfo&)> received;
  std::function<void(int)> exited;
  bool dispatching = false;  // inside its callback now
  bool released = false;     // its handle let go of it during that callback

  ~SourceState() { sd_event_source_disable_unref(source); }

  // Runs a callback so that nothing thrown crosses sd-event's C frames.
  template <typename Callback>
  void Guard(Callback&& callback) {
    dispatching = true;
    try {
      callback();
    } catch (const std::exception& error) {
      ++loop->callbackFailures_;
      LogError("a loop callback failed; the loop goes on",
               {{"source", name}, {"reason", error.what()}});
    } catch (...) {
      ++loop->callbackFailures_;
      LogError("a loop callback failed; the loop goes on",
               {{"source", name}, {"reason", "unknown exception"}});
    }
    dispatching = false;
    if (released) {
      delete this;  // the handle was reset or replaced from inside the callback
    }
  }
};

void SourceStateDeleter::operator()(SourceState* state) const {
  if (state == nullptr) {
    return;
  }
  if (state->dispatching) {
    // Freed when its callback returns; never fires again meanwhile.
    sd_event_source_set_enabled(state->source, SD_EVENT_OFF);
    state->released = true;
    return;
  }
  delete state;
}

}  // namespace detail

namespace {

constexpr uint64_t kTimerAccuracyUsec = 1000;

int OnTimer(sd_event_source* /*source*/, uint64_t /*usec*/, void* userdata) {
  auto* state = static_cast<detail::SourceState*>(userdata);
  state->Guard([state] { state->fire(); });
  return 0;
}

int OnIo(sd_event_source* /*source*/, int /*fd*/, uint32_t events, void* userdata) {
  auto* state = static_cast<detail::SourceState*>(userdata);
  state->Guard([state, events] { state->ready(events); });
  return 0;
}

int OnSignal(sd_event_source* /*source*/, const signalfd_siginfo* info, void* userdata) {
  auto* state = static_cast<detail::SourceState*>(userdata);
  state->Guard([state, info] { state->received(*info); });
  return 0;
}

int OnChild(sd_event_source* /*source*/, const siginfo_t* info, void* userdata) {
  auto* state = static_cast<detail::SourceState*>(userdata);
  int status = 0;
  if (info->si_code == CLD_EXITED) {
    status = info->si_status;
  } else {
    status = 128 + info->si_status;  // killed or dumped: the shell's convention
  }
  state->Guard([state, status] { state->exited(status); });
  return 0;
}

detail::SourceStatePtr NewState(Loop* loop, std::string name) {
  detail::SourceStatePtr state(new detail::SourceState());
  state->loop = loop;
  state->name = std::move(name);
  return state;
}

void Check(int result, const std::string& what) {
  if (result < 0) {
    throw LoopError(what + ": " + std::strerror(-result));
  }
}

}  // namespace

Source::Source() = default;
Source::~Source() = default;
Source::Source(Source&& other) noexcept = default;
Source& Source::operator=(Source&& other) noexcept = default;
Source::Source(detail::SourceStatePtr state) : state_(std::move(state)) {}

void Source::Reset() { state_.reset(); }

const std::string& Source::name() const {
  static const std::string kNone;
  return state_ ? state_->name : kNone;
}

void Timer::Arm(std::chrono::milliseconds delay) {
  if (!state_) {
    return;
  }
  const auto usec = static_cast<uint64_t>(std::max<int64_t>(delay.count(), 0)) * 1000U;
  if (sd_event_source_set_time_relative(state_->source, usec) < 0 ||
      sd_event_source_set_enabled(state_->source, SD_EVENT_ONESHOT) < 0) {
    LogError("cannot arm a timer", {{"source", state_->name}});
  }
}

void Timer::Cancel() {
  if (state_) {
    sd_event_source_set_enabled(state_->source, SD_EVENT_OFF);
  }
}

bool Timer::Armed() const {
  int enabled = SD_EVENT_OFF;
  if (state_) {
    sd_event_source_get_enabled(state_->source, &enabled);
  }
  return enabled != SD_EVENT_OFF;
}

void Io::SetEvents(uint32_t events) {
  if (state_) {
    sd_event_source_set_io_events(state_->source, events);
  }
}

Loop::Loop() {
  Check(sd_event_new(&event_), "cannot create the event loop");
  postedFd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (postedFd_ < 0) {
    sd_event_unref(event_);
    throw LoopError(std::string("cannot create the loop's eventfd: ") + std::strerror(errno));
  }
  posted_ = AddIo("posted work", postedFd_, EPOLLIN, [this](uint32_t) {
    uint64_t count = 0;
    [[maybe_unused]] const ssize_t got = ::read(postedFd_, &count, sizeof count);
    std::vector<std::function<void()>> work;
    {
      std::lock_guard<std::mutex> lock(postedMutex_);
      work.swap(postedWork_);
    }
    for (auto& item : work) {
      // One failing item must not drop the ones after it.
      try {
        item();
      } catch (const std::exception& error) {
        ++callbackFailures_;
        LogError("posted work failed; the loop goes on", {{"reason", error.what()}});
      }
    }
  });
}

Loop::~Loop() {
  posted_.Reset();
  if (postedFd_ >= 0) {
    ::close(postedFd_);
  }
  sd_event_unref(event_);
}

Timer Loop::AddTimer(std::string name, std::function<void()> fire) {
  auto state = NewState(this, std::move(name));
  state->fire = std::move(fire);
  // USEC_INFINITY (UINT64_MAX) as an absolute time: created, never due until armed.
  Check(sd_event_add_time(event_, &state->source, CLOCK_MONOTONIC, UINT64_MAX, kTimerAccuracyUsec,
                          &OnTimer, state.get()),
        "cannot create timer " + state->name);
  sd_event_source_set_enabled(state->source, SD_EVENT_OFF);
  return Timer(std::move(state));
}

Io Loop::AddIo(std::string name, int fd, uint32_t events,
               std::function<void(uint32_t events)> ready) {
  auto state = NewState(this, std::move(name));
  state->ready = std::move(ready);
  Check(sd_event_add_io(event_, &state->source, fd, events, &OnIo, state.get()),
        "cannot watch fd " + std::to_string(fd) + " for " + state->name);
  return Io(std::move(state));
}

Signal Loop::AddSignal(int signo, std::function<void(const signalfd_siginfo&)> received) {
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, signo);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  auto state = NewState(this, std::string("signal ") + strsignal(signo));
  state->received = std::move(received);
  Check(sd_event_add_signal(event_, &state->source, signo, &OnSignal, state.get()),
        "cannot watch " + state->name);
  return Signal(std::move(state));
}

Child Loop::AddChild(std::string name, pid_t pid, std::function<void(int status)> exited) {
  // sd-event reaps through SIGCHLD, which must be blocked (as for AddSignal).
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  auto state = NewState(this, std::move(name));
  state->exited = std::move(exited);
  Check(sd_event_add_child(event_, &state->source, pid, WEXITED, &OnChild, state.get()),
        "cannot watch child " + std::to_string(pid) + " (" + state->name + ")");
  return Child(std::move(state));
}

void Loop::Post(std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(postedMutex_);
    postedWork_.push_back(std::move(work));
  }
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t written = ::write(postedFd_, &one, sizeof one);
}

void Loop::EnableWatchdog() { sd_event_set_watchdog(event_, 1); }

int Loop::Run() {
  const int result = sd_event_loop(event_);
  return result < 0 ? 1 : result;
}

void Loop::Exit(int code) { sd_event_exit(event_, code); }

void Notify(std::string_view state) { sd_notify(0, std::string(state).c_str()); }

}  // namespace cozy::runtime
