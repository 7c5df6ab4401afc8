// Durations as flags take them, the way people write them in units and charts: "5s", "300ms",
// "10m", "1h", or plain seconds.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace cozy::runtime {

// nullopt for anything else: a negative value, an unknown unit, trailing text, an overflow.
std::optional<std::chrono::milliseconds> ParseDuration(std::string_view text);

// The way ParseDuration reads it back, in the largest unit that is exact: "2m", "15s", "500ms".
std::string FormatDuration(std::chrono::milliseconds duration);

}  // namespace cozy::runtime
