// gpu-agent under systemd: the shipped unit passes systemd-analyze, and the daemon speaks the
// notify protocol (READY, STATUS, WATCHDOG, STOPPING) into a socket this test owns.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "test/support/fixture_host.h"

extern char** environ;

namespace cozy {
namespace {

using namespace std::chrono_literals;
using testing::RunCommand;
using testing::ShellQuote;

// The unit as installed, with ExecStart pointing at the built binary (verify checks it exists).
std::filesystem::path UnitForTest(const testing::TempDir& directory) {
  std::ifstream in(testing::SourceDir() / "systemd/gpu-agent.service");
  std::stringstream text;
  text << in.rdbuf();
  const std::string unit = std::regex_replace(text.str(), std::regex("/usr/bin/gpu-agent"),
                                              testing::GpuAgentBinary().string());
  const auto path = directory.path() / "gpu-agent.service";
  std::ofstream(path) << unit;
  return path;
}

TEST(SystemdUnit, VerifiesWithoutAWarning) {
  testing::TempDir directory;
  const auto unit = UnitForTest(directory);
  const auto result = RunCommand("systemd-analyze verify --man=no " + ShellQuote(unit.string()));
  EXPECT_EQ(result.exitCode, 0) << result.err;
  EXPECT_EQ(result.err, "");  // verify exits 0 on unknown keys; a warning is a defect here
  std::ifstream in(unit);
  std::stringstream text;
  text << in.rdbuf();
  for (const char* required :
       {"Type=notify", "WatchdogSec=", "Restart=on-failure",
        "EnvironmentFile=-/etc/default/gpu-agent", "NoNewPrivileges=yes", "ReadOnlyPaths=/sys",
        "RestrictAddressFamilies=AF_UNIX", "CapabilityBoundingSet=", "--dbus system"}) {
    EXPECT_NE(text.str().find(required), std::string::npos) << required;
  }
}

TEST(SystemdUnit, SandboxExposureStaysLow) {
  testing::TempDir directory;
  const auto unit = UnitForTest(directory);
  // systemd's own exposure score (0 safe .. 10 exposed), times ten for --threshold.
  const auto result = RunCommand("systemd-analyze security --offline=true --threshold=25 " +
                                 ShellQuote(unit.string()));
  EXPECT_EQ(result.exitCode, 0) << result.out << result.err;
}

class NotifySocket {
 public:
  explicit NotifySocket(const std::filesystem::path& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
      throw std::runtime_error("bind " + path.string());
    }
  }
  ~NotifySocket() { ::close(fd_); }
  std::vector<std::string> Drain() {
    std::vector<std::string> messages;
    char buffer[4096];
    ssize_t n = 0;
    while ((n = ::recv(fd_, buffer, sizeof buffer, 0)) > 0) {
      messages.emplace_back(buffer, static_cast<size_t>(n));
    }
    return messages;
  }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

TEST(SdNotify, ReadyStatusWatchdogAndStopping) {
  const testing::FixtureHost host("a100-vfio");
  testing::TempDir directory;
  NotifySocket socket(directory.path() / "notify.sock");
  std::vector<std::string> environment = {
      "NOTIFY_SOCKET=" + (directory.path() / "notify.sock").string(),
      "WATCHDOG_USEC=200000",  // WATCHDOG=1 expected every 100 ms
      "PATH=/usr/bin:/bin"};
  std::vector<std::string> arguments = {testing::GpuAgentBinary().string(),
                                        "run",
                                        "--node-name",
                                        "gpu-node-1",
                                        "--sysfs-root",
                                        host.root().string(),
                                        "--pci-ids",
                                        testing::FixturePciIds().string(),
                                        "--pod-resources",
                                        "unix://" + (directory.path() / "kubelet.sock").string(),
                                        "--udev-source",
                                        "off"};
  std::vector<char*> argv;
  for (auto& argument : arguments) {
    argv.push_back(argument.data());
  }
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& variable : environment) {
    envp.push_back(variable.data());
  }
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 2, (directory.path() / "log").c_str(),
                                   O_WRONLY | O_CREAT, 0600);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data()), 0);
  posix_spawn_file_actions_destroy(&actions);

  std::vector<std::string> messages;
  for (int i = 0; i < 50; ++i) {  // up to 5 s for READY and a few watchdog pings
    std::this_thread::sleep_for(100ms);
    for (auto& message : socket.Drain()) {
      messages.push_back(message);
    }
    if (std::count(messages.begin(), messages.end(), "WATCHDOG=1") >= 3) {
      break;
    }
  }
  ::kill(pid, SIGHUP);
  std::this_thread::sleep_for(200ms);
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  for (auto& message : socket.Drain()) {
    messages.push_back(message);
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  ASSERT_FALSE(messages.empty());
  EXPECT_NE(std::find(messages.begin(), messages.end(), "READY=1"), messages.end());
  EXPECT_GE(std::count(messages.begin(), messages.end(), "WATCHDOG=1"), 3);
  EXPECT_NE(std::find(messages.begin(), messages.end(), "STOPPING=1"), messages.end());
  bool summary = false;
  for (const auto& message : messages) {
    summary = summary || message ==
                             "STATUS=2 GPU functions, units unknown (pod-resources "
                             "socketAbsent)";
  }
  EXPECT_TRUE(summary);
  std::ifstream log(directory.path() / "log");
  std::stringstream text;
  text << log.rdbuf();
  EXPECT_NE(text.str().find("SIGHUP: rescanning"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("stopping signal=Terminated"), std::string::npos);
}

}  // namespace
}  // namespace cozy
