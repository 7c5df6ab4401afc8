// The built-in kinds the fake serves and their validation basics.
#include "test/fakes/fake_apiserver_internal.h"

#include <algorithm>
#include <regex>
#include <set>

namespace cozy::fake {
using namespace internal;  // NOLINT

namespace {

// One built-in kind as the real server's discovery describes it. Its singular is its kind in
// lower case and its list kind "<Kind>List", as for every kind the real server serves.
struct BuiltinKind {
  std::string group;
  std::string version;
  std::string plural;
  std::string kind;
  bool namespaced = false;
  bool status = false;  // a status subresource
  std::vector<std::string> shortNames = {};
  std::vector<std::string> fieldLabels = {};  // field selector labels beyond metadata.*
  std::vector<std::string> categories = {};
};

// The kinds a controller of ours uses, with the field selectors their registries allow.
const std::vector<BuiltinKind>& BuiltinKinds() {
  static const std::vector<BuiltinKind> kinds = {
      {.group = "",
       .version = "v1",
       .plural = "nodes",
       .kind = "Node",
       .status = true,
       .shortNames = {"no"},
       .fieldLabels = {"spec.unschedulable"}},
      {.group = "",
       .version = "v1",
       .plural = "pods",
       .kind = "Pod",
       .namespaced = true,
       .status = true,
       .shortNames = {"po"},
       .fieldLabels = {"spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
                       "spec.serviceAccountName", "status.phase", "status.podIP",
                       "status.nominatedNodeName"},
       .categories = {"all"}},
      {.group = "",
       .version = "v1",
       .plural = "namespaces",
       .kind = "Namespace",
       .status = true,
       .shortNames = {"ns"},
       .fieldLabels = {"status.phase"}},
      {.group = "apiextensions.k8s.io",
       .version = "v1",
       .plural = "customresourcedefinitions",
       .kind = "CustomResourceDefinition",
       .status = true,
       .shortNames = {"crd", "crds"}},
      {.group = "",
       .version = "v1",
       .plural = "configmaps",
       .kind = "ConfigMap",
       .namespaced = true,
       .shortNames = {"cm"}},
      {.group = "",
       .version = "v1",
       .plural = "secrets",
       .kind = "Secret",
       .namespaced = true,
       .fieldLabels = {"type"}},
      {.group = "",
       .version = "v1",
       .plural = "resourcequotas",
       .kind = "ResourceQuota",
       .namespaced = true,
       .status = true,
       .shortNames = {"quota"}},
      {.group = "",
       .version = "v1",
       .plural = "events",
       .kind = "Event",
       .namespaced = true,
       .shortNames = {"ev"},
       .fieldLabels = {"involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                       "involvedObject.uid", "involvedObject.apiVersion",
                       "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason",
                       "reportingComponent", "type"}},
      // events.k8s.io/v1: the same Events in the newer shape, kept in the core kind's storage
      // (RegisterBuiltins): an Event written through either API is read, listed and watched
      // through both.
      {.group = "events.k8s.io",
       .version = "v1",
       .plural = "events",
       .kind = "Event",
       .namespaced = true,
       .shortNames = {"ev"},
       .fieldLabels = {"regarding.kind", "regarding.namespace", "regarding.name", "regarding.uid",
                       "regarding.apiVersion", "regarding.resourceVersion", "regarding.fieldPath",
                       "reason", "reportingController", "type"}},
      {.group = "coordination.k8s.io",
       .version = "v1",
       .plural = "leases",
       .kind = "Lease",
       .namespaced = true},
      // Dynamic Resource Allocation's ResourceSlices (pkg/registry/resource/resourceslice).
      {.group = "resource.k8s.io",
       .version = "v1",
       .plural = "resourceslices",
       .kind = "ResourceSlice",
       .fieldLabels = {"spec.nodeName", "spec.driver"}},
      {.group = "resource.k8s.io",
       .version = "v1",
       .plural = "deviceclasses",
       .kind = "DeviceClass"},
      {.group = "resource.k8s.io",
       .version = "v1",
       .plural = "resourceclaims",
       .kind = "ResourceClaim",
       .namespaced = true,
       .status = true},
      // Admission webhook configurations: read on every write that goes through admission
      // (fake_apiserver_admission.cpp).
      {.group = "admissionregistration.k8s.io",
       .version = "v1",
       .plural = "mutatingwebhookconfigurations",
       .kind = "MutatingWebhookConfiguration",
       .categories = {"api-extensions"}},
      {.group = "admissionregistration.k8s.io",
       .version = "v1",
       .plural = "validatingwebhookconfigurations",
       .kind = "ValidatingWebhookConfiguration",
       .categories = {"api-extensions"}},
  };
  return kinds;
}

}  // namespace

void FakeApiServer::RegisterBuiltins() {
  for (const BuiltinKind& builtin : BuiltinKinds()) {
    ResourceType type;
    type.group = builtin.group;
    type.version = builtin.version;
    type.plural = builtin.plural;
    type.kind = builtin.kind;
    type.singular = builtin.kind;
    std::transform(type.singular.begin(), type.singular.end(), type.singular.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    type.listKind = builtin.kind + "List";
    type.namespaced = builtin.namespaced;
    type.statusSubresource = builtin.status;
    type.shortNames = builtin.shortNames;
    type.fieldLabels = builtin.fieldLabels;
    type.categories = builtin.categories;
    // Nodes may be created with their status; a Lease's strategy takes no unconditional update.
    type.statusOnCreate = type.plural == "nodes";
    type.requiresResourceVersion = type.plural == "leases";
    if (type.group == "events.k8s.io") type.storage = "/v1/events";
    auto shared = std::make_shared<const ResourceType>(std::move(type));
    types_[shared->group + "/" + shared->version + "/" + shared->plural] = shared;
  }
}

namespace internal {
namespace {

FieldError Invalid(const std::string& field, const json& value, const std::string& detail) {
  return {"FieldValueInvalid", field, "Invalid value: " + value.dump() + ": " + detail};
}

bool ValidQuantity(const json& value) {
  if (value.is_number()) return true;
  if (!value.is_string()) return false;
  static const std::regex quantity(
      R"(^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?$)");
  return std::regex_match(value.get<std::string>(), quantity);
}

bool NegativeQuantity(const json& value) {
  if (value.is_number()) return value.get<double>() < 0;
  return value.is_string() && !value.get<std::string>().empty() &&
         value.get<std::string>()[0] == '-';
}

// The `data` keys of ConfigMaps and Secrets (IsConfigMapKey).
void ValidateKeys(const json& object, const char* member, std::vector<FieldError>& errors) {
  static const std::regex key("^[-._a-zA-Z0-9]+$");
  const json members1 = object.value(member, json::object());
  for (const auto& [name, value] : members1.items()) {
    (void)value;
    if (!std::regex_match(name, key) || name == "." || name == ".." || name.size() > 253) {
      errors.push_back(Invalid(std::string(member) + "[" + name + "]", name,
                               "a valid config key must consist of alphanumeric characters, "
                               "'-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or "
                               "'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"));
    }
  }
}

// A body field of the wrong JSON type does not decode: 400, as the real decoder answers.
void RequireMapOfStrings(const json& object, const char* member, const std::string& kind) {
  if (!object.contains(member) || object[member].is_null()) return;
  auto refuse = [&](const std::string& what) {
    throw StatusError{400, "BadRequest",
                      kind + " in version \"v1\" cannot be handled as a " + kind +
                          ": json: cannot unmarshal " + what + " into Go struct field " + kind +
                          "." + member + " of type " +
                          (object[member].is_object() ? "string" : "map[string]string")};
  };
  if (!object[member].is_object()) refuse(std::string(object[member].type_name()));
  for (const auto& [name, value] : object[member].items()) {
    (void)name;
    if (!value.is_string()) refuse(std::string(value.type_name()));
  }
}

bool ValidBase64(const std::string& text) {
  static const std::regex base64("^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$");
  return std::regex_match(text, base64);
}

std::string Base64(const std::string& text) {
  static const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  auto byte = [&text](size_t i) -> unsigned {
    return i < text.size() ? static_cast<unsigned>(static_cast<unsigned char>(text[i])) : 0u;
  };
  std::string out;
  for (size_t i = 0; i < text.size(); i += 3) {
    unsigned n = (byte(i) << 16) | (byte(i + 1) << 8) | byte(i + 2);
    out += alphabet[(n >> 18) & 63];
    out += alphabet[(n >> 12) & 63];
    out += i + 1 < text.size() ? alphabet[(n >> 6) & 63] : '=';
    out += i + 2 < text.size() ? alphabet[n & 63] : '=';
  }
  return out;
}

// The fields events.k8s.io/v1 renames: {its name, the core name}.
constexpr std::pair<const char*, const char*> kEventRenames[] = {
    {"regarding", "involvedObject"},
    {"note", "message"},
    {"reportingController", "reportingComponent"},
    {"deprecatedSource", "source"},
    {"deprecatedFirstTimestamp", "firstTimestamp"},
    {"deprecatedLastTimestamp", "lastTimestamp"},
    {"deprecatedCount", "count"}};

// A Go zero value (absent, null, "", 0, {}) as absent, for comparisons as Go makes them.
json Normalized(const json& object, const char* member) {
  if (!object.is_object() || !object.contains(member)) return nullptr;
  const json& value = object[member];
  if ((value.is_string() && value.get<std::string>().empty()) ||
      (value.is_number() && value.get<double>() == 0) || (value.is_object() && value.empty())) {
    return nullptr;
  }
  return value;
}

// A MicroTime (`micro`) or Time field: absent or null is the zero time; a value that does not
// parse is a decode error (400), as for Leases.
bool TimeSet(const json& object, const char* member, bool micro) {
  if (!object.contains(member) || object[member].is_null()) return false;
  const auto parse = micro ? ParseMicroTime : ParseTimestamp;
  if (!object[member].is_string() || !parse(object[member].get<std::string>())) {
    throw StatusError{400, "BadRequest",
                      "Event in version \"v1\" cannot be handled as a Event: parsing time " +
                          object[member].dump() + " as \"2006-01-02T15:04:05.000000Z07:00\""};
  }
  return true;
}

std::string StringField(const json& object, const char* member) {
  return object.contains(member) && object[member].is_string() ? object[member].get<std::string>()
                                                               : "";
}

// validation.IsQualifiedName: [prefix/]name, a name of at most 63 characters.
std::vector<std::string> QualifiedNameErrors(const std::string& value) {
  static const std::regex name("^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$");
  static const std::regex subdomain(
      R"(^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$)");
  const std::string nameRegex =
      "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
      "end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
      "used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
  std::vector<std::string> errors;
  std::string namePart = value;
  if (auto slash = value.find('/'); slash != std::string::npos) {
    if (value.find('/', slash + 1) != std::string::npos) {
      return {
          "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and "
          "must start and end with an alphanumeric character (e.g. 'MyName',  or "
          "'my.name',  or '123-abc', regex used for validation is "
          "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix "
          "and '/' (e.g. 'example.com/MyName')"};
    }
    const std::string prefix = value.substr(0, slash);
    namePart = value.substr(slash + 1);
    if (prefix.empty()) {
      errors.push_back("prefix part must be non-empty");
    } else if (prefix.size() > 253 || !std::regex_match(prefix, subdomain)) {
      errors.push_back(
          "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
          "characters, '-' or '.', and must start and end with an alphanumeric character");
    }
  }
  if (namePart.empty()) {
    errors.push_back("name part must be non-empty");
  } else if (namePart.size() > 63) {
    errors.push_back("name part must be no more than 63 characters");
  }
  if (!std::regex_match(namePart, name)) errors.push_back(nameRegex);
  return errors;
}

// validateV1EventSeries: a series counts at least 2 and says when it was last seen.
void ValidateEventSeries(const json& event, std::vector<FieldError>& errors) {
  if (!event.contains("series") || event["series"].is_null()) return;
  const json& series = event["series"];
  const json count = series.is_object() ? series.value("count", json(0)) : json(0);
  if (!count.is_number() || count.get<double>() < 2) {
    errors.push_back(Invalid("series.count", "", "should be at least 2"));
  }
  if (!series.is_object() || !TimeSet(series, "lastObservedTime", true)) {
    errors.push_back({"FieldValueRequired", "series.lastObservedTime", "Required value"});
  }
}

// pkg/apis/core/validation/events.go on an Event in core form; field paths are the internal
// type's names (reportingController, not reportingComponent), as the real errors have them.
// `strict`: ValidateEventCreate's further rules for events.k8s.io/v1.
void ValidateEvent(const json& event, bool strict, std::vector<FieldError>& errors) {
  const std::string ns = event.value("metadata", json::object()).value("namespace", "");
  const json involvedObject = event.value("involvedObject", json::object());
  const std::string involved =
      involvedObject.is_object() ? StringField(involvedObject, "namespace") : "";
  const bool hasEventTime = TimeSet(event, "eventTime", true);
  auto mismatch = [&] {
    errors.push_back(
        Invalid("involvedObject.namespace", involved, "does not match event.namespace"));
  };
  // legacyValidateEvent.
  if (!hasEventTime) {
    // An old-style Event: its namespace is the involved object's ("" or "default" for a
    // cluster-scoped one).
    if (involved.empty() ? (!ns.empty() && ns != "default") : ns != involved) mismatch();
  } else {
    if (involved.empty() && ns != "default" && ns != "kube-system") mismatch();
    const std::string controller = StringField(event, "reportingComponent");
    if (controller.empty()) {
      errors.push_back({"FieldValueRequired", "reportingController", "Required value"});
    }
    for (const auto& message : QualifiedNameErrors(controller)) {
      errors.push_back(Invalid("reportingController", controller, message));
    }
    auto required = [&](const char* member, size_t limit) {
      const std::string value = StringField(event, member);
      if (value.empty()) errors.push_back({"FieldValueRequired", member, "Required value"});
      if (value.size() > limit) {
        errors.push_back(
            Invalid(member, "", "can have at most " + std::to_string(limit) + " characters"));
      }
    };
    required("reportingInstance", 128);
    required("action", 128);
    required("reason", 128);
    if (StringField(event, "message").size() > 1024) {
      errors.push_back(Invalid("message", "", "can have at most 1024 characters"));
    }
  }
  if (!strict) return;
  // ValidateEventCreate for events.k8s.io/v1.
  ValidateEventSeries(event, errors);
  if (!hasEventTime) errors.push_back({"FieldValueRequired", "eventTime", "Required value"});
  const std::string type = StringField(event, "type");
  if (type != "Normal" && type != "Warning") {
    errors.push_back(Invalid("type", "", "has invalid value: " + type));
  }
  for (const char* deprecated : {"firstTimestamp", "lastTimestamp"}) {
    if (TimeSet(event, deprecated, false))
      errors.push_back(Invalid(deprecated, "", "needs to be unset"));
  }
  if (!Normalized(event, "count").is_null()) {
    errors.push_back(Invalid("count", "", "needs to be unset"));
  }
  const json source = event.value("source", json::object());
  if (source.is_object() &&
      (!StringField(source, "component").empty() || !StringField(source, "host").empty())) {
    errors.push_back(Invalid("source", "", "needs to be unset"));
  }
}

}  // namespace

bool IsEventsV1(const std::string& group, const std::string& plural) {
  return group == "events.k8s.io" && plural == "events";
}

json ToStorage(const std::string& group, const std::string& plural, json object) {
  if (!IsEventsV1(group, plural) || !object.is_object()) return object;
  // The core names are unknown fields of events.k8s.io/v1: the decoder drops them.
  for (const auto& [mine, core] : kEventRenames) {
    (void)mine;
    object.erase(core);
  }
  for (const auto& [mine, core] : kEventRenames) {
    if (auto it = object.find(mine); it != object.end()) {
      json value = std::move(*it);
      object.erase(mine);
      object[core] = std::move(value);
    }
  }
  object["apiVersion"] = "v1";
  object["kind"] = "Event";
  return object;
}

json FromStorage(const std::string& group, const std::string& plural, json object) {
  if (!IsEventsV1(group, plural) || !object.is_object()) return object;
  if (object.value("apiVersion", json()) == "events.k8s.io/v1") return object;  // converted
  for (const auto& [mine, core] : kEventRenames) {
    (void)core;
    object.erase(mine);
  }
  for (const auto& [mine, core] : kEventRenames) {
    if (auto it = object.find(core); it != object.end()) {
      json value = std::move(*it);
      object.erase(core);
      object[mine] = std::move(value);
    }
  }
  object["apiVersion"] = "events.k8s.io/v1";
  object["kind"] = "Event";
  return object;
}

std::vector<FieldError> ValidateName(bool custom, bool label, const std::string& name) {
  std::vector<FieldError> errors;
  if (custom) {
    // Custom resources: any path segment name.
    if (name == "." || name == "..") {
      errors.push_back(Invalid("metadata.name", name, "may not be '" + name + "'"));
    }
    for (const char* bad : {"/", "%"}) {
      if (name.find(bad) != std::string::npos) {
        errors.push_back(
            Invalid("metadata.name", name, std::string("may not contain '") + bad + "'"));
      }
    }
    return errors;
  }
  static const std::regex labelPattern("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$");
  static const std::regex subdomainPattern(
      R"(^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$)");
  if (label) {
    if (name.size() > 63) {
      errors.push_back(Invalid("metadata.name", name, "must be no more than 63 characters"));
    }
    if (!std::regex_match(name, labelPattern)) {
      errors.push_back(Invalid(
          "metadata.name", name,
          "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or "
          "'-', and must start and end with an alphanumeric character (e.g. 'my-name',  or "
          "'123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"));
    }
    return errors;
  }
  if (name.size() > 253) {
    errors.push_back(Invalid("metadata.name", name, "must be no more than 253 characters"));
  }
  if (!std::regex_match(name, subdomainPattern)) {
    errors.push_back(Invalid(
        "metadata.name", name,
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
        "'-' or '.', and must start and end with an alphanumeric character (e.g. "
        "'example.com', regex used for validation is "
        "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"));
  }
  return errors;
}

// A ResourceSlice as the registry's strategy stores it: a device taint without timeAdded gets
// the time of the write; with the gate DRADeviceTaints off every taint is dropped.
void PrepareResourceSlice(json& object, bool deviceTaints) {
  if (!object.contains("spec") || !object["spec"].is_object()) return;
  json& devices = object["spec"]["devices"];
  if (!devices.is_array()) return;
  for (json& device : devices) {
    if (!device.is_object() || !device.contains("taints")) continue;
    if (!deviceTaints) {
      device.erase("taints");
      continue;
    }
    if (!device["taints"].is_array()) continue;
    for (json& taint : device["taints"]) {
      if (taint.is_object() && !taint.contains("timeAdded")) {
        taint["timeAdded"] = FormatTimestamp(std::chrono::system_clock::now());
      }
    }
  }
}

void PrepareBuiltin(const std::string& group, const std::string& plural, json& object) {
  if (!group.empty() || plural != "secrets") return;
  RequireMapOfStrings(object, "data", "Secret");
  RequireMapOfStrings(object, "stringData", "Secret");
  // Secrets: stringData is write-only, merged into data (base64) on every write.
  const json members2 = object.value("stringData", json::object());
  for (const auto& [name, value] : members2.items()) {
    object["data"][name] = Base64(value.get<std::string>());
  }
  object.erase("stringData");
  if (!object.contains("type") || object["type"] == "") object["type"] = "Opaque";
  const json members3 = object.value("data", json::object());
  for (const auto& [name, value] : members3.items()) {
    (void)name;
    if (!ValidBase64(value.get<std::string>())) {
      throw StatusError{400, "BadRequest",
                        "Secret in version \"v1\" cannot be handled as a Secret: illegal base64 "
                        "data at input byte 0"};
    }
  }
}

// validateResources of a webhook rule (pkg/apis/admissionregistration/validation): "*/*" stands
// alone; "*" with a plain resource, "r/*" with "r/x", "*/x" with "r/x" overlap and are refused.
void ValidateRuleResources(const json& resources, const std::string& field,
                           std::vector<FieldError>& errors) {
  if (!resources.is_array() || resources.empty()) {
    errors.push_back({"FieldValueRequired", field, "Required value"});
    return;
  }
  std::set<std::string> wildcardSubresources;  // r of "r/*"
  std::set<std::string> wildcardResources;     // x of "*/x"
  bool doubleWildcard = false, singleWildcard = false, plain = false;
  for (size_t i = 0; i < resources.size(); ++i) {
    const std::string item = resources[i].is_string() ? resources[i].get<std::string>() : "";
    const std::string at = field + "[" + std::to_string(i) + "]";
    if (item.empty()) {
      errors.push_back({"FieldValueRequired", at, "Required value"});
      continue;
    }
    if (item == "*/*") doubleWildcard = true;
    if (item == "*") singleWildcard = true;
    const auto slash = item.find('/');
    if (slash == std::string::npos) {
      plain = item != "*";
      continue;
    }
    const std::string resource = item.substr(0, slash), sub = item.substr(slash + 1);
    if (wildcardSubresources.count(resource)) {
      errors.push_back(
          Invalid(at, item, "if '" + resource + "/*' is present, must not specify " + item));
    }
    if (wildcardResources.count(sub)) {
      errors.push_back(
          Invalid(at, item, "if '*/" + sub + "' is present, must not specify " + item));
    }
    if (sub == "*") wildcardSubresources.insert(resource);
    if (resource == "*") wildcardResources.insert(sub);
  }
  if (resources.size() > 1 && doubleWildcard) {
    errors.push_back(
        Invalid(field, resources, "if '*/*' is present, must not specify other resources"));
  }
  if (singleWildcard && plain) {
    errors.push_back(Invalid(field, resources,
                             "if '*' is present, must not specify other resources without "
                             "subresources"));
  }
}

std::vector<FieldError> ValidateBuiltin(const std::string& group, const std::string& plural,
                                        const json& object) {
  std::vector<FieldError> errors;
  if (group == "admissionregistration.k8s.io" && plural.ends_with("webhookconfigurations")) {
    // Found by installing the chart into kube-apiserver: the fake took overlapping
    // resources that the real server refuses.
    const json webhooks = object.value("webhooks", json::array());
    for (size_t w = 0; w < webhooks.size(); ++w) {
      const json rules = webhooks[w].value("rules", json::array());
      for (size_t r = 0; r < rules.size(); ++r) {
        ValidateRuleResources(
            rules[r].value("resources", json::array()),
            "webhooks[" + std::to_string(w) + "].rules[" + std::to_string(r) + "].resources",
            errors);
      }
    }
  } else if (group.empty() && plural == "configmaps") {
    RequireMapOfStrings(object, "data", "ConfigMap");
    ValidateKeys(object, "data", errors);
    ValidateKeys(object, "binaryData", errors);
    size_t total = 0;
    for (const char* member : {"data", "binaryData"}) {
      const json members4 = object.value(member, json::object());
      for (const auto& [name, value] : members4.items()) {
        total += name.size() + (value.is_string() ? value.get<std::string>().size() : 0);
      }
    }
    const json members5 = object.value("binaryData", json::object());
    for (const auto& [name, value] : members5.items()) {
      (void)value;
      if (object.value("data", json::object()).contains(name)) {
        errors.push_back(
            Invalid("data[" + name + "]", name, "duplicate of key present in binaryData"));
      }
    }
    if (total > 1048576) {
      errors.push_back({"FieldValueTooLong", "", "Too long: must have at most 1048576 bytes"});
    }
  } else if (group.empty() && plural == "secrets") {
    ValidateKeys(object, "data", errors);
    const std::string type = object.value("type", "Opaque");
    auto require = [&](const char* key) {
      if (!object.value("data", json::object()).contains(key)) {
        errors.push_back(
            {"FieldValueRequired", std::string("data[") + key + "]", "Required value"});
      }
    };
    if (type == "kubernetes.io/tls") {
      require("tls.crt");
      require("tls.key");
    } else if (type == "kubernetes.io/dockerconfigjson") {
      require(".dockerconfigjson");
    }
  } else if (group.empty() && plural == "resourcequotas") {
    const json spec = object.value("spec", json::object());
    const json members6 = spec.value("hard", json::object());
    for (const auto& [name, value] : members6.items()) {
      if (!ValidQuantity(value)) {
        throw StatusError{400, "BadRequest",
                          "ResourceQuota in version \"v1\" cannot be handled as a "
                          "ResourceQuota: quantities must match the regular expression "
                          "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"};
      }
      if (NegativeQuantity(value)) {
        errors.push_back(
            Invalid("spec.hard[" + name + "]", value, "must be greater than or equal to 0"));
      }
    }
    static const std::set<std::string> scopes = {"Terminating",   "NotTerminating",
                                                 "BestEffort",    "NotBestEffort",
                                                 "PriorityClass", "CrossNamespacePodAffinity"};
    size_t index = 0;
    for (const auto& scope : spec.value("scopes", json::array())) {
      if (!scope.is_string() || !scopes.count(scope.get<std::string>())) {
        errors.push_back({"FieldValueNotSupported", "spec.scopes[" + std::to_string(index) + "]",
                          "Unsupported value: " + scope.dump()});
      }
      ++index;
    }
  } else if (group == "coordination.k8s.io" && plural == "leases") {
    const json spec = object.value("spec", json::object());
    if (spec.contains("leaseDurationSeconds") &&
        (!spec["leaseDurationSeconds"].is_number_integer() ||
         spec["leaseDurationSeconds"].get<int64_t>() <= 0)) {
      errors.push_back(Invalid("spec.leaseDurationSeconds", spec["leaseDurationSeconds"],
                               "must be greater than 0"));
    }
    if (spec.contains("leaseTransitions") && spec["leaseTransitions"].is_number_integer() &&
        spec["leaseTransitions"].get<int64_t>() < 0) {
      errors.push_back(Invalid("spec.leaseTransitions", spec["leaseTransitions"],
                               "must be greater than or equal to 0"));
    }
    for (const char* time : {"acquireTime", "renewTime"}) {
      if (spec.contains(time) && !spec[time].is_null() &&
          (!spec[time].is_string() || !ParseMicroTime(spec[time].get<std::string>()))) {
        throw StatusError{400, "BadRequest",
                          "Lease in version \"v1\" cannot be handled as a Lease: parsing time " +
                              spec[time].dump() + " as \"2006-01-02T15:04:05.000000Z07:00\""};
      }
    }
  } else if (plural == "events" && (group.empty() || IsEventsV1(group, plural))) {
    // In core form whichever API it came through (ToStorage).
    ValidateEvent(object, IsEventsV1(group, plural), errors);
  }
  return errors;
}

std::vector<FieldError> ValidateBuiltinUpdate(const std::string& group, const std::string& plural,
                                              json& object, const json& old) {
  PrepareBuiltin(group, plural, object);
  if (IsEventsV1(group, plural)) {
    // ValidateEventUpdate for events.k8s.io/v1 (both in core form): the legacy rules, a
    // changed series checked again, and most fields fixed once written.
    auto errors = ValidateBuiltin("", plural, object);
    if (Normalized(object, "series") != Normalized(old, "series")) {
      ValidateEventSeries(object, errors);
    }
    for (const auto& [member, path] : std::initializer_list<std::pair<const char*, const char*>>{
             {"involvedObject", "involvedObject"},
             {"reason", "reason"},
             {"message", "message"},
             {"source", "source"},
             {"firstTimestamp", "firstTimestamp"},
             {"lastTimestamp", "lastTimestamp"},
             {"count", "count"},
             {"type", "type"},
             {"eventTime", "eventTime"},
             {"action", "action"},
             {"related", "related"},
             {"reportingComponent", "reportingController"},
             {"reportingInstance", "reportingInstance"}}) {
      json now = Normalized(object, member);
      if (now != Normalized(old, member)) {
        errors.push_back(Invalid(path, now, "field is immutable"));
      }
    }
    return errors;
  }
  auto errors = ValidateBuiltin(group, plural, object);
  if (group.empty() && (plural == "configmaps" || plural == "secrets") &&
      old.value("immutable", false)) {
    for (const char* member : {"data", "binaryData"}) {
      if (object.value(member, json::object()) != old.value(member, json::object())) {
        errors.push_back({"FieldValueForbidden", member,
                          "Forbidden: field is immutable when `immutable` is set"});
      }
    }
    if (!object.value("immutable", false)) {
      errors.push_back({"FieldValueForbidden", "immutable",
                        "Forbidden: field is immutable when `immutable` is set"});
    }
  }
  if (group.empty() && plural == "secrets" &&
      object.value("type", "Opaque") != old.value("type", "Opaque")) {
    errors.push_back(Invalid("type", object.value("type", ""), "field is immutable"));
  }
  return errors;
}

}  // namespace internal

}  // namespace cozy::fake
