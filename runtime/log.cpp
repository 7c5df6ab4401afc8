#include "runtime/log.h"

#include <array>
#include <chrono>
#include <cstdio>
#include <ctime>

#include <nlohmann/json.hpp>

namespace cozy::runtime {
namespace {

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

std::string Timestamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  std::array<char, 40> buffer{};
  const size_t length = std::strftime(buffer.data(), buffer.size(), "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(buffer.data() + length, buffer.size() - length, ".%03dZ", static_cast<int>(millis));
  return buffer.data();
}

// key=value, quoting values with blanks or quotes so a line stays one parseable line.
std::string TextValue(const std::string& value) {
  if (!value.empty() && value.find_first_of(" \t\"=\n") == std::string::npos) {
    return value;
  }
  return nlohmann::json(value).dump();
}

}  // namespace

Logger& Logger::Get() {
  static Logger logger;
  return logger;
}

void Logger::Configure(LogFormat format, int verbosity) {
  format_ = format;
  verbosity_ = verbosity;
}

void Logger::Write(LogLevel level, std::string_view message, const LogFields& fields) {
  if (level == LogLevel::kDebug && verbosity_ < 1) {
    return;
  }
  std::string line;
  if (format_ == LogFormat::kJson) {
    nlohmann::ordered_json object;
    object["time"] = Timestamp();
    object["level"] = LevelName(level);
    object["msg"] = message;
    for (const auto& [key, value] : fields) {
      object[key] = value;
    }
    line = object.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  } else {
    line = Timestamp() + " " + LevelName(level) + " " + std::string(message);
    for (const auto& [key, value] : fields) {
      line += " " + key + "=" + TextValue(value);
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (sink_ != nullptr) {
    sink_->push_back(line);
    return;
  }
  line += "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace cozy::runtime
