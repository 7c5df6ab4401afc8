// A small HTTP/1.1 server for probes and Prometheus (/healthz, /readyz, /metrics): GET and HEAD
// on fixed paths, one thread running one epoll loop over the listening socket and every
// connection, and hard limits on connections, bytes and time, so that whoever reaches the port
// can neither exhaust the pod's memory nor keep the probe from being answered.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>

namespace cozy::runtime {

struct HttpLimits {
  // Open connections. A new one beyond this closes the oldest connection that is not being
  // answered (one lingering after its answer, else one still sending its request), else the
  // oldest of all; the accept itself never waits.
  size_t maxConnections = 64;
  // The whole request (head and any body) must arrive within this from accept, however it
  // trickles; then the connection is closed (with 408 when part of a request had arrived).
  std::chrono::milliseconds headerDeadline{2000};
  // Request line and headers, up to and including the empty line: 431 beyond (414 when the
  // request line alone does not end within it).
  size_t maxHeaderBytes = 8192;
  // A Content-Length above this, or a chunked body that grows past it: 413 at once, without
  // reading the rest.
  size_t maxBodyBytes = 4096;
  // The answer must have been taken by the client within this from when it was ready; a client
  // that does not read is closed then.
  std::chrono::milliseconds writeDeadline{5000};
};

struct HttpResponse {
  int status = 200;
  std::string contentType = "text/plain; charset=utf-8";
  std::string body;
};

// One request per connection: every answer says `Connection: close` and carries
// Content-Length. Not copyable; Start and Stop from one thread.
class HttpServer {
 public:
  // Called on the server's thread; must be quick (read a snapshot under a mutex). An exception
  // it throws becomes a 500.
  using Handler = std::function<HttpResponse()>;

  explicit HttpServer(HttpLimits limits = {});
  ~HttpServer();  // stops
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Before Start (ignored while serving). GET and HEAD only; HEAD gets the same headers, no body.
  void Handle(std::string path, Handler handler);

  // "host:port", "[v6]:port", ":port" (all IPv4 addresses; "[::]:port" for IPv6 as well) or
  // "off" (serves nothing, returns true). False with error() when it cannot listen or the
  // address is malformed. Port 0 picks a free port: port().
  bool Start(const std::string& address);
  // Wakes the server's thread, closes every connection and joins; prompt whatever clients do.
  void Stop();
  int port() const { return port_; }
  const std::string& error() const { return error_; }

  struct Stats {
    int64_t requests;    // answered with a handler's response or 404
    int64_t rejected;    // refused by the server: 400, 405, 413, 414, 431, 501, 505
    int64_t timedOut;    // closed at the request or the write deadline
    int64_t overflowed;  // closed to make room for a newer connection (maxConnections)
    int64_t accepted;    // connections accepted
  };
  Stats stats() const;

 private:
  class Loop;  // the server thread's state: connections and their deadlines
  struct Counters {
    std::atomic<int64_t> requests{0};
    std::atomic<int64_t> rejected{0};
    std::atomic<int64_t> timedOut{0};
    std::atomic<int64_t> overflowed{0};
    std::atomic<int64_t> accepted{0};
  };

  void CloseDescriptors();

  HttpLimits limits_;
  std::map<std::string, Handler, std::less<>> handlers_;
  Counters counters_;
  int listenFd_ = -1;
  int wakeFd_ = -1;
  int epollFd_ = -1;
  int port_ = 0;
  std::string error_;
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
};

// "host:port" / "[::1]:port" / ":port" -> (host, port); ("", -1) on a malformed address
// (an unbracketed IPv6 literal is ambiguous, so malformed); host "0.0.0.0" for ":port".
std::pair<std::string, int> ParseListenAddress(const std::string& address);

}  // namespace cozy::runtime
