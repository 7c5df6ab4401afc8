#include "test/fakes/fake_apiserver_logic.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <ctime>
#include <map>
#include <regex>
#include <set>
#include <stdexcept>

#include <yaml-cpp/yaml.h>

namespace cozy::fake {
using nlohmann::json;

namespace {

json ScalarToJson(const YAML::Node& node) {
  const std::string& text = node.Scalar();
  if (node.Tag() == "!") return text;  // quoted: always a string
  static const std::regex kInt(R"([-+]?(0|[1-9][0-9]*))");
  static const std::regex kFloat(R"([-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?)");
  if (text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL") {
    return nullptr;
  }
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  if (std::regex_match(text, kInt)) return std::stoll(text);
  if (std::regex_match(text, kFloat)) return std::stod(text);
  return text;
}

json NodeToJson(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Scalar:
      return ScalarToJson(node);
    case YAML::NodeType::Sequence: {
      json array = json::array();
      for (const auto& item : node) array.push_back(NodeToJson(item));
      return array;
    }
    case YAML::NodeType::Map: {
      json object = json::object();
      for (const auto& entry : node)
        object[entry.first.as<std::string>()] = NodeToJson(entry.second);
      return object;
    }
  }
  return nullptr;
}

std::string Trim(const std::string& text) {
  size_t first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

std::string JsonTypeName(const json& value) {
  if (value.is_null()) return "null";
  if (value.is_boolean()) return "boolean";
  if (value.is_number_integer() || value.is_number_unsigned()) return "integer";
  if (value.is_number()) return "number";
  if (value.is_string()) return "string";
  if (value.is_array()) return "array";
  return "object";
}

bool TypeMatches(const std::string& type, const json& value) {
  if (type.empty()) return true;
  if (type == "object") return value.is_object();
  if (type == "array") return value.is_array();
  if (type == "string") return value.is_string();
  if (type == "boolean") return value.is_boolean();
  if (type == "integer") {
    if (value.is_number_integer() || value.is_number_unsigned()) return true;
    // JSON has one number type: 3.0 is an integer to the API server too.
    return value.is_number_float() && std::floor(value.get<double>()) == value.get<double>();
  }
  if (type == "number") return value.is_number();
  return true;
}

void Validate(const json& value, const json& schema, const std::string& field,
              std::vector<FieldError>& errors) {
  if (!schema.is_object()) return;
  const std::string where = field.empty() ? "<root>" : field;
  if (value.is_null()) {
    if (!schema.value("nullable", false)) {
      errors.push_back(
          {"FieldValueInvalid", where,
           where + " in body must be of type " + schema.value("type", "object") + ": \"null\""});
    }
    return;
  }
  std::string type = schema.value("type", "");
  if (!TypeMatches(type, value)) {
    errors.push_back(
        {"FieldValueInvalid", where,
         where + " in body must be of type " + type + ": \"" + JsonTypeName(value) + "\""});
    return;
  }
  if (schema.contains("enum") && schema["enum"].is_array()) {
    bool found = false;
    for (const auto& allowed : schema["enum"]) found = found || allowed == value;
    if (!found) {
      std::string list;
      for (const auto& allowed : schema["enum"])
        list += (list.empty() ? "" : ", ") + allowed.dump();
      errors.push_back({"FieldValueNotSupported", where,
                        "Unsupported value: " + value.dump() + ": supported values: " + list});
    }
  }
  if (value.is_number()) {
    if (schema.contains("minimum") && value.get<double>() < schema["minimum"].get<double>()) {
      errors.push_back(
          {"FieldValueInvalid", where,
           where + " in body should be greater than or equal to " + schema["minimum"].dump()});
    }
    if (schema.contains("maximum") && value.get<double>() > schema["maximum"].get<double>()) {
      errors.push_back(
          {"FieldValueInvalid", where,
           where + " in body should be less than or equal to " + schema["maximum"].dump()});
    }
  }
  if (value.is_string() && schema.contains("pattern")) {
    if (!std::regex_search(value.get<std::string>(),
                           std::regex(schema["pattern"].get<std::string>()))) {
      errors.push_back(
          {"FieldValueInvalid", where,
           where + " in body should match '" + schema["pattern"].get<std::string>() + "'"});
    }
  }
  if (value.is_object()) {
    if (schema.contains("required")) {
      for (const auto& key : schema["required"]) {
        if (!value.contains(key.get<std::string>())) {
          std::string child = (field.empty() ? "" : field + ".") + key.get<std::string>();
          errors.push_back({"FieldValueRequired", child, "Required value"});
        }
      }
    }
    const json& properties = schema.contains("properties") ? schema["properties"] : json();
    for (const auto& [key, child] : value.items()) {
      std::string childField = (field.empty() ? "" : field + ".") + key;
      if (field.empty() && (key == "apiVersion" || key == "kind" || key == "metadata")) continue;
      if (properties.is_object() && properties.contains(key)) {
        Validate(child, properties[key], childField, errors);
      } else if (schema.contains("additionalProperties") &&
                 schema["additionalProperties"].is_object()) {
        Validate(child, schema["additionalProperties"], childField, errors);
      }
    }
  }
  if (value.is_array() && schema.contains("items")) {
    for (size_t i = 0; i < value.size(); ++i) {
      Validate(value[i], schema["items"], field + "[" + std::to_string(i) + "]", errors);
    }
  }
}

// JSONPath steps.
struct Step {
  enum class Kind { kField, kIndex, kWildcard, kFilter } kind;
  std::string name;
  long index = 0;
  std::vector<std::string> filterPath;  // @.a.b
  json filterValue;
};

std::vector<Step> ParseJsonPath(std::string path) {
  std::string original = path;
  // kubectl accepts the path with or without {}.
  if (!path.empty() && path.front() == '{' && path.back() == '}') {
    path = path.substr(1, path.size() - 2);
  }
  auto fail = [&original](const std::string& why) {
    return std::invalid_argument("JSONPath " + original + ": " + why);
  };
  std::vector<Step> steps;
  size_t i = 0;
  auto readName = [&path, &i] {
    size_t start = i;
    while (i < path.size() && path[i] != '.' && path[i] != '[') ++i;
    return path.substr(start, i - start);
  };
  while (i < path.size()) {
    if (path[i] == '.') {
      ++i;
      if (i < path.size() && path[i] == '.') throw fail("recursive descent is not supported");
      std::string name = readName();
      if (name.empty()) continue;
      if (name == "*") {
        steps.push_back({Step::Kind::kWildcard, "", 0, {}, nullptr});
      } else {
        steps.push_back({Step::Kind::kField, name, 0, {}, nullptr});
      }
    } else if (path[i] == '[') {
      size_t close = path.find(']', i);
      if (close == std::string::npos) throw fail("unclosed [");
      std::string inside = path.substr(i + 1, close - i - 1);
      if (inside.rfind("?(", 0) == 0) {
        // [?(@.a.b=="v")]: the ']' found may be inside the quotes; find the real end.
        close = path.find(")]", i);
        if (close == std::string::npos) throw fail("unclosed filter");
        inside = path.substr(i + 3, close - i - 3);
        ++close;
        auto eq = inside.find("==");
        if (eq == std::string::npos || inside.rfind("@.", 0) != 0) {
          throw fail("only [?(@.field==value)] filters are supported");
        }
        Step step{Step::Kind::kFilter, "", 0, {}, nullptr};
        std::string lhs = Trim(inside.substr(2, eq - 2));
        size_t from = 0;
        while (from <= lhs.size()) {
          size_t dot = lhs.find('.', from);
          step.filterPath.push_back(lhs.substr(from, dot - from));
          if (dot == std::string::npos) break;
          from = dot + 1;
        }
        std::string rhs = Trim(inside.substr(eq + 2));
        if (rhs.size() >= 2 && (rhs.front() == '"' || rhs.front() == '\'')) {
          step.filterValue = rhs.substr(1, rhs.size() - 2);
        } else {
          step.filterValue = json::parse(rhs, nullptr, false);
          if (step.filterValue.is_discarded()) throw fail("bad filter value " + rhs);
        }
        steps.push_back(step);
      } else if (inside == "*") {
        steps.push_back({Step::Kind::kWildcard, "", 0, {}, nullptr});
      } else if (inside.size() >= 2 && (inside.front() == '\'' || inside.front() == '"')) {
        steps.push_back({Step::Kind::kField, inside.substr(1, inside.size() - 2), 0, {}, nullptr});
      } else {
        char* end = nullptr;
        long index = std::strtol(inside.c_str(), &end, 10);
        if (inside.empty() || *end != '\0') throw fail("unsupported subscript [" + inside + "]");
        steps.push_back({Step::Kind::kIndex, "", index, {}, nullptr});
      }
      i = close + 1;
    } else {
      throw fail("expected '.' or '[' at offset " + std::to_string(i));
    }
  }
  return steps;
}

}  // namespace

std::vector<json> YamlDocumentsToJson(const std::string& text) {
  std::vector<json> documents;
  for (const auto& node : YAML::LoadAll(text)) {
    if (node.IsNull()) continue;
    documents.push_back(NodeToJson(node));
  }
  return documents;
}

std::vector<json> YamlFileToJson(const std::filesystem::path& file) {
  std::vector<json> documents;
  for (const auto& node : YAML::LoadAllFromFile(file.string())) {
    if (node.IsNull()) continue;
    documents.push_back(NodeToJson(node));
  }
  return documents;
}

LabelSelector::LabelSelector(const std::string& text) {
  // Split on commas outside parentheses.
  std::vector<std::string> parts;
  std::string current;
  int depth = 0;
  for (char c : text) {
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(current);
      current.clear();
    } else {
      current.push_back(c);
    }
  }
  if (!current.empty() || !parts.empty()) parts.push_back(current);
  static const std::regex kSet(R"(^\s*([^\s!=()]+)\s+(in|notin)\s*\(([^)]*)\)\s*$)");
  static const std::regex kCompare(R"(^\s*([^\s!=()]+)\s*(==|=|!=)\s*([^\s,()]*)\s*$)");
  static const std::regex kExists(R"(^\s*(!?)\s*([^\s!=()]+)\s*$)");
  for (const auto& part : parts) {
    std::smatch match;
    Requirement requirement;
    if (std::regex_match(part, match, kSet)) {
      requirement.key = match[1];
      requirement.op = match[2] == "in" ? Requirement::Op::kIn : Requirement::Op::kNotIn;
      std::string values = match[3];
      size_t from = 0;
      while (true) {
        size_t comma = values.find(',', from);
        requirement.values.push_back(Trim(values.substr(from, comma - from)));
        if (comma == std::string::npos) break;
        from = comma + 1;
      }
    } else if (std::regex_match(part, match, kCompare)) {
      requirement.key = match[1];
      requirement.op = match[2] == "!=" ? Requirement::Op::kNotEquals : Requirement::Op::kEquals;
      requirement.values.push_back(match[3]);
    } else if (std::regex_match(part, match, kExists)) {
      requirement.key = match[2];
      requirement.op = match[1] == "!" ? Requirement::Op::kNotExists : Requirement::Op::kExists;
    } else {
      throw std::invalid_argument("unable to parse requirement: \"" + part + "\"");
    }
    requirements_.push_back(std::move(requirement));
  }
}

bool LabelSelector::Matches(const json& labels) const {
  for (const auto& requirement : requirements_) {
    bool has = labels.is_object() && labels.contains(requirement.key);
    std::string value = has && labels[requirement.key].is_string()
                            ? labels[requirement.key].get<std::string>()
                            : "";
    auto in = [&] {
      for (const auto& candidate : requirement.values) {
        if (candidate == value) return true;
      }
      return false;
    };
    switch (requirement.op) {
      case Requirement::Op::kEquals:
      case Requirement::Op::kIn:
        if (!has || !in()) return false;
        break;
      case Requirement::Op::kNotEquals:
      case Requirement::Op::kNotIn:
        if (has && in()) return false;
        break;
      case Requirement::Op::kExists:
        if (!has) return false;
        break;
      case Requirement::Op::kNotExists:
        if (has) return false;
        break;
    }
  }
  return true;
}

std::vector<FieldRequirement> ParseFieldSelector(const std::string& text) {
  std::vector<FieldRequirement> requirements;
  std::vector<std::string> terms;
  std::string current;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size()) {
      current += text.substr(i, 2);
      ++i;
    } else if (text[i] == ',') {
      terms.push_back(current);
      current.clear();
    } else {
      current.push_back(text[i]);
    }
  }
  if (!current.empty()) terms.push_back(current);
  auto unescape = [](const std::string& value) {
    std::string out;
    for (size_t i = 0; i < value.size(); ++i) {
      if (value[i] == '\\' && i + 1 < value.size()) ++i;
      out.push_back(value[i]);
    }
    return out;
  };
  for (const auto& term : terms) {
    FieldRequirement requirement;
    size_t at = std::string::npos;
    size_t width = 0;
    for (size_t i = 0; i < term.size(); ++i) {
      if (term[i] == '\\') {
        ++i;
        continue;
      }
      if (term.compare(i, 2, "!=") == 0) {
        at = i, width = 2, requirement.equals = false;
      } else if (term.compare(i, 2, "==") == 0) {
        at = i, width = 2;
      } else if (term[i] == '=') {
        at = i, width = 1;
      }
      if (at != std::string::npos) break;
    }
    if (at == std::string::npos) {
      throw std::invalid_argument("invalid selector: '" + text + "'; can't understand '" + term +
                                  "'");
    }
    requirement.field = Trim(term.substr(0, at));
    requirement.value = unescape(term.substr(at + width));
    requirements.push_back(requirement);
  }
  return requirements;
}

std::string FieldValue(const json& object, const std::string& field) {
  const json* node = &object;
  size_t from = 0;
  while (true) {
    size_t dot = field.find('.', from);
    std::string key = field.substr(from, dot - from);
    if (!node->is_object() || !node->contains(key)) return "";
    node = &(*node)[key];
    if (dot == std::string::npos) break;
    from = dot + 1;
  }
  if (node->is_string()) return node->get<std::string>();
  if (node->is_null()) return "";
  return node->dump();
}

std::vector<json> EvaluateJsonPath(const json& object, const std::string& path) {
  std::vector<json> current{object};
  for (const Step& step : ParseJsonPath(path)) {
    std::vector<json> next;
    for (const json& value : current) {
      switch (step.kind) {
        case Step::Kind::kField:
          if (value.is_object() && value.contains(step.name)) next.push_back(value[step.name]);
          break;
        case Step::Kind::kIndex:
          if (value.is_array()) {
            long size = static_cast<long>(value.size());
            long index = step.index < 0 ? size + step.index : step.index;
            if (index >= 0 && index < size) next.push_back(value[static_cast<size_t>(index)]);
          }
          break;
        case Step::Kind::kWildcard:
          if (value.is_array() || value.is_object()) {
            for (const auto& item : value) next.push_back(item);
          }
          break;
        case Step::Kind::kFilter:
          if (value.is_array()) {
            for (const auto& item : value) {
              const json* field = &item;
              for (const auto& key : step.filterPath) {
                field = field->is_object() && field->contains(key) ? &(*field)[key] : nullptr;
                if (!field) break;
              }
              if (field && *field == step.filterValue) next.push_back(item);
            }
          }
          break;
      }
    }
    current = std::move(next);
  }
  return current;
}

namespace {

void Prune(json& object, const json& schema, bool root) {
  if (!schema.is_object() || schema.value("x-kubernetes-preserve-unknown-fields", false)) return;
  if (object.is_object()) {
    const json& properties = schema.contains("properties") ? schema["properties"] : json();
    bool isMap =
        schema.contains("additionalProperties") && schema["additionalProperties"].is_object();
    for (auto it = object.begin(); it != object.end();) {
      if (root && (it.key() == "apiVersion" || it.key() == "kind" || it.key() == "metadata")) {
        ++it;  // ObjectMeta is the server's own, never pruned by the CRD's schema
      } else if (properties.is_object() && properties.contains(it.key())) {
        Prune(it.value(), properties[it.key()], false);
        ++it;
      } else if (isMap) {
        Prune(it.value(), schema["additionalProperties"], false);
        ++it;
      } else {
        it = object.erase(it);
      }
    }
  } else if (object.is_array() && schema.contains("items")) {
    for (auto& item : object) Prune(item, schema["items"], false);
  }
}

}  // namespace

void PruneUnknownFields(json& object, const json& schema) { Prune(object, schema, true); }

std::vector<FieldError> ValidateAgainstSchema(const json& object, const json& schema) {
  std::vector<FieldError> errors;
  Validate(object, schema, "", errors);
  return errors;
}

std::string HumanDuration(std::chrono::seconds age) {
  long long s = age.count();
  if (s < 0) s = 0;
  auto text = [](long long value, const char* unit) { return std::to_string(value) + unit; };
  if (s < 120) return text(s, "s");
  long long minutes = s / 60;
  if (minutes < 10)
    return s % 60 == 0 ? text(minutes, "m") : text(minutes, "m") + text(s % 60, "s");
  if (minutes < 180) return text(minutes, "m");
  long long hours = s / 3600;
  if (hours < 8)
    return minutes % 60 == 0 ? text(hours, "h") : text(hours, "h") + text(minutes % 60, "m");
  if (hours < 48) return text(hours, "h");
  long long days = hours / 24;
  if (hours < 192)
    return hours % 24 == 0 ? text(days, "d") : text(days, "d") + text(hours % 24, "h");
  if (days < 365 * 2) return text(days, "d");
  long long years = days / 365;
  if (years < 8)
    return days % 365 == 0 ? text(years, "y") : text(years, "y") + text(days % 365, "d");
  return text(years, "y");
}

std::string FormatTimestamp(std::chrono::system_clock::time_point time) {
  std::time_t t = std::chrono::system_clock::to_time_t(time);
  std::tm parts{};
  gmtime_r(&t, &parts);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &parts);
  return text;
}

std::optional<std::chrono::system_clock::time_point> ParseTimestamp(const std::string& text) {
  std::tm parts{};
  const char* end = strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &parts);
  if (!end) return std::nullopt;
  return std::chrono::system_clock::from_time_t(timegm(&parts));
}

namespace {

// The patch merge keys of the built-in types' lists (k8s.io/api's `patchMergeKey` tags), by the
// list's field name, which the served kinds use consistently.
const std::map<std::string, std::string>& PatchMergeKeys() {
  static const std::map<std::string, std::string> keys = {
      {"webhooks", "name"},          {"containers", "name"},
      {"initContainers", "name"},    {"ephemeralContainers", "name"},
      {"volumes", "name"},           {"env", "name"},
      {"volumeMounts", "mountPath"}, {"volumeDevices", "devicePath"},
      {"ports", "containerPort"},    {"conditions", "type"},
      {"ownerReferences", "uid"},    {"imagePullSecrets", "name"},
      {"hostAliases", "ip"},         {"resourceClaims", "name"}};
  return keys;
}

json WithoutDirectives(json object) {
  if (!object.is_object()) return object;
  for (auto it = object.begin(); it != object.end();) {
    if (!it.key().empty() && it.key()[0] == '$') {
      it = object.erase(it);
    } else {
      if (it->is_object()) *it = WithoutDirectives(*it);
      ++it;
    }
  }
  return object;
}

json MergeObjectList(const json& original, const json& patch, const std::string& key) {
  json result = original.is_array() ? original : json::array();
  for (const json& element : patch) {
    if (!element.is_object() || !element.contains(key)) {
      result.push_back(WithoutDirectives(element));
      continue;
    }
    auto found = std::find_if(result.begin(), result.end(), [&](const json& existing) {
      return existing.is_object() && existing.contains(key) && existing[key] == element[key];
    });
    if (element.value("$patch", "") == "delete") {
      if (found != result.end()) result.erase(found);
    } else if (found != result.end()) {
      *found = StrategicMergePatch(*found, element);
    } else {
      result.push_back(WithoutDirectives(element));
    }
  }
  return result;
}

}  // namespace

json StrategicMergePatch(const json& original, const json& patch) {
  if (!patch.is_object()) return patch;
  if (patch.value("$patch", "") == "replace") return WithoutDirectives(patch);
  json result = original.is_object() ? original : json::object();
  std::map<std::string, json> order;
  for (const auto& [key, value] : patch.items()) {
    if (key.starts_with("$setElementOrder/")) {
      order[key.substr(17)] = value;
    } else if (key.starts_with("$deleteFromPrimitiveList/")) {
      const std::string field = key.substr(25);
      if (result.contains(field) && result[field].is_array() && value.is_array()) {
        json kept = json::array();
        for (const json& item : result[field]) {
          if (std::find(value.begin(), value.end(), item) == value.end()) kept.push_back(item);
        }
        result[field] = kept;
      }
    } else if (!key.empty() && key[0] == '$') {
      continue;  // $patch, $retainKeys: nothing more to do for the fields the fake serves
    } else if (value.is_null()) {
      result.erase(key);
    } else if (value.is_object()) {
      result[key] = StrategicMergePatch(result.contains(key) ? result[key] : json(), value);
    } else if (value.is_array() && PatchMergeKeys().count(key) &&
               std::all_of(value.begin(), value.end(),
                           [](const json& item) { return item.is_object(); })) {
      result[key] = MergeObjectList(result.contains(key) ? result[key] : json(), value,
                                    PatchMergeKeys().at(key));
    } else if (value.is_array() && key == "finalizers") {
      json merged = result.contains(key) && result[key].is_array() ? result[key] : json::array();
      for (const json& item : value) {
        if (std::find(merged.begin(), merged.end(), item) == merged.end()) merged.push_back(item);
      }
      result[key] = merged;
    } else {
      result[key] = value;
    }
  }
  // $setElementOrder/<list>: the listed elements in that order, any others after them.
  for (const auto& [field, wanted] : order) {
    if (!result.contains(field) || !result[field].is_array() || !wanted.is_array()) continue;
    const auto mergeKey = PatchMergeKeys().find(field);
    json remaining = result[field];
    json ordered = json::array();
    for (const json& marker : wanted) {
      for (auto it = remaining.begin(); it != remaining.end(); ++it) {
        const bool same = mergeKey != PatchMergeKeys().end() && marker.is_object()
                              ? it->is_object() && it->contains(mergeKey->second) &&
                                    marker.contains(mergeKey->second) &&
                                    (*it)[mergeKey->second] == marker[mergeKey->second]
                              : *it == marker;
        if (same) {
          ordered.push_back(*it);
          remaining.erase(it);
          break;
        }
      }
    }
    for (const json& rest : remaining) ordered.push_back(rest);
    result[field] = ordered;
  }
  return result;
}

std::optional<std::chrono::system_clock::time_point> ParseMicroTime(const std::string& text) {
  static const std::regex micro(
      R"(^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})$)");
  if (!std::regex_match(text, micro)) return std::nullopt;
  return ParseTimestamp(text);
}

}  // namespace cozy::fake
