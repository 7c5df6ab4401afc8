#include "agent/daemon.h"

#include <libudev.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <systemd/sd-daemon.h>
#include <systemd/sd-event.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <random>

#include "agent/log.h"
#include "agent/nvidia_procfs.h"
#include "agent/status_builder.h"
#include "sysfs/sysfs_io.h"

namespace cozy::agent {
namespace {

constexpr uint64_t kTimerAccuracyUsec = 1000;

uint64_t ToMicroseconds(std::chrono::milliseconds delay) {
  return static_cast<uint64_t>(std::max<int64_t>(delay.count(), 0)) * 1000U;
}

double RandomUnit() {
  static thread_local std::mt19937 generator{std::random_device{}()};
  return std::uniform_real_distribution<double>(0.0, 1.0)(generator);
}

// One line for people (sd_notify STATUS=, logs): "8 GPUs, 7 healthy, units stale (...)".
std::string Summary(const nlohmann::json& status, const UnitsTracker& units) {
  size_t gpus = 0;
  size_t healthy = 0;
  for (const auto& device : status.value("devices", nlohmann::json::array())) {
    ++gpus;
    healthy += device.value("health", "") == "Healthy" ? 1U : 0U;
  }
  std::string summary = std::to_string(gpus) + " GPU function" + (gpus == 1 ? "" : "s");
  if (!units.known()) {
    summary += ", units unknown (pod-resources " +
               std::string(podresources::ToString(units.lastState())) + ")";
  } else {
    summary += ", " + std::to_string(healthy) + " healthy";
    if (units.stale()) {
      summary += ", units stale (pod-resources " +
                 std::string(podresources::ToString(units.lastState())) + ")";
    }
  }
  return summary;
}

}  // namespace

Daemon::Daemon(DaemonOptions options, std::unique_ptr<StatusPublisher> publisher,
               std::unique_ptr<PodWatch> podWatch)
    : options_(std::move(options)),
      publisher_(std::move(publisher)),
      podWatch_(std::move(podWatch)),
      podResources_(options_.podResources),
      units_(options_.podResourcesSchedule) {
  if (options_.fixedPodPhases) {
    podPhases_ = *options_.fixedPodPhases;
  }
}

Daemon::~Daemon() {
  health_.Stop();
  dbus_.reset();
  for (sd_event_source* source : podWatchSources_) {
    sd_event_source_disable_unref(source);
  }
  sd_event_source_disable_unref(podWatchTimer_);
  for (sd_event_source* source : {udevSource_, debounceTimer_, fetchTimer_, resyncTimer_,
                                  publishTimer_, mdevTimer_, heartbeatTimer_, postedSource_}) {
    sd_event_source_disable_unref(source);
  }
  if (monitor_ != nullptr) {
    udev_monitor_unref(monitor_);
  }
  if (udev_ != nullptr) {
    udev_unref(udev_);
  }
  if (postedFd_ >= 0) {
    ::close(postedFd_);
  }
  sd_event_unref(event_);
}

bool Daemon::SetUp() {
  if (sd_event_new(&event_) < 0) {
    LogError("cannot create the event loop");
    return false;
  }
  // Signals arrive through signalfd sources on the loop, never as asynchronous handlers.
  sigset_t mask;
  sigemptyset(&mask);
  for (int signal : {SIGTERM, SIGINT, SIGHUP}) {
    sigaddset(&mask, signal);
  }
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  for (int signal : {SIGTERM, SIGINT, SIGHUP}) {
    sd_event_add_signal(event_, nullptr, signal, &Daemon::OnSignal, this);
  }
  // Timers exist from the start, disabled; ArmTimer sets them off once.
  for (sd_event_source** timer : {&debounceTimer_, &fetchTimer_, &resyncTimer_, &publishTimer_,
                                  &mdevTimer_, &heartbeatTimer_, &podWatchTimer_}) {
    // USEC_INFINITY (UINT64_MAX) as an absolute time: created, never due until armed. The
    // accuracy is 1 ms: sd-event reads 0 as its default of 250 ms and may then fire a timer
    // that late, which made a 100 ms debounce take anywhere up to 350 ms.
    if (sd_event_add_time(event_, timer, CLOCK_MONOTONIC, UINT64_MAX, kTimerAccuracyUsec,
                          &Daemon::OnTimer, this) < 0) {
      LogError("cannot create a timer");
      return false;
    }
    sd_event_source_set_enabled(*timer, SD_EVENT_OFF);
  }
  postedFd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  sd_event_add_io(event_, &postedSource_, postedFd_, EPOLLIN, &Daemon::OnPosted, this);
  // WATCHDOG=1 at half of WatchdogSec when systemd asks for it (WATCHDOG_USEC).
  sd_event_set_watchdog(event_, 1);
  OpenUdevMonitor();
  if (!health_.Start(options_.healthAddress)) {
    LogError("cannot serve health and metrics", {{"reason", health_.error()}});
    return false;
  }
  if (options_.healthAddress != "off") {
    LogInfo("serving /healthz, /readyz, /metrics", {{"address", options_.healthAddress}});
  }
  metrics_.version = options_.version;
  if (options_.dbus != "off") {
    // Requests wait in the socket until the loop runs, which is after the first pass: no
    // caller sees the "{}" of a status not yet built.
    dbus_ = std::make_unique<DbusService>(
        event_, options_.dbus,
        DbusService::Callbacks{[this] { return InventoryJson(); },
                               [this] {
                                 LogInfo("D-Bus Rescan(): rescanning");
                                 FetchPodResources();  // what SIGHUP does
                               },
                               [this] {
                                 if (!status_.is_null()) {
                                   UpdateMetrics();  // else the first pass does
                                 }
                               }});
    dbus_->Start();
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

void Daemon::OpenUdevMonitor() {
  std::string source = options_.udevSource;
  if (source == "off") {
    LogInfo("device events off; rescans on timers and SIGHUP only");
    return;
  }
  if (source == "auto") {
    // A udev-group monitor hears nothing without udevd (a container without /run/udev).
    source = sysfs::PathExists("/run/udev/control") ? "udev" : "kernel";
  }
  udev_ = udev_new();
  monitor_ = udev_ == nullptr ? nullptr : udev_monitor_new_from_netlink(udev_, source.c_str());
  if (monitor_ == nullptr) {
    LogWarning("cannot open the udev monitor; rescans on timers and SIGHUP only",
               {{"source", source}});
    return;
  }
  for (const char* subsystem : {"pci", "mdev", "vfio"}) {
    udev_monitor_filter_add_match_subsystem_devtype(monitor_, subsystem, nullptr);
  }
  if (udev_monitor_enable_receiving(monitor_) < 0) {
    LogWarning(
        "cannot receive udev events (kernel events need the host network namespace); "
        "rescans on timers and SIGHUP only",
        {{"source", source}});
    udev_monitor_unref(monitor_);
    monitor_ = nullptr;
    return;
  }
  sd_event_add_io(event_, &udevSource_, udev_monitor_get_fd(monitor_), EPOLLIN, &Daemon::OnUdev,
                  this);
  LogInfo("listening for device events", {{"source", source}, {"subsystems", "pci,mdev,vfio"}});
}

void Daemon::ArmTimer(sd_event_source*& source, std::chrono::milliseconds delay) {
  if (sd_event_source_set_time_relative(source, ToMicroseconds(delay)) < 0 ||
      sd_event_source_set_enabled(source, SD_EVENT_ONESHOT) < 0) {
    LogError("cannot arm a timer");
  }
}

int Daemon::Run() {
  if (!SetUp()) {
    return 1;
  }
  LogInfo("gpu-agent starting", {{"node", options_.nodeName},
                                 {"sysfsRoot", options_.scan.root},
                                 {"podResources", options_.podResources.endpoint}});
  if (podWatch_) {
    StepPodWatch();  // lists the node's pods before the first count
  }
  FetchPodResources();  // also scans and publishes
  ArmTimer(resyncTimer_, options_.resync);
  ArmTimer(heartbeatTimer_, std::chrono::seconds(1));
  health_.Heartbeat();
  ready_ = true;
  health_.SetReady(true);
  sd_notify(0, "READY=1");
  NotifyStatus();
  const int result = sd_event_loop(event_);
  sd_notify(0, "STOPPING=1");
  LogInfo("gpu-agent stopped");
  return result < 0 ? 1 : 0;
}

void Daemon::Stop() {
  Post([this] { sd_event_exit(event_, 0); });
}

void Daemon::Post(std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(postedMutex_);
    posted_.push_back(std::move(work));
  }
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t written = ::write(postedFd_, &one, sizeof one);
}

void Daemon::PostPodPhases(PodPhases phases) {
  Post([this, phases = std::move(phases)]() mutable {
    if (options_.fixedPodPhases || phases == podPhases_) {
      return;
    }
    podPhases_ = std::move(phases);
    FetchPodResources();
  });
}

int Daemon::OnPosted(sd_event_source* /*source*/, int fd, uint32_t /*events*/, void* self) {
  auto* daemon = static_cast<Daemon*>(self);
  uint64_t count = 0;
  [[maybe_unused]] const ssize_t got = ::read(fd, &count, sizeof count);
  std::vector<std::function<void()>> work;
  {
    std::lock_guard<std::mutex> lock(daemon->postedMutex_);
    work.swap(daemon->posted_);
  }
  for (auto& item : work) {
    item();
  }
  return 0;
}

int Daemon::OnPodWatchIo(sd_event_source* /*source*/, int /*fd*/, uint32_t /*events*/, void* self) {
  static_cast<Daemon*>(self)->StepPodWatch();
  return 0;
}

// The watch's sockets change as connections come and go: after each step the loop listens on
// exactly the ones it names now, and wakes at the deadline it asked for.
void Daemon::StepPodWatch() {
  const auto next = podWatch_->Step(std::chrono::steady_clock::now());
  for (sd_event_source* source : podWatchSources_) {
    sd_event_source_disable_unref(source);
  }
  podWatchSources_.clear();
  for (const LoopDriven::Fd& fd : podWatch_->Fds()) {
    const uint32_t events = (fd.read ? EPOLLIN : 0U) | (fd.write ? EPOLLOUT : 0U);
    sd_event_source* source = nullptr;
    if (events != 0 &&
        sd_event_add_io(event_, &source, fd.fd, events, &Daemon::OnPodWatchIo, this) >= 0) {
      podWatchSources_.push_back(source);
    }
  }
  const auto delay = std::chrono::duration_cast<std::chrono::milliseconds>(
      next - std::chrono::steady_clock::now());
  ArmTimer(podWatchTimer_, std::clamp(delay, std::chrono::milliseconds(1),
                                      std::chrono::milliseconds(std::chrono::minutes(1))));
  bool changed = false;
  const PodPhases& phases = podWatch_->Phases(changed);
  if (changed && !options_.fixedPodPhases && phases != podPhases_) {
    podPhases_ = phases;
    LogDebug("pod phases changed", {{"pods", std::to_string(phases.size())}});
    if (ready_) {
      FetchPodResources();
    }
  }
}

int Daemon::OnSignal(sd_event_source* /*source*/, const ::signalfd_siginfo* info, void* self) {
  auto* daemon = static_cast<Daemon*>(self);
  if (info->ssi_signo == SIGHUP) {
    LogInfo("SIGHUP: rescanning");
    daemon->FetchPodResources();
    return 0;
  }
  LogInfo("stopping", {{"signal", std::string(strsignal(static_cast<int>(info->ssi_signo)))}});
  sd_event_exit(daemon->event_, 0);
  return 0;
}

int Daemon::OnUdev(sd_event_source* /*source*/, int /*fd*/, uint32_t /*events*/, void* self) {
  auto* daemon = static_cast<Daemon*>(self);
  while (udev_device* device = udev_monitor_receive_device(daemon->monitor_)) {
    ++daemon->counters_.deviceEvents;
    const char* action = udev_device_get_action(device);
    const char* subsystem = udev_device_get_subsystem(device);
    const char* sysname = udev_device_get_sysname(device);
    LogDebug("device event", {{"action", action != nullptr ? action : ""},
                              {"subsystem", subsystem != nullptr ? subsystem : ""},
                              {"device", sysname != nullptr ? sysname : ""}});
    udev_device_unref(device);
    daemon->RequestRescan("device event");
  }
  return 0;
}

int Daemon::OnTimer(sd_event_source* source, uint64_t /*usec*/, void* self) {
  auto* daemon = static_cast<Daemon*>(self);
  if (source == daemon->debounceTimer_) {
    ++daemon->counters_.debouncedRescans;
    daemon->Rescan();
  } else if (source == daemon->fetchTimer_) {
    daemon->FetchPodResources();
  } else if (source == daemon->resyncTimer_) {
    daemon->FetchPodResources();
    daemon->ArmTimer(daemon->resyncTimer_, daemon->options_.resync);
  } else if (source == daemon->publishTimer_) {
    daemon->PublishCurrent();
  } else if (source == daemon->mdevTimer_) {
    daemon->Rescan();
  } else if (source == daemon->podWatchTimer_) {
    daemon->StepPodWatch();
  } else if (source == daemon->heartbeatTimer_) {
    // /healthz reports the loop alive while this keeps firing.
    daemon->health_.Heartbeat();
    daemon->ArmTimer(daemon->heartbeatTimer_, std::chrono::seconds(1));
  }
  return 0;
}

// Events are debounced: the first one arms the timer and later ones ride on it, so a burst
// costs one rescan per debounce window and a steady stream cannot postpone the rescan forever.
void Daemon::RequestRescan(const std::string& reason) {
  int enabled = SD_EVENT_OFF;
  sd_event_source_get_enabled(debounceTimer_, &enabled);
  if (enabled == SD_EVENT_OFF) {
    LogDebug("rescan requested", {{"reason", reason}});
    ArmTimer(debounceTimer_, options_.debounce);
  }
}

void Daemon::FetchPodResources() {
  ++counters_.podResourcesFetches;
  units_.Update(podResources_.Fetch());
  const std::string state(podresources::ToString(units_.lastState()));
  ++metrics_.podResourcesResults[state];
  if (state != lastPodResourcesState_) {
    if (units_.lastState() == podresources::FetchState::kOk) {
      LogInfo("pod-resources answers", {{"endpoint", options_.podResources.endpoint}});
    } else {
      LogWarning(units_.known() ? "pod-resources failed; keeping the last counts, stale"
                                : "pod-resources failed; units unknown",
                 {{"state", state}, {"detail", units_.lastMessage()}});
    }
    lastPodResourcesState_ = state;
  }
  ArmTimer(fetchTimer_, units_.NextFetchDelay(RandomUnit()));
  Rescan();
}

void Daemon::Rescan() {
  ++counters_.scans;
  const auto started = std::chrono::steady_clock::now();
  sysfs::HostScan scan;
  try {
    scan = sysfs::ScanHost(options_.scan);
  } catch (const sysfs::RootError& error) {
    // The root can come back (a remount); keep the last status and try on the next event.
    LogError("cannot scan", {{"reason", error.what()}});
    return;
  }
  // Each problem is logged once while it lasts, not on every rescan.
  std::vector<std::string> problems;
  for (const auto& problem : scan.problems) {
    problems.push_back(problem.path + ": " + problem.message);
  }
  for (const auto& function : scan.functions) {
    problems.insert(problems.end(), function.problems.begin(), function.problems.end());
  }
  const NvidiaGpuUuids nvidia = ReadNvidiaGpuUuids(options_.scan.root);
  problems.insert(problems.end(), nvidia.problems.begin(), nvidia.problems.end());
  std::sort(problems.begin(), problems.end());
  for (const auto& problem : problems) {
    if (!std::binary_search(loggedProblems_.begin(), loggedProblems_.end(), problem)) {
      LogWarning("sysfs problem", {{"detail", problem}});
    }
  }
  metrics_.sysfsProblems = static_cast<int64_t>(problems.size());
  loggedProblems_ = std::move(problems);

  // mdev type links appear only after the bind event: look again shortly, a few times, and
  // publish nothing meanwhile, so that a created mdev is one patch that names its type rather
  // than one without the type and another with it. Once the retries are spent (a tree that
  // never gets the link, such as a capture), the scan is published as it is.
  if (scan.mdevLinksPending && mdevRetriesLeft_ > 0) {
    --mdevRetriesLeft_;
    ArmTimer(mdevTimer_, options_.mdevLinkRetry);
    LogDebug("mdev type links pending; rescanning before publishing",
             {{"retriesLeft", std::to_string(mdevRetriesLeft_)}});
    UpdateMetrics();
    return;
  }
  if (!scan.mdevLinksPending) {
    mdevRetriesLeft_ = options_.mdevLinkRetries;
  }

  const auto units = units_.Count(scan, podPhases_, nvidia.gpus);
  nlohmann::json status = BuildStatus(scan, units ? &*units : nullptr);
  metrics_.scanDuration.Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  metrics_.ignoredDeviceIds.clear();
  if (units) {
    metrics_.ignoredDeviceIds = {{"unknownShape", units->ignored.unknownShape},
                                 {"noMatch", units->ignored.noMatch},
                                 {"notGpu", units->ignored.notGpu}};
  }
  if (status == status_) {
    UpdateMetrics();
    return;  // nothing changed: no log line, no write
  }
  const bool first = status_.is_null();
  status_ = std::move(status);
  LogInfo(first ? "inventory" : "inventory changed", {{"summary", Summary(status_, units_)}});
  NotifyStatus();
  if (dbus_) {
    dbus_->InventoryChanged(InventoryJson());
  }
  PublishCurrent();
  UpdateMetrics();
}

void Daemon::PublishCurrent() {
  if (publisher_ == nullptr || status_.is_null()) {
    return;
  }
  if (publishedStatus_ && *publishedStatus_ == status_) {
    return;
  }
  // The loop waits for the rate limit on its publish timer, then writes the status as it is by
  // then: changes in between cost no extra write.
  if (const auto wait = publisher_->ReadyIn()) {
    ++counters_.publishWaits;
    ArmTimer(publishTimer_, *wait);
    return;
  }
  const auto retry = publisher_->Publish(status_);
  if (retry) {
    ++counters_.publishFailures;
    ArmTimer(publishTimer_, *retry);
  } else {
    ++counters_.publishes;
    publishedStatus_ = status_;
  }
  UpdateMetrics();
}

void Daemon::UpdateMetrics() {
  metrics_.scans = counters_.scans;
  metrics_.deviceEvents = counters_.deviceEvents;
  metrics_.deviceRescans = counters_.debouncedRescans;
  metrics_.podResourcesFetches = counters_.podResourcesFetches;
  metrics_.patchesSucceeded = counters_.publishes;
  metrics_.patchesFailed = counters_.publishFailures;
  metrics_.unitsKnown = units_.known();
  metrics_.dbusConnected = dbus_ != nullptr && dbus_->connected();
  metrics_.podResourcesStale = units_.stale();
  metrics_.devicesByHealth = {
      {"Healthy", 0}, {"Unhealthy", 0}, {"Unadvertised", 0}, {"Unknown", 0}};
  for (const auto& device : status_.value("devices", nlohmann::json::array())) {
    ++metrics_.devicesByHealth[device.value("health", "Unknown")];
  }
  health_.SetMetrics(RenderMetrics(metrics_));
}

void Daemon::NotifyStatus() {
  if (!status_.is_null()) {
    sd_notify(0, ("STATUS=" + Summary(status_, units_)).c_str());
  }
}

}  // namespace cozy::agent
