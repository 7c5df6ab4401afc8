// The gpu-agent daemon: one sd-event loop whose sources are the udev monitor, timers (debounce,
// pod-resources re-read, slow resync, publish retry), signals (SIGTERM stops, SIGHUP rescans)
// work posted by other threads, and the D-Bus connection (agent/dbus). Each pass scans sysfs,
// counts units from the last pod-resources answer, builds the GPUNode status and hands it to the
// publisher when it changed.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/dbus/service.h"
#include "agent/health_server.h"
#include "agent/metrics.h"
#include "agent/units.h"
#include "agent/units_tracker.h"
#include "podresources/client.h"
#include "sysfs/scanner.h"

struct sd_event;
struct sd_event_source;
struct signalfd_siginfo;
struct udev;
struct udev_monitor;

namespace cozy::agent {

// Where the desired status goes (the API server's GPUNode, in `run`). Called on the loop.
class StatusPublisher {
 public:
  virtual ~StatusPublisher() = default;
  // Publishes the agent-owned status fields. nullopt: done (written, or nothing to write);
  // a delay: a transient failure, call again with the then-current status after it.
  virtual std::optional<std::chrono::milliseconds> Publish(const nlohmann::json& status) = 0;
  // nullopt when Publish may write now; else how long to wait first (a client-side rate limit
  // that would otherwise sleep inside the request and stall the loop). Waiting is not a failure.
  virtual std::optional<std::chrono::milliseconds> ReadyIn() { return std::nullopt; }
};

// Something the loop drives through its sockets and a deadline (the pod watch): Step() does
// the work that is ready without blocking long and says when it wants to be stepped again.
class LoopDriven {
 public:
  struct Fd {
    int fd;
    bool read;
    bool write;
  };
  virtual ~LoopDriven() = default;
  virtual std::chrono::steady_clock::time_point Step(std::chrono::steady_clock::time_point now) = 0;
  virtual std::vector<Fd> Fds() = 0;
};

// The node's pods as the loop sees them: phases by "namespace/name".
class PodWatch : public LoopDriven {
 public:
  // The phases after the last Step(); `changed` says whether they differ from the step before.
  virtual const PodPhases& Phases(bool& changed) = 0;
  virtual bool Synced() const = 0;
};

struct DaemonOptions {
  std::string nodeName;
  sysfs::ScanOptions scan;
  podresources::ClientOptions podResources;
  FetchSchedule podResourcesSchedule;
  std::chrono::milliseconds debounce{50};
  std::chrono::milliseconds resync{std::chrono::minutes(10)};
  std::chrono::milliseconds mdevLinkRetry{250};
  int mdevLinkRetries = 8;
  std::string udevSource = "auto";  // auto (udev if /run/udev/control exists), udev, kernel, off
  std::optional<PodPhases> fixedPodPhases;  // test-only --pod-phases; else from PostPodPhases
  std::string healthAddress = "off";        // "host:port", ":port" or "off"
  std::string dbus = "off";                 // "system", "session" or "off"
  std::string version;
};

struct DaemonCounters {
  int64_t scans = 0;
  int64_t deviceEvents = 0;
  int64_t debouncedRescans = 0;  // rescans that device events asked for
  int64_t podResourcesFetches = 0;
  int64_t publishes = 0;
  int64_t publishFailures = 0;
  int64_t publishWaits = 0;  // publishes postponed by the client-side rate limit
};

class Daemon {
 public:
  Daemon(DaemonOptions options, std::unique_ptr<StatusPublisher> publisher,
         std::unique_ptr<PodWatch> podWatch = nullptr);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Runs until SIGTERM/SIGINT or Stop(); returns the process exit code.
  int Run();

  // Thread-safe: runs `work` on the loop thread soon (how threaded libraries reach the loop).
  void Post(std::function<void()> work);
  // Thread-safe: the node's pod phases changed (pod watch): re-read pod-resources.
  void PostPodPhases(PodPhases phases);
  void Stop();

  // Loop-thread state, for the D-Bus and HTTP views.
  // The Inventory property: the status as compact JSON; "{}" before the first pass.
  std::string InventoryJson() const;
  const nlohmann::json& status() const { return status_; }
  const DaemonCounters& counters() const { return counters_; }
  bool ready() const { return ready_; }
  // The health server's bound port (after Run() started it), for tests listening on ":0".
  int healthPort() const { return health_.port(); }

 private:
  static int OnSignal(sd_event_source* source, const ::signalfd_siginfo* info, void* self);
  static int OnUdev(sd_event_source* source, int fd, uint32_t events, void* self);
  static int OnTimer(sd_event_source* source, uint64_t usec, void* self);
  static int OnPosted(sd_event_source* source, int fd, uint32_t events, void* self);
  static int OnPodWatchIo(sd_event_source* source, int fd, uint32_t events, void* self);
  void StepPodWatch();

  bool SetUp();
  void OpenUdevMonitor();
  void ArmTimer(sd_event_source*& source, std::chrono::milliseconds delay);
  void RequestRescan(const std::string& reason);
  void Rescan();
  void FetchPodResources();
  void PublishCurrent();
  void NotifyStatus();
  void UpdateMetrics();

  DaemonOptions options_;
  std::unique_ptr<StatusPublisher> publisher_;
  std::unique_ptr<PodWatch> podWatch_;
  std::vector<sd_event_source*> podWatchSources_;
  sd_event_source* podWatchTimer_ = nullptr;
  podresources::Client podResources_;
  UnitsTracker units_;
  PodPhases podPhases_;

  sd_event* event_ = nullptr;
  udev* udev_ = nullptr;
  udev_monitor* monitor_ = nullptr;
  sd_event_source* udevSource_ = nullptr;
  sd_event_source* debounceTimer_ = nullptr;
  sd_event_source* fetchTimer_ = nullptr;
  sd_event_source* resyncTimer_ = nullptr;
  sd_event_source* publishTimer_ = nullptr;
  sd_event_source* mdevTimer_ = nullptr;
  sd_event_source* heartbeatTimer_ = nullptr;
  sd_event_source* postedSource_ = nullptr;
  int postedFd_ = -1;
  std::mutex postedMutex_;
  std::vector<std::function<void()>> posted_;

  nlohmann::json status_;
  std::optional<nlohmann::json> publishedStatus_;
  bool publishPending_ = false;
  bool ready_ = false;
  int mdevRetriesLeft_ = 0;
  std::vector<std::string> loggedProblems_;
  std::string lastPodResourcesState_;
  DaemonCounters counters_;
  HealthServer health_;
  MetricsSnapshot metrics_;
  std::unique_ptr<DbusService> dbus_;  // sources on event_: destroyed before it
};

}  // namespace cozy::agent
