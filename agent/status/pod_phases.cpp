#include "agent/status/pod_phases.h"

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace cozy::agent {
namespace {

[[noreturn]] void Fail(const std::string& message) {
  throw std::runtime_error("pod phases: " + message);
}

std::string StringAt(const nlohmann::json& object, const char* key, const std::string& where) {
  if (!object.is_object() || !object.contains(key) || !object.at(key).is_string()) {
    Fail(where + "." + key + ": missing or not a string");
  }
  return object.at(key).get<std::string>();
}

}  // namespace

PodPhases ParsePodPhases(std::string_view text) {
  nlohmann::json document;
  try {
    document = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& error) {
    Fail(std::string("not JSON: ") + error.what());
  }
  if (!document.is_object()) {
    Fail("top level: not an object");
  }
  PodPhases phases;
  if (document.contains("items") && document.contains("kind")) {
    const auto& items = document.at("items");
    if (!items.is_array()) {
      Fail("items: not an array");
    }
    for (size_t i = 0; i < items.size(); ++i) {
      const std::string where = "items[" + std::to_string(i) + "]";
      const auto& item = items[i];
      if (!item.is_object() || !item.contains("metadata")) {
        Fail(where + ".metadata: missing");
      }
      const std::string name = StringAt(item.at("metadata"), "name", where + ".metadata");
      const std::string ns = StringAt(item.at("metadata"), "namespace", where + ".metadata");
      if (item.contains("status") && item.at("status").contains("phase")) {
        phases[ns + "/" + name] = StringAt(item.at("status"), "phase", where + ".status");
      }
    }
    return phases;
  }
  for (const auto& [key, value] : document.items()) {
    if (key.find('/') == std::string::npos) {
      Fail("\"" + key + "\": expected \"namespace/name\"");
    }
    if (!value.is_string()) {
      Fail("\"" + key + "\": phase is not a string");
    }
    phases[key] = value.get<std::string>();
  }
  return phases;
}

}  // namespace cozy::agent
