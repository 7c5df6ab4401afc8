// fake_kubelet: serves a scenario file as kubelet's pod-resources v1 API on a unix socket.
// The file is re-read on SIGHUP and whenever it changes, so a test or a demo changes kubelet's
// answers (or its misbehaviour) while it runs. A bad file keeps the previous answers.
#include <signal.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>

#include "test/fakes/fake_kubelet.h"

namespace {

struct FileStamp {
  std::filesystem::file_time_type time;
  std::uintmax_t size = 0;
  bool operator==(const FileStamp&) const = default;
};

std::optional<FileStamp> Stamp(const std::string& path) {
  std::error_code error;
  const auto time = std::filesystem::last_write_time(path, error);
  if (error) {
    return std::nullopt;
  }
  const auto size = std::filesystem::file_size(path, error);
  if (error) {
    return std::nullopt;
  }
  return FileStamp{time, size};
}

}  // namespace

constexpr const char* kUsage =
    "usage: fake_kubelet --socket PATH (--scenario FILE | --refuse) [--poll-ms N]\n"
    "  --socket PATH     unix socket to listen on\n"
    "  --scenario FILE   scenario JSON (docs/pod-resources.md); re-read on SIGHUP and when it\n"
    "                    changes\n"
    "  --refuse          create the socket file but never accept (a kubelet that died\n"
    "                    without cleaning up)\n"
    "  --poll-ms N       how often to look for scenario changes (default 200)\n";

int main(int argc, char** argv) {
  std::string socketPath;
  std::string scenarioPath;
  bool refuse = false;
  int pollMs = 200;
  // Plain parsing: four options do not need a library (and CLI11 trips GCC 12's
  // -Wnull-dereference under -O2).
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool hasValue = i + 1 < argc;
    if (arg == "--socket" && hasValue) {
      socketPath = argv[++i];
    } else if (arg == "--scenario" && hasValue) {
      scenarioPath = argv[++i];
    } else if (arg == "--refuse") {
      refuse = true;
    } else if (arg == "--poll-ms" && hasValue) {
      const std::string value = argv[++i];
      char* end = nullptr;
      const long parsed = std::strtol(value.c_str(), &end, 10);
      if (end == value.c_str() || *end != '\0' || parsed < 10 || parsed > 60000) {
        std::fprintf(stderr, "fake_kubelet: --poll-ms: expected 10..60000, got \"%s\"\n",
                     value.c_str());
        return 2;
      }
      pollMs = static_cast<int>(parsed);
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      std::fprintf(stderr, "fake_kubelet: unexpected argument \"%s\"\n%s", arg.c_str(), kUsage);
      return 2;
    }
  }
  if (socketPath.empty() || (!refuse && scenarioPath.empty())) {
    std::fprintf(stderr, "fake_kubelet: --socket and one of --scenario, --refuse are required\n%s",
                 kUsage);
    return 2;
  }

  // Whoever reads our stdout may go away first; a status line is not worth dying for.
  ::signal(SIGPIPE, SIG_IGN);
  // Block the signals before gRPC starts its threads, so only the loop below sees them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGHUP);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::optional<cozy::fakes::RefusingSocket> refusing;
  cozy::fakes::FakeKubelet kubelet;
  std::optional<FileStamp> stamp;
  try {
    if (refuse) {
      refusing.emplace(socketPath);
      std::printf("fake_kubelet: refusing on unix://%s\n", socketPath.c_str());
    } else {
      stamp = Stamp(scenarioPath);
      kubelet.Start(socketPath, cozy::fakes::LoadScenario(scenarioPath));
      std::printf("fake_kubelet: serving unix://%s from %s\n", socketPath.c_str(),
                  scenarioPath.c_str());
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "fake_kubelet: %s\n", error.what());
    return 1;
  }
  std::fflush(stdout);

  const timespec poll{pollMs / 1000, static_cast<long>(pollMs % 1000) * 1000000L};
  for (;;) {
    const int signal = sigtimedwait(&signals, nullptr, &poll);
    if (signal == SIGTERM || signal == SIGINT) {
      break;
    }
    if (refuse) {
      continue;
    }
    const auto now = Stamp(scenarioPath);
    if (signal != SIGHUP && (!now || now == stamp)) {
      continue;
    }
    stamp = now;
    try {
      kubelet.SetScenario(cozy::fakes::LoadScenario(scenarioPath));
      std::printf("fake_kubelet: reloaded %s\n", scenarioPath.c_str());
      std::fflush(stdout);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "fake_kubelet: keeping previous answers: %s\n", error.what());
    }
  }
  kubelet.Stop();
  return 0;
}
