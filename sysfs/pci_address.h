// PCI function addresses (domain:bus:device.function) as sysfs names them.
#pragma once

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace cozy::sysfs {

struct PciAddress {
  uint32_t domain = 0;
  uint8_t bus = 0;
  uint8_t device = 0;    // 0..31
  uint8_t function = 0;  // 0..7

  // "0000:3b:00.0": four-digit domain, lower case, as sysfs prints it.
  std::string ToString() const;
  auto operator<=>(const PciAddress&) const = default;
};

// Accepts "DDDD:BB:DD.F" and "BB:DD.F" (domain 0000), any case. NVML's eight-digit domain
// ("00000000:3B:00.0") is accepted as well. Returns nullopt for anything else, including
// out-of-range device (>31) or function (>7) numbers.
std::optional<PciAddress> ParsePciAddress(std::string_view text);

// `text` as hex digits of either case, between `minDigits` and `maxDigits` of them (at most 8).
std::optional<uint32_t> ParseHexDigits(std::string_view text, size_t minDigits, size_t maxDigits);

// `value` in lower-case hex, at least `minDigits` long: printf's "%0*x", without printf (a
// scan prints thousands of IDs).
std::string FormatHex(uint32_t value, int minDigits);

}  // namespace cozy::sysfs
