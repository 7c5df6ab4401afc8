#include "agent/sources/pod_watch.h"

#include "runtime/log.h"
#include "runtime/thread_name.h"

namespace cozy::agent {

kube::ClientOptions LoopClientOptions() {
  kube::ClientOptions options;
  options.maxRetries = 0;
  options.connectTimeout = std::chrono::seconds(3);
  options.requestTimeout = std::chrono::seconds(10);
  return options;
}

ApiPodWatch::ApiPodWatch(kube::Client& client, const std::string& nodeName)
    : informer_(client, kube::ResourcePath("", "v1", "pods", "", "", ""),
                kube::InformerOptions{.labelSelector = "",
                                      .fieldSelector = "spec.nodeName=" + nodeName,
                                      .watchTimeoutSeconds = 0,
                                      .backoff = {},
                                      .random = {}},
                [this](const kube::WatchEvent&) { eventsSinceRead_ = true; }) {}

ApiPodWatch::~ApiPodWatch() {
  stopping_ = true;
  if (thread_.joinable()) {
    thread_.join();
  }
}

void ApiPodWatch::Start(runtime::Loop& loop, Changed changed) {
  thread_ = std::thread([this, &loop, changed = std::move(changed)] { Main(loop, changed); });
}

void ApiPodWatch::Main(runtime::Loop& loop, Changed changed) {
  runtime::NameThisThread("pod-watch");
  std::string lastError;
  bool reportedSettled = false;
  PodPhases last;
  while (!stopping_) {
    try {
      informer_.RunFor(std::chrono::milliseconds(200), [this] { return stopping_.load(); });
    } catch (const std::exception& error) {
      // The informer reports its own failures; anything else must not end the watch for good.
      runtime::LogError("pod watch failed; retrying", {{"reason", error.what()}});
      std::this_thread::sleep_for(std::chrono::seconds(1));
      continue;
    }
    if (informer_.LastError() != lastError) {
      if (!informer_.LastError().empty()) {
        runtime::LogWarning("pod watch failed; pods count as active until it recovers",
                            {{"reason", informer_.LastError()}});
      }
      lastError = informer_.LastError();
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
      phasesChanged = phases != last;
      if (phasesChanged) {
        last = std::move(phases);
      }
    }
    // Settled once the first list answered or failed: the first pass then goes ahead with
    // what is known rather than waiting for a server that may not come back.
    const bool settled = informer_.Synced() || !lastError.empty();
    if (phasesChanged || (settled && !reportedSettled)) {
      reportedSettled = reportedSettled || settled;
      loop.Post([this, phases = last, settled, changed] {
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
}

}  // namespace cozy::agent
