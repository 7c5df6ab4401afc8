#include "test/support/agent_process.h"

#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <iterator>
#include <stdexcept>

#include "test/support/fixture_host.h"

namespace cozy::testing {

AgentProcess::~AgentProcess() { Stop(); }

void AgentProcess::Start(const std::vector<std::string>& arguments,
                         const std::filesystem::path& log,
                         const std::map<std::string, std::string>& environment) {
  log_ = log;
  std::vector<std::string> words = {GpuAgentBinary().string()};
  words.insert(words.end(), arguments.begin(), arguments.end());
  pid_ = Spawn(words, log, environment);
  if (pid_ < 0) {
    throw std::runtime_error("cannot start " + words[0]);
  }
}

int AgentProcess::Stop() { return Finish(pid_); }

void AgentProcess::Signal(int signal) const {
  if (pid_ > 0) {
    ::kill(pid_, signal);
  }
}

bool AgentProcess::Alive() {
  if (pid_ <= 0) {
    return false;
  }
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

namespace {

long StatusField(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) {
      return std::stol(line.substr(field.size() + 1));
    }
  }
  return -1;
}

}  // namespace

long AgentProcess::RssKiB() const { return pid_ > 0 ? StatusField(pid_, "VmRSS") : -1; }
long AgentProcess::PeakRssKiB() const { return pid_ > 0 ? StatusField(pid_, "VmHWM") : -1; }

std::string AgentProcess::Log() const {
  std::ifstream in(log_);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace cozy::testing
