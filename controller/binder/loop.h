// The binder's loop, on the leader with --enable-gpu: when passes run, what each pass reads and
// what it counts. A change in any cache queues a full pass after a 50 ms debounce; an unanswered
// bind request queues an answers-only pass at once (D4). Passes run on one worker thread of
// their own, so they never overlap (D2) and the reconciler's slow writes never delay them; when
// each starts is runtime::PassScheduler's, as the reconciler's is (a failed pass holds the next
// full one off for a second, never an answer a VM start waits on).
//
// A pass reads the caches into a snapshot (through BinderSource, which the daemon implements
// over its caches), past them where they lag the binder's writes or the last leader's (D3),
// and hands it to the Binder, which asks the model and writes its decisions. The model never
// sees I/O; the event loop and the caches stay the daemon's.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "api/gpudevice.h"
#include "controller/binder/binder.h"
#include "controller/model/model.h"
#include "controller/model/snapshot.h"
#include "kube/client.h"
#include "runtime/loop.h"
#include "runtime/metrics.h"
#include "runtime/pass_loop.h"
#include "runtime/worker.h"

namespace cozy::controller {

// What a pass reads, from the daemon's caches.
class BinderSource {
 public:
  virtual ~BinderSource() = default;
  // Loop thread: whether every cache a pass reads has listed.
  virtual bool BinderCachesSynced() const = 0;
  // Loop thread: whether a cached device carries a bind request without its answer.
  virtual bool AnyUnansweredRequest() const = 0;
  // Binder worker: the GPUDevices as the cache holds them now.
  virtual std::vector<std::shared_ptr<const api::GpuDevice>> CachedDevices() const = 0;
  // Binder worker: one GPUDevice as the cache holds it now ("namespace/name"; null: none).
  virtual std::shared_ptr<const api::GpuDevice> CachedDevice(const std::string& key) const = 0;
  // Binder worker: everything but the devices; returns whether the VMIs are known (their kind
  // served and its cache synced), which the pass needs to read an attachment (G7).
  virtual bool FillSnapshot(model::Snapshot& snapshot) const = 0;
  // Any thread: a count of the caches' changes, and a wait until it moves past `seen` (or
  // `until`): how a pass waits for the watch to deliver its own last writes (D3).
  virtual uint64_t Generation() const = 0;
  virtual void WaitForChange(uint64_t seen, std::chrono::steady_clock::time_point until) const = 0;
};

// The room the last full pass left when it decided only held keeps (a quiet cluster), for the
// pods cache's filter (docs/controller.md, "Who wakes for a change"): a pod change
// model::AbsorbPodChange takes in it cannot change a decision, and wakes no pass. Any thread.
//
// A pass starts recording (BeginPass) before it reads the caches: a pod change from then on is
// kept, not absorbed, and wakes nothing yet, since the pass may or may not have read it. When
// the pass decided only held keeps, Settle replays the recorded changes, in order, against the
// room the pass left: a change the pass did read is counted twice, which only makes the room
// smaller (AbsorbPodChange gives back only units it took itself), and one it did not is counted
// as the room would have counted it had it been settled at the pass's read. If every change is
// taken the room is settled without another pass; otherwise, and after a pass that settles nothing
// (EndPass), a change recorded means one more pass. Before this, the changes that came during
// a pass woke the next pass, which itself ran long enough to catch the next change: a churn of
// GPU pods kept a chain of full passes going after every resync.
class QuietRoom {
 public:
  enum class Take {
    kAbsorbed,  // the room took it: no pass
    kRecorded,  // a pass is running: kept for Settle or EndPass, which say whether to pass again
    kRefused,   // a pass must decide (the room is unsettled, or the change does not fit)
  };
  // Any change, at most this many per pass, is kept; past it the pass that ends runs again.
  static constexpr size_t kRecordLimit = 4096;

  void Unsettle();
  void BeginPass();
  // At the end of a pass that decided only held keeps: the room it left, with the changes
  // recorded since BeginPass taken from it. Returns whether another pass is needed (a recorded
  // change the room refused, more than kRecordLimit of them, or no pass recording: Unsettle
  // came in between). Settled only when not.
  bool Settle(model::FreeUnits room);
  // At the end of any other pass: unsettled; returns whether a change was recorded (or the
  // recording was cut off), which needs a pass.
  bool EndPass();
  Take Absorbs(const model::Pod* before, const model::Pod* after);
  bool Settled() const;
  int64_t Absorbed() const;  // changes absorbed, ever (recorded ones once a Settle takes them)

 private:
  struct Change {
    std::optional<model::Pod> before;
    std::optional<model::Pod> after;
  };
  static bool TryAbsorb(model::FreeUnits& room, const model::Pod* before, const model::Pod* after);
  // Under mutex_: no room, and recording (empty) or not.
  void ResetLocked(bool recording);

  mutable std::mutex mutex_;
  std::optional<model::FreeUnits> room_;
  bool recording_ = false;
  bool overflowed_ = false;
  std::vector<Change> recorded_;
  int64_t absorbed_ = 0;
};

class BinderLoop {
 public:
  // `leadership` is the replica's: read before each pass and each write, and its deadline
  // before each attempt of a write (Binder).
  BinderLoop(runtime::Loop& loop, kube::Client& client, const kube::Leadership& leadership,
             std::string identity, BinderSource& source);
  BinderLoop(const BinderLoop&) = delete;
  BinderLoop& operator=(const BinderLoop&) = delete;

  // Loop thread, before the loop runs: adds the pass timer.
  void Start();
  // Loop thread: a cache changed (or the replica took the lead): the next pass, soon.
  void Trigger();
  // Any thread, on taking the lead, before the leadership turns true: the first pass lists the
  // devices from the API server before it trusts the cache (D3 across a leader change).
  void TookTheLead() {
    quietRoom_.Unsettle();  // a room left in an earlier term is nobody's now
    resync_ = true;
    ++term_;  // the catalog of an earlier term's pass is not exported in this one
  }
  // Before Start: how many namespaces get a gpu_catalog_tenant_units_held series of their own
  // (--catalog-tenant-series; 0: none; docs/controller.md, "Catalog metrics").
  void SetCatalogTenantSeries(size_t series) { catalogTenantSeries_ = series; }
  // Once the leadership is off: lets the pass in flight finish (it writes nothing more), then
  // stops the worker.
  void Stop();
  // The binder's families (the catalog's among them), declared once on the daemon's registry.
  static void DeclareMetrics(runtime::MetricsRegistry& registry);
  // Loop thread, at a scrape: the gpu_controller_binder_* families and the rest of the binder's
  // metrics; while the replica leads, the gpu_catalog_* families of the last full pass of its
  // term.
  void WriteMetrics(runtime::MetricsScrape& out) const;
  // Loop thread: whether an answers-only pass is due or running (the reconciler yields to it).
  bool Answering() const { return answers_ || answering_; }
  // The pods cache's filter asks it whether a pod change needs a pass (any thread).
  QuietRoom& quietRoom() { return quietRoom_; }

 private:
  struct PassResult {
    bool answersOnly = false;
    bool passAgain = false;  // pod changes came during it that the room did not take
    double seconds = 0;
    double readSeconds = 0;  // the caches read into the snapshot, past them where they lag
    uint64_t term = 0;       // term_ when the pass began
    BinderResult result;
  };
  std::function<PassResult()> BeginPass();  // loop thread, when one is due: the pass, or none
  PassResult RunPass(bool answersOnly);     // binder worker
  void PassDone(PassResult pass);           // loop thread
  // Loop thread: the pass's catalog, if it has one, and whether it failed nothing.
  void KeepCatalog(PassResult& pass);

  kube::Client& client_;
  const kube::Leadership& leadership_;
  BinderSource& source_;
  Binder binder_;  // the worker's
  QuietRoom quietRoom_;
  std::atomic<bool> resync_{false};
  std::atomic<uint64_t> term_{0};  // times the replica took the lead
  // Loop thread.
  bool full_ = false;       // a full pass is due
  bool answers_ = false;    // an answers-only pass is due
  bool answering_ = false;  // the pass running is answers-only
  // Metrics, loop thread.
  std::map<std::string, int64_t> passes_;
  runtime::Histogram duration_;
  runtime::Histogram answerLatency_;
  std::map<std::string, int64_t> decisions_;
  int64_t writes_ = 0;
  int64_t conditionWrites_ = 0;
  int64_t eventsSuppressed_ = 0;
  int64_t conflicts_ = 0;
  int64_t failures_ = 0;
  int64_t errors_ = 0;
  int64_t readsPastCache_ = 0;
  int64_t fromOwnWrites_ = 0;
  int64_t heldOff_ = 0;
  size_t backingOff_ = 0;
  int64_t undecodable_ = 0;
  // C18: the last full pass's input problems by kind, and their lines already logged.
  std::map<std::string, int64_t> inputProblems_;
  std::set<std::string> inputProblemsLogged_;
  std::string lastError_;
  // When the last pass that failed nothing ended (Unix seconds; 0: none yet), for the alert
  // that no pass succeeds.
  double lastSuccess_ = 0;
  // The catalog of the last full pass, and the term it ran in.
  std::shared_ptr<const CatalogFigures> catalog_;
  uint64_t catalogTerm_ = 0;
  size_t catalogTenantSeries_ = 200;
  runtime::PassLoop<PassResult> runner_;  // declared last: its worker is joined first
};

}  // namespace cozy::controller
