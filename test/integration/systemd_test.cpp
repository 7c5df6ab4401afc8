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
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

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

std::string ShippedUnit() {
  std::ifstream in(testing::SourceDir() / "systemd/gpu-agent.service");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Every value of `key=` in the unit, in order.
std::vector<std::string> UnitValues(const std::string& unit, const std::string& key) {
  std::vector<std::string> values;
  std::istringstream lines(unit);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(key + "=", 0) == 0) values.push_back(line.substr(key.size() + 1));
  }
  return values;
}

// systemd's sizes: a number with an optional K, M, G or T suffix (powers of 1024).
[[maybe_unused]] uint64_t UnitBytes(const std::string& value) {
  size_t end = 0;
  uint64_t number = std::stoull(value, &end);
  const std::string suffix = value.substr(end);
  for (const char unit : std::string("KMGT")) {
    number *= 1024;
    if (suffix == std::string(1, unit)) return number;
  }
  ADD_FAILURE() << "not a size: " << value;
  return 0;
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
        "RestrictAddressFamilies=AF_UNIX", "CapabilityBoundingSet=", "--dbus system",
        "ProtectSystem=strict", "MemoryMax=", "TasksMax="}) {
    EXPECT_NE(text.str().find(required), std::string::npos) << required;
  }
}

// The agent writes no file: nothing is writable under ProtectSystem=strict, kubelet's
// pod-resources directory least of all (connecting to its socket needs no writable mount;
// docs/install.md "The unit").
TEST(SystemdUnit, NothingIsWritableKubeletsDirectoryLeastOfAll) {
  const std::string unit = ShippedUnit();
  EXPECT_EQ(UnitValues(unit, "ProtectSystem"), std::vector<std::string>{"strict"});
  EXPECT_TRUE(UnitValues(unit, "ReadWritePaths").empty());
  EXPECT_TRUE(UnitValues(unit, "BindPaths").empty());
  EXPECT_TRUE(UnitValues(unit, "StateDirectory").empty());
  EXPECT_EQ(unit.find("/var/lib/kubelet"), std::string::npos)
      << "the unit names kubelet's directory; the default --pod-resources needs no setting";
}

// Health and metrics on loopback unless /etc/default/gpu-agent says otherwise.
TEST(SystemdUnit, HealthListensOnLoopbackByDefault) {
  const std::string unit = ShippedUnit();
  EXPECT_EQ(UnitValues(unit, "Environment"),
            std::vector<std::string>{"GPU_AGENT_HEALTH_ADDR=127.0.0.1:8080"});
  const auto exec = UnitValues(unit, "ExecStart");
  ASSERT_EQ(exec.size(), 1u);
  EXPECT_NE(exec[0].find(" --health-addr ${GPU_AGENT_HEALTH_ADDR} "), std::string::npos) << exec[0];
  // The environment file comes after Environment= and wins over it.
  EXPECT_EQ(UnitValues(unit, "EnvironmentFile"),
            std::vector<std::string>{"-/etc/default/gpu-agent"});
  std::ifstream in(testing::SourceDir() / "systemd/gpu-agent.default");
  std::stringstream defaults;
  defaults << in.rdbuf();
  EXPECT_NE(defaults.str().find("#GPU_AGENT_HEALTH_ADDR=127.0.0.1:8080"), std::string::npos);
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
                                        "off",
                                        "--health-addr",
                                        "127.0.0.1:0"};
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
  // The running daemon within the unit's MemoryMax and TasksMax, with room: its RSS at most
  // half the limit, and its threads with cpp-httplib's pool grown to a 480-CPU host's
  // (CPUs - 1, at least 8) within TasksMax.
  {
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    uint64_t rssKiB = 0;
    uint64_t threads = 0;
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("VmRSS:", 0) == 0) rssKiB = std::stoull(line.substr(6));
      if (line.rfind("Threads:", 0) == 0) threads = std::stoull(line.substr(8));
    }
    const std::string unit = ShippedUnit();
    const auto memoryMax = UnitValues(unit, "MemoryMax");
    const auto tasksMax = UnitValues(unit, "TasksMax");
    ASSERT_EQ(memoryMax.size(), 1u);
    ASSERT_EQ(tasksMax.size(), 1u);
    EXPECT_GT(rssKiB, 0u);
#if !defined(__SANITIZE_ADDRESS__)
    // (Under AddressSanitizer its shadow memory and quarantine are most of the RSS.)
    EXPECT_LE(rssKiB * 1024 * 2, UnitBytes(memoryMax[0])) << rssKiB << " KiB";
#endif
    const uint64_t cpus = std::max(1u, std::thread::hardware_concurrency());
    const uint64_t poolHere = std::max<uint64_t>(8, cpus - 1);
    const uint64_t others = threads - std::min(threads, poolHere);
    EXPECT_LE(others + 479, std::stoull(tasksMax[0])) << threads << " threads";
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
