// The GPUNode resource (gpu.cozystack.io/v1alpha1, cluster-scoped, one per node): its identity
// and the status field names the agent owns (DESIGN §4.2). The agent writes no other field.
#pragma once

#include <array>
#include <string_view>

namespace cozy::api {

inline constexpr std::string_view kGroup = "gpu.cozystack.io";
inline constexpr std::string_view kVersion = "v1alpha1";
inline constexpr std::string_view kApiVersion = "gpu.cozystack.io/v1alpha1";
inline constexpr std::string_view kGpuNodeKind = "GPUNode";
inline constexpr std::string_view kGpuNodePlural = "gpunodes";

// The status fields the agent owns; a merge patch from the agent carries these keys only.
// `summary` goes past DESIGN §4.2: totals for kubectl's printer columns (docs/gpunode.md).
inline constexpr std::array<std::string_view, 4> kAgentOwnedStatusFields = {
    "resourceNames", "devices", "unplaced", "summary"};

// Health of a GPUNode device (DESIGN §4.4).
inline constexpr std::string_view kHealthHealthy = "Healthy";
inline constexpr std::string_view kHealthUnhealthy = "Unhealthy";
inline constexpr std::string_view kHealthUnadvertised = "Unadvertised";

}  // namespace cozy::api
