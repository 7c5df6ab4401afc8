#include "controller/reconciler/loop.h"

#include <algorithm>
#include <exception>

#include "runtime/log.h"

namespace cozy::controller {

using runtime::LogFields;
using runtime::LogWarning;

namespace {

std::vector<std::string> Names(const Reconcilers& reconcilers) {
  std::vector<std::string> names;
  for (const auto& reconciler : reconcilers) names.emplace_back(reconciler->Name());
  return names;
}

// What did not apply: a conflict, an error, or a leader that stepped down mid-pass.
bool WriteFailed(const std::string& result) {
  return result == "conflict" || result == "error" || result == "not-leading";
}

// A counter family whose samples are keyed by (its first label, result).
void WriteByResult(runtime::MetricsScrape& out, std::string_view name,
                   const std::map<std::pair<std::string, std::string>, int64_t>& counts) {
  out.Show(name);
  for (const auto& [key, count] : counts) {
    out.Set(name, {key.first, key.second}, static_cast<double>(count));
  }
}

}  // namespace

void ReconcilerMetrics::Declare(runtime::MetricsRegistry& registry) {
  registry.Counter("gpu_controller_reconcile_passes_total", "Reconciler passes run.");
  registry.Counter("gpu_controller_reconcile_failures_total",
                   "Reconciler passes that could not plan.");
  registry.Counter("gpu_controller_reconcile_deferred_total",
                   "Times a reconciler pass that was due waited for the binder answering bind "
                   "requests (at most 1 s each).");
  registry.HistogramFamily("gpu_controller_reconcile_duration_seconds",
                           "Time of one reconciler pass: plan and writes.");
  registry.Counter("gpu_controller_writes_total",
                   "Reconciler writes by object kind and result (ok, conflict, gone, forbidden, "
                   "error, skipped).",
                   {"kind", "result"});
  registry.Counter("gpu_controller_reconcile_actions_total",
                   "Actions each reconciler planned, by what became of them: the results of "
                   "gpu_controller_writes_total, and not-leading (the replica stepped down "
                   "mid-pass).",
                   {"reconciler", "result"});
  registry.Counter(
      "gpu_controller_reconcile_write_failures_total",
      "Actions of each reconciler that did not apply: a conflict, an error, or a leader "
      "that stepped down mid-pass.",
      {"reconciler"});
  registry.Counter("gpu_controller_conflicts_total",
                   "Writes refused with 409: a stale read or a concurrent writer.");
  registry.Gauge("gpu_controller_queue_depth",
                 "Writes the last pass planned and could not make; the next pass retries them.");
  registry.Gauge("gpu_controller_write_backoff_objects",
                 "Objects whose last write failed, held off for a delay of their own "
                 "(1 s doubling to 1 min); the rest of each pass writes on.");
  registry.Gauge("gpu_controller_waiting", "Objects waiting, by what they wait for.", {"for"});
}

ReconcilerMetrics::ReconcilerMetrics(std::vector<std::string> reconcilers) {
  for (std::string& name : reconcilers) writeFailures_[std::move(name)] = 0;
}

void ReconcilerMetrics::Pass(double seconds, bool failed, const ApplyCounts& counts,
                             const Waiting& waiting) {
  ++passes_;
  duration_.Observe(seconds);
  failures_ += failed ? 1 : 0;
  for (const auto& [key, count] : counts.writes) {
    writes_[key] += count;
  }
  for (const auto& [key, count] : counts.byReconciler) {
    actions_[key] += count;
    if (WriteFailed(key.second)) writeFailures_[key.first] += count;
  }
  conflicts_ += counts.conflicts;
  queueDepth_ = counts.failed + counts.heldOff;
  backingOff_ = static_cast<double>(counts.backingOff);
  waiting_ = waiting;
}

void ReconcilerMetrics::Write(runtime::MetricsScrape& out) const {
  out.Set("gpu_controller_reconcile_passes_total", {}, static_cast<double>(passes_));
  out.Set("gpu_controller_reconcile_failures_total", {}, static_cast<double>(failures_));
  out.Set("gpu_controller_reconcile_deferred_total", {}, static_cast<double>(deferred_));
  out.SetHistogram("gpu_controller_reconcile_duration_seconds", duration_);
  WriteByResult(out, "gpu_controller_writes_total", writes_);
  WriteByResult(out, "gpu_controller_reconcile_actions_total", actions_);
  out.Show("gpu_controller_reconcile_write_failures_total");
  for (const auto& [name, count] : writeFailures_) {
    out.Set("gpu_controller_reconcile_write_failures_total", {name}, static_cast<double>(count));
  }
  out.Set("gpu_controller_conflicts_total", {}, static_cast<double>(conflicts_));
  out.Set("gpu_controller_queue_depth", {}, queueDepth_);
  out.Set("gpu_controller_write_backoff_objects", {}, backingOff_);
  out.Set("gpu_controller_waiting", {"vmi-in-use"}, waiting_.devicesInUse);
  out.Set("gpu_controller_waiting", {"class-holders"}, waiting_.classesWithHolders);
  out.Set("gpu_controller_waiting", {"attachment-grace"}, waiting_.attachmentsInGrace);
  out.Set("gpu_controller_waiting", {"vmi-unknown"}, waiting_.vmisUnknown);
}

ReconcilerLoop::ReconcilerLoop(runtime::Loop& loop, kube::Client& client,
                               const kube::Leadership& leadership, ReconcilerSource& source,
                               std::chrono::milliseconds resync, std::function<void()> onResync,
                               Reconcilers reconcilers)
    : loop_(loop),
      leadership_(leadership),
      source_(source),
      resync_(resync),
      onResync_(std::move(onResync)),
      reconcilers_(std::move(reconcilers)),
      applier_(client, leadership),
      metrics_(Names(reconcilers_)),
      passes_(
          loop, "reconcile", "reconciler", [this] { return BeginPass(); },
          [this](PassResult result) { PassDone(std::move(result)); }) {}

void ReconcilerLoop::Start() {
  passes_.Start();
  resyncTimer_ = loop_.AddTimer("resync", [this] {
    if (onResync_) onResync_();
  });
}

std::chrono::milliseconds ReconcilerLoop::Debounce(double seconds) {
  const auto scaled =
      std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000 * kDebouncePerPassTime));
  return std::clamp(scaled, kDebounce, kDebounceMax);
}

void ReconcilerLoop::Trigger() { passes_.Ask(debounce_); }

void ReconcilerLoop::TriggerForRecords() { passes_.Ask(std::max(debounce_, kRecordsDebounce)); }

void ReconcilerLoop::Stop() { passes_.Stop(); }

std::function<ReconcilerLoop::PassResult()> ReconcilerLoop::BeginPass() {
  if (!leadership_.Leading() || !source_.ReconcilerCachesSynced()) {
    return {};  // leading and syncing both trigger again
  }
  if (yield_ && yield_()) {
    const auto now = std::chrono::steady_clock::now();
    if (!yieldingSince_) {
      yieldingSince_ = now;
      metrics_.Deferred();
    }
    if (now - *yieldingSince_ < kYieldMax) {
      passes_.Ask(kYieldRecheck);
      return {};
    }
  }
  yieldingSince_.reset();
  return [this] { return RunPass(); };
}

ReconcilerLoop::PassResult ReconcilerLoop::RunPass() {
  const auto started = std::chrono::steady_clock::now();
  PassResult result;
  try {
    ReconcileInput input = source_.BuildInput();
    Plan plan = PlanReconcile(input, reconcilers_);
    result.planned = static_cast<int>(plan.actions.size());
    result.waiting = plan.waiting;
    result.wakeAt = plan.wakeAt;
    result.counts = applier_.Apply(plan.actions, std::chrono::steady_clock::now());
  } catch (const std::exception& error) {
    result.error = error.what();
  }
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

void ReconcilerLoop::PassDone(PassResult result) {
  // G7: attachments whose VMI cannot be told (the kind not served, its cache not synced, the
  // read failing) were skipped, never read as ended: the pass did not finish its work. The
  // rest of the plan was applied; the next pass (an event, or the resync) tries again.
  metrics_.Pass(result.seconds, !result.error.empty() || result.waiting.vmisUnknown > 0,
                result.counts, result.waiting);
  debounce_ = Debounce(result.seconds);
  if (!result.error.empty()) {
    LogWarning("reconcile pass failed", LogFields{{"error", result.error}});
  } else if (result.waiting.vmisUnknown > 0) {
    LogWarning("reconcile pass skipped attachments whose VMI cannot be told",
               LogFields{{"attachments", std::to_string(result.waiting.vmisUnknown)},
                         {"first", result.waiting.vmisUnknownWhy}});
  }
  // Again when the first object that failed a write may be tried again (its own backoff: one
  // failing object does not rerun the whole pass every second), a second after a pass that could
  // not plan, at the next grace deadline, and at the resync otherwise.
  auto next = resync_;
  if (!result.error.empty()) {
    next = std::min(next, std::chrono::milliseconds(1000));
  }
  if (result.counts.retryAt) {
    const auto until = std::chrono::duration_cast<std::chrono::milliseconds>(
        *result.counts.retryAt - std::chrono::steady_clock::now());
    next = std::min(next, std::max(until, std::chrono::milliseconds(10)));
  }
  if (result.wakeAt) {
    const auto until = std::chrono::duration_cast<std::chrono::milliseconds>(
        *result.wakeAt - std::chrono::system_clock::now());
    next = std::min(next,
                    std::max(until + std::chrono::milliseconds(10), std::chrono::milliseconds(10)));
  }
  resyncTimer_.Arm(next);
  passes_.Finished();  // a change during the pass: one more, soon
}

}  // namespace cozy::controller
