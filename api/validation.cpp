#include "api/validation.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>
#include <cstdio>

#include "api/keys.h"

namespace cozy::api {
namespace {

bool IsLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }
bool IsAlnum(char c) { return IsLowerAlnum(c) || (c >= 'A' && c <= 'Z'); }

std::string Quoted(std::string_view text) { return "\"" + std::string(text) + "\""; }

// The name part of a qualified name: [A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?, at most 63.
std::string CheckQualifiedNamePart(std::string_view name) {
  if (name.empty()) {
    return "the name after the domain is empty";
  }
  if (name.size() > 63) {
    return "the name after the domain is longer than 63 characters";
  }
  if (!IsAlnum(name.front()) || !IsAlnum(name.back())) {
    return "the name after the domain must start and end with a letter or digit";
  }
  for (char c : name) {
    if (!IsAlnum(c) && c != '-' && c != '_' && c != '.') {
      return "the name after the domain may hold only letters, digits, '-', '_' and '.'";
    }
  }
  return "";
}

bool IsDomainOrSubdomainOf(std::string_view domain, std::string_view parent) {
  if (domain == parent) {
    return true;
  }
  return domain.size() > parent.size() && domain.ends_with(parent) &&
         domain[domain.size() - parent.size() - 1] == '.';
}

}  // namespace

std::string CheckDnsLabel(std::string_view name) {
  if (name.empty()) {
    return "is empty";
  }
  if (name.size() > 63) {
    return Quoted(name) + " is longer than 63 characters";
  }
  for (char c : name) {
    if (!IsLowerAlnum(c) && c != '-') {
      return Quoted(name) + " may hold only lower-case letters, digits and '-'";
    }
  }
  if (name.front() == '-' || name.back() == '-') {
    return Quoted(name) + " must start and end with a letter or digit";
  }
  return "";
}

std::string CheckDnsSubdomain(std::string_view name) {
  if (name.empty()) {
    return "is empty";
  }
  if (name.size() > 253) {
    return Quoted(name) + " is longer than 253 characters";
  }
  size_t start = 0;
  while (true) {
    const size_t dot = name.find('.', start);
    const std::string_view label =
        name.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    if (!CheckDnsLabel(label).empty()) {
      return Quoted(name) + " is not a DNS subdomain (label " + Quoted(label) + ")";
    }
    if (dot == std::string_view::npos) {
      return "";
    }
    start = dot + 1;
  }
}

std::string CheckClassName(std::string_view name) {
  if (std::string why = CheckDnsLabel(name); !why.empty()) {
    return "class name " + why;
  }
  if (name == kTotalBudgetName) {
    return "class name \"total\" is reserved for the budget over all classes";
  }
  return "";
}

std::string CheckPciVendorSelector(std::string_view selector) {
  auto hex = [](std::string_view part) {
    return std::all_of(part.begin(), part.end(),
                       [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; });
  };
  const bool shaped = selector.size() == 9 && selector[4] == ':' && hex(selector.substr(0, 4)) &&
                      hex(selector.substr(5));
  return shaped ? std::string()
                : "\"" + std::string(selector) +
                      "\" is not a PCI vendor and device ID (VVVV:DDDD, hexadecimal)";
}

std::string CheckClassResourceName(std::string_view resourceName) {
  const size_t slash = resourceName.find('/');
  if (slash == std::string_view::npos) {
    return Quoted(resourceName) +
           " is not an extended resource name: it needs a domain, as in nvidia.com/GA100";
  }
  const std::string_view domain = resourceName.substr(0, slash);
  if (!CheckDnsSubdomain(domain).empty()) {
    return Quoted(resourceName) + ": the domain " + Quoted(domain) + " is not a DNS subdomain";
  }
  if (IsDomainOrSubdomainOf(domain, "kubernetes.io")) {
    return Quoted(resourceName) + ": kubernetes.io names are not extended resources";
  }
  if (resourceName.starts_with(kRawQuotaKeyPrefix)) {
    return Quoted(resourceName) + ": a name starting with \"requests.\" is a quota key";
  }
  if (IsDomainOrSubdomainOf(domain, kGroup)) {
    return Quoted(resourceName) + ": gpu.cozystack.io names would read as GPU budget keys";
  }
  if (std::string why = CheckQualifiedNamePart(resourceName.substr(slash + 1)); !why.empty()) {
    return Quoted(resourceName) + ": " + why;
  }
  return "";
}

std::string JoinSubdomain(std::string_view first, std::string_view second) {
  constexpr size_t kMaxName = 253;
  constexpr size_t kMaxLabel = 63;
  constexpr size_t kHashDigits = 16;
  std::string name = std::string(first) + "-" + std::string(second);
  // The second name joins the first one's last label, which may leave no room for it.
  if (api::CheckDnsSubdomain(name).empty()) {
    return name;
  }
  // FNV-1a over both names with a separator, so ("a-b", "c") and ("a", "b-c") differ.
  uint64_t hash = 14695981039346656037ULL;
  auto mix = [&hash](std::string_view text) {
    for (char c : text) {
      hash ^= static_cast<unsigned char>(c);
      hash *= 1099511628211ULL;
    }
  };
  mix(first);
  mix(std::string_view("\0", 1));
  mix(second);
  std::array<char, kHashDigits + 1> digits{};
  std::snprintf(digits.data(), digits.size(), "%016llx", static_cast<unsigned long long>(hash));
  // A cut may leave a label ending in '-' or '.', which a subdomain does not allow.
  auto trim = [&name] {
    while (!name.empty() && (name.back() == '-' || name.back() == '.')) {
      name.pop_back();
    }
  };
  name.resize(std::min(name.size(), kMaxName - kHashDigits - 1));
  trim();
  // The hash joins the last label, which must stay within 63 characters too.
  const size_t lastLabel = name.rfind('.') == std::string::npos ? 0 : name.rfind('.') + 1;
  name.resize(std::min(name.size(), lastLabel + kMaxLabel - kHashDigits - 1));
  trim();
  return name + "-" + digits.data();
}

}  // namespace cozy::api
