// What the agent knows of kubelet's device plugins across fetches: the last good answer is kept
// while kubelet cannot answer, marked stale, never replaced by zeros (DESIGN §4.4;
// docs/pod-resources.md, "Across fetches").
#pragma once

#include <chrono>
#include <optional>
#include <set>
#include <string>

#include "agent/status/units.h"
#include "podresources/allocation.h"
#include "podresources/fetch.h"
#include "sysfs/host_scan.h"

namespace cozy::agent {

// When to ask kubelet again: the regular interval after an answer; after a failure an
// exponential backoff (kubelet's rate limit answers RESOURCE_EXHAUSTED; a restarting kubelet
// has no socket for a while), with jitter so the nodes of a cluster do not ask in step.
struct FetchSchedule {
  std::chrono::milliseconds interval{10000};
  std::chrono::milliseconds firstBackoff{1000};
  std::chrono::milliseconds maxBackoff{60000};
  double jitter = 0.2;  // the delay varies by up to ±20 %
  // How long a resource whose every device vanished from one answer to the next keeps its last
  // devices (docs/pod-resources.md, "What a real kubelet says"): a restarted kubelet lists none
  // until its plugins register again, and a restarted plugin none until it is back. Meanwhile
  // kubelet is asked again after firstBackoff.
  std::chrono::milliseconds vanishedGrace{10000};
};

class UnitsTracker {
 public:
  explicit UnitsTracker(FetchSchedule schedule = {}) : schedule_(schedule) {}

  // Takes one fetch result, answered at `at`. kOk replaces the kept allocation, except the
  // devices of a resource that all vanished at once, kept (stale) for vanishedGrace; any
  // failure keeps it and marks it stale. A resource losing some of its devices (one turned
  // Unhealthy, A5) is taken at once.
  void Update(const podresources::FetchResult& fetch,
              std::chrono::system_clock::time_point at = std::chrono::system_clock::now());

  // Units of `host` from the kept allocation, or nullopt while kubelet has never answered
  // (units unknown). "Previously advertised" (for Unhealthy) is remembered across calls.
  std::optional<UnitReport> Count(const sysfs::HostScan& host, const PodPhases& podPhases,
                                  const NvmlGpuAddresses& nvmlGpus);

  // The delay before the next fetch; `random01` is a uniform draw in [0, 1) for the jitter.
  std::chrono::milliseconds NextFetchDelay(double random01) const;
  int consecutiveFailures() const { return consecutiveFailures_; }

  bool known() const { return allocation_.has_value(); }
  // Resources whose devices all vanished, held at their last devices within the grace.
  const std::set<std::string>& holding() const { return holding_; }
  bool stale() const { return stale_; }
  // When kubelet last answered (the counts' age); unset before the first answer.
  std::optional<std::chrono::system_clock::time_point> lastAnswerAt() const {
    return lastAnswerAt_;
  }
  // While stale: when the first failed fetch after the last answer happened.
  std::optional<std::chrono::system_clock::time_point> failingSince() const {
    return failingSince_;
  }
  podresources::FetchState lastState() const { return lastState_; }
  const std::string& lastMessage() const { return lastMessage_; }

 private:
  std::optional<podresources::Allocation> allocation_;
  bool stale_ = false;
  std::optional<std::chrono::system_clock::time_point> lastAnswerAt_;
  std::optional<std::chrono::system_clock::time_point> failingSince_;
  podresources::FetchState lastState_ = podresources::FetchState::kSocketAbsent;
  std::string lastMessage_ = "pod-resources not asked yet";
  std::set<sysfs::PciAddress> advertised_;
  std::set<std::string> holding_;
  std::optional<std::chrono::system_clock::time_point> vanishedSince_;
  FetchSchedule schedule_;
  int consecutiveFailures_ = 0;
};

}  // namespace cozy::agent
