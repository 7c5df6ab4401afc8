// The TakesBinds condition of every GPUNode, for the binder (controller/binder/binder.h): whether
// the node takes binds now and, where not, why (cordoned, NotReady, tainted, no Node), so that
// `kubectl get gpunodes` and `kubectl gpu nodes` show what the binder decides.
#pragma once

#include <chrono>
#include <cstdint>

#include "controller/model/snapshot.h"
#include "kube/client.h"
#include "kube/leader_election.h"

namespace cozy::controller {

// Writes the condition of each GPUNode where it changed: a status merge patch of
// status.conditions (which only the binder writes), conditional on the version read, while
// `leadership` leads. Returns the writes made.
int64_t WriteNodeConditions(kube::Client& client, const kube::WriteOptions& write,
                            const kube::Leadership& leadership, const model::Snapshot& snapshot,
                            std::chrono::system_clock::time_point now);

}  // namespace cozy::controller
