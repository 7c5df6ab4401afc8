#include "sysfs/attributes.h"

#include <charconv>
#include <limits>

#include "sysfs/pci_address.h"

namespace cozy::sysfs {
namespace {

bool IsBlank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Shows a bad value in an error message: quoted, control bytes escaped, cut after 40 bytes.
std::string Quote(std::string_view text) {
  std::string out = "\"";
  size_t shown = 0;
  for (char c : text) {
    if (++shown > 40) {
      out += "...";
      break;
    }
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte >= 0x7f || c == '"' || c == '\\') {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 0xf];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

template <typename T>
Parsed<T> ParseDecimal(std::string_view text, std::string_view what) {
  const std::string_view trimmed = TrimAttribute(text);
  T value{};
  const auto* begin = trimmed.data();
  const auto* end = trimmed.data() + trimmed.size();
  const auto [ptr, ec] = std::from_chars(begin, end, value);
  if (trimmed.empty() || ec != std::errc() || ptr != end) {
    return Parsed<T>::Error(std::string("not ") + std::string(what) + ": " + Quote(trimmed));
  }
  return value;
}

}  // namespace

std::string_view TrimAttribute(std::string_view text) {
  while (!text.empty() && IsBlank(text.front())) {
    text.remove_prefix(1);
  }
  while (!text.empty() && IsBlank(text.back())) {
    text.remove_suffix(1);
  }
  return text;
}

bool IsHexDigit(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

Parsed<uint32_t> ParseHexAttribute(std::string_view text, size_t maxDigits) {
  const std::string_view trimmed = TrimAttribute(text);
  if (trimmed.size() < 3 || trimmed[0] != '0' || (trimmed[1] != 'x' && trimmed[1] != 'X')) {
    return Parsed<uint32_t>::Error("not hex: " + Quote(trimmed));
  }
  const std::string_view digits = trimmed.substr(2);
  if (digits.size() > maxDigits) {
    return Parsed<uint32_t>::Error("hex value too long: " + Quote(trimmed));
  }
  uint32_t value = 0;
  for (char c : digits) {
    if (!IsHexDigit(c)) {
      return Parsed<uint32_t>::Error("not hex: " + Quote(trimmed));
    }
  }
  std::from_chars(digits.data(), digits.data() + digits.size(), value, 16);
  return value;
}

Parsed<uint16_t> ParseHexId(std::string_view text) {
  auto parsed = ParseHexAttribute(text, 4);
  if (!parsed) {
    return Parsed<uint16_t>::Error(parsed.error());
  }
  return static_cast<uint16_t>(*parsed);
}

Parsed<uint32_t> ParseClassCode(std::string_view text) { return ParseHexAttribute(text, 6); }

Parsed<std::optional<int32_t>> ParseNumaNode(std::string_view text) {
  auto parsed = ParseDecimal<int32_t>(text, "a NUMA node");
  if (!parsed) {
    return Parsed<std::optional<int32_t>>::Error(parsed.error());
  }
  if (*parsed < -1) {
    return Parsed<std::optional<int32_t>>::Error("not a NUMA node: " + Quote(TrimAttribute(text)));
  }
  if (*parsed == -1) {
    return std::optional<int32_t>();
  }
  return std::optional<int32_t>(*parsed);
}

Parsed<uint32_t> ParseUnsigned(std::string_view text) {
  return ParseDecimal<uint32_t>(text, "an unsigned number");
}

Parsed<std::map<std::string, std::string>> ParseMdevDescription(std::string_view text) {
  std::map<std::string, std::string> pairs;
  std::string_view rest = TrimAttribute(text);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = TrimAttribute(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (item.empty()) {
      continue;
    }
    const size_t equals = item.find('=');
    if (equals == std::string_view::npos || equals == 0) {
      // Free text (other vendors write prose here): keep what was parsed so far.
      continue;
    }
    pairs[std::string(TrimAttribute(item.substr(0, equals)))] =
        std::string(TrimAttribute(item.substr(equals + 1)));
  }
  if (pairs.empty()) {
    return Parsed<std::map<std::string, std::string>>::Error("no key=value pairs: " +
                                                             Quote(TrimAttribute(text)));
  }
  return pairs;
}

std::optional<int64_t> MaxInstancesFromDescription(std::string_view text) {
  const auto pairs = ParseMdevDescription(text);
  if (!pairs) {
    return std::nullopt;
  }
  const auto it = pairs->find("max_instance");
  if (it == pairs->end()) {
    return std::nullopt;
  }
  const auto value = ParseDecimal<int64_t>(it->second, "a number");
  if (!value || *value < 0) {
    return std::nullopt;
  }
  return *value;
}

Parsed<std::vector<VgpuTypeEntry>> ParseCreatableVgpuTypes(std::string_view text) {
  std::vector<VgpuTypeEntry> entries;
  size_t lineNumber = 0;
  std::string_view rest = text;
  while (!rest.empty()) {
    const size_t newline = rest.find('\n');
    const std::string_view line = TrimAttribute(rest.substr(0, newline));
    rest = newline == std::string_view::npos ? std::string_view() : rest.substr(newline + 1);
    ++lineNumber;
    if (line.empty()) {
      continue;
    }
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) {
      return Parsed<std::vector<VgpuTypeEntry>>::Error("line " + std::to_string(lineNumber) +
                                                       ": no ':' in " + Quote(line));
    }
    const std::string_view id = TrimAttribute(line.substr(0, colon));
    const std::string_view name = TrimAttribute(line.substr(colon + 1));
    if (id == "ID" && entries.empty()) {
      continue;  // the "ID    : vGPU Name" header
    }
    const auto numeric = ParseDecimal<uint32_t>(id, "a vGPU type id");
    if (!numeric || name.empty()) {
      return Parsed<std::vector<VgpuTypeEntry>>::Error("line " + std::to_string(lineNumber) +
                                                       ": not \"<id> : <name>\": " + Quote(line));
    }
    entries.push_back({std::string(id), std::string(name)});
  }
  return entries;
}

Parsed<std::map<std::string, std::string>> ParseUevent(std::string_view text) {
  std::map<std::string, std::string> variables;
  size_t lineNumber = 0;
  std::string_view rest = text;
  while (!rest.empty()) {
    const size_t newline = rest.find('\n');
    const std::string_view line = rest.substr(0, newline);
    rest = newline == std::string_view::npos ? std::string_view() : rest.substr(newline + 1);
    ++lineNumber;
    if (line.empty()) {
      continue;
    }
    const size_t equals = line.find('=');
    if (equals == std::string_view::npos || equals == 0) {
      return Parsed<std::map<std::string, std::string>>::Error(
          "line " + std::to_string(lineNumber) + ": not KEY=VALUE: " + Quote(line));
    }
    variables[std::string(line.substr(0, equals))] = std::string(line.substr(equals + 1));
  }
  return variables;
}

namespace {

// "10DE:2330": two IDs of exactly four hex digits.
bool ParseIdPair(std::string_view text, uint16_t& first, uint16_t& second) {
  if (text.size() != 9 || text[4] != ':') {
    return false;
  }
  const auto a = ParseHexDigits(text.substr(0, 4), 4, 4);
  const auto b = ParseHexDigits(text.substr(5), 4, 4);
  if (!a || !b) {
    return false;
  }
  first = static_cast<uint16_t>(*a);
  second = static_cast<uint16_t>(*b);
  return true;
}

}  // namespace

std::optional<PciUeventIdentity> ParsePciUevent(std::string_view text) {
  PciUeventIdentity identity;
  bool haveClass = false;
  bool haveId = false;
  bool haveSubsystem = false;
  std::string_view rest = text;
  while (!rest.empty()) {
    const size_t newline = rest.find('\n');
    const std::string_view line = rest.substr(0, newline);
    rest = newline == std::string_view::npos ? std::string_view() : rest.substr(newline + 1);
    if (line.starts_with("PCI_CLASS=")) {
      const auto classCode = ParseHexDigits(line.substr(10), 1, 6);
      if (haveClass || !classCode) {
        return std::nullopt;
      }
      identity.classCode = *classCode;
      haveClass = true;
    } else if (line.starts_with("PCI_ID=")) {
      if (haveId || !ParseIdPair(line.substr(7), identity.vendorId, identity.deviceId)) {
        return std::nullopt;
      }
      haveId = true;
    } else if (line.starts_with("PCI_SUBSYS_ID=")) {
      if (haveSubsystem ||
          !ParseIdPair(line.substr(14), identity.subsystemVendorId, identity.subsystemDeviceId)) {
        return std::nullopt;
      }
      haveSubsystem = true;
    }
  }
  if (!haveClass || !haveId || !haveSubsystem) {
    return std::nullopt;
  }
  return identity;
}

bool IsMdevUuid(std::string_view text) {
  if (text.size() != 36) {
    return false;
  }
  for (size_t i = 0; i < text.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? text[i] != '-' : !IsHexDigit(text[i])) {
      return false;
    }
  }
  return true;
}

std::string ToLower(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') {
      c = static_cast<char>(c - 'A' + 'a');
    }
  }
  return out;
}

std::string_view LinkBasename(std::string_view target) {
  while (!target.empty() && target.back() == '/') {
    target.remove_suffix(1);
  }
  const size_t slash = target.rfind('/');
  return slash == std::string_view::npos ? target : target.substr(slash + 1);
}

std::string_view LinkParentName(std::string_view target) {
  while (!target.empty() && target.back() == '/') {
    target.remove_suffix(1);
  }
  const size_t slash = target.rfind('/');
  if (slash == std::string_view::npos) {
    return {};
  }
  return LinkBasename(target.substr(0, slash));
}

}  // namespace cozy::sysfs
