#include "agent/status/output.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <regex>
#include <vector>

namespace cozy::agent {
namespace {

// Would this plain scalar read back as something other than a string (YAML 1.1 or 1.2)?
bool NeedsQuotes(const std::string& text) {
  if (text.empty()) {
    return true;
  }
  static const std::regex kNonString(
      R"(^([-+]?[0-9.]|[-+]?\.(inf|Inf|INF|nan|NaN|NAN)$|~$|(null|Null|NULL|true|True|TRUE|false|False|FALSE|yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF|y|Y|n|N)$))");
  if (std::regex_search(text, kNonString)) {
    return true;
  }
  static const std::string kIndicators = "-?:,[]{}#&*!|>'\"%@`";
  if (kIndicators.find(text.front()) != std::string::npos || std::isspace(text.front()) != 0 ||
      std::isspace(text.back()) != 0) {
    return true;
  }
  return text.find(": ") != std::string::npos || text.find(" #") != std::string::npos ||
         text.back() == ':';
}

void Emit(YAML::Emitter& out, const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::object:
      out << YAML::BeginMap;
      for (const auto& [key, item] : value.items()) {
        out << YAML::Key << key << YAML::Value;
        Emit(out, item);
      }
      out << YAML::EndMap;
      break;
    case nlohmann::json::value_t::array:
      out << YAML::BeginSeq;
      for (const auto& item : value) {
        Emit(out, item);
      }
      out << YAML::EndSeq;
      break;
    case nlohmann::json::value_t::string: {
      const auto& text = value.get_ref<const std::string&>();
      if (NeedsQuotes(text)) {
        out << YAML::DoubleQuoted << text;
      } else {
        out << text;
      }
      break;
    }
    case nlohmann::json::value_t::boolean:
      out << (value.get<bool>() ? "true" : "false");
      break;
    case nlohmann::json::value_t::null:
      out << YAML::Null;
      break;
    default:
      out << value.dump();
      break;
  }
}

std::string Cell(const nlohmann::json& device, const char* key) {
  if (!device.contains(key)) {
    return "-";
  }
  const auto& value = device[key];
  return value.is_string() ? value.get<std::string>() : value.dump();
}

}  // namespace

std::string RenderYaml(const nlohmann::json& object) {
  YAML::Emitter out;
  out.SetIndent(2);
  out.SetSeqFormat(YAML::Block);
  Emit(out, object);
  return std::string(out.c_str()) + "\n";
}

std::string RenderTable(const nlohmann::json& gpuNode) {
  const std::vector<std::string> header = {"ADDRESS", "ID",   "MODEL",  "DRIVER",   "GROUP",
                                           "VIABLE",  "NUMA", "SR-IOV", "MDEV/VGPU"};
  std::vector<std::vector<std::string>> rows;
  const nlohmann::json empty = nlohmann::json::array();
  const auto& devices = gpuNode.contains("status") && gpuNode["status"].contains("devices")
                            ? gpuNode["status"]["devices"]
                            : empty;
  for (const auto& device : devices) {
    std::string sriov = "-";
    if (device.contains("sriov")) {
      sriov = std::to_string(device["sriov"]["numVFs"].get<int>()) + "/" +
              std::to_string(device["sriov"]["totalVFs"].get<int>()) + " VFs";
    } else if (device.contains("physicalFunction")) {
      sriov = "VF of " + device["physicalFunction"].get<std::string>();
    }
    std::string mediated = "-";
    if (device.contains("mdevTypes") || device.contains("mdevs")) {
      const size_t types = device.contains("mdevTypes") ? device["mdevTypes"].size() : 0;
      const size_t created = device.contains("mdevs") ? device["mdevs"].size() : 0;
      mediated = std::to_string(created) + " mdev" + (created == 1 ? "" : "s") + ", " +
                 std::to_string(types) + " type" + (types == 1 ? "" : "s");
    } else if (device.contains("vgpu")) {
      mediated = device["vgpu"].contains("currentType")
                     ? "vGPU type " + device["vgpu"]["currentType"].get<std::string>()
                     : "vGPU: none, " + std::to_string(device["vgpu"]["creatableTypes"].size()) +
                           " creatable";
    }
    std::string viable = "-";
    if (device.contains("iommuGroupViable")) {
      viable = device["iommuGroupViable"].get<bool>() ? "yes" : "no";
    }
    rows.push_back({Cell(device, "pciAddress"),
                    Cell(device, "vendorID") + ":" + Cell(device, "deviceID"),
                    device.contains("model") ? device["model"].get<std::string>() : "(unknown)",
                    Cell(device, "driver"), Cell(device, "iommuGroup"), viable,
                    Cell(device, "numaNode"), sriov, mediated});
  }
  std::vector<size_t> widths(header.size());
  for (size_t column = 0; column < header.size(); ++column) {
    widths[column] = header[column].size();
    for (const auto& row : rows) {
      widths[column] = std::max(widths[column], row[column].size());
    }
  }
  std::string out;
  auto appendRow = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t column = 0; column < row.size(); ++column) {
      line += row[column];
      if (column + 1 < row.size()) {
        line.append(widths[column] - row[column].size() + 2, ' ');
      }
    }
    out += line + "\n";
  };
  appendRow(header);
  for (const auto& row : rows) {
    appendRow(row);
  }
  if (rows.empty()) {
    out += "(no GPU functions)\n";
  }
  return out;
}

}  // namespace cozy::agent
