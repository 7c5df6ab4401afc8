// bench_scan: the agent's full scan of the large synthetic host next to lspci reading the same
// tree in the same run, and gpu-agent's peak RSS. Prints figures and ratios; asserts nothing.
//
//   build/test/bench/bench_scan [runs]
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "fixtures/sysfs/fixture_builder.h"
#include "sysfs/scanner.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

struct ProcessRun {
  double seconds = 0;
  long maxRssKiB = 0;
  int status = 0;
};

// Runs argv with stdout and stderr on /dev/null; wall time and peak RSS from wait4.
ProcessRun RunProcess(const std::vector<std::string>& arguments) {
  std::vector<char*> argv;
  for (const auto& argument : arguments) {
    argv.push_back(const_cast<char*>(argument.c_str()));
  }
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  const auto start = Clock::now();
  pid_t pid = 0;
  ProcessRun run;
  if (posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ) != 0) {
    std::fprintf(stderr, "bench_scan: cannot start %s\n", argv[0]);
    std::exit(1);
  }
  struct rusage usage {};
  ::wait4(pid, &run.status, 0, &usage);
  run.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  run.maxRssKiB = usage.ru_maxrss;
  posix_spawn_file_actions_destroy(&actions);
  return run;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::atoi(argv[1]) : 15;
  char pattern[] = "/tmp/bench-scan.XXXXXX";
  const std::string root = ::mkdtemp(pattern);
  const auto spec =
      cozy::fixtures::LoadSpec(COZY_SOURCE_DIR "/fixtures/sysfs/specs/large-synthetic.json");
  cozy::fixtures::BuildTree(spec, root);
  const std::string busPci = root + "/sys/bus/pci";

  cozy::sysfs::ScanOptions options;
  options.root = root;
  size_t functions = 0;
  size_t gpus = 0;
  std::vector<double> inProcess;
  std::vector<double> agentProcess;
  std::vector<double> lspciProcess;
  long agentRss = 0;
  long lspciRss = 0;
  for (int i = 0; i < runs + 1; ++i) {  // the first round warms the page cache and is dropped
    const auto start = Clock::now();
    const auto scan = cozy::sysfs::ScanHost(options);
    const double scanSeconds = std::chrono::duration<double>(Clock::now() - start).count();
    functions = scan.functions.size();
    gpus = scan.Gpus().size();
    const ProcessRun agent =
        RunProcess({COZY_GPU_AGENT_BINARY, "scan", "--sysfs-root", root, "-o", "json"});
    const ProcessRun lspci = RunProcess(
        {"lspci", "-A", "linux-sysfs", "-O", "sysfs.path=" + busPci, "-D", "-k", "-vmm"});
    if (agent.status != 0 || lspci.status != 0) {
      std::fprintf(stderr, "bench_scan: a run failed (agent %d, lspci %d)\n", agent.status,
                   lspci.status);
      return 1;
    }
    if (i == 0) {
      continue;
    }
    inProcess.push_back(scanSeconds);
    agentProcess.push_back(agent.seconds);
    lspciProcess.push_back(lspci.seconds);
    agentRss = std::max(agentRss, agent.maxRssKiB);
    lspciRss = std::max(lspciRss, lspci.maxRssKiB);
  }
  std::filesystem::remove_all(root);

  const double scanMedian = Median(inProcess);
  const double agentMedian = Median(agentProcess);
  const double lspciMedian = Median(lspciProcess);
  std::printf("host: large-synthetic, %zu PCI functions, %zu GPU functions; %d runs, medians\n",
              functions, gpus, runs);
  std::printf("agent scan, in process (ScanHost)          %8.2f ms\n", scanMedian * 1e3);
  std::printf("gpu-agent scan -o json, whole process      %8.2f ms\n", agentMedian * 1e3);
  std::printf("lspci -A linux-sysfs -D -k -vmm, process   %8.2f ms\n", lspciMedian * 1e3);
  std::printf("ratio gpu-agent scan / lspci               %8.2f  (goal <= 1.0)\n",
              agentMedian / lspciMedian);
  std::printf("ratio in-process scan / lspci              %8.2f\n", scanMedian / lspciMedian);
  std::printf("peak RSS gpu-agent scan                    %8.2f MiB (goal < 16)\n",
              static_cast<double>(agentRss) / 1024.0);
  std::printf("peak RSS lspci                             %8.2f MiB\n",
              static_cast<double>(lspciRss) / 1024.0);
  return 0;
}
