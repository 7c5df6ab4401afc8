// Watches: the initial events or a resume from the history, bookmarks, 410, fault modes.
#include "test/fakes/fake_apiserver_internal.h"

#include <algorithm>

namespace cozy::fake {
using namespace internal;  // NOLINT

void FakeApiServer::Watch(const httplib::Request& request, httplib::Response& response,
                          std::shared_ptr<const ResourceType> type, const std::string& ns,
                          size_t logIndex) {
  Selectors selectors;
  if (request.has_param("labelSelector") && !request.get_param_value("labelSelector").empty()) {
    selectors.labels.emplace(request.get_param_value("labelSelector"));
  }
  if (request.has_param("fieldSelector")) {
    selectors.fields = ParseFieldSelector(request.get_param_value("fieldSelector"));
  }
  std::string from =
      request.has_param("resourceVersion") ? request.get_param_value("resourceVersion") : "";
  bool bookmarks = ParamTrue(request, "allowWatchBookmarks");
  int timeoutSeconds = request.has_param("timeoutSeconds")
                           ? std::stoi(request.get_param_value("timeoutSeconds"))
                           : 1800;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutSeconds);

  // Where the stream starts: the current state as ADDED events, or the history after `from`.
  std::vector<json> initial;
  uint64_t position = 0;
  bool expired = false;
  uint64_t dropGeneration = 0;
  uint64_t expireGeneration = 0;
  {
    std::lock_guard lock(mutex_);
    dropGeneration = dropGeneration_;
    expireGeneration = expireGeneration_;
    if (from.empty() || from == "0") {
      for (const auto& [key, object] : objects_[type->StoreKey()]) {
        (void)key;
        if (!ns.empty() && object["metadata"].value("namespace", "") != ns) continue;
        json shown = FromStorage(type->group, type->plural, object);
        if (selectors.Matches(shown)) {
          initial.push_back({{"type", "ADDED"}, {"object", std::move(shown)}});
        }
      }
      position = resourceVersion_;
    } else {
      position = std::stoull(from);
      expired = position < compactedThrough_;
    }
  }
  // A bad event to send after the initial ones (as a frame of text: one mode is not JSON).
  std::string garbled;
  bool closeAtOnce = false;
  // Not spent on a watch that only gets its 410.
  if (auto fault = expired ? std::nullopt : TakeModeFault(request, /*listModes=*/false, logIndex)) {
    json object = {
        {"apiVersion", type->ApiVersion()},
        {"kind", type->kind},
        {"metadata", {{"name", "garbled"}, {"resourceVersion", std::to_string(position)}}}};
    if (type->namespaced) object["metadata"]["namespace"] = ns.empty() ? "default" : ns;
    switch (fault->mode) {
      case FaultMode::kWatchResourceVersionNumber:
        object["metadata"]["resourceVersion"] = position;
        garbled = json{{"type", "ADDED"}, {"object", object}}.dump();
        break;
      case FaultMode::kWatchMetadataMissing:
        object.erase("metadata");
        garbled = json{{"type", "MODIFIED"}, {"object", object}}.dump();
        break;
      case FaultMode::kWatchObjectNotObject:
        garbled = json{{"type", "ADDED"}, {"object", "garbled"}}.dump();
        break;
      case FaultMode::kWatchUnknownType:
        garbled = json{{"type", "RENAMED"}, {"object", object}}.dump();
        break;
      case FaultMode::kWatchNotJson:
        garbled = R"({"type":"ADDED","object":{"metadata":{"name":garbled}}})";
        break;
      case FaultMode::kWatchErrorWrongTypes:
        garbled = json{{"type", "ERROR"},
                       {"object",
                        {{"kind", "Status"},
                         {"apiVersion", "v1"},
                         {"status", "Failure"},
                         {"code", "500"},
                         {"reason", 7},
                         {"message", {"not", "text"}},
                         {"details", {{"retryAfterSeconds", "5"}}}}}}
                      .dump();
        break;
      case FaultMode::kWatchCloseAtOnce:
        closeAtOnce = true;
        break;
      default:
        break;
    }
  }
  auto expiredEvent = [](uint64_t version, uint64_t oldest) {
    return json{{"type", "ERROR"},
                {"object", StatusBody(410, "Expired",
                                      "too old resource version: " + std::to_string(version) +
                                          " (" + std::to_string(oldest) + ")",
                                      json::object())}};
  };
  auto streamer = [this, type, ns, selectors, initial, position, expired, bookmarks, deadline,
                   dropGeneration, expireGeneration, expiredEvent, garbled,
                   closeAtOnce](size_t, httplib::DataSink& sink) mutable {
    auto send = [&sink](const json& event) {
      std::string line = event.dump() + "\n";
      return sink.write(line.data(), line.size());
    };
    if (closeAtOnce) {
      sink.done();
      return true;
    }
    if (expired) {
      uint64_t oldest;
      {
        std::lock_guard lock(mutex_);
        oldest = compactedThrough_ + 1;
      }
      send(expiredEvent(position, oldest));
      sink.done();
      return true;
    }
    for (const auto& event : initial) {
      if (!send(event)) return false;
    }
    if (!garbled.empty()) {
      std::string line = garbled + "\n";
      if (!sink.write(line.data(), line.size())) return false;
      garbled.clear();
    }
    auto nextBookmark = std::chrono::steady_clock::now() + options_.bookmarkInterval;
    while (true) {
      std::vector<json> batch;
      bool end = false;
      bool expire = false;
      uint64_t current = 0;
      {
        std::unique_lock lock(mutex_);
        auto wake = std::min(deadline, bookmarks ? nextBookmark : deadline);
        changed_.wait_until(lock, wake, [&] {
          return stopping_ || dropGeneration_ != dropGeneration ||
                 expireGeneration_ != expireGeneration ||
                 (!history_.empty() && history_.back()->resourceVersion > position);
        });
        current = resourceVersion_;
        if (stopping_ || dropGeneration_ != dropGeneration) {
          end = true;
        } else if (expireGeneration_ != expireGeneration) {
          expire = true;
        } else if (position < compactedThrough_) {
          expire = true;  // the history we would resume from is gone
        } else {
          // The history is in resourceVersion order: start after `position`.
          auto first = std::upper_bound(
              history_.begin(), history_.end(), position,
              [](uint64_t version, const auto& event) { return version < event->resourceVersion; });
          for (auto it = first; it != history_.end(); ++it) {
            const auto& event = *it;
            if (event->resourceVersion <= position) continue;
            position = event->resourceVersion;
            if (event->storeKey != type->StoreKey()) continue;
            if (!ns.empty() && event->object["metadata"].value("namespace", "") != ns) continue;
            // The history holds the storage's form; each watcher sees its kind's.
            json shown = FromStorage(type->group, type->plural, event->object);
            if (!selectors.Matches(shown)) continue;
            batch.push_back({{"type", event->type}, {"object", std::move(shown)}});
          }
        }
      }
      if (end) break;
      if (expire) {
        send(expiredEvent(position, current));
        break;
      }
      for (const auto& event : batch) {
        if (!send(event)) return false;
      }
      auto now = std::chrono::steady_clock::now();
      if (now >= deadline) break;  // the server's timeout: the stream just ends
      if (bookmarks && now >= nextBookmark) {
        json bookmark = {{"type", "BOOKMARK"},
                         {"object",
                          {{"kind", type->kind},
                           {"apiVersion", type->ApiVersion()},
                           {"metadata", {{"resourceVersion", std::to_string(current)}}}}}};
        if (!send(bookmark)) return false;
        nextBookmark = now + options_.bookmarkInterval;
      }
      if (!sink.is_writable()) return false;
    }
    sink.done();
    return true;
  };
  response.status = 200;
  StreamUncompressed(request);
  response.set_chunked_content_provider("application/json", streamer);
}

}  // namespace cozy::fake
