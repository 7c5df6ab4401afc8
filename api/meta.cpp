#include "api/meta.h"

#include <algorithm>

namespace cozy::api {

std::string ObjectMeta::Key() const {
  return namespaceName.empty() ? name : namespaceName + "/" + name;
}

ObjectMeta ObjectMetaFromJson(const JsonField& metadata) {
  ObjectMeta meta;
  meta.name = metadata.StringOr("name", "");
  meta.namespaceName = metadata.StringOr("namespace", "");
  meta.uid = metadata.StringOr("uid", "");
  meta.resourceVersion = metadata.StringOr("resourceVersion", "");
  meta.generation = metadata.OptionalInt("generation");
  meta.creationTimestamp = metadata.StringOr("creationTimestamp", "");
  meta.deletionTimestamp = metadata.OptionalString("deletionTimestamp");
  meta.labels = metadata.StringMapOr("labels");
  meta.annotations = metadata.StringMapOr("annotations");
  if (std::optional<JsonField> finalizers = metadata.Find("finalizers")) {
    meta.finalizers = finalizers->AsStringList();
  }
  return meta;
}

nlohmann::json ToJson(const ObjectMeta& metadata) {
  nlohmann::json json = nlohmann::json::object();
  json["name"] = metadata.name;
  if (!metadata.namespaceName.empty()) {
    json["namespace"] = metadata.namespaceName;
  }
  if (!metadata.uid.empty()) {
    json["uid"] = metadata.uid;
  }
  if (!metadata.resourceVersion.empty()) {
    json["resourceVersion"] = metadata.resourceVersion;
  }
  if (metadata.generation) {
    json["generation"] = *metadata.generation;
  }
  if (!metadata.creationTimestamp.empty()) {
    json["creationTimestamp"] = metadata.creationTimestamp;
  }
  if (metadata.deletionTimestamp) {
    json["deletionTimestamp"] = *metadata.deletionTimestamp;
  }
  if (!metadata.labels.empty()) {
    json["labels"] = metadata.labels;
  }
  if (!metadata.annotations.empty()) {
    json["annotations"] = metadata.annotations;
  }
  if (!metadata.finalizers.empty()) {
    json["finalizers"] = metadata.finalizers;
  }
  return json;
}

bool LabelSelector::Matches(const Labels& labels) const {
  for (const auto& [key, value] : matchLabels) {
    const auto it = labels.find(key);
    if (it == labels.end() || it->second != value) {
      return false;
    }
  }
  for (const LabelSelectorRequirement& requirement : matchExpressions) {
    const auto it = labels.find(requirement.key);
    const bool present = it != labels.end();
    const bool listed = present && std::find(requirement.values.begin(), requirement.values.end(),
                                             it->second) != requirement.values.end();
    bool holds = false;
    if (requirement.op == "In") {
      holds = listed;
    } else if (requirement.op == "NotIn") {
      holds = !listed;
    } else if (requirement.op == "Exists") {
      holds = present;
    } else if (requirement.op == "DoesNotExist") {
      holds = !present;
    }
    if (!holds) {
      return false;
    }
  }
  return true;
}

LabelSelector LabelSelectorFromJson(const JsonField& selector) {
  LabelSelector result;
  result.matchLabels = selector.StringMapOr("matchLabels");
  if (std::optional<JsonField> expressions = selector.Find("matchExpressions")) {
    for (const JsonField& item : expressions->AsArray()) {
      LabelSelectorRequirement requirement;
      requirement.key = item.Require("key").AsString();
      const JsonField op = item.Require("operator");
      requirement.op = op.AsString();
      if (std::optional<JsonField> values = item.Find("values")) {
        requirement.values = values->AsStringList();
      }
      const bool takesValues = requirement.op == "In" || requirement.op == "NotIn";
      const bool takesNone = requirement.op == "Exists" || requirement.op == "DoesNotExist";
      if (!takesValues && !takesNone) {
        op.Fail("\"" + requirement.op + "\" is not one of In, NotIn, Exists, DoesNotExist");
      }
      if (takesValues && requirement.values.empty()) {
        op.Fail(requirement.op + " needs at least one value");
      }
      if (takesNone && !requirement.values.empty()) {
        op.Fail(requirement.op + " takes no values");
      }
      result.matchExpressions.push_back(std::move(requirement));
    }
  }
  return result;
}

nlohmann::json ToJson(const LabelSelector& selector) {
  nlohmann::json json = nlohmann::json::object();
  if (!selector.matchLabels.empty()) {
    json["matchLabels"] = selector.matchLabels;
  }
  if (!selector.matchExpressions.empty()) {
    nlohmann::json expressions = nlohmann::json::array();
    for (const LabelSelectorRequirement& requirement : selector.matchExpressions) {
      nlohmann::json expression = {{"key", requirement.key}, {"operator", requirement.op}};
      if (!requirement.values.empty()) {
        expression["values"] = requirement.values;
      }
      expressions.push_back(std::move(expression));
    }
    json["matchExpressions"] = std::move(expressions);
  }
  return json;
}

std::vector<Toleration> TolerationsFromJson(const JsonField& tolerations) {
  std::vector<Toleration> all;
  for (const JsonField& item : tolerations.AsArray()) {
    Toleration toleration;
    toleration.key = item.StringOr("key", "");
    toleration.op = item.StringOr("operator", "");
    toleration.value = item.StringOr("value", "");
    toleration.effect = item.StringOr("effect", "");
    toleration.tolerationSeconds = item.OptionalInt("tolerationSeconds");
    if (toleration.op != "" && toleration.op != "Equal" && toleration.op != "Exists") {
      item.Require("operator").Fail("\"" + toleration.op + "\" is not one of Equal, Exists");
    }
    if (toleration.op == "Exists" && !toleration.value.empty()) {
      item.Require("value").Fail("must be empty with operator Exists");
    }
    if (toleration.key.empty() && toleration.op != "Exists") {
      item.Fail("an empty key (every taint) needs operator Exists");
    }
    if (toleration.effect != "" && toleration.effect != "NoSchedule" &&
        toleration.effect != "PreferNoSchedule" && toleration.effect != "NoExecute") {
      item.Require("effect").Fail("\"" + toleration.effect +
                                  "\" is not one of NoSchedule, PreferNoSchedule, NoExecute");
    }
    if (toleration.tolerationSeconds && toleration.effect != "NoExecute") {
      item.Require("tolerationSeconds").Fail("is only valid with effect NoExecute");
    }
    all.push_back(std::move(toleration));
  }
  return all;
}

nlohmann::json ToJson(const Toleration& toleration) {
  nlohmann::json json = nlohmann::json::object();
  if (!toleration.key.empty()) {
    json["key"] = toleration.key;
  }
  if (!toleration.op.empty()) {
    json["operator"] = toleration.op;
  }
  if (!toleration.value.empty()) {
    json["value"] = toleration.value;
  }
  if (!toleration.effect.empty()) {
    json["effect"] = toleration.effect;
  }
  if (toleration.tolerationSeconds) {
    json["tolerationSeconds"] = *toleration.tolerationSeconds;
  }
  return json;
}

std::vector<Condition> ConditionsFromJson(const JsonField& conditions) {
  std::vector<Condition> all;
  for (const JsonField& item : conditions.AsArray()) {
    all.push_back(Condition{item.Require("type").AsString(), item.Require("status").AsString(),
                            item.StringOr("reason", ""), item.StringOr("message", ""),
                            item.StringOr("lastTransitionTime", ""),
                            item.OptionalInt("observedGeneration")});
  }
  return all;
}

nlohmann::json ToJson(const Condition& condition) {
  nlohmann::json item = {{"type", condition.type},
                         {"status", condition.status},
                         {"reason", condition.reason},
                         {"message", condition.message}};
  if (!condition.lastTransitionTime.empty()) {
    item["lastTransitionTime"] = condition.lastTransitionTime;
  }
  if (condition.observedGeneration) {
    item["observedGeneration"] = *condition.observedGeneration;
  }
  return item;
}

}  // namespace cozy::api
