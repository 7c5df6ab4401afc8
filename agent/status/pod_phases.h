// Pod phases from a file, for `gpu-agent scan --pod-phases FILE` (tests, demos) until the pod
// watch exists: kubelet's pod-resources answer carries no phases.
#pragma once

#include <string_view>

#include "agent/status/units.h"

namespace cozy::agent {

// Accepts either a plain object {"namespace/name": "Running", ...} or a PodList as
// `kubectl get pods -o json` prints it (items[].metadata.{namespace,name}, items[].status.phase;
// pods without a phase are left out, so they count as active). Throws std::runtime_error with
// the offending key on bad input.
PodPhases ParsePodPhases(std::string_view json);

}  // namespace cozy::agent
