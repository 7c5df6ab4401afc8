#include "agent/sources/pod_watch.h"

#include "runtime/log.h"

namespace cozy::agent {

kube::ClientOptions LoopClientOptions() {
  kube::ClientOptions options;
  options.maxRetries = 0;
  options.connectTimeout = std::chrono::seconds(3);
  options.requestTimeout = std::chrono::seconds(10);
  return options;
}

ApiPodWatch::ApiPodWatch(kube::Client& client, const std::string& nodeName)
    : client_(client),
      informer_(client, kube::ResourcePath("", "v1", "pods", "", "", ""),
                kube::InformerOptions{.labelSelector = "",
                                      .fieldSelector = "spec.nodeName=" + nodeName,
                                      .watchTimeoutSeconds = 0,
                                      .backoff = {},
                                      .random = {}},
                [this](const kube::WatchEvent&) { eventsSinceRead_ = true; }) {}

ApiPodWatch::~ApiPodWatch() {
  if (watching_) watching_->Remove(*this);
}

void ApiPodWatch::Start(runtime::Loop& loop, Changed changed) {
  events_ = &loop;
  changed_ = std::move(changed);
  watching_ = std::make_unique<kube::InformerLoop>("pod-watch", client_.time());
  watching_->Add(*this);
}

kube::LoopMember::Next ApiPodWatch::Step(kube::TimePoint now, bool mayList) {
  const kube::TimePoint next = informer_.Step(now, mayList);  // never throws
  Report();
  return {next, informer_.Fds()};
}

void ApiPodWatch::Report() {
  if (informer_.LastError() != lastError_) {
    if (!informer_.LastError().empty()) {
      runtime::LogWarning("pod watch failed; pods count as active until it recovers",
                          {{"reason", informer_.LastError()}});
    }
    lastError_ = informer_.LastError();
  }
  // The phases are read again only when the informer delivered something (an event, or a
  // relist's differences); a quiet node costs no walk over its pods every step.
  bool phasesChanged = false;
  if (eventsSinceRead_) {
    eventsSinceRead_ = false;
    PodPhases phases;
    for (const auto& [key, pod] : informer_.Cache()) {
      // Fields of the wrong type (a server or a proxy gone wrong) leave that pod out.
      try {
        const auto& metadata = pod.at("metadata");
        const std::string phase = pod.at("status").at("phase").get<std::string>();
        if (!phase.empty()) {
          phases[metadata.at("namespace").get<std::string>() + "/" +
                 metadata.at("name").get<std::string>()] = phase;
        }
      } catch (const nlohmann::json::exception&) {
        continue;
      }
    }
    phasesChanged = phases != last_;
    if (phasesChanged) last_ = std::move(phases);
  }
  // Settled once the first list answered or failed: the first pass then goes ahead with
  // what is known rather than waiting for a server that may not come back.
  const bool settled = informer_.Synced() || !lastError_.empty();
  if (phasesChanged || (settled && !reportedSettled_)) {
    reportedSettled_ = reportedSettled_ || settled;
    events_->Post([this, phases = last_, settled, changed = changed_] {
      const bool differ = phases != phases_;
      const bool nowSettled = settled && !settled_;
      phases_ = phases;
      settled_ = settled_ || settled;
      if (differ || nowSettled) {
        changed(differ ? "pod phases changed" : "pod watch settled", false);
      }
    });
  }
}

}  // namespace cozy::agent
