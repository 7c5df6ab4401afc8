#include "api/validation.h"

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

}  // namespace cozy::api
