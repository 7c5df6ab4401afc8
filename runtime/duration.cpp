#include "runtime/duration.h"

#include <charconv>
#include <cstdint>
#include <limits>

namespace cozy::runtime {

std::optional<std::chrono::milliseconds> ParseDuration(std::string_view text) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end == text.data() || value < 0) {
    return std::nullopt;
  }
  const std::string_view unit(end, static_cast<size_t>(text.data() + text.size() - end));
  int64_t scale = 0;
  if (unit == "ms") {
    scale = 1;
  } else if (unit == "s" || unit.empty()) {
    scale = 1000;
  } else if (unit == "m") {
    scale = 60 * 1000;
  } else if (unit == "h") {
    scale = 3600 * 1000;
  } else {
    return std::nullopt;
  }
  if (value > std::numeric_limits<int64_t>::max() / scale) {
    return std::nullopt;
  }
  return std::chrono::milliseconds(value * scale);
}

std::string FormatDuration(std::chrono::milliseconds duration) {
  const int64_t ms = duration.count();
  if (ms != 0 && ms % (3600 * 1000) == 0) return std::to_string(ms / (3600 * 1000)) + "h";
  if (ms != 0 && ms % (60 * 1000) == 0) return std::to_string(ms / (60 * 1000)) + "m";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  return std::to_string(ms) + "ms";
}

}  // namespace cozy::runtime
