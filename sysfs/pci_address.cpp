#include "sysfs/pci_address.h"

#include <array>

namespace cozy::sysfs {

std::optional<uint32_t> ParseHexDigits(std::string_view text, size_t minDigits, size_t maxDigits) {
  if (text.size() < minDigits || text.size() > maxDigits) {
    return std::nullopt;
  }
  uint32_t value = 0;
  for (char c : text) {
    uint32_t digit = 0;
    if (c >= '0' && c <= '9') {
      digit = static_cast<uint32_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      digit = static_cast<uint32_t>(c - 'a' + 10);
    } else if (c >= 'A' && c <= 'F') {
      digit = static_cast<uint32_t>(c - 'A' + 10);
    } else {
      return std::nullopt;
    }
    value = value * 16 + digit;
  }
  return value;
}

std::string FormatHex(uint32_t value, int minDigits) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::array<char, 8> buffer{};
  size_t start = buffer.size();
  do {
    buffer[--start] = kDigits[value & 0xf];
    value >>= 4;
  } while (value != 0);
  const size_t digits = buffer.size() - start;
  const size_t width = minDigits > 0 ? static_cast<size_t>(minDigits) : 0;
  std::string text(width > digits ? width - digits : 0, '0');
  text.append(buffer.data() + start, digits);
  return text;
}

// "%04x:%02x:%02x.%x"
std::string PciAddress::ToString() const {
  std::string text = FormatHex(domain, 4);
  text += ':';
  text += FormatHex(bus, 2);
  text += ':';
  text += FormatHex(device, 2);
  text += '.';
  text += FormatHex(function, 1);
  return text;
}

std::optional<PciAddress> ParsePciAddress(std::string_view text) {
  // Split from the right: "<domain>:"? "<bus>:<device>.<function>"
  const size_t dot = text.rfind('.');
  if (dot == std::string_view::npos || dot + 2 != text.size()) {
    return std::nullopt;
  }
  const size_t lastColon = text.rfind(':', dot);
  if (lastColon == std::string_view::npos) {
    return std::nullopt;
  }
  const size_t firstColon = text.rfind(':', lastColon == 0 ? 0 : lastColon - 1);
  std::string_view domainText;
  std::string_view busText;
  if (firstColon == std::string_view::npos || lastColon == 0) {
    busText = text.substr(0, lastColon);
  } else {
    domainText = text.substr(0, firstColon);
    busText = text.substr(firstColon + 1, lastColon - firstColon - 1);
    if (domainText.empty()) {
      return std::nullopt;
    }
  }
  const auto domain =
      domainText.empty() ? std::optional<uint32_t>(0) : ParseHexDigits(domainText, 4, 8);
  const auto bus = ParseHexDigits(busText, 2, 2);
  const auto device = ParseHexDigits(text.substr(lastColon + 1, dot - lastColon - 1), 2, 2);
  const auto function = ParseHexDigits(text.substr(dot + 1), 1, 1);
  if (!domain || !bus || !device || !function || *device > 31 || *function > 7 ||
      *domain > 0x7fffffff) {
    return std::nullopt;
  }
  return PciAddress{*domain, static_cast<uint8_t>(*bus), static_cast<uint8_t>(*device),
                    static_cast<uint8_t>(*function)};
}

}  // namespace cozy::sysfs
