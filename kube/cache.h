// Typed, thread-safe caches over the informer (client-go's shared informer + indexer): one
// collection listed and watched on an informer loop (one thread for the watches of every cache
// that shares it, kube/informer_loop.h), its objects decoded into T, with
// named indexes (a function object -> keys) that readers on any thread query while the
// informer updates them.
//
// Consistency: the cache changes in whole steps under a writer lock: each batch of watch
// events the informer takes in one step, and each relist (built off the lock from the
// informer's new state, then swapped in at once). A reader holds the reader lock for one
// call, so it sees the state before a step or after it, never half a relist. A relist of tens
// of thousands of objects runs on a list worker, never on the loop's thread nor the caller's; the
// informer re-watches and relists with its backoff (see informer.h).
#pragma once

#include <atomic>
#include <concepts>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "kube/client.h"
#include "kube/informer.h"
#include "kube/informer_loop.h"

namespace cozy::kube {

// "namespace/name", or "name" for a cluster-scoped object: the informer's key.
std::string ObjectKey(const nlohmann::json& object);

// Index functions over JSON objects, for Cache<nlohmann::json>.
using JsonIndexFunc = std::function<std::vector<std::string>(const nlohmann::json&)>;
JsonIndexFunc NamespaceIndex();                            // metadata.namespace
JsonIndexFunc FieldIndex(const std::string& jsonPointer);  // a string field, "/spec/nodeName"
JsonIndexFunc LabelIndex(const std::string& label);        // a label's value
JsonIndexFunc AnnotationIndex(const std::string& annotation);

// What a daemon needs of any cache, whatever its type: to hear of changes, to know it synced,
// and what it exports and logs (its size, list/watch failures, objects that did not decode).
class CacheBase {
 public:
  virtual ~CacheBase() = default;
  virtual void SetOnChange(std::function<void()> onChange) = 0;
  virtual bool Synced() const = 0;
  virtual size_t Size() const = 0;
  virtual InformerStats Stats() const = 0;
  virtual std::string LastError() const = 0;
  virtual int DecodeFailures() const = 0;
  virtual int64_t IgnoredChanges() const = 0;
};

template <class T>
class Cache : public CacheBase, private LoopMember {
 public:
  // Turns a stored object into T; one that throws is left out of the cache (counted in
  // DecodeFailures(), described by LastError()).
  using Decode = std::function<T(const nlohmann::json&)>;
  // An object's keys under one index (none: not in that index).
  using IndexFunc = std::function<std::vector<std::string>(const T&)>;
  using Ptr = std::shared_ptr<const T>;

  Cache(Client& client, std::string collectionPath, Decode decode, InformerOptions options = {})
      : client_(client),
        path_(std::move(collectionPath)),
        decode_(std::move(decode)),
        options_(std::move(options)),
        state_(std::make_unique<State>()) {
    // The decoded object is the only copy: the informer keeps stubs (InformerOptions).
    options_.keepObjects = false;
  }
  ~Cache() override { Stop(); }
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;

  // Registers an index by name; only before Start() (std::logic_error after).
  void AddIndex(const std::string& name, IndexFunc index) {
    if (loop_ != nullptr) throw std::logic_error("Cache::AddIndex after Start: " + name);
    indexFuncs_[name] = std::move(index);
    state_->indexes[name];
  }

  // Called on the loop's thread (or a list worker's) after each step that changed it (a batch of
  // watch events, a relist, the first sync); only before Start(). It must return quickly: post, do
  // not work.
  void SetOnChange(std::function<void()> onChange) override {
    if (loop_ != nullptr) throw std::logic_error("Cache::SetOnChange after Start");
    onChange_ = std::move(onChange);
  }
  // Whether a change of one object matters to the cache's readers: `before` is the object as
  // cached (nullptr: it is new), `after` as it is now (nullptr: it went, or no longer decodes).
  // A step whose changes all fail it still updates the cache (a later read sees the object as
  // it is) but calls no onChange: a pod's status heartbeat need not wake a controller whose
  // decisions do not read it. Only before Start(). None: every change matters.
  using ChangeFilter = std::function<bool(const T* before, const T* after)>;
  void SetChangeFilter(ChangeFilter matters) {
    if (loop_ != nullptr) throw std::logic_error("Cache::SetChangeFilter after Start");
    matters_ = std::move(matters);
  }
  // The filter for a T that compares equal when its readers would read the same in it (its
  // decode keeps only what they read): a change between two equal values does not matter.
  static ChangeFilter WhenValueDiffers() requires std::equality_comparable<T> {
    return [](const T* before, const T* after) {
      return before == nullptr || after == nullptr || !(*before == *after);
    };
  }
  // Which decoded objects the cache holds: one that fails `keep` is not stored (and leaves the
  // cache if it was, as if deleted), costs no index and no change filter, and wakes nobody. The
  // informer still knows its resourceVersion, so a relist does not hand it over again unless it
  // changed. For a kind of which readers want a few (the pods that ask for an extended
  // resource, a tenth of a cluster's or fewer), most objects then cost a decode and nothing
  // more, neither memory nor a walk of the cache's tree. A skim in the InformerOptions that
  // wants the keys `keep` reads spares the watch's events of the others even the JSON document
  // and the decode: they come as stubs (WatchEvent::skimmed) and are dropped as `keep` would
  // drop them. Only before Start(). None: keep all.
  void SetKeep(std::function<bool(const T&)> keep) {
    if (loop_ != nullptr) throw std::logic_error("Cache::SetKeep after Start");
    keep_ = std::move(keep);
  }
  // Changes applied without an onChange because none mattered (SetChangeFilter), or of objects
  // the cache does not keep (SetKeep).
  int64_t IgnoredChanges() const override { return ignoredChanges_.load(); }
  // Lists and watches until Stop(): on `loop`, the thread every cache of a daemon shares (its
  // lists on threads of their own, kube/informer_loop.h), or without one on a loop of its own
  // whose thread is named for the collection.
  void Start(InformerLoop* loop = nullptr) {
    if (loop_ != nullptr) return;
    informer_ = std::make_unique<Informer>(client_, path_, options_,
                                           [this](const WatchEvent& event) { Take(event); });
    if (loop == nullptr) {
      // "c:" and the collection's last segment: c:pods, c:gpudevices, c:configmaps.
      ownLoop_ = std::make_unique<InformerLoop>("c:" + LoopName(), client_.time());
      loop = ownLoop_.get();
    }
    loop_ = loop;
    loop_->Add(*this);
  }
  // Steps it no more, at once; waits for a step or a LIST in flight (at most the client's
  // request timeout).
  void Stop() {
    if (loop_ == nullptr) return;
    loop_->Remove(*this);
    ownLoop_.reset();
    loop_ = nullptr;
  }
  // How many times the cache has been stepped: on the real clock an idle watch costs a step
  // when curl's timer asks for one (about once a second), not ten.
  uint64_t Wakeups() const { return wakeups_.load(); }

  // The first list has been applied.
  bool Synced() const override { return synced_.load(); }
  // How many steps changed what the cache holds: read before a List(), an equal count read
  // later says the cache holds what that List() returned (a copy of it can be kept).
  uint64_t Version() const { return version_.load(); }

  Ptr Get(const std::string& key) const {
    ReadLock lock(*this);
    auto it = state_->objects.find(key);
    return it == state_->objects.end() ? nullptr : it->second.object;
  }
  std::vector<Ptr> List() const {
    ReadLock lock(*this);
    std::vector<Ptr> all;
    all.reserve(state_->objects.size());
    for (const auto& [key, entry] : state_->objects) all.push_back(entry.object);
    return all;
  }
  size_t Size() const override {
    ReadLock lock(*this);
    return state_->objects.size();
  }
  // The objects whose index `index` yields `value`, in key order. std::invalid_argument for
  // an index never registered.
  std::vector<Ptr> ByIndex(const std::string& index, const std::string& value) const {
    ReadLock lock(*this);
    const auto& values = IndexOf(index);
    std::vector<Ptr> found;
    auto it = values.find(value);
    if (it == values.end()) return found;
    found.reserve(it->second.size());
    for (const auto& key : it->second) found.push_back(state_->objects.at(key).object);
    return found;
  }
  // The object keys under `value`, in order.
  std::vector<std::string> IndexKeys(const std::string& index, const std::string& value) const {
    ReadLock lock(*this);
    const auto& values = IndexOf(index);
    auto it = values.find(value);
    if (it == values.end()) return {};
    return {it->second.begin(), it->second.end()};
  }
  // Every value the index has objects for.
  std::vector<std::string> IndexValues(const std::string& index) const {
    ReadLock lock(*this);
    std::vector<std::string> all;
    for (const auto& [value, keys] : IndexOf(index)) all.push_back(value);
    return all;
  }
  // Runs `read` under the reader lock with a consistent view: every call it makes sees the
  // same state. `read` must not call back into this cache.
  template <class Read>
  auto WithView(Read&& read) const {
    ReadLock lock(*this);
    return read(View{this});
  }

  InformerStats Stats() const override {
    std::lock_guard lock(infoMutex_);
    return stats_;
  }
  std::string LastError() const override {
    std::lock_guard lock(infoMutex_);
    return lastError_;
  }
  int DecodeFailures() const override { return decodeFailures_.load(); }

 private:
  struct Entry {
    std::string resourceVersion;
    Ptr object;
    std::map<std::string, std::vector<std::string>> indexValues;  // index -> its keys
  };
  struct State {
    std::map<std::string, Entry> objects;
    std::map<std::string, std::map<std::string, std::set<std::string>>> indexes;
  };

 public:
  // A read-only view for WithView; valid only inside the call.
  class View {
   public:
    Ptr Get(const std::string& key) const {
      auto it = cache_->state_->objects.find(key);
      return it == cache_->state_->objects.end() ? nullptr : it->second.object;
    }
    size_t Size() const { return cache_->state_->objects.size(); }
    std::vector<std::string> IndexKeys(const std::string& index, const std::string& value) const {
      const auto& values = cache_->IndexOf(index);
      auto it = values.find(value);
      if (it == values.end()) return {};
      return {it->second.begin(), it->second.end()};
    }
    size_t IndexCount(const std::string& index, const std::string& value) const {
      const auto& values = cache_->IndexOf(index);
      auto it = values.find(value);
      return it == values.end() ? 0 : it->second.size();
    }

   private:
    friend class Cache;
    explicit View(const Cache* cache) : cache_(cache) {}
    const Cache* cache_;
  };

 private:
  // glibc's shared_mutex lets readers in while a writer waits, so readers that never pause
  // (webhooks under load) could hold a relist off for ever. Readers pass through `gate_`,
  // which a writer holds while it waits: a waiting writer is next.
  struct ReadLock {
    explicit ReadLock(const Cache& cache) {
      std::lock_guard gate(cache.gate_);
      lock = std::shared_lock(cache.mutex_);
    }
    std::shared_lock<std::shared_mutex> lock;
  };
  struct WriteLock {
    explicit WriteLock(const Cache& cache) : gate(cache.gate_), lock(cache.mutex_) {}
    std::lock_guard<std::mutex> gate;
    std::unique_lock<std::shared_mutex> lock;
  };

  const std::map<std::string, std::set<std::string>>& IndexOf(const std::string& index) const {
    auto it = state_->indexes.find(index);
    if (it == state_->indexes.end()) {
      throw std::invalid_argument("cache " + path_ + ": no index named " + index);
    }
    return it->second;
  }

  void Note(const std::string& error) {
    std::lock_guard lock(infoMutex_);
    lastError_ = error;
  }

  // Decodes and indexes one object; false when it does not decode or is not kept (SetKeep).
  bool MakeEntry(const std::string& key, const nlohmann::json& object, Entry& entry) {
    const auto& metadata = object.at("metadata");
    entry.resourceVersion = metadata.value("resourceVersion", "");
    try {
      T decoded = decode_(object);
      if (keep_ && !keep_(decoded)) return false;
      entry.object = std::make_shared<const T>(std::move(decoded));
    } catch (const std::exception& error) {
      ++decodeFailures_;
      Note("decode " + key + ": " + error.what());
      return false;
    }
    for (const auto& [name, index] : indexFuncs_) {
      try {
        entry.indexValues[name] = index(*entry.object);
      } catch (const std::exception& error) {
        Note("index " + name + " of " + key + ": " + error.what());
      }
    }
    return true;
  }

  // One object's change at `at` (not `found`: it is new and `at` is where it goes), with the
  // one lookup of its key the caller made: an update replaces the entry where it stands and
  // touches only the indexes whose values moved (a pod's status write leaves its node and
  // resources, and so its index entries, alone).
  static void Replace(State& state, typename std::map<std::string, Entry>::iterator at, bool found,
                      const std::string& key, std::optional<Entry> entry) {
    static const std::vector<std::string> kNone;
    const auto valuesOf = [](const Entry* of,
                             const std::string& name) -> const std::vector<std::string>& {
      if (of == nullptr) return kNone;
      const auto it = of->indexValues.find(name);
      return it == of->indexValues.end() ? kNone : it->second;
    };
    Entry* before = found ? &at->second : nullptr;
    const Entry* after = entry ? &*entry : nullptr;
    // Every index is registered in state.indexes (AddIndex), and an entry's values are only
    // ever under those names.
    for (auto& [name, index] : state.indexes) {
      const auto& old = valuesOf(before, name);
      const auto& now = valuesOf(after, name);
      if (old == now) continue;
      for (const auto& value : old) {
        auto held = index.find(value);
        if (held == index.end()) continue;
        held->second.erase(key);
        if (held->second.empty()) index.erase(held);
      }
      for (const auto& value : now) index[value].insert(key);
    }
    if (after == nullptr) {
      if (before != nullptr) state.objects.erase(at);
    } else if (before != nullptr) {
      *before = std::move(*entry);
    } else {
      state.objects.emplace_hint(at, key, std::move(*entry));
    }
  }

  // One event, decoded now (the informer keeps no copy of the object): the step's changes are
  // applied together once it is over. A relist shows up as its differences, so an object whose
  // resourceVersion did not change keeps its decoded value.
  void Take(const WatchEvent& event) {
    std::string key = ObjectKey(event.object);
    if (event.type == "DELETED" || event.skimmed) {  // skimmed: an object the cache does not keep
      pending_.emplace_back(std::move(key), std::nullopt);
      return;
    }
    Entry entry;
    if (MakeEntry(key, event.object, entry)) {
      pending_.emplace_back(std::move(key), std::move(entry));
    } else {
      // An undecodable update, or one the cache does not keep, drops it.
      pending_.emplace_back(std::move(key), std::nullopt);
    }
  }

  // The step's changes, in order, under one write lock; the replaced entries are freed after.
  // Returns whether a change mattered (ChangeFilter), or the step is the first sync.
  bool ApplyPending(bool listed) {
    std::vector<Ptr> replaced;  // the last references, dropped outside the lock
    bool mattered = listed && !synced_;
    int64_t ignored = 0;
    bool changed = false;
    {
      WriteLock lock(*this);
      for (auto& [key, entry] : pending_) {
        const T* before = nullptr;
        const auto old = state_->objects.lower_bound(key);
        const bool found = old != state_->objects.end() && old->first == key;
        if (found) {
          replaced.push_back(old->second.object);
          before = old->second.object.get();
        }
        const T* after = entry ? entry->object.get() : nullptr;
        if (before == nullptr && after == nullptr) {
          ++ignored;  // an object the cache does not keep, or a deletion of one it never had
          continue;
        }
        bool matters = true;  // a filter that throws: the change is taken as one that matters
        try {
          if (matters_) matters = matters_(before, after);
        } catch (...) {
        }
        mattered = mattered || matters;
        ignored += matters ? 0 : 1;
        Replace(*state_, old, found, key, std::move(entry));
        changed = true;
      }
      if (changed) ++version_;
      if (listed) synced_ = true;
    }
    pending_.clear();
    ignoredChanges_ += ignored;
    return mattered;
  }

  std::string LoopName() const override { return path_.substr(path_.find_last_of('/') + 1); }
  bool ListDue(TimePoint now) const override { return informer_->ListDue(now); }

  // One step of the informer and the change it made, applied under one write lock.
  Next Step(TimePoint now, bool mayList) override {
    ++wakeups_;
    const int lists = informer_->Stats().lists;
    pending_.clear();
    const TimePoint next = informer_->Step(now, mayList);
    const bool took = !pending_.empty();
    try {
      const bool listed = informer_->Stats().lists != lists;
      if (listed || !pending_.empty()) {
        if (ApplyPending(listed) && onChange_) onChange_();
      }
    } catch (const std::exception& error) {
      Note(std::string("cache ") + path_ + ": " + error.what());
    }
    {
      std::lock_guard lock(infoMutex_);
      stats_ = informer_->Stats();
      if (!informer_->LastError().empty()) lastError_ = informer_->LastError();
    }
    if (took && options_.batch > Duration::zero()) {
      // The events that come meanwhile wait in the socket for the next read (InformerOptions::
      // batch): nothing wakes this cache before then.
      return {client_.time().Now() + options_.batch, {}};
    }
    return {next, informer_->Fds()};
  }

  Client& client_;
  std::string path_;
  Decode decode_;
  InformerOptions options_;
  std::map<std::string, IndexFunc> indexFuncs_;
  std::function<void()> onChange_;
  ChangeFilter matters_;
  std::function<bool(const T&)> keep_;
  std::atomic<int64_t> ignoredChanges_{0};
  std::unique_ptr<Informer> informer_;
  // The cache thread's: this step's changes, decoded (nullopt: the key goes).
  std::vector<std::pair<std::string, std::optional<Entry>>> pending_;
  InformerLoop* loop_ = nullptr;           // while started
  std::unique_ptr<InformerLoop> ownLoop_;  // Start() without a loop
  std::atomic<uint64_t> wakeups_{0};
  std::atomic<bool> synced_{false};
  std::atomic<uint64_t> version_{0};  // bumped under the writer lock, with each change
  std::atomic<int> decodeFailures_{0};
  mutable std::mutex gate_;          // see ReadLock
  mutable std::shared_mutex mutex_;  // guards *state_ (the pointer and what it points to)
  std::unique_ptr<State> state_;
  mutable std::mutex infoMutex_;
  InformerStats stats_;
  std::string lastError_;
};

// A cache of the objects as JSON.
using JsonCache = Cache<nlohmann::json>;
inline nlohmann::json IdentityDecode(const nlohmann::json& object) { return object; }

}  // namespace cozy::kube
