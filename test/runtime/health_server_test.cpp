// The health server's /metrics: the daemon's text as it set it, then the process's own figures
// under the names Prometheus's client libraries use, read at each scrape.
#include "runtime/health_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "runtime/metrics.h"

namespace cozy::runtime {
namespace {

// One GET over a plain socket; the whole answer, headers and body.
std::string Get(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    close(fd);
    return "";
  }
  const std::string request = "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return "";
  }
  std::string answer;
  char buffer[4096];
  for (ssize_t n; (n = read(fd, buffer, sizeof buffer)) > 0;) {
    answer.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return answer;
}

// Sample name -> value of an exposition text (samples without labels only).
std::map<std::string, double> Samples(const std::string& text) {
  std::map<std::string, double> samples;
  std::istringstream lines(text.substr(text.find("\r\n\r\n") + 4));
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto space = line.find(' ');
    samples[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return samples;
}

double ResidentBytesFromStatus() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) * 1024;
  }
  return -1;
}

TEST(HealthServerMetrics, TheDaemonsFamiliesThenTheProcessFiguresRenderedAtEachScrape) {
  HealthServer server;
  ASSERT_TRUE(server.Start("127.0.0.1:0")) << server.error();
  MetricsRegistry registry;
  MetricFamily& passes = registry.Counter("daemon_passes_total", "Passes.");
  passes.Set(3);
  server.SetRegistry(&registry);

  const std::string first = Get(server.port(), "/metrics");
  ASSERT_NE(first.find("200 OK"), std::string::npos) << first;
  // The daemon's text comes first and whole; each process family is typed once.
  EXPECT_NE(first.find("\r\n\r\n# HELP daemon_passes_total Passes.\n# TYPE daemon_passes_total "
                       "counter\ndaemon_passes_total 3\n"),
            std::string::npos)
      << first;
  for (const char* family :
       {"# TYPE process_cpu_seconds_total counter", "# TYPE process_resident_memory_bytes gauge",
        "# TYPE process_virtual_memory_bytes gauge", "# TYPE process_open_fds gauge"}) {
    const auto at = first.find(family);
    EXPECT_NE(at, std::string::npos) << family << "\n" << first;
    EXPECT_EQ(first.find(family, at + 1), std::string::npos) << family;
  }
  std::map<std::string, double> before = Samples(first);
  EXPECT_EQ(before["daemon_passes_total"], 3);
  // Resident memory as the kernel's status file says it, within what the scrape itself moves.
  const double resident = ResidentBytesFromStatus();
  EXPECT_GT(before["process_resident_memory_bytes"], resident * 0.8);
  EXPECT_LT(before["process_resident_memory_bytes"], resident * 1.25);
  EXPECT_GE(before["process_virtual_memory_bytes"], before["process_resident_memory_bytes"]);
  // This test's own socket is among the open descriptors, and the limit is above them.
  EXPECT_GE(before["process_open_fds"], 3);
  if (before.count("process_max_fds")) {
    EXPECT_GT(before["process_max_fds"], before["process_open_fds"]);
  }

  // CPU to the nanosecond, not in 10 ms ticks: 20 ms of work on this thread shows as such at
  // the next scrape, and a ticks-based figure could show 10 or 30.
  const double cpuBefore = before["process_cpu_seconds_total"];
  EXPECT_GT(cpuBefore, 0);
  timespec start{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
  volatile uint64_t spin = 0;
  for (timespec now = start;
       (now.tv_sec - start.tv_sec) * 1000000000L + (now.tv_nsec - start.tv_nsec) < 20000000L;
       clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now)) {
    spin = spin + 1;
  }
  const double cpuAfter = Samples(Get(server.port(), "/metrics"))["process_cpu_seconds_total"];
  EXPECT_GE(cpuAfter - cpuBefore, 0.020);
  // The server's own threads ran too, but a scrape is well under a second of CPU.
  EXPECT_LT(cpuAfter - cpuBefore, 1.0);
  // The daemon's figures are rendered at each scrape: a value set now is the next page's.
  passes.Add(2);
  EXPECT_EQ(Samples(Get(server.port(), "/metrics"))["daemon_passes_total"], 5);
}

}  // namespace
}  // namespace cozy::runtime
