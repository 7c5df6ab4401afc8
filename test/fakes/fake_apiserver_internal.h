// What the fake API server's parts share (not for tests): the served kinds, the event
// history's entries, Status errors and the small helpers of every handler. The parts, by job:
// fake_apiserver.cpp (the server, control API, faults), fake_apiserver_store.cpp (objects,
// writes, deletion, finalizers, garbage collection, namespaces), fake_apiserver_kinds.cpp
// (built-in kinds and their validation), fake_apiserver_rest.cpp (the REST handlers),
// fake_apiserver_watch.cpp (watches), fake_apiserver_discovery.cpp (discovery and tables),
// fake_apiserver_admission.cpp (admission webhooks).
#pragma once

#include <httplib.h>

#include <cctype>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "test/fakes/fake_apiserver.h"
#include "test/fakes/fake_apiserver_logic.h"

namespace cozy::fake {
using nlohmann::json;

struct FakeApiServer::ResourceType {
  std::string group;
  std::string version;
  std::string plural;
  std::string singular;
  std::string kind;
  std::string listKind;
  bool namespaced = false;
  bool statusSubresource = false;
  bool statusOnCreate = false;  // nodes may be created with their status
  bool custom = false;
  bool requiresResourceVersion = false;  // a PUT must carry one (custom resources, Leases)
  std::vector<std::string> shortNames;
  std::vector<std::string> categories;
  json schema;                           // openAPIV3Schema of a custom resource
  json columns;                          // additionalPrinterColumns
  std::vector<std::string> fieldLabels;  // field selector labels beyond metadata.*
  std::string crdName;
  // The kind whose storage this one shares, as its key in types_ ("/v1/events": the real
  // server keeps events.k8s.io/v1 Events as core v1 Events); "" for storage of its own. Its
  // objects are stored, validated and sent to every watcher in that kind's form, and
  // converted on the way in and out (ToStorage, FromStorage).
  std::string storage;

  std::string ApiVersion() const { return group.empty() ? version : group + "/" + version; }
  std::string StoreKey() const {
    if (storage.empty()) return group + "/" + plural;
    return storage.substr(0, storage.find('/')) + storage.substr(storage.rfind('/'));
  }
  std::string Qualified() const { return group.empty() ? plural : plural + "." + group; }
};

struct FakeApiServer::Event {
  uint64_t resourceVersion;
  std::string storeKey;
  std::string type;
  json object;
};

struct FakeApiServer::Outcome {
  int status;
};

// One write as admission sees it (kubernetes/apiserver admission.Attributes).
struct FakeApiServer::Admission {
  std::shared_ptr<const ResourceType> type;
  std::string operation;  // CREATE, UPDATE (PUT and every PATCH), DELETE
  std::string subresource;
  std::string ns;
  std::string name;
  json object;     // null on DELETE
  json oldObject;  // null on CREATE
  bool dryRun = false;
  json options;  // CreateOptions, UpdateOptions or DeleteOptions (meta.k8s.io/v1)
  UserInfo user;
};

namespace internal {

// An error answered as a Status object.
struct StatusError {
  int code;
  std::string reason;
  std::string message;
  json details = json::object();
};

inline json StatusBody(int code, const std::string& reason, const std::string& message,
                       const json& details) {
  json status = {{"kind", "Status"},    {"apiVersion", "v1"}, {"metadata", json::object()},
                 {"status", "Failure"}, {"message", message}, {"reason", reason},
                 {"code", code}};
  if (!details.empty()) status["details"] = details;
  return status;
}

inline void SendJson(httplib::Response& response, int code, const json& body) {
  response.status = code;
  response.set_content(body.dump(), "application/json");
}

// A streamed answer (a watch, an endless fault body) goes out uncompressed, as kube-apiserver
// sends every watch (WatchServer.HandleHTTP: identity, flushed after each burst of events).
// cpp-httplib 0.11 compresses a chunked answer of type application/json whenever the request
// accepts gzip or br (kubectl's Go transport always does), and its compressors flush only at
// the end of the stream: every event would sit in zlib's buffer until the watch ends, so
// `kubectl delete`'s wait for the DELETED event timed out. cpp-httplib has no per-response
// switch; it reads the request's Accept-Encoding after the handler returns, and the Request is
// its own non-const object (Server::process_request), so dropping the header here is defined.
inline void StreamUncompressed(const httplib::Request& request) {
  const_cast<httplib::Request&>(request).headers.erase("Accept-Encoding");  // NOLINT
}

inline void SendPlainNotFound(httplib::Response& response) {
  // What the end of kube-apiserver's handler chain answers for a kind it does not serve.
  response.status = 404;
  response.set_content("404 page not found\n", "text/plain; charset=utf-8");
}

inline std::string PercentDecode(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() &&
        std::isxdigit(static_cast<unsigned char>(text[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(text[i + 2]))) {
      out.push_back(static_cast<char>(std::stoi(text.substr(i + 1, 2), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

inline std::vector<std::string> Split(const std::string& path) {
  std::vector<std::string> parts;
  std::stringstream stream(path);
  std::string part;
  while (std::getline(stream, part, '/')) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

inline bool ParamTrue(const httplib::Request& request, const char* name) {
  if (!request.has_param(name)) return false;
  std::string value = request.get_param_value(name);
  return value == "1" || value == "true" || value == "True";
}

inline std::string ObjectKey(const std::string& ns, const std::string& name) {
  return ns + "/" + name;
}

inline json Without(json object, std::initializer_list<const char*> metadataKeys) {
  if (object.contains("metadata") && object["metadata"].is_object()) {
    for (const char* key : metadataKeys) object["metadata"].erase(key);
  }
  return object;
}

// Everything outside metadata (and outside status where status is a subresource).
inline json SpecPart(json object, bool statusSubresource) {
  object.erase("metadata");
  if (statusSubresource) object.erase("status");
  return object;
}

// A 422 Invalid as apimachinery's NewInvalid words it: `<Kind>[.<group>] "<name>" is invalid:
// <field>: <message>` (several errors in brackets), each error a StatusCause.
inline StatusError InvalidError(const std::string& kind, const std::string& group,
                                const std::string& name, const std::vector<FieldError>& errors) {
  json causes = json::array();
  std::string text;
  for (const auto& error : errors) {
    causes.push_back(
        {{"reason", error.reason}, {"field", error.field}, {"message", error.message}});
    text += (text.empty() ? "" : ", ") + error.field + ": " + error.message;
  }
  if (errors.size() > 1) text = "[" + text + "]";
  std::string qualified = group.empty() ? kind : kind + "." + group;
  return StatusError{422,
                     "Invalid",
                     qualified + " \"" + name + "\" is invalid: " + text,
                     {{"name", name}, {"group", group}, {"kind", kind}, {"causes", causes}}};
}

inline bool IsDeleting(const json& object) {
  return object.contains("metadata") && object["metadata"].contains("deletionTimestamp") &&
         !object["metadata"]["deletionTimestamp"].is_null();
}

inline std::vector<std::string> Finalizers(const json& object) {
  std::vector<std::string> out;
  if (!object.contains("metadata")) return out;
  for (const auto& value : object["metadata"].value("finalizers", json::array())) {
    if (value.is_string()) out.push_back(value.get<std::string>());
  }
  return out;
}

inline std::string NameOfKey(const std::string& key) { return key.substr(key.find('/') + 1); }

// Built-in kinds (fake_apiserver_kinds.cpp). Names: custom resources take any path segment,
// namespaces an RFC 1123 label, the rest an RFC 1123 subdomain.
std::vector<FieldError> ValidateName(bool custom, bool label, const std::string& name);
// Defaulting and conversion on every write (Secrets: stringData into data, type Opaque);
// throws a 400 StatusError for a body that would not decode.
void PrepareBuiltin(const std::string& group, const std::string& plural, json& object);
void PrepareResourceSlice(json& object, bool deviceTaints);
std::vector<FieldError> ValidateBuiltin(const std::string& group, const std::string& plural,
                                        const json& object);
// An object as the storage of its kind keeps it, and back: events.k8s.io/v1 Events are core v1
// Events with fields renamed (pkg/apis/events/v1/conversion.go: regarding/involvedObject,
// note/message, reportingController/reportingComponent, deprecatedSource/source,
// deprecatedFirstTimestamp/firstTimestamp, deprecatedLastTimestamp/lastTimestamp,
// deprecatedCount/count). The identity for every other kind.
bool IsEventsV1(const std::string& group, const std::string& plural);
json ToStorage(const std::string& group, const std::string& plural, json object);
json FromStorage(const std::string& group, const std::string& plural, json object);
// PrepareBuiltin, ValidateBuiltin and the update-only rules (immutable fields).
std::vector<FieldError> ValidateBuiltinUpdate(const std::string& group, const std::string& plural,
                                              json& object, const json& old);

struct Selectors {
  std::optional<LabelSelector> labels;
  std::vector<FieldRequirement> fields;

  bool Matches(const json& object) const {
    if (labels && !labels->Matches(object["metadata"].value("labels", json::object()))) {
      return false;
    }
    for (const auto& requirement : fields) {
      bool equal = FieldValue(object, requirement.field) == requirement.value;
      if (equal != requirement.equals) return false;
    }
    return true;
  }
};

}  // namespace internal
}  // namespace cozy::fake
