#include "runtime/health_server.h"

#include <httplib.h>

namespace cozy::runtime {

std::pair<std::string, int> ParseListenAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return {"", -1};
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);  // [::1]:8080
  }
  if (host.empty()) {
    host = "0.0.0.0";
  }
  int port = -1;
  try {
    size_t end = 0;
    port = std::stoi(address.substr(colon + 1), &end);
    if (end != address.size() - colon - 1 || port < 0 || port > 65535) {
      port = -1;
    }
  } catch (const std::exception&) {
    port = -1;
  }
  return {host, port};
}

HealthServer::HealthServer() : lastBeat_(std::chrono::steady_clock::now()) {}

HealthServer::~HealthServer() { Stop(); }

bool HealthServer::Start(const std::string& address) {
  if (address == "off" || address.empty()) {
    return true;
  }
  const auto [host, port] = ParseListenAddress(address);
  if (port < 0) {
    error_ = "--health-addr " + address + ": not host:port";
    return false;
  }
  server_ = std::make_unique<httplib::Server>();
  server_->Get("/healthz", [this](const httplib::Request&, httplib::Response& response) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto silence = std::chrono::steady_clock::now() - lastBeat_;
    if (silence > stallLimit_) {
      response.status = 503;
      response.set_content("event loop stalled\n", "text/plain");
      return;
    }
    response.set_content("ok\n", "text/plain");
  });
  server_->Get("/readyz", [this](const httplib::Request&, httplib::Response& response) {
    std::lock_guard<std::mutex> lock(mutex_);
    response.status = ready_ ? 200 : 503;
    response.set_content(ready_ ? "ok\n" : "first scan not done\n", "text/plain");
  });
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
    std::lock_guard<std::mutex> lock(mutex_);
    response.set_content(metrics_, "text/plain; version=0.0.4; charset=utf-8");
  });
  const int bound = port == 0                           ? server_->bind_to_any_port(host)
                    : server_->bind_to_port(host, port) ? port
                                                        : -1;
  if (bound < 0) {
    error_ = "--health-addr " + address + ": cannot listen";
    server_.reset();
    return false;
  }
  port_ = bound;
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  return true;
}

void HealthServer::Stop() {
  if (server_) {
    server_->stop();
  }
  if (thread_.joinable()) {
    thread_.join();
  }
  server_.reset();
}

void HealthServer::Heartbeat() {
  std::lock_guard<std::mutex> lock(mutex_);
  lastBeat_ = std::chrono::steady_clock::now();
}

void HealthServer::SetReady(bool ready) {
  std::lock_guard<std::mutex> lock(mutex_);
  ready_ = ready;
}

void HealthServer::SetMetrics(std::string text) {
  std::lock_guard<std::mutex> lock(mutex_);
  metrics_ = std::move(text);
}

}  // namespace cozy::runtime
