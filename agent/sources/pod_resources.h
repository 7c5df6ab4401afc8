// kubelet's pod-resources API as a source: what device plugins advertise and which pods hold
// what. Each read is a pass of a runtime::PassLoop (docs/runtime.md, "One pass loop"): the gRPC
// call runs on the loop's worker (a hung kubelet holds it for the call's deadline, never the
// loop), its answer comes back to the loop thread, which keeps the units (UnitsTracker) and asks
// for a status pass. Reads follow the fetch schedule: the interval after an answer, backoff after
// a failure, and a trigger during the backoff waits for it (kubelet rate-limits this API); a
// trigger during a read is one more read after it, unless that read failed.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "agent/sources/source.h"
#include "agent/status/units_tracker.h"
#include "podresources/client.h"
#include "runtime/pass_loop.h"

namespace cozy::agent {

class PodResourcesSource : public Source {
 public:
  PodResourcesSource(podresources::ClientOptions options, FetchSchedule schedule);
  ~PodResourcesSource() override;
  std::string_view Name() const override { return "pod-resources"; }
  void Start(runtime::Loop& loop, Changed changed) override;
  bool Settled() const override { return answers_ > 0; }
  // A read now, unless one is running (then one more after it, unless it fails) or kubelet is
  // being backed off and nobody forced it.
  void Refresh(bool force) override;

  // Loop thread. The pass counts from these (Count remembers what was advertised).
  UnitsTracker& units() { return units_; }
  int64_t fetches() const { return fetches_; }
  // Results by state (ok, socketAbsent, ...), for the metrics.
  const std::map<std::string, int64_t>& results() const { return results_; }

 private:
  void OnAnswer(const podresources::FetchResult& result);

  podresources::ClientOptions options_;
  podresources::Client client_;  // used on the worker only
  UnitsTracker units_;
  runtime::Loop* loop_ = nullptr;
  Changed changed_;
  int64_t fetches_ = 0;
  int64_t answers_ = 0;
  std::map<std::string, int64_t> results_;
  std::string lastState_;
  std::optional<podresources::Allocation> lastAllocation_;
  // Last: stopped first (its read in flight waited for), before what the read uses.
  std::unique_ptr<runtime::PassLoop<podresources::FetchResult>> reads_;
};

}  // namespace cozy::agent
