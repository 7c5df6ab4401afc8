#include "agent/daemon.h"

#include <sys/signalfd.h>

#include <algorithm>
#include <csignal>
#include <cstring>

#include "runtime/log.h"
#include "sysfs/scanner.h"

namespace cozy::agent {

using runtime::LogDebug;
using runtime::LogError;
using runtime::LogInfo;
using runtime::LogWarning;

namespace {

// One line for people (sd_notify STATUS=, logs): "8 GPU functions, 7 healthy, units stale
// (...)", from the typed counts.
std::string Summary(const StatusCounts& counts, const UnitsTracker& units) {
  std::string summary =
      std::to_string(counts.gpus) + " GPU function" + (counts.gpus == 1 ? "" : "s");
  if (!counts.unitsKnown) {
    summary += ", units unknown (pod-resources " +
               std::string(podresources::ToString(units.lastState())) + ")";
  } else {
    summary += ", " + std::to_string(counts.byHealth.at("Healthy")) + " healthy";
    if (counts.unitsStale) {
      summary += ", units stale (pod-resources " +
                 std::string(podresources::ToString(units.lastState())) + ")";
    }
  }
  return summary;
}

}  // namespace

Daemon::Daemon(DaemonOptions options, std::unique_ptr<StatusPublisher> publisher,
               std::unique_ptr<PodWatch> podWatch, SliceOutput slices)
    : options_(std::move(options)),
      deviceEvents_(options_.udevSource),
      podResources_(options_.podResources, options_.podResourcesSchedule),
      podWatch_(std::move(podWatch)) {
  if (!podWatch_) {
    podWatch_ = std::make_unique<FixedPodPhases>(options_.fixedPodPhases.value_or(PodPhases{}));
  }
  if (publisher) {
    publisher_ = std::make_unique<PublishSource>(std::move(publisher));
  }
  sources_ = {&deviceEvents_, &podResources_, podWatch_.get()};
  if (publisher_) {
    sources_.push_back(publisher_.get());
  }
  if (slices.plugin) {
    // Registered with kubelet before the slice offers its devices: kubelet tries a pod whose
    // driver is missing again only at its periodic resync.
    kubeletPlugin_ = std::move(slices.plugin);
    sources_.push_back(kubeletPlugin_.get());
  }
  if (slices.publisher) {
    slices_ = std::make_unique<PublishSource>(std::move(slices.publisher), "slices");
    sources_.push_back(slices_.get());
  }
  if (slices_ && slices.watch) {
    sliceWatch_ = std::move(slices.watch);
    sliceWatch_->OnDrift([this](std::string_view why) {
      LogInfo("repairing this node's ResourceSlice", {{"why", std::string(why)}});
      slices_->Refresh(false);
    });
    sources_.push_back(sliceWatch_.get());
  }
}

Daemon::~Daemon() {
  health_.Stop();
  dbus_.reset();
}

bool Daemon::SetUp() {
  try {
    // Signals arrive through signalfd sources on the loop, never as asynchronous handlers.
    auto stop = [this](const signalfd_siginfo& info) {
      LogInfo("stopping", {{"signal", std::string(strsignal(static_cast<int>(info.ssi_signo)))}});
      loop_.Exit(0);
    };
    sigterm_ = loop_.AddSignal(SIGTERM, stop);
    sigint_ = loop_.AddSignal(SIGINT, stop);
    sighup_ = loop_.AddSignal(SIGHUP, [this](const signalfd_siginfo&) {
      LogInfo("SIGHUP: rescanning");
      RefreshAll("SIGHUP", true);
    });
    // The pass runs on the loop thread and is over when it returns: nothing stays running.
    rescans_ = std::make_unique<runtime::PassScheduler>(loop_, "debounce", [this] {
      ++debouncedRescans_;
      Pass();
      return false;
    });
    mdevRetry_ = loop_.AddTimer("mdev link retry", [this] { Pass(); });
    resync_ = loop_.AddTimer("resync", [this] {
      RefreshAll("resync", false);
      resync_.Arm(options_.resync);
    });
    heartbeat_ = loop_.AddTimer("heartbeat", [this] {
      // /healthz reports the loop alive while this keeps firing.
      health_.Heartbeat();
      heartbeat_.Arm(std::chrono::seconds(1));
    });
    startup_ = loop_.AddTimer("startup wait", [this] {
      if (!started_) {
        std::string waiting;
        for (const std::string& name : manager_.Waiting()) {
          waiting += (waiting.empty() ? "" : ",") + name;
        }
        LogWarning("first pass without every source's first answer", {{"waiting", waiting}});
        Pass();
      }
    });
  } catch (const runtime::LoopError& error) {
    LogError("cannot set up the event loop", {{"reason", error.what()}});
    return false;
  }
  // WATCHDOG=1 at half of WatchdogSec when systemd asks for it (WATCHDOG_USEC).
  loop_.EnableWatchdog();
  // /metrics is rendered at each scrape from what the loop reads then (docs/runtime.md,
  // "Metrics registry"): a stalled loop leaves the last figures and the process's own.
  registry_.AddCollector(
      [this](runtime::MetricsScrape& scrape) { metricFamilies_.Collect(scrape, Snapshot()); },
      [this](std::function<void()> work) { loop_.Post(std::move(work)); });
  health_.SetRegistry(&registry_);
  if (!health_.Start(options_.healthAddress)) {
    LogError("cannot serve health and metrics", {{"reason", health_.error()}});
    return false;
  }
  if (options_.healthAddress != "off") {
    LogInfo("serving /healthz, /readyz, /metrics", {{"address", options_.healthAddress}});
  }
  metrics_.version = options_.version;
  if (options_.dbus != "off") {
    // Started after the first pass (Pass()): whoever sees the name appear finds the inventory.
    dbus_ = std::make_unique<DbusService>(
        loop_, options_.dbus,
        DbusService::Callbacks{[this] { return InventoryJson(); },
                               [this] {
                                 LogInfo("D-Bus Rescan(): rescanning");
                                 RefreshAll("D-Bus Rescan()", true);
                               },
                               {}});
  }
  return true;
}

std::string Daemon::InventoryJson() const {
  if (status_.is_null()) {
    return "{}";
  }
  // Names come from pci.ids and sysfs: a stray byte is replaced, never thrown over.
  return status_.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

int Daemon::Run() {
  if (!SetUp()) {
    return 1;
  }
  LogInfo("gpu-agent starting", {{"node", options_.nodeName},
                                 {"sysfsRoot", options_.scan.root},
                                 {"podResources", options_.podResources.endpoint}});
  for (Source* source : sources_) {
    runtime::Manager::Runnable runnable;
    runnable.name = std::string(source->Name());
    runnable.start = [this, source] {
      source->Start(loop_, [this, source](std::string_view reason, bool debounce) {
        OnSourceChanged(source, reason, debounce);
      });
    };
    runnable.synced = [source] { return source->Settled(); };
    runnable.gatesReadiness = true;  // the first pass waits for it (up to --startup-wait)
    manager_.Add(std::move(runnable));
  }
  try {
    manager_.Start();
  } catch (const std::exception& error) {
    LogError("cannot start the agent's sources", {{"reason", error.what()}});
    return 1;
  }
  startup_.Arm(options_.startupWait);
  OnSourceChanged(nullptr, "start", false);  // runs the first pass now when every source is settled
  resync_.Arm(options_.resync);
  heartbeat_.Arm(std::chrono::seconds(1));
  health_.Heartbeat();
  const int result = loop_.Run();
  rescans_->Stop();
  manager_.Stop();
  runtime::Notify("STOPPING=1");
  LogInfo("gpu-agent stopped");
  return result;
}

DaemonCounters Daemon::counters() const {
  DaemonCounters counters;
  counters.scans = scans_;
  counters.deviceEvents = deviceEvents_.events();
  counters.debouncedRescans = debouncedRescans_;
  counters.podResourcesFetches = podResources_.fetches();
  if (publisher_) {
    counters.publishes = publisher_->counters().written;
    counters.publishesUnchanged = publisher_->counters().unchanged;
    counters.publishFailures = publisher_->counters().failed;
    counters.publishWaits = publisher_->counters().waits;
  }
  if (slices_) {
    counters.slicePublishes = slices_->counters();
  }
  counters.callbackFailures = loop_.callbackFailures();
  return counters;
}

void Daemon::PostPodPhases(PodPhases phases) {
  Post([this, phases = std::move(phases)]() mutable {
    if (options_.fixedPodPhases || phases == postedPodPhases_) {
      return;
    }
    postedPodPhases_ = std::move(phases);
    OnSourceChanged(podWatch_.get(), "pod phases posted", false);
  });
}

void Daemon::OnSourceChanged(const Source* source, std::string_view reason, bool debounce) {
  if (!started_) {
    if (!manager_.Ready()) {
      return;  // the startup timer runs the first pass at the latest
    }
    Pass();
    return;
  }
  if (source == podWatch_.get()) {
    // A pod that finished frees its devices now; kubelet's lists say so soon after.
    podResources_.Refresh(false);
  }
  if (debounce) {
    // The first event arms the timer and later ones ride on it: a burst costs one pass per
    // window, and a steady stream cannot postpone it forever.
    if (!rescans_->Armed()) {
      LogDebug("rescan requested", {{"reason", std::string(reason)}});
    }
    rescans_->Ask(options_.debounce);  // rides on an armed pass, never pushes it back
    return;
  }
  Pass();
}

void Daemon::RefreshAll(std::string_view why, bool force) {
  LogDebug("refreshing every source", {{"why", std::string(why)}});
  for (Source* source : sources_) {
    source->Refresh(force);
  }
  if (started_) {
    Pass();
  }
}

void Daemon::Pass() {
  ++scans_;
  const auto began = std::chrono::steady_clock::now();
  const bool first = !started_;
  started_ = true;
  startup_.Cancel();
  // Ready, and D-Bus takes its name, once the first pass is over however it ended: whoever sees
  // the name appear finds the inventory (or "{}" when the root could not be scanned).
  struct AfterFirstPass {
    Daemon* daemon;
    bool first;
    ~AfterFirstPass() {
      if (!first) {
        return;
      }
      daemon->ready_ = true;
      daemon->health_.SetReady(true);
      runtime::Notify("READY=1");
      if (daemon->dbus_) {
        daemon->dbus_->Start();
      }
    }
  } afterFirstPass{this, first};
  PassOptions passOptions;
  passOptions.staleAfter = options_.staleAfter;
  if (slices_ || kubeletPlugin_) passOptions.sliceNode = options_.nodeName;
  const PodPhases& phases =
      postedPodPhases_.empty() || options_.fixedPodPhases ? podWatch_->Phases() : postedPodPhases_;
  PassResult result;
  try {
    result = RunScanPass(options_.scan, podResources_.units(), phases, passOptions);
  } catch (const sysfs::RootError& error) {
    // The root can come back (a remount); keep the last status and try on the next event.
    LogError("cannot scan", {{"reason", error.what()}});
    return;
  }
  // Each problem is logged once while it lasts, not on every rescan.
  for (const auto& problem : result.problems) {
    if (!std::binary_search(loggedProblems_.begin(), loggedProblems_.end(), problem)) {
      LogWarning("sysfs problem", {{"detail", problem}});
    }
  }
  metrics_.sysfsProblems = static_cast<int64_t>(result.problems.size());
  loggedProblems_ = std::move(result.problems);

  // mdev type links appear only after the bind event: look again shortly, a few times, and
  // publish nothing meanwhile, so that a created mdev is one patch that names its type rather
  // than one without the type and another with it. Once the retries are spent (a tree that
  // never gets the link, such as a capture), the scan is published as it is.
  if (result.mdevLinksPending && mdevRetriesLeft_ > 0) {
    --mdevRetriesLeft_;
    mdevRetry_.Arm(options_.mdevLinkRetry);
    LogDebug("mdev type links pending; rescanning before publishing",
             {{"retriesLeft", std::to_string(mdevRetriesLeft_)}});
    return;
  }
  if (!result.mdevLinksPending) {
    mdevRetriesLeft_ = options_.mdevLinkRetries;
  }
  metrics_.scanDuration.Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
  counts_ = result.counts;
  if (kubeletPlugin_) {
    kubeletPlugin_->SetDevices(PreparableDevices(result.sliceDevices));
  }
  if (slices_) {
    slices_->Offer(std::move(result.sliceDevices));  // written only when it changed
  }
  if (result.status == status_) {
    return;  // nothing changed: no log line, no write
  }
  // (The first pass always changes the status: it was null.)
  const bool firstStatus = status_.is_null();
  status_ = std::move(result.status);
  LogInfo(firstStatus ? "inventory" : "inventory changed",
          {{"summary", Summary(counts_, podResources_.units())}});
  NotifyStatus();
  if (dbus_ && dbus_->connected()) {
    dbus_->InventoryChanged(InventoryJson());
  }
  if (publisher_) {
    publisher_->Offer(status_);
  }
}

MetricsSnapshot Daemon::Snapshot() const {
  MetricsSnapshot snapshot = metrics_;
  const DaemonCounters counters = this->counters();
  snapshot.scans = counters.scans;
  snapshot.deviceEvents = counters.deviceEvents;
  snapshot.deviceRescans = counters.debouncedRescans;
  snapshot.podResourcesFetches = counters.podResourcesFetches;
  snapshot.podResourcesResults = podResources_.results();
  snapshot.publishes = {{"written", counters.publishes},
                        {"unchanged", counters.publishesUnchanged},
                        {"failed", counters.publishFailures},
                        {"waited", counters.publishWaits}};
  if (kubeletPlugin_) {
    const KubeletPluginCounters& plugin = kubeletPlugin_->counters();
    snapshot.draClaims = {{"prepared", plugin.prepared.load()},
                          {"prepareFailed", plugin.prepareFailures.load()},
                          {"unprepared", plugin.unprepared.load()},
                          {"unprepareFailed", plugin.unprepareFailures.load()}};
  }
  if (slices_) {
    snapshot.slicePublishes = {{"written", counters.slicePublishes.written},
                               {"unchanged", counters.slicePublishes.unchanged},
                               {"failed", counters.slicePublishes.failed},
                               {"waited", counters.slicePublishes.waits}};
  }
  snapshot.callbackFailures = counters.callbackFailures;
  snapshot.unitsKnown = counts_.unitsKnown;
  snapshot.podResourcesStale = counts_.unitsStale;
  snapshot.dbusConnected = dbus_ != nullptr && dbus_->connected();
  snapshot.devicesByHealth = counts_.byHealth;
  snapshot.ignoredDeviceIds = counts_.ignoredDeviceIds;
  const runtime::HttpServer::Stats http = health_.stats();
  snapshot.httpConnections = {{"answered", http.requests},
                              {"rejected", http.rejected},
                              {"timedOut", http.timedOut},
                              {"overflowed", http.overflowed}};
  return snapshot;
}

void Daemon::NotifyStatus() {
  if (!status_.is_null()) {
    runtime::Notify("STATUS=" + Summary(counts_, podResources_.units()));
  }
}

}  // namespace cozy::agent
