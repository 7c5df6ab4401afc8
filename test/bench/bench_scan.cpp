// bench_scan: the agent's full scan of the large synthetic host next to lspci reading the same
// tree in the same run, and gpu-agent's peak RSS. Prints figures and ratios; asserts nothing.
// Wall time on shared machines swings; instructions under callgrind barely move, so where
// valgrind is installed each process also runs once under it and the counts are printed.
//
//   build/test/bench/bench_scan [runs]
//   BENCH_GPU_AGENT=/other/build/gpu-agent build/test/bench/bench_scan   # another build
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

// Instructions `arguments` executes under callgrind ("Collected : N"), or 0 without valgrind.
uint64_t CallgrindInstructions(const std::vector<std::string>& arguments) {
  std::string command = "valgrind --tool=callgrind --callgrind-out-file=/dev/null";
  for (const std::string& argument : arguments) {
    command += " '" + argument + "'";
  }
  command += " 2>&1 >/dev/null";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    return 0;
  }
  uint64_t collected = 0;
  char line[512];
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
    const char* at = std::strstr(line, "Collected : ");
    if (at != nullptr) {
      collected = std::strtoull(at + std::strlen("Collected : "), nullptr, 10);
    }
  }
  return ::pclose(pipe) == 0 ? collected : 0;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::atoi(argv[1]) : 15;
  const char* otherAgent = std::getenv("BENCH_GPU_AGENT");
  const std::string agentBinary =
      otherAgent != nullptr && *otherAgent != '\0' ? otherAgent : COZY_GPU_AGENT_BINARY;
  char pattern[] = "/tmp/bench-scan.XXXXXX";
  const std::string root = ::mkdtemp(pattern);
  const auto spec =
      cozy::fixtures::LoadSpec(COZY_SOURCE_DIR "/fixtures/sysfs/specs/large-synthetic.json");
  cozy::fixtures::BuildTree(spec, root);
  const std::string busPci = root + "/sys/bus/pci";

  const std::vector<std::string> agentCommand = {agentBinary, "scan", "--sysfs-root",
                                                 root,        "-o",   "json"};
  const std::vector<std::string> lspciCommand = {
      "lspci", "-A", "linux-sysfs", "-O", "sysfs.path=" + busPci, "-D", "-k", "-vmm"};
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
    const ProcessRun agent = RunProcess(agentCommand);
    const ProcessRun lspci = RunProcess(lspciCommand);
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
  const uint64_t agentInstructions = CallgrindInstructions(agentCommand);
  const uint64_t lspciInstructions = CallgrindInstructions(lspciCommand);
  std::filesystem::remove_all(root);

  const double scanMedian = Median(inProcess);
  const double agentMedian = Median(agentProcess);
  const double lspciMedian = Median(lspciProcess);
  std::printf("host: large-synthetic, %zu PCI functions, %zu GPU functions; %d runs, medians\n",
              functions, gpus, runs);
  std::printf("agent scan, in process (ScanHost)          %8.2f ms\n", scanMedian * 1e3);
  std::printf("gpu-agent scan -o json, whole process      %8.2f ms\n", agentMedian * 1e3);
  std::printf("lspci -A linux-sysfs -D -k -vmm, process   %8.2f ms\n", lspciMedian * 1e3);
  std::printf("ratio gpu-agent scan / lspci               %8.2f  (goal <= 0.5)\n",
              agentMedian / lspciMedian);
  std::printf("ratio in-process scan / lspci              %8.2f\n", scanMedian / lspciMedian);
  std::printf("peak RSS gpu-agent scan                    %8.2f MiB (goal < 16)\n",
              static_cast<double>(agentRss) / 1024.0);
  std::printf("peak RSS lspci                             %8.2f MiB\n",
              static_cast<double>(lspciRss) / 1024.0);
  if (agentInstructions == 0 || lspciInstructions == 0) {
    std::printf("instructions under callgrind: valgrind is not installed or failed\n");
  } else {
    std::printf("instructions, gpu-agent scan -o json      %8.1f M\n",
                static_cast<double>(agentInstructions) / 1e6);
    std::printf("instructions, lspci                       %8.1f M\n",
                static_cast<double>(lspciInstructions) / 1e6);
    std::printf("ratio of instructions gpu-agent / lspci    %8.2f  (goal <= 0.5)\n",
                static_cast<double>(agentInstructions) / static_cast<double>(lspciInstructions));
  }
  return 0;
}
