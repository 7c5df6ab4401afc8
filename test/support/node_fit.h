// What kube-scheduler's filters say about one pod on one Node, reduced to what a pod's pin
// decides (E13): nodeSelector, required node affinity (matchExpressions on labels,
// matchFields on metadata.name), the cordon (NodeUnschedulable: spec.unschedulable needs a
// toleration of node.kubernetes.io/unschedulable:NoSchedule) and NoSchedule/NoExecute taints.
// Resources, ports and pod (anti-)affinity are not looked at. Header-only, for unit and e2e tests.
#pragma once

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

namespace cozy::testing {

namespace node_fit_detail {

inline std::string Text(const nlohmann::json& object, const char* key) {
  if (!object.is_object()) return "";
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

inline bool Requirement(const nlohmann::json& requirement, bool present, const std::string& value) {
  const std::string op = Text(requirement, "operator");
  const nlohmann::json values = requirement.value("values", nlohmann::json::array());
  const bool listed =
      std::find(values.begin(), values.end(), nlohmann::json(value)) != values.end();
  if (op == "In") return present && listed;
  if (op == "NotIn") return !present || !listed;
  if (op == "Exists") return present;
  if (op == "DoesNotExist") return !present;
  if ((op == "Gt" || op == "Lt") && present && values.size() == 1 && values[0].is_string()) {
    try {
      const long long have = std::stoll(value);
      const long long want = std::stoll(values[0].get<std::string>());
      return op == "Gt" ? have > want : have < want;
    } catch (const std::exception&) {
      return false;
    }
  }
  return false;
}

inline bool Term(const nlohmann::json& term, const nlohmann::json& node) {
  const nlohmann::json labels = node["metadata"].value("labels", nlohmann::json::object());
  const std::string name = Text(node["metadata"], "name");
  bool any = false;
  for (const nlohmann::json& expression : term.value("matchExpressions", nlohmann::json::array())) {
    any = true;
    const std::string key = Text(expression, "key");
    const bool present = labels.contains(key) && labels[key].is_string();
    if (!Requirement(expression, present, present ? labels[key].get<std::string>() : "")) {
      return false;
    }
  }
  for (const nlohmann::json& field : term.value("matchFields", nlohmann::json::array())) {
    any = true;
    if (Text(field, "key") != "metadata.name" || !Requirement(field, true, name)) return false;
  }
  return any;  // an empty term selects no node
}

inline bool Tolerates(const nlohmann::json& tolerations, const std::string& key,
                      const std::string& value, const std::string& effect) {
  for (const nlohmann::json& toleration : tolerations) {
    const std::string tEffect = Text(toleration, "effect");
    if (!tEffect.empty() && tEffect != effect) continue;
    const std::string tKey = Text(toleration, "key");
    const std::string op = Text(toleration, "operator");
    if (tKey.empty()) {
      if (op == "Exists") return true;
      continue;
    }
    if (tKey != key) continue;
    if (op == "Exists") return true;
    if ((op.empty() || op == "Equal") && Text(toleration, "value") == value) return true;
  }
  return false;
}

}  // namespace node_fit_detail

// Why `pod` cannot be scheduled onto `node` (both as the API server holds them), or "" when it
// can, as far as the filters above go.
inline std::string WhyNotOn(const nlohmann::json& pod, const nlohmann::json& node) {
  using namespace node_fit_detail;
  const nlohmann::json spec = pod.value("spec", nlohmann::json::object());
  const nlohmann::json labels = node["metadata"].value("labels", nlohmann::json::object());
  const nlohmann::json selector = spec.value("nodeSelector", nlohmann::json::object());
  for (const auto& [key, value] : selector.items()) {
    if (!labels.contains(key) || labels[key] != value) return "nodeSelector " + key;
  }
  nlohmann::json terms;  // null: no required node affinity
  if (const auto affinity = spec.value("affinity", nlohmann::json::object());
      affinity.contains("nodeAffinity")) {
    terms = affinity["nodeAffinity"]
                .value("requiredDuringSchedulingIgnoredDuringExecution", nlohmann::json::object())
                .value("nodeSelectorTerms", nlohmann::json());
  }
  if (terms.is_array() && std::none_of(terms.begin(), terms.end(),
                                       [&](const nlohmann::json& t) { return Term(t, node); })) {
    return "required node affinity selects no term on node " + Text(node["metadata"], "name");
  }
  const nlohmann::json tolerations = spec.value("tolerations", nlohmann::json::array());
  const nlohmann::json nodeSpec = node.value("spec", nlohmann::json::object());
  if (nodeSpec.value("unschedulable", false) &&
      !Tolerates(tolerations, "node.kubernetes.io/unschedulable", "", "NoSchedule")) {
    return "node " + Text(node["metadata"], "name") +
           " is cordoned and the pod does not tolerate node.kubernetes.io/unschedulable";
  }
  for (const nlohmann::json& taint : nodeSpec.value("taints", nlohmann::json::array())) {
    const std::string effect = Text(taint, "effect");
    if (effect != "NoSchedule" && effect != "NoExecute") continue;
    if (!Tolerates(tolerations, Text(taint, "key"), Text(taint, "value"), effect)) {
      return "taint " + Text(taint, "key") + ":" + effect;
    }
  }
  return "";
}

// The Node as it is with its kubelet running. The tests' Nodes have none, so on the real control
// plane kube-controller-manager's node lifecycle taints them not-ready (and unreachable), which
// the Ready GPU node of a real launcher does not carry; the fake adds no such taint.
inline nlohmann::json WithoutLifecycleTaints(nlohmann::json node) {
  if (!node.contains("spec") || !node["spec"].contains("taints")) return node;
  nlohmann::json kept = nlohmann::json::array();
  for (const nlohmann::json& taint : node["spec"]["taints"]) {
    const std::string key = taint.value("key", "");
    if (key != "node.kubernetes.io/not-ready" && key != "node.kubernetes.io/unreachable") {
      kept.push_back(taint);
    }
  }
  node["spec"]["taints"] = kept;
  return node;
}

}  // namespace cozy::testing
