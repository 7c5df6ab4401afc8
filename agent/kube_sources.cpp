#include "agent/kube_sources.h"

#include "agent/log.h"

namespace cozy::agent {

kube::ClientOptions LoopClientOptions() {
  kube::ClientOptions options;
  options.maxRetries = 0;
  options.connectTimeout = std::chrono::seconds(3);
  options.requestTimeout = std::chrono::seconds(10);
  return options;
}

ApiStatusPublisher::ApiStatusPublisher(kube::Client& client, const std::string& nodeName)
    : client_(client), publisher_(client, nodeName) {}

std::optional<std::chrono::milliseconds> ApiStatusPublisher::ReadyIn() {
  const kube::Duration wait = client_.rateLimiter().Delay();
  if (wait <= kube::Duration::zero()) {
    return std::nullopt;
  }
  return std::max(std::chrono::ceil<std::chrono::milliseconds>(wait), std::chrono::milliseconds(1));
}

std::optional<std::chrono::milliseconds> ApiStatusPublisher::Publish(const nlohmann::json& status) {
  const auto now = kube::Clock::now();
  const PublishResult result = publisher_.Publish(status, now);
  switch (result.outcome) {
    case PublishOutcome::kPublished:
      LogInfo("published GPUNode",
              {{"node", publisher_.nodeName()}, {"writes", std::to_string(result.writes)}});
      lastError_.clear();
      return std::nullopt;
    case PublishOutcome::kUnchanged:
      lastError_.clear();
      return std::nullopt;
    case PublishOutcome::kWaiting:
    case PublishOutcome::kFailed:
      break;
  }
  if (result.outcome == PublishOutcome::kFailed && result.error != lastError_) {
    // One line per kind of failure, not one per retry.
    LogWarning("cannot publish GPUNode; retrying with backoff",
               {{"node", publisher_.nodeName()}, {"reason", result.error}});
    lastError_ = result.error;
  }
  const auto delay = std::chrono::duration_cast<std::chrono::milliseconds>(result.retryAt - now);
  return std::max(delay, std::chrono::milliseconds(10));
}

ApiPodWatch::ApiPodWatch(kube::Client& client, const std::string& nodeName)
    : informer_(client, kube::ResourcePath("", "v1", "pods", "", "", ""),
                kube::InformerOptions{.labelSelector = "",
                                      .fieldSelector = "spec.nodeName=" + nodeName,
                                      .watchTimeoutSeconds = 0,
                                      .backoff = {},
                                      .random = {}},
                [](const kube::WatchEvent&) {}) {}

std::chrono::steady_clock::time_point ApiPodWatch::Step(std::chrono::steady_clock::time_point now) {
  const auto next = informer_.Step(now);
  if (informer_.LastError() != lastError_) {
    if (!informer_.LastError().empty()) {
      LogWarning("pod watch failed; pods count as active until it recovers",
                 {{"reason", informer_.LastError()}});
    }
    lastError_ = informer_.LastError();
  }
  PodPhases phases;
  for (const auto& [key, pod] : informer_.Cache()) {
    const auto& metadata = pod.value("metadata", nlohmann::json::object());
    const std::string phase = pod.value("status", nlohmann::json::object()).value("phase", "");
    if (!phase.empty()) {
      phases[metadata.value("namespace", "") + "/" + metadata.value("name", "")] = phase;
    }
  }
  changed_ = changed_ || phases != phases_;
  phases_ = std::move(phases);
  return next;
}

std::vector<LoopDriven::Fd> ApiPodWatch::Fds() {
  std::vector<Fd> fds;
  for (const auto& fd : informer_.Fds()) {
    fds.push_back({fd.fd, fd.read, fd.write});
  }
  return fds;
}

const PodPhases& ApiPodWatch::Phases(bool& changed) {
  changed = changed_;
  changed_ = false;
  return phases_;
}

}  // namespace cozy::agent
