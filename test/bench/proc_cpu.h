// CPU time from /proc and the thread clock, for the benchmarks that print where a controller's
// CPU goes (by thread name: the controller names its threads, runtime/thread_name.h).
#pragma once

#include <time.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>

namespace cozy::bench {

// utime + stime, in seconds, of a /proc stat text (a process's or a thread's); `close` is
// where its "(comm)" ends.
inline double StatCpuSeconds(const std::string& text, size_t close) {
  std::istringstream fields(text.substr(close + 2));  // after "(comm) "
  std::string field;
  double ticks = 0;
  for (int i = 3; fields >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);
    if (i == 15) break;
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// utime + stime of a process, in seconds.
inline double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  return StatCpuSeconds(text, text.rfind(')'));
}

// The calling thread's CPU seconds, to the nanosecond: the in-process walks' clock.
inline double ThisThreadCpu() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) / 1e9;
}

// utime + stime of each of a process's threads, in seconds, summed by thread name (the
// controller names its threads: c:pods is the pods cache's, binder the binder's).
inline std::map<std::string, double> ThreadCpu(pid_t pid) {
  std::map<std::string, double> byName;
  const std::filesystem::path tasks = "/proc/" + std::to_string(pid) + "/task";
  std::error_code error;
  for (const auto& task : std::filesystem::directory_iterator(tasks, error)) {
    std::ifstream in(task.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(in)), {});
    const size_t open = text.find('('), close = text.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;  // ended meanwhile
    byName[text.substr(open + 1, close - open - 1)] += StatCpuSeconds(text, close);
  }
  return byName;
}

}  // namespace cozy::bench
