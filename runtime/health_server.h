// HTTP /healthz, /readyz and /metrics for probes and Prometheus. cpp-httplib serves on its own
// thread (its model); the handlers never touch the daemon: they read a snapshot the loop
// publishes after each pass and a heartbeat the loop refreshes, both under one mutex.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace httplib {
class Server;
}

namespace cozy::runtime {

class HealthServer {
 public:
  HealthServer();
  ~HealthServer();
  HealthServer(const HealthServer&) = delete;
  HealthServer& operator=(const HealthServer&) = delete;

  // "host:port", ":port" (all addresses) or "off". Returns false (with error()) when it cannot
  // listen. The bound port is port() (useful with ":0" in tests).
  bool Start(const std::string& address);
  void Stop();
  int port() const { return port_; }
  const std::string& error() const { return error_; }

  // Called on the loop thread.
  void Heartbeat();
  void SetReady(bool ready);
  void SetMetrics(std::string text);

  // A loop that has not beaten for this long is reported dead by /healthz.
  void SetStallLimit(std::chrono::milliseconds limit) { stallLimit_ = limit; }

 private:
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  std::string error_;
  std::mutex mutex_;
  std::chrono::steady_clock::time_point lastBeat_;
  bool ready_ = false;
  std::string metrics_;
  std::chrono::milliseconds stallLimit_{std::chrono::seconds(30)};
};

// "host:port" / ":port" -> (host, port); nullopt-like port -1 on a malformed address.
std::pair<std::string, int> ParseListenAddress(const std::string& address);

}  // namespace cozy::runtime
