#include "controller/admission/pod.h"
#include <array>

namespace cozy::admission {
namespace {

nlohmann::json HostnameIn(const std::string& node) {
  return {{"key", kHostnameLabel}, {"operator", "In"}, {"values", nlohmann::json::array({node})}};
}

bool Pins(const nlohmann::json& term, const std::string& node) {
  const auto expressions = term.find("matchExpressions");
  if (expressions == term.end() || !expressions->is_array()) {
    return false;
  }
  for (const nlohmann::json& expression : *expressions) {
    if (expression.is_object() && expression.value("key", "") == kHostnameLabel &&
        expression.value("operator", "") == "In" && expression.contains("values") &&
        expression["values"] == nlohmann::json::array({node})) {
      return true;
    }
  }
  return false;
}

}  // namespace

nlohmann::json PodAffinityPatch(const nlohmann::json& pod, const std::string& node) {
  nlohmann::json ops = nlohmann::json::array();
  const nlohmann::json term = {{"matchExpressions", nlohmann::json::array({HostnameIn(node)})}};
  // From the innermost wanted member outwards: add at the first level that exists.
  const std::array<const char*, 5> keys = {"spec", "affinity", "nodeAffinity",
                                           "requiredDuringSchedulingIgnoredDuringExecution",
                                           "nodeSelectorTerms"};
  const nlohmann::json* at = &pod;
  std::string path;
  size_t depth = 0;
  for (; depth < keys.size(); ++depth) {
    if (!at->is_object()) {
      break;
    }
    const auto it = at->find(keys[depth]);
    if (it == at->end() || it->is_null()) {
      break;
    }
    at = &*it;
    path += "/";
    path += keys[depth];
  }
  if (depth < keys.size() || !at->is_array() || at->empty()) {
    // Build what lacks below the last level that exists (an empty or odd terms list is
    // replaced: it selects nothing).
    nlohmann::json value = nlohmann::json::array({term});
    const size_t from = depth < keys.size() ? depth : keys.size() - 1;
    for (size_t k = keys.size() - 1; k > from; --k) {
      value = nlohmann::json{{keys[k], std::move(value)}};
    }
    if (depth == keys.size()) {
      // nodeSelectorTerms exists but holds no term: path already points at it.
      ops.push_back({{"op", "replace"}, {"path", path}, {"value", std::move(value)}});
    } else {
      ops.push_back(
          {{"op", "add"}, {"path", path + "/" + keys[depth]}, {"value", std::move(value)}});
    }
    return ops;
  }
  for (size_t i = 0; i < at->size(); ++i) {
    const nlohmann::json& existing = (*at)[i];
    if (Pins(existing, node)) {
      continue;
    }
    const std::string termPath = path + "/" + std::to_string(i);
    const auto expressions =
        existing.is_object() ? existing.find("matchExpressions") : nlohmann::json::const_iterator();
    if (!existing.is_object() || expressions == existing.end() || !expressions->is_array()) {
      ops.push_back({{"op", "add"},
                     {"path", termPath + "/matchExpressions"},
                     {"value", nlohmann::json::array({HostnameIn(node)})}});
    } else {
      ops.push_back(
          {{"op", "add"}, {"path", termPath + "/matchExpressions/-"}, {"value", HostnameIn(node)}});
    }
  }
  return ops;
}

std::optional<std::string> LauncherVmiName(const nlohmann::json& pod) {
  std::optional<std::string> owner;
  std::optional<std::string> label;
  const auto metadata = pod.find("metadata");
  if (metadata != pod.end() && metadata->is_object()) {
    if (const auto refs = metadata->find("ownerReferences");
        refs != metadata->end() && refs->is_array()) {
      for (const nlohmann::json& ref : *refs) {
        if (ref.is_object() && ref.value("kind", "") == kVmiKind &&
            ref.value("apiVersion", "").starts_with("kubevirt.io/") &&
            ref.value("controller", false) && ref.value("name", "") != "") {
          owner = ref.value("name", "");
        }
      }
    }
    if (const auto labels = metadata->find("labels");
        labels != metadata->end() && labels->is_object()) {
      const auto value = labels->find(std::string(kVmiNameLabel));
      if (value != labels->end() && value->is_string() && !value->get<std::string>().empty()) {
        label = value->get<std::string>();
      }
    }
  }
  if (owner && label && *owner != *label) {
    return std::nullopt;
  }
  return owner ? owner : label;
}

}  // namespace cozy::admission
