#include "kube/cache.h"

namespace cozy::kube {
using nlohmann::json;

namespace {

std::vector<std::string> StringOrNothing(const json& object, const json::json_pointer& pointer) {
  if (!object.contains(pointer)) return {};
  const json& value = object.at(pointer);
  if (!value.is_string()) return {};
  return {value.get<std::string>()};
}

// JSON pointer tokens escape '/' as "~1".
std::string EscapePointerToken(const std::string& token) {
  std::string out;
  for (char c : token) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string ObjectKey(const json& object) {
  const json& metadata = object.at("metadata");
  const auto ns = metadata.find("namespace");
  const std::string name = metadata.value("name", "");
  if (ns == metadata.end() || !ns->is_string() || ns->get_ref<const std::string&>().empty()) {
    return name;
  }
  return ns->get<std::string>() + "/" + name;
}

JsonIndexFunc NamespaceIndex() { return FieldIndex("/metadata/namespace"); }

JsonIndexFunc FieldIndex(const std::string& jsonPointer) {
  json::json_pointer pointer(jsonPointer);  // throws at registration for a malformed one
  return [pointer](const json& object) { return StringOrNothing(object, pointer); };
}

JsonIndexFunc LabelIndex(const std::string& label) {
  return FieldIndex("/metadata/labels/" + EscapePointerToken(label));
}

JsonIndexFunc AnnotationIndex(const std::string& annotation) {
  return FieldIndex("/metadata/annotations/" + EscapePointerToken(annotation));
}

}  // namespace cozy::kube
