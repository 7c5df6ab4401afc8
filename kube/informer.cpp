#include "kube/informer.h"

#include "kube/json_stream.h"

#include <poll.h>
#include <algorithm>
#include <optional>
#include <vector>

namespace cozy::kube {
using nlohmann::json;

namespace {

// What is wrong with an object's metadata for the cache, or "": the informer keys objects by
// namespace/name and resumes from resourceVersions, so those must be strings.
std::string MetadataProblem(const json& object, bool needName, bool needVersion) {
  if (!object.is_object()) return "the object is " + JsonTypeName(object) + ", not an object";
  const auto metadata = object.find("metadata");
  if (metadata == object.end()) return "metadata is missing";
  if (!metadata->is_object()) return "metadata is " + JsonTypeName(*metadata) + ", not an object";
  const struct {
    const char* name;
    bool needed;
  } fields[] = {{"name", needName}, {"namespace", false}, {"resourceVersion", needVersion}};
  for (const auto& field : fields) {
    const std::string where = std::string("metadata.") + field.name;
    const auto value = metadata->find(field.name);
    if (value == metadata->end()) {
      if (field.needed) return where + " is missing";
    } else if (!value->is_string()) {
      return where + " is " + JsonTypeName(*value) + ", not a string";
    } else if (field.needed && value->get_ref<const std::string&>().empty()) {
      return where + " is empty";
    }
  }
  return "";
}

}  // namespace

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
  // Only called on objects MetadataProblem passed.
  const json& metadata = object.at("metadata");
  std::string ns = StringField(metadata, "namespace");
  std::string name = StringField(metadata, "name");
  return ns.empty() ? name : ns + "/" + name;
}

json Informer::Stub(const std::string& key, const std::string& resourceVersion) {
  json metadata = {{"resourceVersion", resourceVersion}};
  if (const auto slash = key.find('/'); slash != std::string::npos) {
    metadata["namespace"] = key.substr(0, slash);
    metadata["name"] = key.substr(slash + 1);
  } else {
    metadata["name"] = key;
  }
  return {{"metadata", std::move(metadata)}};
}

void Informer::ListAndReplace() {
  // Tell the handler what changed while we were not watching, as plain events. With objects
  // kept, the cache is replaced only once all of them are through: a handler that throws gets
  // them again. Without (keepObjects false), each page's changes go to the handler as the page
  // arrives and only stubs are kept, so the whole list is never held at once; a list that
  // fails on a later page has handed over newer states of some objects, which the relist after
  // the backoff hands over again (the versions kept are still the old ones).
  std::map<std::string, json> fresh;
  VersionMap freshVersions;
  if (!options_.keepObjects) freshVersions.reserve(versions_.size());
  size_t index = 0;
  // The resourceVersion kept for `key` before this list; nullopt for an object new to it.
  const auto kept = [this](const std::string& key) -> std::optional<std::string> {
    if (options_.keepObjects) {
      const auto old = cache_.find(key);
      if (old == cache_.end()) return std::nullopt;
      return StringField(old->second["metadata"], "resourceVersion");
    }
    const auto old = versions_.find(key);
    if (old == versions_.end()) return std::nullopt;
    return old->second;
  };
  const auto changed = [&kept](const std::string& key, const json& object) -> const char* {
    const std::optional<std::string> old = kept(key);
    if (!old) return "ADDED";
    return *old != StringField(object["metadata"], "resourceVersion") ? "MODIFIED" : nullptr;
  };
  // Client::ListPages checked each page's shape; the cache also needs every item named.
  ListOptions list{
      options_.labelSelector, options_.fieldSelector, "", std::max(0, options_.pageSize), {}};
  list.onPageHalved = [this](int, int to) {
    options_.pageSize = to;
    stats_.pageSize = to;
    ++stats_.pagesHalved;
  };
  const json metadata = client_.ListPages(path_, list, [&](json& page) {
    for (json& item : page["items"]) {
      if (std::string problem = MetadataProblem(item, true, false); !problem.empty()) {
        throw ApiError(ErrorKind::kBadResponse, 200, "",
                       "list: items[" + std::to_string(index) + "]: " + problem, "GET", path_);
      }
      ++index;
      std::string key = Key(item);
      if (options_.keepObjects) {
        fresh[key] = std::move(item);
        continue;
      }
      if (const char* type = changed(key, item)) handler_({type, item});
      freshVersions[key] = StringField(item["metadata"], "resourceVersion");
    }
    page["items"] = json::array();  // this page's objects go now
  });
  if (options_.keepObjects) {
    for (const auto& [key, object] : cache_) {
      if (!fresh.count(key)) handler_({"DELETED", object});
    }
    for (const auto& [key, object] : fresh) {
      if (const char* type = changed(key, object)) handler_({type, object});
    }
    cache_ = std::move(fresh);
  } else {
    // In key order, as the kept objects' deletions above: the handler sees the same sequence
    // whichever way the informer keeps what it knows.
    std::vector<const std::pair<const std::string, std::string>*> gone;
    for (const auto& version : versions_) {
      if (!freshVersions.count(version.first)) gone.push_back(&version);
    }
    std::sort(gone.begin(), gone.end(),
              [](const auto* a, const auto* b) { return a->first < b->first; });
    for (const auto* version : gone) handler_({"DELETED", Stub(version->first, version->second)});
    versions_ = std::move(freshVersions);
  }
  resourceVersion_ = StringField(metadata, "resourceVersion");
  needList_ = false;
  synced_ = true;
  ++stats_.lists;
  stats_.pageSize = options_.pageSize;
}

void Informer::OpenWatch(TimePoint now) {
  int timeout = options_.watchTimeoutSeconds;
  if (timeout <= 0) timeout = 300 + static_cast<int>(options_.random() * 300.0);
  WatchOptions watch{options_.labelSelector,
                     options_.fieldSelector,
                     resourceVersion_,
                     true,
                     timeout,
                     options_.keepObjects ? SkimWants{} : options_.skim};
  watch_ = client_.Watch(path_, watch);
  watchOpened_ = now;
  watchEvents_ = 0;
  ++stats_.watches;
}

void Informer::Apply(const WatchEvent& event, const std::string& key) {
  // The cache changes first (a handler may read it), and back if the handler throws, so
  // the relist that follows the failure delivers the event again.
  // One lookup on the way in (an update replaces the value where it stands); the rare roll
  // back looks again.
  const auto apply = [this, &event, &key](auto& store, auto stored) {
    std::optional<std::decay_t<decltype(stored)>> previous;
    const auto it = store.find(key);
    if (it != store.end()) previous = std::move(it->second);
    if (event.type == "DELETED") {
      if (it != store.end()) store.erase(it);
    } else if (it != store.end()) {
      it->second = std::move(stored);
    } else {
      store.emplace(key, std::move(stored));
    }
    try {
      handler_(event);
    } catch (...) {
      store.erase(key);
      if (previous) store.emplace(key, std::move(*previous));
      throw;
    }
  };
  if (options_.keepObjects) {
    apply(cache_, event.object);
  } else {
    apply(versions_, StringField(event.object["metadata"], "resourceVersion"));
  }
}

void Informer::HandleEvents(TimePoint now) {
  for (WatchEvent& event : watch_->TakeEvents()) {
    ++watchEvents_;
    if (event.type == "ERROR") {
      // A Status (WatchStream made sure `object` is an object; its fields may be anything,
      // which ErrorFromResponse takes in its stride).
      const auto code = event.object.find("code");
      const int status = code != event.object.end() && code->is_number_integer() &&
                                 code->get<int64_t>() > 0 && code->get<int64_t>() < 1000
                             ? static_cast<int>(code->get<int64_t>())
                             : 0;
      const std::string text = event.object.dump(-1, ' ', false, json::error_handler_t::replace);
      const ApiError error =
          ErrorFromResponse(status, "application/json", text, "", "GET", watch_->path());
      watch_.reset();
      if (ErrorKindFromStatus(status, StringField(event.object, "reason")) == ErrorKind::kExpired) {
        // Our resourceVersion is compacted away: only a fresh list can say what is true now.
        ++stats_.expired;
        needList_ = true;
        lastError_ = std::string("ERROR event: ") + error.what();
        return;
      }
      // Anything else (a 500, a 429 as an event) is waited out, then re-watched from the
      // same resourceVersion, which is still good.
      Fail(std::string("ERROR event: ") + error.what(), now, error.retryAfter());
      return;
    }
    const bool bookmark = event.type == "BOOKMARK";
    if (std::string problem = MetadataProblem(event.object, !bookmark, true); !problem.empty()) {
      // The stream cannot be trusted past this: what it meant is for a relist to say.
      const std::string path = watch_->path();
      watch_.reset();
      needList_ = true;
      Fail(ApiError(ErrorKind::kBadResponse, 200, "",
                    "event " + std::to_string(watchEvents_) + " (" + event.type + "): " + problem,
                    "GET", path)
               .what(),
           now, std::nullopt);
      return;
    }
    std::string version = StringField(event.object["metadata"], "resourceVersion");
    if (bookmark) {
      resourceVersion_ = version;  // only moves the resourceVersion on
      continue;
    }
    Apply(event, Key(event.object));
    resourceVersion_ = version;
    backoff_.Reset();
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
  const std::string path = watch_->path();
  watch_.reset();
  if (!error) {
    // The server's timeout or a dropped stream: re-watch at once from resourceVersion_. But a
    // stream that ends as soon as it starts, saying nothing, would be re-opened in a hot
    // loop: that one backs off and relists, as client-go's reflector does.
    const Duration lasted = now - watchOpened_;
    if (watchEvents_ == 0 && lasted < kShortWatch) {
      needList_ = true;
      Fail("watch " + path + ": closed after " +
               std::to_string(
                   std::chrono::duration_cast<std::chrono::milliseconds>(lasted).count()) +
               " ms without a single event",
           now, std::nullopt);
    }
    return;
  }
  if (error->kind() == ErrorKind::kExpired) {
    ++stats_.expired;
    needList_ = true;
    return;
  }
  // A stream this client could not read on: the events after the bad one are lost, so only
  // a relist can say what is true now.
  if (error->kind() == ErrorKind::kBadResponse) needList_ = true;
  Fail(error->what(), now, error->retryAfter());
}

TimePoint Informer::Step(TimePoint now, bool mayList) {
  try {
    return StepOnce(now, mayList);
  } catch (const ApiError& error) {
    if (error.kind() == ErrorKind::kExpired || error.kind() == ErrorKind::kBadResponse) {
      needList_ = true;
    }
    watch_.reset();
    Fail(error.what(), now, error.retryAfter());
  } catch (const std::exception& error) {
    // A handler that threw, or a bug here: nothing of it may leave the event loop.
    watch_.reset();
    needList_ = true;
    Fail("informer " + path_ + ": " + error.what(), now, std::nullopt);
  } catch (...) {
    watch_.reset();
    needList_ = true;
    Fail("informer " + path_ + ": unknown exception", now, std::nullopt);
  }
  return retryAt_;
}

TimePoint Informer::StepOnce(TimePoint now, bool mayList) {
  if (now < retryAt_) return retryAt_;
  if (watch_) {
    watch_->Perform();
    HandleEvents(now);
    if (watch_ && watch_->Done()) HandleEnd(now);
    if (now < retryAt_) return retryAt_;
  }
  if (!watch_) {
    if (needList_ && !mayList) return now;  // ListDue(): for a step that may block
    if (needList_) ListAndReplace();
    OpenWatch(now);
    watch_->Perform();
    HandleEvents(now);
    if (now < retryAt_) return retryAt_;
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
