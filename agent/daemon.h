// The gpu-agent daemon: one runtime::Loop whose inputs are sources (agent/sources): device
// events, kubelet's pod-resources, the node's pods and the publisher. When any of them says its
// input changed, the daemon runs the scan pass (agent/status/scan_pass.h, the same one `scan`
// runs) and offers the status to the publisher when it changed. The sources are the runnables
// of a runtime::Manager, as the controller's caches are: started in order, and the first pass
// waits until the manager reports them all synced (each source's first answer). A burst of
// device events is one pass through runtime::PassScheduler, the debounced single-flight runner
// the controller's reconciler and binder use. Timers: the mdev link retry, the slow resync and
// the health heartbeat; signals: SIGTERM/SIGINT stop, SIGHUP rescans; D-Bus (agent/dbus)
// serves the inventory from the same loop.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/dbus/service.h"
#include "agent/metrics.h"
#include "agent/sources/device_events.h"
#include "agent/sources/pod_resources.h"
#include "agent/sources/pod_watch.h"
#include "agent/sources/publish.h"
#include "agent/sources/slice_publisher.h"
#include "agent/status/scan_pass.h"
#include "podresources/client.h"
#include "runtime/health_server.h"
#include "runtime/loop.h"
#include "runtime/manager.h"
#include "runtime/pass_scheduler.h"
#include "sysfs/scanner.h"

namespace cozy::agent {

struct DaemonOptions {
  std::string nodeName;
  sysfs::ScanOptions scan;
  podresources::ClientOptions podResources;
  FetchSchedule podResourcesSchedule;
  std::chrono::milliseconds debounce{50};
  std::chrono::milliseconds resync{std::chrono::minutes(10)};
  std::chrono::milliseconds mdevLinkRetry{250};
  int mdevLinkRetries = 8;
  // The first pass waits this long at most for every source's first answer.
  std::chrono::milliseconds startupWait{std::chrono::seconds(10)};
  // kubelet silent this long: the status says since when its counts are (staleUnits).
  std::chrono::milliseconds staleAfter{std::chrono::minutes(1)};
  std::string udevSource = "auto";  // auto (udev if /run/udev/control exists), udev, kernel, off
  std::optional<PodPhases> fixedPodPhases;  // test-only --pod-phases; else the pod watch's
  std::string healthAddress = "off";        // "host:port", ":port" or "off"
  std::string dbus = "off";                 // "system", "session" or "off"
  std::string version;
};

struct DaemonCounters {
  int64_t scans = 0;
  int64_t deviceEvents = 0;
  int64_t debouncedRescans = 0;  // rescans that device events asked for
  int64_t podResourcesFetches = 0;
  int64_t publishes = 0;           // attempts that changed the object
  int64_t publishesUnchanged = 0;  // attempts that found nothing to write
  int64_t publishFailures = 0;
  int64_t publishWaits = 0;        // publishes postponed by the client-side rate limit
  PublishCounters slicePublishes;  // the same for the ResourceSlice
  int64_t callbackFailures = 0;    // loop callbacks that threw (logged, survived)
};

class Daemon {
 public:
  // `publisher`: where the status goes (none: discover and serve only). `podWatch`: the node's
  // pods (none: DaemonOptions::fixedPodPhases, else phases posted with PostPodPhases).
  // `slices`: the node's ResourceSlice (`--resource-slices`; none: not published).
  Daemon(DaemonOptions options, std::unique_ptr<StatusPublisher> publisher,
         std::unique_ptr<PodWatch> podWatch = nullptr, SliceOutput slices = {});
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Runs until SIGTERM/SIGINT or Stop(); returns the process exit code.
  int Run();

  // Thread-safe: runs `work` on the loop thread soon.
  void Post(std::function<void()> work) { loop_.Post(std::move(work)); }
  // Thread-safe: the node's pod phases changed (tests, and a daemon without a pod watch).
  void PostPodPhases(PodPhases phases);
  void Stop() { loop_.RequestExit(0); }

  // Loop-thread state, for the D-Bus and HTTP views (and tests once Run returned).
  // The Inventory property: the status as compact JSON; "{}" before the first pass.
  std::string InventoryJson() const;
  const nlohmann::json& status() const { return status_; }
  DaemonCounters counters() const;
  bool ready() const { return ready_; }
  // The health server's bound port (after Run() started it), for tests listening on ":0".
  int healthPort() const { return health_.port(); }

 private:
  bool SetUp();
  // `source`: who changed (nullptr at start).
  void OnSourceChanged(const Source* source, std::string_view reason, bool debounce);
  void RefreshAll(std::string_view why, bool force);
  void Pass();
  void NotifyStatus();
  // Loop thread, at each scrape: the figures of the agent's metric families.
  MetricsSnapshot Snapshot() const;

  DaemonOptions options_;
  runtime::Loop loop_;  // first: outlives every source registered on it
  DeviceEvents deviceEvents_;
  PodResourcesSource podResources_;
  std::unique_ptr<PodWatch> podWatch_;
  std::unique_ptr<PublishSource> publisher_;
  std::unique_ptr<KubeletPlugin> kubeletPlugin_;  // the DRA driver's kubelet plugin
  std::unique_ptr<PublishSource> slices_;         // the ResourceSlice's writer ...
  std::unique_ptr<SliceWatch> sliceWatch_;        // ... and its repairer: gone first
  std::vector<Source*> sources_;
  runtime::Manager manager_;  // the sources, in order; synced: each has its first answer

  runtime::Signal sigterm_;
  runtime::Signal sigint_;
  runtime::Signal sighup_;
  std::unique_ptr<runtime::PassScheduler> rescans_;  // debounced passes (device events)
  runtime::Timer mdevRetry_;
  runtime::Timer resync_;
  runtime::Timer heartbeat_;
  runtime::Timer startup_;

  PodPhases postedPodPhases_;
  bool started_ = false;  // the first pass ran
  bool ready_ = false;
  int mdevRetriesLeft_ = 0;
  int64_t scans_ = 0;
  int64_t debouncedRescans_ = 0;
  nlohmann::json status_;
  StatusCounts counts_;
  std::vector<std::string> loggedProblems_;
  // Declared before the health server that renders them; collected on loop_ at each scrape.
  runtime::MetricsRegistry registry_;
  AgentMetrics metricFamilies_{registry_};
  runtime::HealthServer health_;
  MetricsSnapshot metrics_;  // what passes set (scan duration, sysfs problems); loop thread
  std::unique_ptr<DbusService> dbus_;  // sources on loop_: destroyed before it
};

}  // namespace cozy::agent
