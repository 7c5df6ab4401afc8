// Fuzz target for the sysfs attribute parsers: any bytes in, no crash, and every accepted value
// survives the checks below (what a parser accepts must mean what the kernel's format says).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "sysfs/attributes.h"
#include "sysfs/pci_address.h"

namespace {

void Check(bool condition) {
  if (!condition) {
    std::abort();
  }
}

std::string ToUpper(std::string text) {
  for (char& c : text) {
    if (c >= 'a' && c <= 'z') {
      c = static_cast<char>(c - 'a' + 'A');
    }
  }
  return text;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cozy::sysfs;
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  if (const auto id = ParseHexId(text); id.ok()) {
    char formatted[16];
    std::snprintf(formatted, sizeof formatted, "0x%04x\n", *id);
    Check(*ParseHexId(formatted) == *id);
  } else {
    Check(!id.error().empty());
  }
  if (const auto classCode = ParseClassCode(text); classCode.ok()) {
    Check(*classCode <= 0xffffff);
  }
  if (const auto numa = ParseNumaNode(text); numa.ok() && numa->has_value()) {
    Check(**numa >= 0);
  }
  (void)ParseUnsigned(text);
  if (const auto pairs = ParseMdevDescription(text); pairs.ok()) {
    Check(!pairs->empty());
    for (const auto& [key, value] : *pairs) {
      Check(!key.empty());
    }
  }
  if (const auto max = MaxInstancesFromDescription(text)) {
    Check(*max >= 0);
  }
  if (const auto types = ParseCreatableVgpuTypes(text); types.ok()) {
    for (const auto& type : *types) {
      Check(!type.id.empty() && type.id.find_first_not_of("0123456789") == std::string::npos);
      Check(!type.name.empty());
    }
  }
  if (const auto variables = ParseUevent(text); variables.ok()) {
    for (const auto& [key, value] : *variables) {
      Check(!key.empty() && key.find('\n') == std::string::npos);
    }
  }
  // What the one-file identity reads is what the general parser sees under the same keys.
  if (const auto identity = ParsePciUevent(text)) {
    const auto variables = ParseUevent(text);
    if (variables.ok()) {
      char id[16];
      std::snprintf(id, sizeof id, "%04X:%04X", identity->vendorId, identity->deviceId);
      Check(ToUpper(variables->at("PCI_ID")) == id);
      std::snprintf(id, sizeof id, "%04X:%04X", identity->subsystemVendorId,
                    identity->subsystemDeviceId);
      Check(ToUpper(variables->at("PCI_SUBSYS_ID")) == id);
      Check(std::strtoul(variables->at("PCI_CLASS").c_str(), nullptr, 16) == identity->classCode);
    }
    Check(identity->classCode <= 0xffffff);
  }
  if (const auto address = ParsePciAddress(text)) {
    const auto again = ParsePciAddress(address->ToString());
    Check(again && *again == *address);
  }
  if (IsMdevUuid(text)) {
    Check(text.size() == 36);
  }
  (void)LinkBasename(text);
  (void)LinkParentName(text);
  return 0;
}
