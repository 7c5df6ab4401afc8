#include "kube/informer.h"

#include <poll.h>

namespace cozy::kube {
using nlohmann::json;

Informer::Informer(Client& client, std::string collectionPath, InformerOptions options,
                   Handler handler)
    : client_(client),
      path_(std::move(collectionPath)),
      options_(std::move(options)),
      handler_(std::move(handler)),
      backoff_(options_.backoff, options_.random ? options_.random : DefaultRandomSource()) {
  if (!options_.random) options_.random = DefaultRandomSource();
}

Informer::~Informer() = default;

std::string Informer::Key(const json& object) {
  const json& metadata = object.contains("metadata") ? object["metadata"] : json::object();
  std::string ns = metadata.value("namespace", "");
  std::string name = metadata.value("name", "");
  return ns.empty() ? name : ns + "/" + name;
}

void Informer::ListAndReplace() {
  json list = client_.List(path_, {options_.labelSelector, options_.fieldSelector, "", 0});
  std::map<std::string, json> fresh;
  for (auto& item : list["items"]) {
    std::string key = Key(item);  // before the move: the right side of = is evaluated first
    fresh[key] = std::move(item);
  }
  // Tell the handler what changed while we were not watching, as plain events.
  for (const auto& [key, object] : cache_) {
    if (!fresh.count(key)) handler_({"DELETED", object});
  }
  for (const auto& [key, object] : fresh) {
    auto old = cache_.find(key);
    if (old == cache_.end()) {
      handler_({"ADDED", object});
    } else if (old->second["metadata"].value("resourceVersion", "") !=
               object["metadata"].value("resourceVersion", "")) {
      handler_({"MODIFIED", object});
    }
  }
  cache_ = std::move(fresh);
  resourceVersion_ = list["metadata"].value("resourceVersion", "");
  needList_ = false;
  synced_ = true;
  ++stats_.lists;
}

void Informer::OpenWatch() {
  int timeout = options_.watchTimeoutSeconds;
  if (timeout <= 0) timeout = 300 + static_cast<int>(options_.random() * 300.0);
  WatchOptions watch{options_.labelSelector, options_.fieldSelector, resourceVersion_, true,
                     timeout};
  watch_ = client_.Watch(path_, watch);
  ++stats_.watches;
}

void Informer::HandleEvents() {
  for (WatchEvent& event : watch_->TakeEvents()) {
    if (event.type == "ERROR") {
      int code = event.object.value("code", 0);
      std::string reason = event.object.value("reason", "");
      if (ErrorKindFromStatus(code, reason) == ErrorKind::kExpired) {
        // Our resourceVersion is compacted away: only a fresh list can say what is true now.
        ++stats_.expired;
        needList_ = true;
      }
      lastError_ = "watch " + path_ + ": ERROR event: " + event.object.value("message", "");
      watch_.reset();
      return;
    }
    const json& metadata =
        event.object.contains("metadata") ? event.object["metadata"] : json::object();
    std::string version = metadata.value("resourceVersion", "");
    if (!version.empty()) resourceVersion_ = version;
    if (event.type == "BOOKMARK") continue;  // only moves the resourceVersion on
    std::string key = Key(event.object);
    if (event.type == "DELETED") {
      cache_.erase(key);
    } else {
      cache_[key] = event.object;
    }
    backoff_.Reset();
    handler_(event);
  }
}

void Informer::Fail(const std::string& why, TimePoint now,
                    std::optional<std::chrono::seconds> after) {
  ++stats_.failures;
  lastError_ = why;
  Duration wait = backoff_.Next();
  if (after && *after > wait) wait = *after;
  retryAt_ = now + wait;
}

void Informer::HandleEnd(TimePoint now) {
  auto error = watch_->Error();
  watch_.reset();
  if (!error) return;  // the server's timeout: re-watch at once from resourceVersion_
  if (error->kind() == ErrorKind::kExpired) {
    ++stats_.expired;
    needList_ = true;
    return;
  }
  Fail(error->what(), now, error->retryAfter());
}

TimePoint Informer::Step(TimePoint now) {
  if (now < retryAt_) return retryAt_;
  if (watch_) {
    watch_->Perform();
    HandleEvents();
    if (watch_ && watch_->Done()) HandleEnd(now);
    if (now < retryAt_) return retryAt_;
  }
  if (!watch_) {
    try {
      if (needList_) ListAndReplace();
      OpenWatch();
      watch_->Perform();
      HandleEvents();
    } catch (const ApiError& error) {
      if (error.kind() == ErrorKind::kExpired) needList_ = true;
      Fail(error.what(), now, error.retryAfter());
      return retryAt_;
    }
  }
  return now + (watch_ ? watch_->Timeout() : Duration::zero());
}

std::vector<WatchStream::Fd> Informer::Fds() {
  return watch_ ? watch_->Fds() : std::vector<WatchStream::Fd>{};
}

void Informer::RunFor(Duration duration, const std::function<bool()>& stop) {
  TimeSource& time = client_.time();
  const TimePoint end = time.Now() + duration;
  while (time.Now() < end && !(stop && stop())) {
    TimePoint now = time.Now();
    TimePoint next = std::min(Step(now), end);
    if (stop && stop()) break;
    Duration wait = std::max(Duration::zero(), next - time.Now());
    std::vector<pollfd> polls;
    for (const auto& fd : Fds()) {
      polls.push_back(
          {fd.fd, static_cast<short>((fd.read ? POLLIN : 0) | (fd.write ? POLLOUT : 0)), 0});
    }
    if (!polls.empty()) {
      // Socket waits are real time; cap them so an injected clock still moves on.
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(wait).count();
      poll(polls.data(), polls.size(), static_cast<int>(std::min<long long>(ms, 100)));
    } else if (wait > Duration::zero()) {
      time.SleepFor(wait);
    }
  }
}

}  // namespace cozy::kube
