#include "agent/status/units_tracker.h"

#include <algorithm>

namespace cozy::agent {

void UnitsTracker::Update(const podresources::FetchResult& fetch,
                          std::chrono::system_clock::time_point at) {
  lastState_ = fetch.state;
  lastMessage_ = fetch.message;
  if (fetch.state == podresources::FetchState::kOk && fetch.allocation) {
    podresources::Allocation next = *fetch.allocation;
    std::set<std::string> vanished;
    if (allocation_) {
      for (const auto& [resource, devices] : allocation_->allocatable) {
        const auto now = next.allocatable.find(resource);
        if (!devices.empty() && (now == next.allocatable.end() || now->second.empty())) {
          vanished.insert(resource);
        }
      }
    }
    if (vanished.empty()) {
      vanishedSince_.reset();
    } else if (!vanishedSince_) {
      vanishedSince_ = at;
    }
    holding_.clear();
    if (!vanished.empty() && at - *vanishedSince_ < schedule_.vanishedGrace) {
      // Zeros for a whole resource right after a kubelet or plugin restart would tell the
      // cluster its GPUs failed; its last devices are closer to the truth for a moment.
      for (const std::string& resource : vanished) {
        next.allocatable[resource] = allocation_->allocatable.at(resource);
      }
      holding_ = std::move(vanished);
    }
    allocation_ = std::move(next);
    stale_ = !holding_.empty();
    consecutiveFailures_ = 0;
    lastAnswerAt_ = at;
    failingSince_.reset();
    return;
  }
  ++consecutiveFailures_;
  if (!failingSince_) {
    failingSince_ = at;
  }
  // Zeros would tell the cluster the GPUs are gone; the last answer is closer to the truth.
  stale_ = allocation_.has_value();
}

std::chrono::milliseconds UnitsTracker::NextFetchDelay(double random01) const {
  std::chrono::milliseconds delay = holding_.empty() ? schedule_.interval : schedule_.firstBackoff;
  if (consecutiveFailures_ > 0) {
    delay = schedule_.firstBackoff;
    for (int i = 1; i < consecutiveFailures_ && delay < schedule_.maxBackoff; ++i) {
      delay *= 2;
    }
    delay = std::min(delay, schedule_.maxBackoff);
  }
  const double factor = 1.0 + schedule_.jitter * (2.0 * random01 - 1.0);
  return std::chrono::milliseconds(
      static_cast<int64_t>(static_cast<double>(delay.count()) * factor));
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
