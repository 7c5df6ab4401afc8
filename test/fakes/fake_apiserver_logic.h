// The pure parts of the fake API server, tested on their own: YAML to JSON, label and field
// selectors, the JSONPath subset of printer columns, structural-schema pruning and
// validation, and kubectl's age format. Each follows research/k8s-api.md.
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cozy::fake {

// Every document of a YAML file (or text) as JSON; plain scalars become bool, null, integer
// or number where YAML 1.2's core schema says so, quoted ones stay strings.
std::vector<nlohmann::json> YamlDocumentsToJson(const std::string& text);
std::vector<nlohmann::json> YamlFileToJson(const std::filesystem::path& file);

// labelSelector: k=v, k==v, k!=v, k in (a,b), k notin (a,b), k, !k. Throws
// std::invalid_argument on a malformed selector.
class LabelSelector {
 public:
  explicit LabelSelector(const std::string& text);
  bool Matches(const nlohmann::json& labels) const;

 private:
  struct Requirement {
    std::string key;
    enum class Op { kEquals, kNotEquals, kIn, kNotIn, kExists, kNotExists } op;
    std::vector<std::string> values;
  };
  std::vector<Requirement> requirements_;
};

// fieldSelector: key=value, key==value, key!=value joined by commas (backslash escapes).
struct FieldRequirement {
  std::string field;  // e.g. "spec.nodeName", "metadata.name"
  bool equals = true;
  std::string value;
};
std::vector<FieldRequirement> ParseFieldSelector(const std::string& text);
// The value a field label reads on an object ("" when absent, as the API server does).
std::string FieldValue(const nlohmann::json& object, const std::string& field);

// JSONPath as printer columns use it: .a.b, [n], [*], ['key'], [?(@.a.b=="v")]. Returns
// every match in order; throws std::invalid_argument on a path outside the subset.
std::vector<nlohmann::json> EvaluateJsonPath(const nlohmann::json& object, const std::string& path);

// One structural-schema failure, shaped like a StatusCause.
struct FieldError {
  std::string reason;  // FieldValueInvalid, FieldValueRequired, FieldValueNotSupported
  std::string field;   // status.devices[0].iommuGroup
  std::string message;
};
// Drops every field the schema does not name (unless x-kubernetes-preserve-unknown-fields),
// as the API server prunes custom resources; apiVersion, kind and metadata stay.
void PruneUnknownFields(nlohmann::json& object, const nlohmann::json& schema);
// Checks types, required, enum, nullable, minimum/maximum, items and properties.
std::vector<FieldError> ValidateAgainstSchema(const nlohmann::json& object,
                                              const nlohmann::json& schema);

// A strategic merge patch as the real server applies it to built-in kinds, for the lists the
// fake serves: lists of objects with a patch merge key (webhooks, containers, volumes, env,
// ports, conditions... by `name`, `mountPath`, `containerPort`, `type`, `uid`) merge element by
// element, `$patch: delete` removes one, `$setElementOrder/<list>` orders the result,
// `$deleteFromPrimitiveList/<list>` removes values, `$patch: replace` replaces a map, and
// `finalizers` merges as a set. Anything else behaves as an RFC 7386 merge patch.
nlohmann::json StrategicMergePatch(const nlohmann::json& original, const nlohmann::json& patch);

// kubectl's age text: 45s, 3m12s, 12m, 5h3m, 30h, 3d4h, 40d, 2y30d.
std::string HumanDuration(std::chrono::seconds age);

// RFC 3339 UTC with second precision, as metadata.creationTimestamp carries it.
std::string FormatTimestamp(std::chrono::system_clock::time_point time);
std::optional<std::chrono::system_clock::time_point> ParseTimestamp(const std::string& text);
// metav1.MicroTime as the real server decodes it (RFC3339Micro): exactly six fractional digits
// ("2026-12-02T07:36:47.000000Z"); a Time's "2026-12-02T07:36:47Z" does not parse.
std::optional<std::chrono::system_clock::time_point> ParseMicroTime(const std::string& text);

}  // namespace cozy::fake
