// `gpu-agent run` as a child process, for end-to-end tests, benchmarks and the soak test: its
// stderr goes to a log file, SIGTERM stops it, /proc tells its memory.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "test/support/process.h"

namespace cozy::testing {

class AgentProcess {
 public:
  AgentProcess() = default;
  ~AgentProcess();  // stops it if still running
  AgentProcess(const AgentProcess&) = delete;
  AgentProcess& operator=(const AgentProcess&) = delete;

  // Starts the built gpu-agent with `arguments` (after the program name); stdout and stderr
  // are appended to `log`; `environment` as Spawn's. Throws std::runtime_error when it cannot
  // start.
  void Start(const std::vector<std::string>& arguments, const std::filesystem::path& log,
             const std::map<std::string, std::string>& environment = {});
  // SIGTERM, then waits; returns the wait status (-1 when it was not running).
  int Stop();
  void Signal(int signal) const;
  // Still running (not exited, not reaped)?
  bool Alive();
  pid_t pid() const { return pid_; }
  // VmRSS and VmHWM of the process from /proc/<pid>/status, in KiB; -1 when unreadable.
  long RssKiB() const;
  long PeakRssKiB() const;
  std::string Log() const;

 private:
  pid_t pid_ = -1;
  std::filesystem::path log_;
};

}  // namespace cozy::testing
