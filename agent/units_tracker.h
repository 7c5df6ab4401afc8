// What the agent knows of kubelet's device plugins across fetches: the last good answer is kept
// while kubelet cannot answer, marked stale, never replaced by zeros (DESIGN §4.4, issue 3).
#pragma once

#include <optional>
#include <set>
#include <string>

#include "agent/units.h"
#include "podresources/allocation.h"
#include "podresources/client.h"
#include "sysfs/host_scan.h"

namespace cozy::agent {

class UnitsTracker {
 public:
  // Takes one fetch result. kOk replaces the kept allocation; any failure keeps it and marks
  // it stale.
  void Update(const podresources::FetchResult& fetch);

  // Units of `host` from the kept allocation, or nullopt while kubelet has never answered
  // (units unknown). "Previously advertised" (for Unhealthy) is remembered across calls.
  std::optional<UnitReport> Count(const sysfs::HostScan& host, const PodPhases& podPhases,
                                  const NvmlGpuAddresses& nvmlGpus);

  bool known() const { return allocation_.has_value(); }
  bool stale() const { return stale_; }
  podresources::FetchState lastState() const { return lastState_; }
  const std::string& lastMessage() const { return lastMessage_; }

 private:
  std::optional<podresources::Allocation> allocation_;
  bool stale_ = false;
  podresources::FetchState lastState_ = podresources::FetchState::kSocketAbsent;
  std::string lastMessage_ = "pod-resources not asked yet";
  std::set<sysfs::PciAddress> advertised_;
};

}  // namespace cozy::agent
