// lspci as the tests' oracle: its machine-readable output (-vmm) as records keyed by slot.
#pragma once

#include <map>
#include <string>

namespace cozy::testing {

using LspciRecord = std::map<std::string, std::string>;  // "Vendor" -> "10de", ...

// Parses `lspci -vmm`: blank-line separated records of "Key:\tValue" lines, keyed by Slot.
std::map<std::string, LspciRecord> ParseLspciMachineReadable(const std::string& text);

// A record's field, or "" when lspci printed none (no driver, no NUMA node, ...).
std::string Field(const LspciRecord& record, const std::string& key);

}  // namespace cozy::testing
