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
};

// The quantity rounded up to a whole number, as the scheduler's Value() reads a request.
// Negative quantities and values beyond int64 are errors: no budget or request is either.
QuantityResult ParseWholeQuantity(std::string_view text);

}  // namespace cozy::api
