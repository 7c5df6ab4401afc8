// A duration flag bound straight into the option it sets (CLI11): the text is read as
// ParseDuration reads it and checked against the flag's rule at parse time, and the default
// --help shows is the option's own value, so each default lives once, where the option is
// declared.
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <string>

#include "runtime/duration.h"

namespace cozy::runtime {

enum class DurationRule {
  kPositive,     // more than zero
  kNonNegative,  // zero allowed ("at once")
};

template <typename Rep, typename Period>
CLI::Option* AddDurationFlag(CLI::App* app, const std::string& name,
                             std::chrono::duration<Rep, Period>& target,
                             const std::string& description,
                             DurationRule rule = DurationRule::kPositive) {
  auto set = [&target, name, rule](const std::string& text) {
    const auto duration = ParseDuration(text);
    if (!duration || (rule == DurationRule::kPositive && duration->count() <= 0)) {
      throw CLI::ValidationError(
          name, text + (rule == DurationRule::kPositive
                            ? ": must be a positive duration such as 90s, 2m or 500ms"
                            : ": must be a duration such as 0s, 90s or 5m"));
    }
    target = std::chrono::duration_cast<std::chrono::duration<Rep, Period>>(*duration);
  };
  return app->add_option_function<std::string>(name, set, description)
      ->type_name("DURATION")
      ->default_str(FormatDuration(std::chrono::duration_cast<std::chrono::milliseconds>(target)));
}

}  // namespace cozy::runtime
