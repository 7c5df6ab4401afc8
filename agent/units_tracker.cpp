#include "agent/units_tracker.h"

namespace cozy::agent {

void UnitsTracker::Update(const podresources::FetchResult& fetch) {
  lastState_ = fetch.state;
  lastMessage_ = fetch.message;
  if (fetch.state == podresources::FetchState::kOk && fetch.allocation) {
    allocation_ = *fetch.allocation;
    stale_ = false;
    return;
  }
  // Zeros would tell the cluster the GPUs are gone; the last answer is closer to the truth.
  stale_ = allocation_.has_value();
}

std::optional<UnitReport> UnitsTracker::Count(const sysfs::HostScan& host,
                                              const PodPhases& podPhases,
                                              const NvmlGpuAddresses& nvmlGpus) {
  if (!allocation_) {
    return std::nullopt;
  }
  UnitReport report = CountUnits(host, *allocation_, podPhases, advertised_, nvmlGpus);
  advertised_ = report.advertised;
  return report;
}

}  // namespace cozy::agent
