// The GPUNode resource (gpu.cozystack.io/v1alpha1, cluster-scoped, one per node): its identity
// and the status field names the agent owns (DESIGN §4.2). The agent writes no other field.
#pragma once

#include <array>
#include <string_view>

#include "api/keys.h"

namespace cozy::api {

// The group, version and kind are api/keys.h's, the one place every name is defined.
inline constexpr std::string_view kGpuNodePlural = "gpunodes";

// The status fields the agent owns; a merge patch from the agent carries these keys only.
// `summary` goes past DESIGN §4.2: totals for kubectl's printer columns (docs/gpunode.md).
// `staleUnits` says since when the unit counts are kubelet's last answer, while it has not
// answered for a while (docs/gpunode.md).
inline constexpr std::array<std::string_view, 5> kAgentOwnedStatusFields = {
    "resourceNames", "devices", "unplaced", "summary", "staleUnits"};
inline constexpr std::string_view kStaleUnitsField = "staleUnits";

// Health of a GPUNode device (DESIGN §4.4).
inline constexpr std::string_view kHealthHealthy = "Healthy";
inline constexpr std::string_view kHealthUnhealthy = "Unhealthy";
inline constexpr std::string_view kHealthUnadvertised = "Unadvertised";

}  // namespace cozy::api
