// Structured logs: one line per event worth a hoster's attention, as text or JSON, to stderr
// (journald and kubectl logs both take stderr). Thread-safe: workers log too.
#pragma once

#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cozy::runtime {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };
enum class LogFormat { kText, kJson };

using LogFields = std::vector<std::pair<std::string, std::string>>;

class Logger {
 public:
  static Logger& Get();
  void Configure(LogFormat format, int verbosity);  // verbosity >= 1 shows debug
  void Write(LogLevel level, std::string_view message, const LogFields& fields = {});
  // Capture for tests: lines go to `sink` instead of stderr while set.
  void SetSinkForTesting(std::vector<std::string>* sink) {
    std::lock_guard<std::mutex> lock(mutex_);
    sink_ = sink;
  }

 private:
  LogFormat format_ = LogFormat::kText;
  int verbosity_ = 0;
  std::vector<std::string>* sink_ = nullptr;
  std::mutex mutex_;
};

inline void LogInfo(std::string_view message, const LogFields& fields = {}) {
  Logger::Get().Write(LogLevel::kInfo, message, fields);
}
inline void LogWarning(std::string_view message, const LogFields& fields = {}) {
  Logger::Get().Write(LogLevel::kWarning, message, fields);
}
inline void LogError(std::string_view message, const LogFields& fields = {}) {
  Logger::Get().Write(LogLevel::kError, message, fields);
}
inline void LogDebug(std::string_view message, const LogFields& fields = {}) {
  Logger::Get().Write(LogLevel::kDebug, message, fields);
}

}  // namespace cozy::runtime
