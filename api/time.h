// metav1.Time's text form: RFC 3339 in UTC, to the second ("2026-12-01T10:00:00Z"), as the API
// server writes creationTimestamp and conditions' lastTransitionTime.
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace cozy::api {

std::string FormatTime(std::chrono::system_clock::time_point time);
// Reads RFC 3339 with a "Z" or a numeric offset and optional fractional seconds; nullopt when
// the text is not that.
std::optional<std::chrono::system_clock::time_point> ParseTime(const std::string& text);

}  // namespace cozy::api
