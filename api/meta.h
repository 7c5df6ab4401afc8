// Object metadata and label selectors as the gpu.cozystack.io types and the controller's
// snapshot read them.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "api/json_field.h"

namespace cozy::api {

using Labels = std::map<std::string, std::string>;

// The part of `metadata` the project reads and round-trips.
struct ObjectMeta {
  std::string name;
  std::string namespaceName;  // empty for cluster-scoped objects
  std::string uid;
  std::string resourceVersion;
  std::optional<int64_t> generation;
  std::string creationTimestamp;                 // RFC 3339 as the API server writes it
  std::optional<std::string> deletionTimestamp;  // set while finalizers hold the object
  Labels labels;
  std::map<std::string, std::string> annotations;
  std::vector<std::string> finalizers;

  bool operator==(const ObjectMeta&) const = default;
  // "ns/name" for namespaced objects, "name" otherwise: how messages name an object.
  std::string Key() const;
};

ObjectMeta ObjectMetaFromJson(const JsonField& metadata);
nlohmann::json ToJson(const ObjectMeta& metadata);

// metav1.Condition.
struct Condition {
  std::string type;
  std::string status;  // True, False, Unknown
  std::string reason;
  std::string message;
  std::string lastTransitionTime;
  std::optional<int64_t> observedGeneration;
  bool operator==(const Condition&) const = default;
};

// A status.conditions array; throws DecodeError naming the field.
std::vector<Condition> ConditionsFromJson(const JsonField& conditions);
nlohmann::json ToJson(const Condition& condition);

// metav1.LabelSelectorRequirement. Operators: In, NotIn, Exists, DoesNotExist.
struct LabelSelectorRequirement {
  std::string key;
  std::string op;
  std::vector<std::string> values;
  bool operator==(const LabelSelectorRequirement&) const = default;
};

// metav1.LabelSelector: every matchLabels entry and every expression must hold. An empty
// selector matches everything.
struct LabelSelector {
  Labels matchLabels;
  std::vector<LabelSelectorRequirement> matchExpressions;

  bool Matches(const Labels& labels) const;
  bool operator==(const LabelSelector&) const = default;
};

// Rejects unknown operators and the value rules of metav1 (In/NotIn need values,
// Exists/DoesNotExist take none), naming the field.
LabelSelector LabelSelectorFromJson(const JsonField& selector);
nlohmann::json ToJson(const LabelSelector& selector);

// core/v1 Toleration: a pod (here a VMI, or a GPUClass for the launchers of its orders) may go
// to a node carrying a taint it tolerates.
struct Toleration {
  std::string key;  // empty with Exists: every key
  std::string op;   // Equal (the default when empty) | Exists | Gt | Lt
  std::string value;
  std::string effect;                                       // empty: every effect
  std::optional<int64_t> tolerationSeconds = std::nullopt;  // NoExecute only: how long
  bool operator==(const Toleration&) const = default;
};

// A spec.tolerations list as the API server validates a pod's: operator Equal (or unset) or
// Exists, Exists takes no value, an empty key needs Exists, effect one of NoSchedule,
// PreferNoSchedule, NoExecute or unset, tolerationSeconds only with NoExecute. Gt and Lt are
// refused (they tolerate nothing: C9). Throws DecodeError naming the field.
std::vector<Toleration> TolerationsFromJson(const JsonField& tolerations);
nlohmann::json ToJson(const Toleration& toleration);

}  // namespace cozy::api
