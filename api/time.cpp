#include "api/time.h"

#include <array>
#include <cctype>
#include <cstdio>
#include <ctime>

namespace cozy::api {

std::string FormatTime(std::chrono::system_clock::time_point time) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(time);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  std::array<char, 32> buffer{};
  const size_t length = std::strftime(buffer.data(), buffer.size(), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return std::string(buffer.data(), length);
}

std::optional<std::chrono::system_clock::time_point> ParseTime(const std::string& text) {
  int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0, used = 0;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &year, &month, &day, &hour, &minute,
                  &second, &used) != 6 ||
      used != 19 || month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || minute > 59 ||
      second > 60) {
    return std::nullopt;
  }
  size_t at = 19;
  std::chrono::nanoseconds fraction{0};
  if (at < text.size() && text[at] == '.') {
    ++at;
    int64_t scale = 100000000;
    const size_t start = at;
    while (at < text.size() && std::isdigit(static_cast<unsigned char>(text[at])) != 0) {
      fraction += std::chrono::nanoseconds((text[at] - '0') * scale);
      scale /= 10;
      ++at;
    }
    if (at == start) {
      return std::nullopt;
    }
  }
  std::chrono::seconds offset{0};
  if (at < text.size() && (text[at] == 'Z' || text[at] == 'z') && at + 1 == text.size()) {
    // UTC
  } else if (at + 6 == text.size() && (text[at] == '+' || text[at] == '-') && text[at + 3] == ':') {
    int hours = 0, minutes = 0;
    if (std::sscanf(text.c_str() + at + 1, "%2d:%2d", &hours, &minutes) != 2) {
      return std::nullopt;
    }
    offset = std::chrono::hours(hours) + std::chrono::minutes(minutes);
    if (text[at] == '-') {
      offset = -offset;
    }
  } else {
    return std::nullopt;
  }
  std::tm utc{};
  utc.tm_year = year - 1900;
  utc.tm_mon = month - 1;
  utc.tm_mday = day;
  utc.tm_hour = hour;
  utc.tm_min = minute;
  utc.tm_sec = second;
  const std::time_t seconds = timegm(&utc);
  return std::chrono::system_clock::from_time_t(seconds) - offset +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(fraction);
}

}  // namespace cozy::api
