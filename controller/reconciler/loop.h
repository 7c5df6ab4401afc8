// The reconciler's loop, on the leader: when its passes run and what each one counts (a runnable of
// its own, as the binder's loop is, so the daemon is wiring only: docs/controller.md, "The caches
// and the wiring"). A change in a cache the reconciler reads asks for a pass within 50 ms;
// runtime::PassScheduler collapses asks into one pass at a time. A pass runs on a worker thread of
// its own: it reads the caches (through ReconcilerSource), plans (PlanReconcile over its list of
// reconcilers, each pure) and writes (Applier, one for every reconciler's actions), and its result
// comes back to the loop thread, which counts it and arms the next resync: a second after a pass
// that could not plan, when the first object a write failed on may be tried again (its own backoff,
// apply.h), at the next grace deadline a plan waits for, and at the resync period otherwise.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "controller/reconciler/apply.h"
#include "controller/reconciler/plan.h"
#include "controller/reconciler/reconcilers.h"
#include "kube/client.h"
#include "runtime/loop.h"
#include "runtime/metrics.h"
#include "runtime/pass_loop.h"
#include "runtime/worker.h"

namespace cozy::controller {

// What a pass reads, from the daemon's caches.
class ReconcilerSource {
 public:
  virtual ~ReconcilerSource() = default;
  // Loop thread: whether every cache the reconciler reads has listed.
  virtual bool ReconcilerCachesSynced() const = 0;
  // Reconciler worker: the plan's input as the caches show it now; throws when it cannot be
  // read (a pass that could not plan).
  virtual ReconcileInput BuildInput() const = 0;
};

// The reconciler's passes and writes, as the loop thread learns of each finished pass; each
// reconciler's actions under its name.
class ReconcilerMetrics {
 public:
  // `reconcilers`: the names each reconciler's samples are written under, from the first page.
  explicit ReconcilerMetrics(std::vector<std::string> reconcilers = {});
  // One pass: how long it took, whether it failed (could not plan, or skipped attachments whose
  // VMI cannot be told), what the applier wrote and what waits.
  void Pass(double seconds, bool failed, const ApplyCounts& counts, const Waiting& waiting);
  // A pass that was due and waited for the binder's answers (ReconcilerLoop::SetYield).
  void Deferred() { ++deferred_; }
  // The families, once on the daemon's registry; Write fills them at a scrape (loop thread).
  static void Declare(runtime::MetricsRegistry& registry);
  void Write(runtime::MetricsScrape& out) const;

 private:
  int64_t passes_ = 0;
  int64_t failures_ = 0;
  int64_t deferred_ = 0;
  runtime::Histogram duration_{{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30}};
  std::map<std::pair<std::string, std::string>, int64_t> writes_;
  std::map<std::pair<std::string, std::string>, int64_t> actions_;  // (reconciler, result)
  std::map<std::string, int64_t> writeFailures_;                    // by reconciler
  int64_t conflicts_ = 0;
  int queueDepth_ = 0;
  double backingOff_ = 0;  // objects held off after the last pass
  Waiting waiting_;
};

class ReconcilerLoop {
 public:
  // `leadership` is read before each pass starts and by the applier before every write; its
  // deadline bounds each write in time (Applier). `resync` is the longest time between
  // two passes; when it comes, `onResync` runs on the loop thread (the daemon asks both its
  // loops for a pass then). Each pass plans `reconcilers`, in order.
  ReconcilerLoop(runtime::Loop& loop, kube::Client& client, const kube::Leadership& leadership,
                 ReconcilerSource& source, std::chrono::milliseconds resync,
                 std::function<void()> onResync, Reconcilers reconcilers = StandardReconcilers());
  ReconcilerLoop(const ReconcilerLoop&) = delete;
  ReconcilerLoop& operator=(const ReconcilerLoop&) = delete;

  // Loop thread, once the loop runs: passes may start from now on.
  void Start();
  // Loop thread: a pass soon, collapsing a burst of asks into one: within 50 ms, or four times
  // the last pass's time where that is longer (1 s at most). Under a storm of changes (a
  // thousand binds at once on a 5,000-node cluster, where a pass takes 50 ms) the passes then
  // take a fifth of a core at most, not every cycle the binder answering VM starts could use;
  // on a small cluster nothing changes.
  void Trigger();
  // Loop thread: a pass for the pods' usage records (C11), within kRecordsDebounce: a GPU pod's
  // start or end is billed within a second, and pod churn costs about a pass a second at most;
  // any other change's ask pulls it forward.
  void TriggerForRecords();
  static constexpr std::chrono::milliseconds kRecordsDebounce{1000};
  static constexpr std::chrono::milliseconds kDebounce{50};
  static constexpr std::chrono::milliseconds kDebounceMax{1000};
  static constexpr int kDebouncePerPassTime = 4;
  // The debounce after a pass of `seconds`.
  static std::chrono::milliseconds Debounce(double seconds);
  // Loop thread, before Start: `busy` (loop thread) says whether the binder is answering bind
  // requests (an answers-only pass due or running). A pass due then waits, checked again every
  // kYieldRecheck, for at most kYieldMax from when it was first due: a thousand VM starts at
  // once get the CPU and the API server the reconciler's passes took while they waited (a
  // fifth of the controller's CPU in bench_binder's burst: docs/benchmarks.md, "The binder's
  // answers alone"), and the reconciler still runs within a second.
  void SetYield(std::function<bool()> busy) { yield_ = std::move(busy); }
  static constexpr std::chrono::milliseconds kYieldRecheck{20};
  static constexpr std::chrono::milliseconds kYieldMax{1000};
  // Loop thread: no pass starts after this; the one in flight finishes its write in progress
  // (the daemon has cleared `leading` first, so it makes no further ones) and is waited for.
  void Stop();

  // Loop thread.
  void WriteMetrics(runtime::MetricsScrape& out) const { metrics_.Write(out); }

 private:
  struct PassResult {
    double seconds = 0;
    int planned = 0;
    ApplyCounts counts;
    Waiting waiting;
    std::optional<std::chrono::system_clock::time_point> wakeAt;
    std::string error;  // the pass could not run (e.g. a decode failure)
  };

  std::function<PassResult()> BeginPass();  // loop thread, when one is due: the pass, or none
  PassResult RunPass();                     // worker thread
  void PassDone(PassResult result);         // loop thread

  runtime::Loop& loop_;
  const kube::Leadership& leadership_;
  ReconcilerSource& source_;
  std::chrono::milliseconds resync_;
  std::function<void()> onResync_;
  const Reconcilers reconcilers_;
  Applier applier_;  // the worker's
  runtime::Timer resyncTimer_;
  ReconcilerMetrics metrics_;                       // loop thread
  std::chrono::milliseconds debounce_ = kDebounce;  // loop thread: Debounce of the last pass
  std::function<bool()> yield_;                     // SetYield's
  // Loop thread: since when the pass due has waited for the binder's answers.
  std::optional<std::chrono::steady_clock::time_point> yieldingSince_;
  runtime::PassLoop<PassResult> passes_;  // declared last: its worker is joined first
};

}  // namespace cozy::controller
