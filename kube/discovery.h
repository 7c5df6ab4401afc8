// Whether the API server serves a kind, per group/version/resource, refreshed periodically:
// "not served" (the group/version is absent, or present without the resource) is told apart
// from "not known yet" (no answer so far) and from "failing" (5xx, a connection error, a bad
// answer), so a caller can treat a missing CRD differently from a server in trouble.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kube/client.h"
#include "kube/clock.h"

namespace cozy::kube {

struct GroupVersionResource {
  std::string group;  // "" for the core group
  std::string version;
  std::string resource;  // the plural, e.g. "virtualmachineinstances"
  std::string GroupVersion() const { return group.empty() ? version : group + "/" + version; }
  auto operator<=>(const GroupVersionResource&) const = default;
};

enum class Served {
  kNotSynced,  // no answer about its group/version yet
  kServed,     // listed in the group/version's APIResourceList
  kNotServed,  // the group/version is absent (404 from discovery) or does not list it
  kFailing,    // the last try failed: 5xx, 429, a transport error, 401/403, a bad answer
};
std::string_view ServedName(Served served);

struct ResourceState {
  Served served = Served::kNotSynced;
  // While kFailing: whether it was served at the last good answer (kNotSynced if never).
  Served lastKnown = Served::kNotSynced;
  std::string error;  // kFailing: what went wrong
  bool namespaced = false;
  std::string kind;
};

struct DiscoveryOptions {
  Duration refreshInterval = std::chrono::seconds(30);
};

// Thread-safe. Refresh() asks the server (one GET of /api/v1 or /apis/<group>/<version> per
// tracked group/version) on the calling thread; Start() does it every refreshInterval on a
// thread of its own, so a slow server never holds up an event loop.
class Discovery {
 public:
  Discovery(Client& client, DiscoveryOptions options = {});
  ~Discovery();  // Stop()
  Discovery(const Discovery&) = delete;
  Discovery& operator=(const Discovery&) = delete;

  // Tracks a resource (kNotSynced until the next refresh answers for it).
  void Track(const GroupVersionResource& resource);
  void Refresh();
  ResourceState State(const GroupVersionResource& resource) const;
  Served IsServed(const GroupVersionResource& resource) const { return State(resource).served; }
  int Refreshes() const;  // completed refresh rounds

  void Start();
  void RefreshSoon();  // wakes the thread for a refresh now
  void Stop();

 private:
  void Run();
  Client& client_;
  DiscoveryOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::map<GroupVersionResource, ResourceState> states_;
  int refreshes_ = 0;
  bool stopping_ = false;
  bool soon_ = false;
  std::thread thread_;
};

}  // namespace cozy::kube
