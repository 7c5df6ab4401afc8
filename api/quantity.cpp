#include "api/quantity.h"

#include <array>
#include <cstddef>

namespace cozy::api {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

QuantityResult Error(std::string_view text, std::string_view why) {
  return {std::nullopt, "\"" + std::string(text) + "\" " + std::string(why), false};
}

QuantityResult TooLarge(std::string_view text) {
  QuantityResult result = Error(text, "is too large");
  result.tooLarge = true;
  return result;
}

bool MultiplyChecked(int64_t& value, int64_t factor) {
  return !__builtin_mul_overflow(value, factor, &value);
}

struct Suffix {
  std::string_view text;
  int power2;   // multiply by 2^power2
  int power10;  // multiply by 10^power10
};

constexpr std::array<Suffix, 13> kSuffixes = {{
    {"Ki", 10, 0},
    {"Mi", 20, 0},
    {"Gi", 30, 0},
    {"Ti", 40, 0},
    {"Pi", 50, 0},
    {"Ei", 60, 0},
    {"n", 0, -9},
    {"u", 0, -6},
    {"m", 0, -3},
    {"k", 0, 3},
    {"M", 0, 6},
    {"G", 0, 9},
    {"T", 0, 12},
}};
// "P" and "E" are decimal suffixes too; kept apart because "E" also starts an exponent.
constexpr std::array<Suffix, 2> kLargeSuffixes = {{{"P", 0, 15}, {"E", 0, 18}}};

}  // namespace

QuantityResult ParseWholeQuantity(std::string_view text) {
  size_t pos = 0;
  if (pos < text.size() && (text[pos] == '+' || text[pos] == '-')) {
    if (text[pos] == '-') {
      return Error(text, "is negative");
    }
    ++pos;
  }
  // Mantissa: digits with an optional fraction; leading zeros do not count towards range.
  int64_t mantissa = 0;
  int power10 = 0;
  bool sawDigit = false;
  bool inFraction = false;
  for (; pos < text.size(); ++pos) {
    const char c = text[pos];
    if (c == '.' && !inFraction) {
      inFraction = true;
      continue;
    }
    if (!IsDigit(c)) {
      break;
    }
    sawDigit = true;
    if (!MultiplyChecked(mantissa, 10) || __builtin_add_overflow(mantissa, c - '0', &mantissa)) {
      return TooLarge(text);
    }
    if (inFraction) {
      --power10;
    }
  }
  if (!sawDigit) {
    return Error(text, "is not a quantity");
  }
  int power2 = 0;
  const std::string_view suffix = text.substr(pos);
  if (!suffix.empty()) {
    bool known = false;
    for (const Suffix& candidate : kSuffixes) {
      if (suffix == candidate.text) {
        power2 += candidate.power2;
        power10 += candidate.power10;
        known = true;
      }
    }
    for (const Suffix& candidate : kLargeSuffixes) {
      if (suffix == candidate.text) {
        power10 += candidate.power10;
        known = true;
      }
    }
    if (!known && (suffix[0] == 'e' || suffix[0] == 'E') && suffix.size() > 1) {
      size_t at = 1;
      const bool negative = suffix[at] == '-';
      if (suffix[at] == '-' || suffix[at] == '+') {
        ++at;
      }
      int exponent = 0;
      known = at < suffix.size();
      for (; at < suffix.size() && known; ++at) {
        known = IsDigit(suffix[at]) && exponent < 100;
        exponent = exponent * 10 + (suffix[at] - '0');
      }
      power10 += negative ? -exponent : exponent;
    }
    if (!known) {
      return Error(text, "has an unknown suffix \"" + std::string(suffix) + "\"");
    }
  }
  // Multiply first, divide last, so "1.5Ki" is exactly 1536.
  int64_t value = mantissa;
  for (int i = 0; i < power2; ++i) {
    if (!MultiplyChecked(value, 2)) {
      return TooLarge(text);
    }
  }
  for (; power10 > 0; --power10) {
    if (!MultiplyChecked(value, 10)) {
      return TooLarge(text);
    }
  }
  bool remainder = false;
  for (; power10 < 0 && value != 0; ++power10) {
    remainder = remainder || value % 10 != 0;
    value /= 10;
  }
  if (power10 < 0) {
    remainder = remainder || mantissa != 0;
  }
  if (remainder) {
    ++value;
  }
  return {value, "", false};
}

}  // namespace cozy::api
