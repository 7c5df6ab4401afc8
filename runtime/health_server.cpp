#include "runtime/health_server.h"

#include "runtime/metrics.h"

namespace cozy::runtime {

HealthServer::HealthServer() : lastBeat_(std::chrono::steady_clock::now()) {
  server_.Handle("/healthz", [this] {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto silence = std::chrono::steady_clock::now() - lastBeat_;
    if (silence > stallLimit_) {
      return HttpResponse{503, "text/plain; charset=utf-8", "event loop stalled\n"};
    }
    return HttpResponse{200, "text/plain; charset=utf-8", "ok\n"};
  });
  server_.Handle("/readyz", [this] {
    std::lock_guard<std::mutex> lock(mutex_);
    return ready_ ? HttpResponse{200, "text/plain; charset=utf-8", "ok\n"}
                  : HttpResponse{503, "text/plain; charset=utf-8", "first pass not done\n"};
  });
  server_.Handle("/metrics", [this] {
    // The daemon's families rendered now, then the process's own figures as they are now
    // (read from the kernel, not the daemon: a stalled loop still shows its CPU and memory, and
    // its collectors' figures as they last came back).
    std::string text = registry_ != nullptr ? registry_->Render() : std::string();
    MetricsWriter process;
    WriteProcessMetrics(process);
    text += process.Take();
    return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", std::move(text)};
  });
}

HealthServer::~HealthServer() { Stop(); }

bool HealthServer::Start(const std::string& address) {
  if (address == "off" || address.empty()) {
    return true;
  }
  if (!server_.Start(address)) {
    error_ = "--health-addr " + address + ": " + server_.error();
    return false;
  }
  return true;
}

void HealthServer::Stop() { server_.Stop(); }

void HealthServer::Heartbeat() {
  std::lock_guard<std::mutex> lock(mutex_);
  lastBeat_ = std::chrono::steady_clock::now();
}

void HealthServer::SetReady(bool ready) {
  std::lock_guard<std::mutex> lock(mutex_);
  ready_ = ready;
}

}  // namespace cozy::runtime
