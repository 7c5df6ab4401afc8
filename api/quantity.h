// Kubernetes resource quantities ("2", "500m", "80Gi", "1e3") as whole counts: what GPU
// budgets, pod requests and memory sizes are read as.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace cozy::api {

struct QuantityResult {
  std::optional<int64_t> value;  // set on success
  std::string error;             // why not, for people, on failure
  bool tooLarge = false;         // the failure is a well-formed quantity past int64 ("10E")
};

// The most units anything is counted as: more than any node, tenant or cluster has (2^40,
// about 1.1e12). A request, budget, report or order past it is read as this many, so that
// every sum of such values the model makes (docs/controller.md, "Inputs out of range") stays
// far inside int64: a pod asking for "10E" holds "more than any node has", it never wraps.
inline constexpr int64_t kMaxUnits = int64_t{1} << 40;

// The ceiling of a sum of units (2^61): values of at most kMaxUnits reach it only past two
// million of them, and a sum that would pass it stays there (saturates) instead of wrapping.
// Free room, usage and budget checks then subtract such sums from one another inside int64.
inline constexpr int64_t kMaxUnitsSum = int64_t{1} << 61;

// a + b, held inside [-kMaxUnitsSum, kMaxUnitsSum].
constexpr int64_t AddUnits(int64_t a, int64_t b) {
  int64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) return a > 0 ? kMaxUnitsSum : -kMaxUnitsSum;
  return sum > kMaxUnitsSum ? kMaxUnitsSum : (sum < -kMaxUnitsSum ? -kMaxUnitsSum : sum);
}

// `value` capped at kMaxUnits (and floored at 0).
constexpr int64_t ClampUnits(int64_t value) {
  return value < 0 ? 0 : (value > kMaxUnits ? kMaxUnits : value);
}

// The quantity rounded up to a whole number, as the scheduler's Value() reads a request.
// Negative quantities and values beyond int64 are errors: no budget or request is either.
QuantityResult ParseWholeQuantity(std::string_view text);

}  // namespace cozy::api
