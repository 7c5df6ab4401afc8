#include "controller/binder/loop.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "api/keys.h"
#include "controller/kinds.h"
#include "runtime/log.h"

namespace cozy::controller {

using runtime::LogFields;

BinderLoop::BinderLoop(runtime::Loop& loop, kube::Client& client,
                       const kube::Leadership& leadership, std::string identity,
                       BinderSource& source)
    : client_(client),
      leadership_(leadership),
      source_(source),
      binder_(client, leadership, std::move(identity)),
      duration_({0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30}),
      answerLatency_({0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30}),
      runner_(
          loop, "bind", "binder", [this] { return BeginPass(); },
          [this](PassResult pass) { PassDone(std::move(pass)); }) {}

void BinderLoop::Start() { runner_.Start(); }

void BinderLoop::Trigger() {
  if (runner_.Stopping() || !leadership_.Leading() || !runner_.Started()) return;
  if (source_.AnyUnansweredRequest()) {
    answers_ = true;
    runner_.Ask(std::chrono::milliseconds(0));
  } else {
    full_ = true;
    runner_.Ask(std::chrono::milliseconds(50));
  }
}

void BinderLoop::Stop() { runner_.Stop(); }

std::function<BinderLoop::PassResult()> BinderLoop::BeginPass() {
  if (!leadership_.Leading() || !source_.BinderCachesSynced()) return {};
  // A full pass answers too; an answers-only pass goes first when both are due.
  const bool answersOnly = answers_ || !full_;
  if (!answersOnly) full_ = false;
  answers_ = false;
  answering_ = answersOnly;
  return [this, answersOnly] { return RunPass(answersOnly); };
}

void QuietRoom::ResetLocked(bool recording) {
  room_.reset();
  recording_ = recording;
  overflowed_ = false;
  recorded_.clear();
}

void QuietRoom::Unsettle() {
  std::lock_guard lock(mutex_);
  ResetLocked(false);
}

void QuietRoom::BeginPass() {
  std::lock_guard lock(mutex_);
  ResetLocked(true);
}

bool QuietRoom::TryAbsorb(model::FreeUnits& room, const model::Pod* before,
                          const model::Pod* after) {
  try {
    return model::AbsorbPodChange(room, before, after);
  } catch (const std::exception&) {
    return false;  // a quantity the model cannot read: the pass says what
  }
}

bool QuietRoom::Settle(model::FreeUnits room) {
  std::lock_guard lock(mutex_);
  bool passAgain = !recording_ || overflowed_;
  for (const Change& change : recorded_) {
    if (passAgain) break;
    passAgain = !TryAbsorb(room, change.before ? &*change.before : nullptr,
                           change.after ? &*change.after : nullptr);
  }
  const auto taken = static_cast<int64_t>(recorded_.size());
  ResetLocked(false);
  if (!passAgain) {
    absorbed_ += taken;
    room_ = std::move(room);
  }
  return passAgain;
}

bool QuietRoom::EndPass() {
  std::lock_guard lock(mutex_);
  const bool passAgain = !recording_ || overflowed_ || !recorded_.empty();
  ResetLocked(false);
  return passAgain;
}

QuietRoom::Take QuietRoom::Absorbs(const model::Pod* before, const model::Pod* after) {
  std::lock_guard lock(mutex_);
  if (recording_) {
    if (recorded_.size() < kRecordLimit) {
      recorded_.push_back({before ? std::optional<model::Pod>(*before) : std::nullopt,
                           after ? std::optional<model::Pod>(*after) : std::nullopt});
    } else {
      overflowed_ = true;
    }
    return Take::kRecorded;
  }
  if (!room_) return Take::kRefused;
  if (!TryAbsorb(*room_, before, after)) {
    room_.reset();  // the room no longer says what is free; the pass this wakes settles anew
    return Take::kRefused;
  }
  ++absorbed_;
  return Take::kAbsorbed;
}

int64_t QuietRoom::Absorbed() const {
  std::lock_guard lock(mutex_);
  return absorbed_;
}

bool QuietRoom::Settled() const {
  std::lock_guard lock(mutex_);
  return room_.has_value();
}

BinderLoop::PassResult BinderLoop::RunPass(bool answersOnly) {
  const auto started = std::chrono::steady_clock::now();
  PassResult pass;
  pass.answersOnly = answersOnly;
  pass.term = term_.load();
  // Before the caches are read: a pod change from here on is recorded for the end of the pass.
  quietRoom_.BeginPass();
  bool settling = false;
  try {
    model::Snapshot snapshot;
    int resyncMarked = 0;
    std::vector<std::string> undecodable;
    if (resync_.load()) {
      // D3 across a leader change: the cache may lag the last leader's writes, which this
      // binder's own markers know nothing of. One list from the server marks each device the
      // cache shows otherwise, read past until the cache shows the server's version.
      std::vector<api::GpuDevice> listed;
      kube::ListOptions pages;
      pages.limit = 500;  // as the caches list: no one response near the client's cap
      const nlohmann::json list = client_.List(kGpuDevices.Path(), pages);
      for (const nlohmann::json& item : list["items"]) {
        try {
          listed.push_back(api::GpuDeviceFromJson(item));
        } catch (const std::exception& error) {
          // As the cache does: skipped and counted, never the end of every pass.
          const nlohmann::json metadata = item.value("metadata", nlohmann::json::object());
          undecodable.push_back(metadata.value("namespace", "") + "/" + metadata.value("name", "") +
                                ": " + error.what());
        }
      }
      resyncMarked = binder_.readPast().Resync(source_.CachedDevices(), listed);
      resync_ = false;
      runtime::LogInfo("binder read the devices from the API server on taking the lead",
                       LogFields{{"devices", std::to_string(listed.size())},
                                 {"cacheBehind", std::to_string(resyncMarked)}});
    }
    // D3: the cache must show this binder's last writes. Where it does not, the pass plans
    // from the answers the API server gave to them, with no wait. The devices it has no answer
    // for (the last leader's writes, an answer that did not decode) are read past the cache:
    // the watch gets up to 200 ms, woken by each change the caches take (not a poll), then
    // each still stale is read with a GET. Every check looks the written devices up by key;
    // the devices are listed once, after, so the list is at least as new as what the checks
    // saw (ReadPast takes a device the list shows newer than the answer from the list).
    const ReadPastCache::CachedLookup cached = [this](const std::string& key) {
      return source_.CachedDevice(key);
    };
    std::vector<std::string> stale = binder_.readPast().StaleInCache(cached);
    if (std::vector<std::string> waiting = binder_.readPast().NeedReading(stale);
        !waiting.empty()) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
      while (!waiting.empty() && std::chrono::steady_clock::now() < until) {
        const uint64_t seen = source_.Generation();  // before the read: a change after it wakes
        waiting = binder_.readPast().StillStale(waiting, cached);
        if (!waiting.empty()) source_.WaitForChange(seen, until);
      }
      stale = binder_.readPast().StaleInCache(cached);
    }
    const auto cachedDevices = source_.CachedDevices();
    int fromOwnWrites = 0;
    const int readPast =
        binder_.readPast().ReadPast(cachedDevices, stale, snapshot.devices, &fromOwnWrites);
    const bool vmisKnown = source_.FillSnapshot(snapshot);
    pass.readSeconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const auto now = std::chrono::system_clock::now();
    pass.result = binder_.Pass(snapshot, answersOnly, vmisKnown, now);
    pass.result.readPastCache = readPast;
    pass.result.fromOwnWrites = fromOwnWrites;
    pass.result.undecodable = std::move(undecodable);
    if (!answersOnly) {
      pass.result.conditionWrites = binder_.WriteNodeConditions(snapshot, now);
      binder_.ReportUnpermittedClasses(snapshot, now, pass.result);
      if (pass.result.error.empty()) binder_.ReportInputProblems(now, pass.result);
    }
    BinderResult& result = pass.result;
    if (result.quietRoom && result.error.empty() && !result.incomplete && result.failures == 0 &&
        result.conflicts == 0 && result.heldOff == 0 && leadership_.Leading()) {
      settling = true;
      pass.passAgain = quietRoom_.Settle(std::move(*result.quietRoom));
    }
    result.quietRoom.reset();
  } catch (const std::exception& error) {
    pass.result.error = error.what();
  }
  if (!settling) pass.passAgain = quietRoom_.EndPass();
  pass.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return pass;
}

void BinderLoop::KeepCatalog(PassResult& pass) {
  if (pass.result.catalog) {
    catalog_ = std::move(pass.result.catalog);
    catalogTerm_ = pass.term;
  }
  if (pass.result.error.empty() && !pass.result.incomplete && pass.result.failures == 0 &&
      pass.result.conflicts == 0) {
    lastSuccess_ = static_cast<double>(std::chrono::duration_cast<std::chrono::seconds>(
                                           std::chrono::system_clock::now().time_since_epoch())
                                           .count());
  }
}

void BinderLoop::PassDone(PassResult pass) {
  answering_ = false;
  ++passes_[pass.answersOnly ? "answers" : "full"];
  duration_.Observe(pass.seconds);
  for (const auto& [action, count] : pass.result.decisions) {
    decisions_[action] += count;
  }
  writes_ += pass.result.writes;
  conditionWrites_ += pass.result.conditionWrites;
  eventsSuppressed_ += pass.result.eventsSuppressed;
  conflicts_ += pass.result.conflicts;
  failures_ += pass.result.failures;
  readsPastCache_ += pass.result.readPastCache;
  fromOwnWrites_ += pass.result.fromOwnWrites;
  heldOff_ += pass.result.heldOff;
  if (pass.result.error.empty()) backingOff_ = pass.result.backingOff;
  undecodable_ += static_cast<int64_t>(pass.result.undecodable.size());
  KeepCatalog(pass);
  if (!pass.answersOnly && pass.result.error.empty()) {
    std::map<std::string, int64_t> byKind;
    std::set<std::string> described;
    for (const model::InputProblem& problem : pass.result.inputProblems) {
      ++byKind[problem.kind];
      std::string line = problem.Describe();
      if (!inputProblemsLogged_.contains(line)) {
        runtime::LogWarning(
            "the catalog reads an input out of range so that it holds back only "
            "its own node or tenant",
            LogFields{{"input", line}});
      }
      described.insert(std::move(line));
    }
    inputProblems_ = std::move(byKind);
    inputProblemsLogged_ = std::move(described);
  }
  for (const std::string& device : pass.result.undecodable) {
    runtime::LogWarning("binder skipped a GPUDevice it cannot decode",
                        LogFields{{"device", device}});
  }
  for (double latency : pass.result.answerLatencies) answerLatency_.Observe(latency);
  auto ms = [](double seconds) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f", seconds * 1000);
    return std::string(text);
  };
  runtime::LogDebug("binder pass",
                    LogFields{{"kind", pass.answersOnly ? "answers" : "full"},
                              {"ms", ms(pass.seconds)},
                              {"readMs", ms(pass.readSeconds)},
                              {"ownAnswers", std::to_string(pass.result.fromOwnWrites)},
                              {"reads", std::to_string(pass.result.readPastCache)},
                              {"planMs", ms(pass.result.planSeconds)},
                              {"writeMs", ms(pass.result.writeSeconds)},
                              {"writes", std::to_string(pass.result.writes)},
                              {"answers", std::to_string(pass.result.answerLatencies.size())},
                              {"events", std::to_string(pass.result.events)}});
  if (!pass.result.error.empty()) {
    ++errors_;
    if (pass.result.error != lastError_) {
      runtime::LogWarning("binder pass did not run", LogFields{{"error", pass.result.error}});
    }
    lastError_ = pass.result.error;
  } else {
    lastError_.clear();
  }
  // A failed or refused pass runs again soon; an answers-only pass is followed by the full
  // pass it left the rest to.
  if (pass.result.incomplete || !pass.result.error.empty()) {
    full_ = true;
    runner_.Finished(std::chrono::milliseconds(pass.result.error.empty() ? 50 : 1000));
  } else if (pass.answersOnly) {
    full_ = true;
    runner_.Finished(std::chrono::milliseconds(50));
  } else {
    runner_.Finished();
  }
  // Pod changes recorded during the pass that its room did not take (QuietRoom): the next
  // full pass decides them, as if they had woken it when they came.
  if (pass.passAgain) {
    full_ = true;
    runner_.Ask(std::chrono::milliseconds(50));
  }
  // A device held off after a refused write is tried again when its backoff ends: a pass then
  // (the decisions a held-off move or loss kept back wait for it too).
  if (pass.result.retryAt) {
    const auto until = std::chrono::duration_cast<std::chrono::milliseconds>(
        *pass.result.retryAt - std::chrono::steady_clock::now());
    full_ = true;
    runner_.Ask(std::max(until, std::chrono::milliseconds(10)));
  }
}

void BinderLoop::DeclareMetrics(runtime::MetricsRegistry& registry) {
  registry.Gauge("gpu_controller_model_input_problems",
                 "Inputs the last full binder pass read out of range or could not read, by kind "
                 "(Pod, ResourceQuota, GPUNode, Namespace): each holds back only its own node or "
                 "tenant, and "
                 "has a Warning Event (reason InputOutOfRange) on its object.",
                 {"kind"});
  registry.Gauge(
      "gpu_controller_binder_last_success_timestamp_seconds",
      "When the last binder pass that failed nothing ended (Unix seconds): it ran, and no "
      "write of it failed or conflicted. 0 before the first; only the leader passes.");
  DeclareCatalogMetrics(registry);
  registry.Counter("gpu_controller_binder_quiet_pod_changes_total",
                   "Pod changes the room of a quiet cluster took without a binder pass.");
  registry.Gauge(
      "gpu_controller_binder_quiet",
      "1 while the last full pass decided only held keeps and its room takes pod changes.");
  registry.Counter("gpu_controller_binder_passes_total",
                   "Binder passes: full, or answers only (bind requests first).", {"kind"});
  registry.HistogramFamily("gpu_controller_binder_pass_duration_seconds",
                           "Time of one binder pass: snapshot, model and writes.");
  registry.Counter("gpu_controller_binder_decisions_total",
                   "The model's decisions by action, summed over passes.", {"action"});
  registry.Counter("gpu_controller_binder_writes_total",
                   "Placement and answer writes that applied.");
  registry.Counter("gpu_controller_node_condition_writes_total",
                   "GPUNode TakesBinds conditions written (only when they change).");
  registry.Counter("gpu_controller_events_total",
                   "Events for tenants: written, refused or failed (failed), repeats held back "
                   "(suppressed), and dropped with the sender's queue full (dropped).",
                   {"result"});
  registry.Counter("gpu_controller_binder_conflicts_total",
                   "Placement writes refused with 409 (the pass stops; the next re-reads).");
  registry.Counter("gpu_controller_binder_failures_total",
                   "Placement writes that failed otherwise, and passes that could not run.");
  registry.Counter(
      "gpu_controller_binder_held_off_total",
      "Placement writes not sent: their device is held off after the server refused it.");
  registry.Gauge(
      "gpu_controller_binder_backoff_devices",
      "GPUDevices held off now after the server refused their writes (400/403/404/422).");
  registry.Counter("gpu_controller_binder_device_reads_total",
                   "GPUDevices read past a cache still behind the binder's writes (D3).");
  registry.Counter("gpu_controller_binder_own_write_answers_total",
                   "GPUDevices a pass took from the answers to the binder's own writes, the cache "
                   "still behind them (D3).");
  registry.Counter(
      "gpu_controller_binder_undecodable_total",
      "GPUDevices the binder read from the API server and skipped: they do not decode.");
  registry.HistogramFamily("gpu_controller_bind_answer_seconds",
                           "From a bind request's requestedAt to the binder's answer.");
}

void BinderLoop::WriteMetrics(runtime::MetricsScrape& out) const {
  out.Show("gpu_controller_model_input_problems");
  for (const std::string kind : {"GPUNode", "Namespace", "Pod", "ResourceQuota"}) {
    const auto count = inputProblems_.find(kind);
    out.Set("gpu_controller_model_input_problems", {kind},
            static_cast<double>(count == inputProblems_.end() ? 0 : count->second));
  }
  out.Set("gpu_controller_binder_last_success_timestamp_seconds", {}, lastSuccess_);
  if (catalog_ && catalogTerm_ == term_.load() && leadership_.Leading()) {
    WriteCatalogMetrics(out, *catalog_, catalogTenantSeries_, std::chrono::system_clock::now());
  }
  out.Set("gpu_controller_binder_quiet_pod_changes_total", {},
          static_cast<double>(quietRoom_.Absorbed()));
  out.Set("gpu_controller_binder_quiet", {}, quietRoom_.Settled() ? 1 : 0);
  out.Show("gpu_controller_binder_passes_total");
  for (const auto& [kind, count] : passes_) {
    out.Set("gpu_controller_binder_passes_total", {kind}, static_cast<double>(count));
  }
  out.SetHistogram("gpu_controller_binder_pass_duration_seconds", duration_);
  out.Show("gpu_controller_binder_decisions_total");
  for (const auto& [action, count] : decisions_) {
    out.Set("gpu_controller_binder_decisions_total", {action}, static_cast<double>(count));
  }
  out.Set("gpu_controller_binder_writes_total", {}, static_cast<double>(writes_));
  out.Set("gpu_controller_node_condition_writes_total", {}, static_cast<double>(conditionWrites_));
  out.Set("gpu_controller_events_total", {"written"}, static_cast<double>(binder_.EventsWritten()));
  out.Set("gpu_controller_events_total", {"suppressed"}, static_cast<double>(eventsSuppressed_));
  out.Set("gpu_controller_events_total", {"failed"}, static_cast<double>(binder_.EventsFailed()));
  out.Set("gpu_controller_events_total", {"dropped"}, static_cast<double>(binder_.EventsDropped()));
  out.Set("gpu_controller_binder_conflicts_total", {}, static_cast<double>(conflicts_));
  out.Set("gpu_controller_binder_failures_total", {}, static_cast<double>(failures_ + errors_));
  out.Set("gpu_controller_binder_held_off_total", {}, static_cast<double>(heldOff_));
  out.Set("gpu_controller_binder_backoff_devices", {}, static_cast<double>(backingOff_));
  out.Set("gpu_controller_binder_device_reads_total", {}, static_cast<double>(readsPastCache_));
  out.Set("gpu_controller_binder_own_write_answers_total", {}, static_cast<double>(fromOwnWrites_));
  out.Set("gpu_controller_binder_undecodable_total", {}, static_cast<double>(undecodable_));
  out.SetHistogram("gpu_controller_bind_answer_seconds", answerLatency_);
}

}  // namespace cozy::controller
