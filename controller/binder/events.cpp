#include "controller/binder/events.h"

#include <cstdio>
#include <utility>

#include "controller/kinds.h"
#include "kube/leader_election.h"
#include "runtime/log.h"

namespace cozy::controller {

EventRecorder::EventRecorder(kube::Client& client, const kube::WriteOptions& write,
                             std::string identity)
    : client_(client), write_(write), identity_(std::move(identity)) {}

std::optional<EventRecorder::Pending> EventRecorder::Make(
    const nlohmann::json& regarding, const std::string& eventNamespace, const std::string& uid,
    const std::string& action, const std::string& reason, const std::string& type, std::string note,
    std::chrono::system_clock::time_point now, int64_t& suppressed) {
  if (note.size() > 1024) note.resize(1024);  // the API's limit on an Event's note
  std::string key = uid + "\n" + reason + "\n" + note;
  auto sent = sent_.find(key);
  if ((sent != sent_.end() && now - sent->second < kRepeat) || thisPass_ >= kPerPass) {
    ++suppressed;
    return std::nullopt;
  }
  for (auto it = sent_.begin(); it != sent_.end();) {
    it = now - it->second >= kRepeat ? sent_.erase(it) : std::next(it);
  }
  ++thisPass_;  // taken now, so Events prepared together stay within the limit
  const std::string time = kube::FormatMicroTime(now);
  // Named as client-go's recorder names Events, "<object>.<unix nanoseconds in hex>": unique
  // per object and time, and a valid DNS subdomain. (A generateName of "<object>." is not:
  // kube-apiserver validates the prefix as a name and refuses its trailing dot.)
  const std::string name = regarding.value("name", std::string());
  std::string prefix = name.substr(0, 200);
  while (!prefix.empty() && (prefix.back() == '.' || prefix.back() == '-')) prefix.pop_back();
  char suffix[24];
  std::snprintf(
      suffix, sizeof suffix, ".%llx",
      static_cast<unsigned long long>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::system_clock::now().time_since_epoch())
                                          .count()));
  Pending event;
  event.key = std::move(key);
  event.eventNamespace = eventNamespace;
  event.what = regarding.value("kind", std::string()) + " " +
               (eventNamespace == kClusterNamespace ? name : eventNamespace + "/" + name);
  event.body = {
      {"apiVersion", "events.k8s.io/v1"},
      {"kind", "Event"},
      {"metadata", {{"name", prefix + suffix}, {"namespace", eventNamespace}}},
      {"eventTime", time},
      {"reportingController", "gpu.cozystack.io/gpu-controller"},
      {"reportingInstance", identity_.empty() ? std::string("gpu-controller") : identity_},
      {"action", action},
      {"reason", reason},
      {"type", type},
      {"note", note},
      {"regarding", regarding}};
  return event;
}

void EventRecorder::Send(Pending& event) {
  try {
    client_.Create(kEvents.Path(event.eventNamespace), event.body, write_);
    event.written = true;
  } catch (const std::exception& error) {
    event.error = error.what();
  }
}

void EventRecorder::Post(Pending event, std::chrono::system_clock::time_point now,
                         int64_t& queued) {
  if (queued_.load() >= queueLimit_) {
    --thisPass_;
    ++dropped_;
    return;
  }
  // Counted, and held back from repeating, as it is handed over: the sender's outcome is its
  // own (gpu_controller_events_total{result="failed"}).
  sent_[event.key] = now;
  ++queued;
  ++queued_;
  sender_.Run([this, event = std::move(event)]() mutable {
    Send(event);
    if (event.written) {
      ++written_;
    } else {
      ++failed_;
      runtime::LogDebug("event not written",
                        runtime::LogFields{{"object", event.what}, {"error", event.error}});
    }
    std::lock_guard lock(mutex_);
    --queued_;
    drained_.notify_all();
  });
}

void EventRecorder::Record(const nlohmann::json& regarding, const std::string& eventNamespace,
                           const std::string& uid, const std::string& action,
                           const std::string& reason, const std::string& type, std::string note,
                           std::chrono::system_clock::time_point now, int64_t& queued,
                           int64_t& suppressed) {
  std::optional<Pending> event =
      Make(regarding, eventNamespace, uid, action, reason, type, std::move(note), now, suppressed);
  if (event) Post(std::move(*event), now, queued);
}

bool EventRecorder::WaitForQueued(std::chrono::milliseconds limit) {
  std::unique_lock lock(mutex_);
  return drained_.wait_for(lock, limit, [this] { return queued_.load() == 0; });
}

}  // namespace cozy::controller
