// A loopback TCP proxy for fault tests: one client's connection to a server, which the test can
// cut (every open connection reset, new ones refused) and restore, while other clients keep
// talking to the server directly. What a network partition of one replica looks like.
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace cozy::testing {

class TcpProxy {
 public:
  // Forwards 127.0.0.1:port() to 127.0.0.1:targetPort.
  explicit TcpProxy(int targetPort);
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // Resets every open connection and refuses new ones (closed at once, as a dropped route
  // looks to a client), until Restore().
  void Cut();
  void Restore();
  int connections() const { return accepted_.load(); }

 private:
  void Run();
  int targetPort_;
  int listenFd_ = -1;
  int port_ = 0;
  int wakeFd_ = -1;  // eventfd: Cut and the destructor wake the thread
  std::atomic<bool> cut_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<int> accepted_{0};
  std::thread thread_;
};

}  // namespace cozy::testing
