// Carries out the reconciler's plan with the API: each action one conditional write (a merge
// patch or an update at the resourceVersion the plan saw, a delete with uid and
// resourceVersion preconditions), with a field manager. A conflict (409) is counted and left
// to the next pass, which plans from the fresher cache; nothing is retried blindly.
//
// The caches lag the writes by a watch event, so a pass that runs before that event would
// plan the same write again. The applier remembers, per object, the resourceVersion it wrote
// from and skips an action planned from that same version for a while (kMemoLife): a write is
// sent once per state of the object, not once per pass.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <string>

#include "controller/reconciler/plan.h"
#include "kube/client.h"

namespace cozy::controller {

struct ApplyCounts {
  // (target kind, result) -> writes; result: ok, conflict, gone, forbidden, error, skipped.
  std::map<std::pair<std::string, std::string>, int64_t> writes;
  int64_t conflicts = 0;
  int failed = 0;  // actions that did not apply this pass (conflicts included)
};

class Applier {
 public:
  static constexpr std::chrono::seconds kMemoLife{30};
  inline static const std::string kFieldManager = "gpu-controller";

  // `leading` is read before every write: a replica that lost the Lease mid-pass stops writing.
  // With `leadingUntil` (the elector's LeaderElector::LeadingUntil; empty: no limit in time)
  // both are read again before every attempt of each write, retries included, and no attempt
  // starts or runs past the instant the replica leads until (kube::LeaderDeadline).
  Applier(kube::Client& client, const std::atomic<bool>& leading,
          kube::DeadlineSource leadingUntil = {});

  // Applies the actions in order; never throws for an API error (counted, logged).
  ApplyCounts Apply(const std::vector<Action>& actions, std::chrono::steady_clock::time_point now);

 private:
  void ApplyOne(const Action& action);
  kube::Client& client_;
  const std::atomic<bool>& leading_;
  kube::DeadlineSource deadline_;  // kube::LeaderDeadline(leading, leadingUntil)
  struct Memo {
    std::string resourceVersion;
    std::chrono::steady_clock::time_point at;
  };
  std::map<std::string, Memo> memo_;  // Action::Key() -> version written from
};

// The path of the object an action writes.
std::string ActionPath(const Action& action, bool status = false);

}  // namespace cozy::controller
