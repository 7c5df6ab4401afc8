// Child processes and waiting, for tests and benchmarks that run real programs (the agent,
// dbus-daemon, busctl) beside in-process fakes.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace cozy::testing {

// Starts `arguments` (the program looked up on PATH unless it has a slash) with stdout and
// stderr appended to `log`; `environment` entries replace or add to the inherited ones.
// Returns the pid, or -1 when it cannot start.
pid_t Spawn(const std::vector<std::string>& arguments, const std::filesystem::path& log,
            const std::map<std::string, std::string>& environment = {});

// Sends `signal` to a process this test started, waits for it and returns its wait status
// (-1 when `pid` was not running); `pid` becomes -1.
int Finish(pid_t& pid, int signal = SIGTERM);

// The suite's one wait: polls `done` every `poll` until it holds or `limit` passed; the last
// answer of `done`.
bool WaitFor(const std::function<bool()>& done,
             std::chrono::milliseconds limit = std::chrono::seconds(15),
             std::chrono::milliseconds poll = std::chrono::milliseconds(20));
// The same for a limit in any unit (kube::Duration's nanoseconds, seconds), rounded up.
template <typename Rep, typename Period>
bool WaitFor(const std::function<bool()>& done, std::chrono::duration<Rep, Period> limit,
             std::chrono::milliseconds poll = std::chrono::milliseconds(20)) {
  return WaitFor(done, std::chrono::ceil<std::chrono::milliseconds>(limit), poll);
}

// A loopback TCP port free a moment ago (0 when none could be found).
int FreePort();

}  // namespace cozy::testing
