// /healthz, /readyz and /metrics for probes and Prometheus, on the runtime's hardened HTTP server
// (runtime/http_server.h: GET and HEAD only, bounded bytes, connections and time, one thread of
// its own). /healthz and /readyz never touch the daemon: they read a heartbeat and a readiness
// the loop sets, under one mutex. /metrics renders the daemon's registry at each scrape
// (runtime/metrics.h): its collectors that read the daemon's state run on the daemon's loop and
// are waited for at most the registry's collect bound (docs/runtime.md, "Metrics registry").
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "runtime/http_server.h"
#include "runtime/metrics.h"

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
  int port() const { return server_.port(); }
  const std::string& error() const { return error_; }
  HttpServer::Stats stats() const { return server_.stats(); }

  // Called on the loop thread.
  void Heartbeat();
  void SetReady(bool ready);

  // Set before Start; outlives the server. Without one, /metrics has the process's figures only.
  void SetRegistry(const MetricsRegistry* registry) { registry_ = registry; }

  // A loop that has not beaten for this long is reported dead by /healthz.
  void SetStallLimit(std::chrono::milliseconds limit) { stallLimit_ = limit; }

 private:
  HttpServer server_;
  std::string error_;
  std::mutex mutex_;
  std::chrono::steady_clock::time_point lastBeat_;
  bool ready_ = false;
  const MetricsRegistry* registry_ = nullptr;
  std::chrono::milliseconds stallLimit_{std::chrono::seconds(30)};
};

}  // namespace cozy::runtime
