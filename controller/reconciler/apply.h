// Carries out the reconcilers' plan with the API, whichever reconciler planned each action: each
// action one conditional write to the target it names, by its verb (a merge patch or an update at
// the resourceVersion the plan saw, a create, a delete with uid and resourceVersion
// preconditions), with a field manager. A conflict (409) is counted and left
// to the next pass, which plans from the fresher cache; nothing is retried blindly.
//
// The caches lag the writes by a watch event, so a pass that runs before that event would
// plan the same write again. The applier remembers, per object, the resourceVersion it wrote
// from and skips an action planned from that same version for a while (kMemoLife): a write is
// sent once per state of the object, not once per pass.
//
// A write that fails backs off its object, not the pass (docs/controller.md, "The reconciler: what
// each finalizer waits for"): the object waits a delay of its own (kRetry: 1 s, doubling to 1 min,
// reset by a success) and the pass writes every other object meanwhile. A conflict holds the object
// off only while the plan still reads the version that conflicted: once the cache shows a newer
// one, the write goes at once. The pass reports when the first held-off object may be tried again,
// and the daemon runs a pass then.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "controller/reconciler/plan.h"
#include "kube/backoff.h"
#include "kube/client.h"
#include "kube/leader_election.h"

namespace cozy::controller {

struct ApplyCounts {
  // (target kind, result) -> writes; result: ok, conflict, gone, forbidden, error, skipped
  // (written from this version already), backoff (its object is held off after a failure).
  std::map<std::pair<std::string, std::string>, int64_t> writes;
  int64_t conflicts = 0;
  // (reconciler, result) -> actions: the same results, and not-leading (not tried: the replica
  // stepped down mid-pass), by the reconciler that planned each action.
  std::map<std::pair<std::string, std::string>, int64_t> byReconciler;
  int failed = 0;   // actions that did not apply this pass (conflicts included)
  int heldOff = 0;  // actions not tried: their object backs off
  // When the first object held off may be tried again: the pass to run then.
  std::optional<std::chrono::steady_clock::time_point> retryAt;
  size_t backingOff = 0;  // objects held off after this pass
};

class Applier {
 public:
  static constexpr std::chrono::seconds kMemoLife{30};
  inline static const std::string kFieldManager = "gpu-controller";
  // Per object: 1 s after its first failure, doubling to a minute; no jitter (one controller
  // writes, not a fleet in lock step).
  static constexpr kube::BackoffPolicy kRetry{std::chrono::seconds(1), std::chrono::minutes(1), 2.0,
                                              0.0};

  // `leadership` is read before every write: a replica that lost the Lease mid-pass stops
  // writing. Its deadline is read again before every attempt of each write, retries included,
  // and no attempt starts or runs past the instant the replica leads until
  // (kube::Leadership::Deadline).
  Applier(kube::Client& client, const kube::Leadership& leadership,
          kube::BackoffPolicy retry = kRetry);

  // Applies the actions in order, past those whose object backs off; never throws for an API
  // error (counted, logged). `now` is the pass's start: memo ages and backoff delays count
  // from it.
  ApplyCounts Apply(const std::vector<Action>& actions, std::chrono::steady_clock::time_point now);

 private:
  void ApplyOne(const Action& action);
  kube::Client& client_;
  const kube::Leadership& leadership_;
  kube::DeadlineSource deadline_;  // leadership_.Deadline()
  struct Memo {
    std::string resourceVersion;
    std::chrono::steady_clock::time_point at;
  };
  std::map<std::string, Memo> memo_;  // Action::Key() -> version written from
  kube::KeyedBackoff backoff_;        // Action::Key() -> its failures in a row
};

}  // namespace cozy::controller
