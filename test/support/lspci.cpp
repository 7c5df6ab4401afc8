#include "test/support/lspci.h"

#include <sstream>

namespace cozy::testing {

std::map<std::string, LspciRecord> ParseLspciMachineReadable(const std::string& text) {
  std::map<std::string, LspciRecord> records;
  LspciRecord current;
  std::istringstream lines(text);
  std::string line;
  auto flush = [&] {
    if (current.count("Slot") != 0) {
      records[current["Slot"]] = current;
    }
    current.clear();
  };
  while (std::getline(lines, line)) {
    if (line.empty()) {
      flush();
      continue;
    }
    const size_t colon = line.find(":\t");
    if (colon != std::string::npos) {
      current[line.substr(0, colon)] = line.substr(colon + 2);
    }
  }
  flush();
  return records;
}

std::string Field(const LspciRecord& record, const std::string& key) {
  const auto it = record.find(key);
  return it == record.end() ? std::string() : it->second;
}

}  // namespace cozy::testing
