// List, then watch, then resume: a reflector in the client-go sense for one collection. It
// keeps a cache keyed by namespace/name, hands every change to a handler, re-watches from the
// last resourceVersion when a stream ends, and relists when the server says Expired (410).
//
// Nothing a server sends makes it throw: a list or a watch event of the wrong shape, a body
// over the size cap, a handler that throws, all end in the same place as a failed request —
// counted in Stats().failures, described by LastError() (what, and where), a backoff, then a
// relist. The cache and the resourceVersion are only ever replaced by a good list, so a bad
// answer loses nothing.
//
// Driving it: Step() never waits on the watch socket; it returns the time by which it wants
// to be called again, and Fds() says which sockets should wake the caller earlier. An event
// loop registers those (kube::InformerLoop, for every cache of a daemon); RunFor() is the same
// loop on poll(2) for a thread of its own or tests. The LIST itself is one ordinary (blocking,
// time-bounded) request, which a caller that must not block keeps off its thread (ListDue()).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>

#include "kube/backoff.h"
#include "kube/client.h"
#include "kube/watch.h"

namespace cozy::kube {

struct InformerOptions {
  std::string labelSelector;
  std::string fieldSelector;
  // Watch timeout asked of the server; 0 picks one in [300, 600) s as client-go does.
  int watchTimeoutSeconds = 0;
  BackoffPolicy backoff{};  // client-go's reflector: 800 ms .. 30 s, factor 2, jitter 1
  RandomSource random;      // empty: seeded generator
  // Lists in pages of this many objects, followed through `continue` (client-go's reflector:
  // 500), so no one response nears the client's response cap on a large cluster; 0: one page.
  int pageSize = 500;
  // false: the informer keeps of each object only its resourceVersion by key (Versions(): all
  // a relist's differences need), and Cache() stays empty. For a consumer that keeps
  // what it needs from the events themselves (kube::Cache decodes them), so that no object is
  // held twice, once as raw JSON (4.7 MB per 1,000 pods before: docs/benchmarks.md, "The
  // controller's memory per 1,000 pods").
  bool keepObjects = true;
  // Passed to the watch (WatchOptions::skim): its skimmed events reach the handler as stubs.
  // Only with keepObjects false (a stub is no object to keep); lists always come whole.
  SkimWants skim{};
  // Read by kube::Cache's thread: after a step that took events, the watch is read again no
  // sooner than this, so a busy kind's events are read several per wake-up rather than one each
  // (a wake-up, a read and a cold cache paid per event). Stop() still wakes it at once. Zero:
  // each event is read as it comes.
  Duration batch{};
};

struct InformerStats {
  int lists = 0;     // LIST requests that succeeded
  int watches = 0;   // watch requests opened
  int expired = 0;   // 410s seen (each one causes a relist)
  int failures = 0;  // failed lists and watches (each one backs off)
  // List pages over the client's response cap, each asked for again with half as many objects
  // (Client::ListPages), and the page size the informer lists with now: it keeps the smaller
  // size for its later relists.
  int pagesHalved = 0;
  int pageSize = 0;
};

// A watch that ends cleanly sooner than this without a single event (not even a bookmark) is
// a failure that backs off, not a stream to re-open at once (client-go's reflector: "very
// short watch").
inline constexpr Duration kShortWatch = std::chrono::seconds(1);

class Informer {
 public:
  // Called with ADDED, MODIFIED and DELETED events. A relist shows up as the differences
  // between the old cache and the new list, in the same three types. Every object handed
  // over has a metadata object with a string name and resourceVersion. A handler that
  // throws fails the step like a bad answer: the event is not applied to the cache, and
  // the relist after the backoff delivers it again.
  using Handler = std::function<void(const WatchEvent&)>;

  Informer(Client& client, std::string collectionPath, InformerOptions options, Handler handler);
  ~Informer();

  // Does whatever is due at `now`; returns when it wants to run again at the latest. Never
  // throws: a failure is counted, kept in LastError() and backed off. With mayList false a list
  // that falls due is not made: the step returns `now`, and ListDue() says so (a shared thread
  // that must not block hands that step to a thread of its own, kube/informer_loop.h).
  TimePoint Step(TimePoint now, bool mayList = true);
  // The next step lists (and blocks on it): no watch is open, a list is needed and no backoff
  // holds it.
  bool ListDue(TimePoint now) const { return !watch_ && needList_ && now >= retryAt_; }
  // Sockets whose readiness should trigger Step() before that time.
  std::vector<WatchStream::Fd> Fds();
  // Steps on poll(2) until `duration` has passed on the client's clock or `stop()` says so.
  void RunFor(Duration duration, const std::function<bool()>& stop = nullptr);

  bool Synced() const { return synced_; }  // the first list has been delivered
  // The objects by key (keepObjects; empty without).
  const std::map<std::string, nlohmann::json>& Cache() const { return cache_; }
  // Without keepObjects: the resourceVersion of each object by key, all a relist's differences
  // need (a stub as a JSON object cost ten times the memory: 0.6 MiB per 1,000 pods). Hashed:
  // a watch event finds its key with one or two cache misses, not the 17 levels of a tree of
  // 100,000 pods (docs/benchmarks.md, "Where the churn's CPU goes").
  using VersionMap = std::unordered_map<std::string, std::string>;
  const VersionMap& Versions() const { return versions_; }
  const std::string& ResourceVersion() const { return resourceVersion_; }
  const InformerStats& Stats() const { return stats_; }
  const std::string& LastError() const { return lastError_; }

 private:
  TimePoint StepOnce(TimePoint now, bool mayList);
  void ListAndReplace();
  void OpenWatch(TimePoint now);
  void HandleEvents(TimePoint now);
  void HandleEnd(TimePoint now);
  void Apply(const WatchEvent& event, const std::string& key);
  void Fail(const std::string& why, TimePoint now, std::optional<std::chrono::seconds> after);
  static std::string Key(const nlohmann::json& object);
  // A stub of an object the informer keeps no copy of: its name, namespace, resourceVersion.
  static nlohmann::json Stub(const std::string& key, const std::string& resourceVersion);

  Client& client_;
  std::string path_;
  InformerOptions options_;
  Handler handler_;
  Backoff backoff_;
  std::map<std::string, nlohmann::json> cache_;  // keepObjects: the objects
  VersionMap versions_;                          // !keepObjects: resourceVersion by key
  std::string resourceVersion_;
  std::unique_ptr<WatchStream> watch_;
  TimePoint watchOpened_{};
  int watchEvents_ = 0;  // events (bookmarks too) taken from the open watch
  bool needList_ = true;
  bool synced_ = false;
  TimePoint retryAt_{};
  InformerStats stats_;
  std::string lastError_;
};

}  // namespace cozy::kube
