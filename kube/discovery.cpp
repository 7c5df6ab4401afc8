#include "kube/discovery.h"

#include "runtime/thread_name.h"

#include <set>

namespace cozy::kube {
using nlohmann::json;

std::string_view ServedName(Served served) {
  switch (served) {
    case Served::kNotSynced:
      return "not synced";
    case Served::kServed:
      return "served";
    case Served::kNotServed:
      return "not served";
    case Served::kFailing:
      return "failing";
  }
  return "unknown";
}

Discovery::Discovery(Client& client, DiscoveryOptions options)
    : client_(client), options_(options) {}

Discovery::~Discovery() { Stop(); }

void Discovery::Track(const GroupVersionResource& resource) {
  std::lock_guard lock(mutex_);
  states_.try_emplace(resource);
}

ResourceState Discovery::State(const GroupVersionResource& resource) const {
  std::lock_guard lock(mutex_);
  auto it = states_.find(resource);
  return it == states_.end() ? ResourceState{} : it->second;
}

int Discovery::Refreshes() const {
  std::lock_guard lock(mutex_);
  return refreshes_;
}

void Discovery::Refresh() {
  std::set<std::pair<std::string, std::string>> groupVersions;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [resource, state] : states_) {
      (void)state;
      groupVersions.emplace(resource.group, resource.version);
    }
  }
  for (const auto& [group, version] : groupVersions) {
    const std::string path = group.empty() ? "/api/" + version : "/apis/" + group + "/" + version;
    // Outcome for the group/version: served resources, or not served at all, or failing.
    std::map<std::string, std::pair<bool, std::string>> resources;  // name -> namespaced, kind
    bool absent = false;
    std::string error;
    try {
      json list = client_.Get(path);
      const auto items = list.is_object() ? list.find("resources") : list.end();
      if (!list.is_object() || items == list.end() || !items->is_array()) {
        error = "GET " + path + ": not an APIResourceList";
      } else {
        for (const json& item : *items) {
          if (!item.is_object() || !item.contains("name") || !item["name"].is_string()) continue;
          const auto namespaced = item.find("namespaced");
          const auto kind = item.find("kind");
          resources[item["name"].get<std::string>()] = {
              namespaced != item.end() && namespaced->is_boolean() && namespaced->get<bool>(),
              kind != item.end() && kind->is_string() ? kind->get<std::string>() : ""};
        }
      }
    } catch (const ApiError& failure) {
      if (failure.kind() == ErrorKind::kResourceNotServed ||
          failure.kind() == ErrorKind::kNotFound) {
        absent = true;
      } else {
        error = failure.what();
      }
    } catch (const std::exception& failure) {
      error = "GET " + path + ": " + failure.what();
    }
    std::lock_guard lock(mutex_);
    for (auto& [resource, state] : states_) {
      if (resource.group != group || resource.version != version) continue;
      if (!error.empty()) {
        if (state.served != Served::kFailing) state.lastKnown = state.served;
        state.served = Served::kFailing;
        state.error = error;
        continue;
      }
      state.error.clear();
      auto it = resources.find(resource.resource);
      if (absent || it == resources.end()) {
        state.served = Served::kNotServed;
      } else {
        state.served = Served::kServed;
        state.namespaced = it->second.first;
        state.kind = it->second.second;
      }
      state.lastKnown = state.served;
    }
  }
  std::lock_guard lock(mutex_);
  ++refreshes_;
}

void Discovery::Start() {
  std::lock_guard lock(mutex_);
  if (thread_.joinable() || stopping_) return;
  thread_ = std::thread([this] { Run(); });
}

void Discovery::RefreshSoon() {
  {
    std::lock_guard lock(mutex_);
    soon_ = true;
  }
  wake_.notify_all();
}

void Discovery::Stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Discovery::Run() {
  runtime::NameThisThread("discovery");
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      soon_ = false;
    }
    Refresh();  // never throws ApiError; anything else is a bug worth crashing on
    std::unique_lock lock(mutex_);
    wake_.wait_for(lock, options_.refreshInterval, [this] { return stopping_ || soon_; });
  }
}

}  // namespace cozy::kube
