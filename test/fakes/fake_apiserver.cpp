#include "test/fakes/fake_apiserver.h"

#include <httplib.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <limits>
#include <sstream>

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
  std::vector<std::string> shortNames;
  std::vector<std::string> categories;
  json schema;                           // openAPIV3Schema of a custom resource
  json columns;                          // additionalPrinterColumns
  std::vector<std::string> fieldLabels;  // field selector labels beyond metadata.*
  std::string crdName;

  std::string ApiVersion() const { return group.empty() ? version : group + "/" + version; }
  std::string StoreKey() const { return group + "/" + plural; }
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

namespace {

// An error answered as a Status object.
struct StatusError {
  int code;
  std::string reason;
  std::string message;
  json details = json::object();
};

json StatusBody(int code, const std::string& reason, const std::string& message,
                const json& details) {
  json status = {{"kind", "Status"},    {"apiVersion", "v1"}, {"metadata", json::object()},
                 {"status", "Failure"}, {"message", message}, {"reason", reason},
                 {"code", code}};
  if (!details.empty()) status["details"] = details;
  return status;
}

void SendJson(httplib::Response& response, int code, const json& body) {
  response.status = code;
  response.set_content(body.dump(), "application/json");
}

void SendPlainNotFound(httplib::Response& response) {
  // What the end of kube-apiserver's handler chain answers for a kind it does not serve.
  response.status = 404;
  response.set_content("404 page not found\n", "text/plain; charset=utf-8");
}

std::string PercentDecode(const std::string& text) {
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

std::vector<std::string> Split(const std::string& path) {
  std::vector<std::string> parts;
  std::stringstream stream(path);
  std::string part;
  while (std::getline(stream, part, '/')) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

bool ParamTrue(const httplib::Request& request, const char* name) {
  if (!request.has_param(name)) return false;
  std::string value = request.get_param_value(name);
  return value == "1" || value == "true" || value == "True";
}

std::string ObjectKey(const std::string& ns, const std::string& name) { return ns + "/" + name; }

json Without(json object, std::initializer_list<const char*> metadataKeys) {
  if (object.contains("metadata") && object["metadata"].is_object()) {
    for (const char* key : metadataKeys) object["metadata"].erase(key);
  }
  return object;
}

// Everything outside metadata (and outside status where status is a subresource).
json SpecPart(json object, bool statusSubresource) {
  object.erase("metadata");
  if (statusSubresource) object.erase("status");
  return object;
}

}  // namespace

Fault Fault::Answer(int status, int count, std::string method, int retryAfterSeconds) {
  Fault fault;
  fault.status = status;
  fault.count = count;
  fault.method = std::move(method);
  fault.retryAfterSeconds = retryAfterSeconds;
  return fault;
}

Fault Fault::Drop(int count, std::string method) {
  Fault fault;
  fault.dropConnection = true;
  fault.count = count;
  fault.method = std::move(method);
  return fault;
}

namespace {

constexpr std::pair<FaultMode, std::string_view> kFaultModes[] = {
    {FaultMode::kNone, ""},
    {FaultMode::kListResourceVersionNumber, "listResourceVersionNumber"},
    {FaultMode::kListItemsNotArray, "listItemsNotArray"},
    {FaultMode::kListWithoutMetadata, "listWithoutMetadata"},
    {FaultMode::kWatchResourceVersionNumber, "watchResourceVersionNumber"},
    {FaultMode::kWatchMetadataMissing, "watchMetadataMissing"},
    {FaultMode::kWatchObjectNotObject, "watchObjectNotObject"},
    {FaultMode::kWatchUnknownType, "watchUnknownType"},
    {FaultMode::kWatchNotJson, "watchNotJson"},
    {FaultMode::kWatchErrorWrongTypes, "watchErrorWrongTypes"},
    {FaultMode::kWatchCloseAtOnce, "watchCloseAtOnce"},
    {FaultMode::kEndlessBody, "endlessBody"},
    {FaultMode::kEndlessString, "endlessString"},
};

bool IsListMode(FaultMode mode) {
  return mode == FaultMode::kListResourceVersionNumber || mode == FaultMode::kListItemsNotArray ||
         mode == FaultMode::kListWithoutMetadata;
}

bool IsWatchMode(FaultMode mode) {
  return mode == FaultMode::kWatchResourceVersionNumber ||
         mode == FaultMode::kWatchMetadataMissing || mode == FaultMode::kWatchObjectNotObject ||
         mode == FaultMode::kWatchUnknownType || mode == FaultMode::kWatchNotJson ||
         mode == FaultMode::kWatchErrorWrongTypes || mode == FaultMode::kWatchCloseAtOnce;
}

// IMF-fixdate (RFC 9110 §5.6.7), spelled out so no locale can change it.
std::string HttpDate(std::chrono::system_clock::time_point when) {
  static const char* days[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
  static const char* months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                 "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  time_t seconds = std::chrono::system_clock::to_time_t(when);
  tm utc{};
  gmtime_r(&seconds, &utc);
  char text[64];
  std::snprintf(text, sizeof text, "%s, %02d %s %04d %02d:%02d:%02d GMT", days[utc.tm_wday % 7],
                utc.tm_mday, months[utc.tm_mon % 12], utc.tm_year + 1900, utc.tm_hour, utc.tm_min,
                utc.tm_sec);
  return text;
}

}  // namespace

std::string_view FaultModeName(FaultMode mode) {
  for (const auto& [known, name] : kFaultModes) {
    if (known == mode) return name;
  }
  return "";
}

FaultMode ParseFaultMode(std::string_view name) {
  std::string names;
  for (const auto& [mode, known] : kFaultModes) {
    if (known == name) return mode;
    if (!known.empty()) names += (names.empty() ? "" : ", ") + std::string(known);
  }
  throw std::invalid_argument("unknown fault mode \"" + std::string(name) + "\" (known: " + names +
                              ")");
}

Fault Fault::Mode(FaultMode mode, int count, std::string pathPrefix) {
  Fault fault;
  fault.mode = mode;
  fault.count = count;
  fault.pathPrefix = std::move(pathPrefix);
  return fault;
}

Fault Fault::FromJson(const json& value) {
  if (!value.is_object()) throw std::invalid_argument("a fault is a JSON object");
  Fault fault;
  auto wrongType = [](const std::string& key, const char* wanted, const json& field) {
    return std::invalid_argument("fault field \"" + key + "\" must be " + wanted + ", not " +
                                 std::string(field.type_name()));
  };
  for (const auto& [key, field] : value.items()) {
    auto text = [&](std::string& out) {
      if (!field.is_string()) throw wrongType(key, "a string", field);
      out = field.get<std::string>();
    };
    auto flag = [&](bool& out) {
      if (!field.is_boolean()) throw wrongType(key, "true or false", field);
      out = field.get<bool>();
    };
    auto number = [&](int& out) {
      if (!field.is_number_integer() || field.get<int64_t>() < -1 ||
          field.get<int64_t>() > std::numeric_limits<int>::max()) {
        throw wrongType(key, "an integer from -1 to 2147483647", field);
      }
      out = field.get<int>();
    };
    if (key == "method") {
      text(fault.method);
    } else if (key == "pathPrefix") {
      text(fault.pathPrefix);
    } else if (key == "watchOnly") {
      flag(fault.watchOnly);
    } else if (key == "status") {
      number(fault.status);
    } else if (key == "retryAfterSeconds") {
      number(fault.retryAfterSeconds);
    } else if (key == "retryAfterHttpDate") {
      flag(fault.retryAfterHttpDate);
    } else if (key == "retryAfterRaw") {
      text(fault.retryAfterRaw);
    } else if (key == "latencyMs") {
      number(fault.latencyMs);
    } else if (key == "dropConnection") {
      flag(fault.dropConnection);
    } else if (key == "mode") {
      std::string name;
      text(name);
      fault.mode = ParseFaultMode(name);
    } else if (key == "count") {
      number(fault.count);
    } else {
      throw std::invalid_argument("unknown fault field \"" + key + "\"");
    }
  }
  return fault;
}

json Fault::ToJson() const {
  return {{"method", method},
          {"pathPrefix", pathPrefix},
          {"watchOnly", watchOnly},
          {"status", status},
          {"retryAfterSeconds", retryAfterSeconds},
          {"retryAfterHttpDate", retryAfterHttpDate},
          {"retryAfterRaw", retryAfterRaw},
          {"latencyMs", latencyMs},
          {"dropConnection", dropConnection},
          {"mode", std::string(FaultModeName(mode))},
          {"count", count}};
}

json LoggedRequest::ToJson() const {
  return {{"method", method},           {"path", path},     {"query", query},
          {"contentType", contentType}, {"accept", accept}, {"body", body},
          {"bearerToken", bearerToken}, {"status", status}, {"fault", fault},
          {"bytesSent", bytesSent}};
}

FakeApiServer::FakeApiServer(FakeApiServerOptions options) : options_(std::move(options)) {
  RegisterBuiltins();
  for (const auto& path : options_.crdPaths) {
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(path)) {
      for (const auto& entry : std::filesystem::directory_iterator(path)) {
        auto extension = entry.path().extension();
        if (extension == ".yaml" || extension == ".yml" || extension == ".json") {
          files.push_back(entry.path());
        }
      }
      std::sort(files.begin(), files.end());
    } else {
      files.push_back(path);
    }
    for (const auto& file : files) {
      for (const auto& document : YamlFileToJson(file)) {
        if (document.value("kind", "") == "CustomResourceDefinition") LoadCrd(document);
      }
    }
  }
}

FakeApiServer::~FakeApiServer() { Stop(); }

void FakeApiServer::RegisterBuiltins() {
  auto add = [this](ResourceType type) {
    auto shared = std::make_shared<const ResourceType>(std::move(type));
    types_[shared->group + "/" + shared->version + "/" + shared->plural] = shared;
  };
  ResourceType nodes;
  nodes.version = "v1";
  nodes.plural = "nodes";
  nodes.singular = "node";
  nodes.kind = "Node";
  nodes.listKind = "NodeList";
  nodes.statusSubresource = true;
  nodes.statusOnCreate = true;
  nodes.shortNames = {"no"};
  nodes.fieldLabels = {"spec.unschedulable"};
  add(nodes);
  ResourceType pods;
  pods.version = "v1";
  pods.plural = "pods";
  pods.singular = "pod";
  pods.kind = "Pod";
  pods.listKind = "PodList";
  pods.namespaced = true;
  pods.statusSubresource = true;
  pods.shortNames = {"po"};
  pods.categories = {"all"};
  pods.fieldLabels = {"spec.nodeName",           "spec.restartPolicy", "spec.schedulerName",
                      "spec.serviceAccountName", "status.phase",       "status.podIP",
                      "status.nominatedNodeName"};
  add(pods);
  ResourceType namespaces;
  namespaces.version = "v1";
  namespaces.plural = "namespaces";
  namespaces.singular = "namespace";
  namespaces.kind = "Namespace";
  namespaces.listKind = "NamespaceList";
  namespaces.statusSubresource = true;
  namespaces.shortNames = {"ns"};
  namespaces.fieldLabels = {"status.phase"};
  add(namespaces);
  ResourceType crds;
  crds.group = "apiextensions.k8s.io";
  crds.version = "v1";
  crds.plural = "customresourcedefinitions";
  crds.singular = "customresourcedefinition";
  crds.kind = "CustomResourceDefinition";
  crds.listKind = "CustomResourceDefinitionList";
  crds.statusSubresource = true;
  crds.shortNames = {"crd", "crds"};
  add(crds);
}

void FakeApiServer::RegisterCrdLocked(const json& crd) {
  const json& spec = crd.at("spec");
  const json& names = spec.at("names");
  std::string name = crd.at("metadata").at("name").get<std::string>();
  UnregisterCrdLocked(name);
  for (const auto& version : spec.at("versions")) {
    if (!version.value("served", true)) continue;
    ResourceType type;
    type.custom = true;
    type.crdName = name;
    type.group = spec.at("group").get<std::string>();
    type.version = version.at("name").get<std::string>();
    type.plural = names.at("plural").get<std::string>();
    type.singular = names.value("singular", "");
    if (type.singular.empty()) {
      type.singular = names.at("kind").get<std::string>();
      std::transform(type.singular.begin(), type.singular.end(), type.singular.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    }
    type.kind = names.at("kind").get<std::string>();
    type.listKind = names.value("listKind", type.kind + "List");
    type.namespaced = spec.value("scope", "Namespaced") == "Namespaced";
    type.shortNames = names.value("shortNames", std::vector<std::string>{});
    type.categories = names.value("categories", std::vector<std::string>{});
    type.statusSubresource =
        version.contains("subresources") && version["subresources"].contains("status");
    if (version.contains("schema"))
      type.schema = version["schema"].value("openAPIV3Schema", json());
    type.columns = version.value("additionalPrinterColumns", json::array());
    for (const auto& field : version.value("selectableFields", json::array())) {
      std::string path = field.value("jsonPath", "");
      if (!path.empty() && path.front() == '.') path.erase(0, 1);
      type.fieldLabels.push_back(path);
    }
    auto shared = std::make_shared<const ResourceType>(std::move(type));
    types_[shared->group + "/" + shared->version + "/" + shared->plural] = shared;
  }
}

void FakeApiServer::UnregisterCrdLocked(const std::string& name) {
  for (auto it = types_.begin(); it != types_.end();) {
    if (it->second->custom && it->second->crdName == name) {
      it = types_.erase(it);
    } else {
      ++it;
    }
  }
}

void FakeApiServer::LoadCrd(const json& crd) {
  std::lock_guard lock(mutex_);
  auto type = types_.at("apiextensions.k8s.io/v1/customresourcedefinitions");
  std::string name = crd.at("metadata").at("name").get<std::string>();
  auto& store = objects_[type->StoreKey()];
  if (store.count(ObjectKey("", name))) {
    json old = store[ObjectKey("", name)];
    json updated = crd;
    updated["metadata"] = old["metadata"];
    WriteLocked(*type, ObjectKey("", name), old, updated, false);
  } else {
    CreateLocked(*type, "", crd, false);
  }
}

void FakeApiServer::DeleteCrd(const std::string& name) {
  std::lock_guard lock(mutex_);
  auto type = types_.at("apiextensions.k8s.io/v1/customresourcedefinitions");
  auto& store = objects_[type->StoreKey()];
  auto it = store.find(ObjectKey("", name));
  if (it == store.end()) return;
  json crd = it->second;
  store.erase(it);
  crd["metadata"]["resourceVersion"] = std::to_string(++resourceVersion_);
  RecordEventLocked(*type, "DELETED", crd);
  std::string group = crd["spec"].value("group", "");
  std::string plural = crd["spec"]["names"].value("plural", "");
  for (auto& [key, object] : objects_[group + "/" + plural]) {
    (void)key;
    for (const auto& [typeKey, candidate] : types_) {
      (void)typeKey;
      if (candidate->crdName == name) {
        object["metadata"]["resourceVersion"] = std::to_string(++resourceVersion_);
        RecordEventLocked(*candidate, "DELETED", object);
        break;
      }
    }
  }
  objects_.erase(group + "/" + plural);
  UnregisterCrdLocked(name);
}

std::shared_ptr<const FakeApiServer::ResourceType> FakeApiServer::FindType(
    const std::string& group, const std::string& version, const std::string& plural) const {
  auto it = types_.find(group + "/" + version + "/" + plural);
  return it == types_.end() ? nullptr : it->second;
}

void FakeApiServer::RecordEventLocked(const ResourceType& type, const std::string& eventType,
                                      const json& object) {
  uint64_t version = std::stoull(object["metadata"].value("resourceVersion", "0"));
  history_.push_back(
      std::make_shared<const Event>(Event{version, type.StoreKey(), eventType, object}));
  while (history_.size() > options_.historyLimit) {
    compactedThrough_ = history_.front()->resourceVersion;
    history_.pop_front();
  }
  changed_.notify_all();
}

json FakeApiServer::CreateLocked(const ResourceType& type, const std::string& ns, json object,
                                 bool validate) {
  if (!object.is_object()) throw StatusError{400, "BadRequest", "the body is not an object"};
  json& metadata = object["metadata"];
  if (!metadata.is_object()) metadata = json::object();
  std::string name = metadata.value("name", "");
  if (name.empty() && !metadata.value("generateName", "").empty()) {
    name = metadata["generateName"].get<std::string>() + std::to_string(++uidCounter_);
  }
  if (name.empty()) {
    throw StatusError{422,
                      "Invalid",
                      type.kind +
                          " \"\" is invalid: metadata.name: Required value: name or "
                          "generateName is required",
                      {{"kind", type.plural},
                       {"group", type.group},
                       {"causes", json::array({{{"reason", "FieldValueRequired"},
                                                {"field", "metadata.name"},
                                                {"message", "Required value"}}})}}};
  }
  if (type.namespaced) {
    std::string bodyNs = metadata.value("namespace", "");
    if (!bodyNs.empty() && bodyNs != ns) {
      throw StatusError{400, "BadRequest",
                        "the namespace of the provided object does not match the namespace "
                        "sent on the request"};
    }
    metadata["namespace"] = ns;
  } else {
    metadata.erase("namespace");
  }
  auto& store = objects_[type.StoreKey()];
  std::string key = ObjectKey(type.namespaced ? ns : "", name);
  if (store.count(key)) {
    throw StatusError{409,
                      "AlreadyExists",
                      type.Qualified() + " \"" + name + "\" already exists",
                      {{"name", name}, {"group", type.group}, {"kind", type.plural}}};
  }
  object["apiVersion"] = type.ApiVersion();
  object["kind"] = type.kind;
  metadata["name"] = name;
  metadata["uid"] = "00000000-0000-4000-8000-" + [this] {
    char text[13];
    std::snprintf(text, sizeof text, "%012llu", static_cast<unsigned long long>(++uidCounter_));
    return std::string(text);
  }();
  metadata["creationTimestamp"] = FormatTimestamp(std::chrono::system_clock::now());
  metadata["generation"] = 1;
  metadata.erase("deletionTimestamp");
  metadata.erase("managedFields");
  if (validate && type.statusSubresource && !type.statusOnCreate) {
    // The status strategy: a create carries no status (a pod starts Pending).
    object.erase("status");
    if (type.plural == "pods") object["status"] = {{"phase", "Pending"}};
  }
  if (type.plural == "customresourcedefinitions") {
    object["status"] = {
        {"conditions", json::array({{{"type", "NamesAccepted"}, {"status", "True"}},
                                    {{"type", "Established"}, {"status", "True"}}})},
        {"acceptedNames", object["spec"].value("names", json::object())},
        {"storedVersions", json::array()}};
  }
  if (type.custom) {
    PruneUnknownFields(object, type.schema);
    if (validate) {
      auto errors = ValidateAgainstSchema(object, type.schema);
      if (!errors.empty()) {
        json causes = json::array();
        std::string text;
        for (const auto& error : errors) {
          causes.push_back(
              {{"reason", error.reason}, {"field", error.field}, {"message", error.message}});
          text += (text.empty() ? "" : ", ") + error.field + ": " + error.message;
        }
        throw StatusError{
            422,
            "Invalid",
            type.kind + "." + type.group + " \"" + name + "\" is invalid: [" + text + "]",
            {{"name", name}, {"group", type.group}, {"kind", type.kind}, {"causes", causes}}};
      }
    }
  }
  metadata["resourceVersion"] = std::to_string(++resourceVersion_);
  store[key] = object;
  RecordEventLocked(type, "ADDED", object);
  if (type.plural == "customresourcedefinitions") RegisterCrdLocked(object);
  return object;
}

json FakeApiServer::WriteLocked(const ResourceType& type, const std::string& key, const json& old,
                                json updated, bool statusWrite) {
  json result;
  if (statusWrite) {
    // /status: everything but status comes from the stored object.
    result = old;
    if (updated.contains("status")) {
      result["status"] = updated["status"];
    } else {
      result.erase("status");
    }
  } else {
    result = std::move(updated);
    if (!result.contains("metadata") || !result["metadata"].is_object()) {
      result["metadata"] = json::object();
    }
    if (type.statusSubresource) {
      // The main resource ignores status changes.
      if (old.contains("status")) {
        result["status"] = old["status"];
      } else {
        result.erase("status");
      }
    }
    for (const char* immutable : {"name", "namespace", "uid", "creationTimestamp", "generation"}) {
      if (old["metadata"].contains(immutable)) {
        result["metadata"][immutable] = old["metadata"][immutable];
      } else {
        result["metadata"].erase(immutable);
      }
    }
    result["apiVersion"] = type.ApiVersion();
    result["kind"] = type.kind;
  }
  if (type.custom) {
    PruneUnknownFields(result, type.schema);
    auto errors = ValidateAgainstSchema(result, type.schema);
    if (!errors.empty()) {
      json causes = json::array();
      std::string text;
      for (const auto& error : errors) {
        causes.push_back(
            {{"reason", error.reason}, {"field", error.field}, {"message", error.message}});
        text += (text.empty() ? "" : ", ") + error.field + ": " + error.message;
      }
      std::string name = old["metadata"].value("name", "");
      throw StatusError{
          422,
          "Invalid",
          type.kind + "." + type.group + " \"" + name + "\" is invalid: [" + text + "]",
          {{"name", name}, {"group", type.group}, {"kind", type.kind}, {"causes", causes}}};
    }
  }
  // A write that changes nothing is not stored: no new resourceVersion, no event.
  if (Without(result, {"resourceVersion", "managedFields"}) ==
      Without(old, {"resourceVersion", "managedFields"})) {
    return old;
  }
  if (SpecPart(result, type.statusSubresource) != SpecPart(old, type.statusSubresource)) {
    result["metadata"]["generation"] = old["metadata"].value("generation", 1) + 1;
  }
  result["metadata"]["resourceVersion"] = std::to_string(++resourceVersion_);
  objects_[type.StoreKey()][key] = result;
  RecordEventLocked(type, "MODIFIED", result);
  if (type.plural == "customresourcedefinitions") RegisterCrdLocked(result);
  return result;
}

void FakeApiServer::Start() {
  // A client that hangs up mid-answer (every endless mode ends so) must cost a failed write,
  // not the process: cpp-httplib sends without MSG_NOSIGNAL.
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    std::signal(SIGPIPE, SIG_IGN);
  }
  {
    std::lock_guard lock(mutex_);
    requestDelay_ = options_.requestDelay;
  }
  server_ = std::make_unique<httplib::Server>();
  // Watches hold a thread each for as long as they stream.
  server_->new_task_queue = [] { return new httplib::ThreadPool(64); };
  server_->set_keep_alive_max_count(1000);
  // As Go's net/http (the real API server) does: without it an answer written in two pieces
  // waits for the client's delayed ACK, up to 200 ms per request on a kept-alive connection.
  server_->set_tcp_nodelay(true);
  auto handler = [this](const httplib::Request& request, httplib::Response& response) {
    Serve(request, response);
  };
  server_->Get(".*", handler);
  server_->Post(".*", handler);
  server_->Put(".*", handler);
  server_->Patch(".*", handler);
  server_->Delete(".*", handler);
  if (options_.port == 0) {
    port_ = server_->bind_to_any_port(options_.host);
  } else {
    port_ = server_->bind_to_port(options_.host, options_.port) ? options_.port : -1;
  }
  if (port_ <= 0) {
    throw std::runtime_error("fake API server: cannot bind " + options_.host + ":" +
                             std::to_string(options_.port));
  }
  {
    std::lock_guard lock(mutex_);
    stopping_ = false;
  }
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  while (!server_->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void FakeApiServer::Stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
  server_.reset();
}

std::string FakeApiServer::url() const {
  return "http://" + options_.host + ":" + std::to_string(port_);
}

std::string FakeApiServer::Kubeconfig(const std::string& token) const {
  std::string text =
      "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
      "clusters:\n- name: fake\n  cluster:\n    server: " +
      url() +
      "\n"
      "contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n"
      "users:\n- name: fake\n  user:\n";
  text += token.empty() ? "    {}\n" : "    token: " + token + "\n";
  return text;
}

void FakeApiServer::AddFault(const Fault& fault) {
  std::lock_guard lock(mutex_);
  faults_.push_back(fault);
}

void FakeApiServer::ClearFaults() {
  std::lock_guard lock(mutex_);
  faults_.clear();
}

void FakeApiServer::SetRequestDelay(std::chrono::milliseconds delay) {
  std::lock_guard lock(mutex_);
  requestDelay_ = std::max(delay, std::chrono::milliseconds(0));
}

std::chrono::milliseconds FakeApiServer::RequestDelay() const {
  std::lock_guard lock(mutex_);
  return requestDelay_;
}

void FakeApiServer::WaitUnlessStopping(std::chrono::milliseconds delay) {
  if (delay <= std::chrono::milliseconds(0)) return;
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, delay, [this] { return stopping_; });
}

std::vector<LoggedRequest> FakeApiServer::Requests() const {
  std::lock_guard lock(mutex_);
  return log_;
}

void FakeApiServer::ClearRequests() {
  std::lock_guard lock(mutex_);
  log_.clear();
}

void FakeApiServer::SetAcceptedTokens(std::set<std::string> tokens) {
  std::lock_guard lock(mutex_);
  acceptedTokens_ = std::move(tokens);
}

void FakeApiServer::DropWatches() {
  std::lock_guard lock(mutex_);
  ++dropGeneration_;
  changed_.notify_all();
}

void FakeApiServer::ExpireWatches() {
  std::lock_guard lock(mutex_);
  ++expireGeneration_;
  compactedThrough_ = resourceVersion_;
  history_.clear();
  changed_.notify_all();
}

void FakeApiServer::Compact() {
  std::lock_guard lock(mutex_);
  compactedThrough_ = resourceVersion_;
  history_.clear();
}

json FakeApiServer::Seed(const json& object) {
  std::lock_guard lock(mutex_);
  std::string apiVersion = object.value("apiVersion", "v1");
  std::string group;
  std::string version = apiVersion;
  if (auto slash = apiVersion.find('/'); slash != std::string::npos) {
    group = apiVersion.substr(0, slash);
    version = apiVersion.substr(slash + 1);
  }
  std::string kind = object.value("kind", "");
  for (const auto& [key, type] : types_) {
    (void)key;
    if (type->group == group && type->version == version && type->kind == kind) {
      std::string ns = type->namespaced ? object["metadata"].value("namespace", "default") : "";
      return CreateLocked(*type, ns, object, false);
    }
  }
  throw std::invalid_argument("fake API server: no served kind " + apiVersion + " " + kind);
}

json FakeApiServer::Object(const std::string& apiVersion, const std::string& plural,
                           const std::string& ns, const std::string& name) const {
  std::lock_guard lock(mutex_);
  std::string group =
      apiVersion.find('/') == std::string::npos ? "" : apiVersion.substr(0, apiVersion.find('/'));
  auto store = objects_.find(group + "/" + plural);
  if (store == objects_.end()) return nullptr;
  auto it = store->second.find(ObjectKey(ns, name));
  return it == store->second.end() ? json(nullptr) : it->second;
}

std::string FakeApiServer::CurrentResourceVersion() const {
  std::lock_guard lock(mutex_);
  return std::to_string(resourceVersion_);
}

bool FakeApiServer::HandleControl(const httplib::Request& request, httplib::Response& response) {
  const std::string& path = request.path;
  const std::string& method = request.method;
  try {
    if (path == "/_fake/requests" && method == "GET") {
      json list = json::array();
      for (const auto& entry : Requests()) list.push_back(entry.ToJson());
      SendJson(response, 200, list);
    } else if (path == "/_fake/requests" && method == "DELETE") {
      ClearRequests();
      SendJson(response, 200, json::object());
    } else if (path == "/_fake/faults" && method == "POST") {
      AddFault(Fault::FromJson(json::parse(request.body)));
      SendJson(response, 200, json::object());
    } else if (path == "/_fake/faults" && method == "DELETE") {
      ClearFaults();
      SendJson(response, 200, json::object());
    } else if (path == "/_fake/faults" && method == "GET") {
      std::lock_guard lock(mutex_);
      json list = json::array();
      for (const auto& fault : faults_) list.push_back(fault.ToJson());
      SendJson(response, 200, list);
    } else if (path == "/_fake/delay" && method == "PUT") {
      json body = json::parse(request.body);
      const auto ms = body.find("ms");
      if (!body.is_object() || ms == body.end() || !ms->is_number_integer() ||
          ms->get<int64_t>() < 0 || ms->get<int64_t>() > std::numeric_limits<int>::max()) {
        throw std::invalid_argument("the delay is {\"ms\": a non-negative integer}");
      }
      SetRequestDelay(std::chrono::milliseconds(ms->get<int64_t>()));
      SendJson(response, 200, {{"ms", RequestDelay().count()}});
    } else if (path == "/_fake/delay" && method == "GET") {
      SendJson(response, 200, {{"ms", RequestDelay().count()}});
    } else if (path == "/_fake/watches/drop" && method == "POST") {
      DropWatches();
      SendJson(response, 200, json::object());
    } else if (path == "/_fake/watches/expire" && method == "POST") {
      ExpireWatches();
      SendJson(response, 200, json::object());
    } else if (path == "/_fake/compact" && method == "POST") {
      Compact();
      SendJson(response, 200, json::object());
    } else if (path == "/_fake/tokens" && method == "PUT") {
      json body = json::parse(request.body);
      SetAcceptedTokens(body.value("accepted", std::set<std::string>{}));
      SendJson(response, 200, json::object());
    } else if (path == "/_fake/seed" && method == "POST") {
      SendJson(response, 201, Seed(json::parse(request.body)));
    } else {
      SendJson(response, 404, {{"error", "unknown control endpoint " + method + " " + path}});
    }
  } catch (const std::exception& error) {
    SendJson(response, 400, {{"error", error.what()}});
  }
  return true;
}

void FakeApiServer::Serve(const httplib::Request& request, httplib::Response& response) {
  if (request.path.rfind("/_fake/", 0) == 0) {
    HandleControl(request, response);
    return;
  }
  LoggedRequest entry;
  entry.received = std::chrono::steady_clock::now();
  entry.method = request.method;
  entry.path = request.path;
  if (auto mark = request.target.find('?'); mark != std::string::npos) {
    entry.query = PercentDecode(request.target.substr(mark + 1));
  }
  entry.contentType = request.get_header_value("Content-Type");
  entry.accept = request.get_header_value("Accept");
  entry.body = request.body;
  std::string authorization = request.get_header_value("Authorization");
  if (authorization.rfind("Bearer ", 0) == 0) entry.bearerToken = authorization.substr(7);
  size_t logIndex = 0;
  std::optional<Fault> fault;
  bool authorized = true;
  std::chrono::milliseconds delay{0};
  const bool isWatch = ParamTrue(request, "watch");
  {
    std::lock_guard lock(mutex_);
    logIndex = log_.size();
    log_.push_back(entry);
    authorized = acceptedTokens_.empty() || acceptedTokens_.count(entry.bearerToken) > 0;
    delay = requestDelay_;
    for (auto it = faults_.begin(); it != faults_.end(); ++it) {
      if (it->count == 0) continue;
      // List and watch modes are taken where the list or the watch is answered.
      if (IsListMode(it->mode) || IsWatchMode(it->mode)) continue;
      if (it->mode == FaultMode::kEndlessBody && isWatch) continue;
      if (!it->method.empty() && it->method != request.method) continue;
      if (!it->pathPrefix.empty() && request.path.rfind(it->pathPrefix, 0) != 0) continue;
      if (it->watchOnly && !isWatch) continue;
      fault = *it;
      if (it->count > 0) --it->count;
      break;
    }
    if (fault) {
      log_[logIndex].fault = fault->mode != FaultMode::kNone
                                 ? std::string(FaultModeName(fault->mode))
                             : fault->dropConnection ? "drop"
                             : fault->status > 0     ? "status"
                                                     : "";
    }
  }
  auto finish = [this, logIndex](int status) {
    std::lock_guard lock(mutex_);
    if (logIndex < log_.size()) log_[logIndex].status = status;
  };
  // A brownout and a fault's latency add up; both end early when the server stops.
  WaitUnlessStopping(delay + std::chrono::milliseconds(fault ? fault->latencyMs : 0));
  if (fault && fault->dropConnection) {
    // Headers promise a body that never comes: the client sees the connection cut.
    response.status = 200;
    response.set_content_provider(1024, "application/json",
                                  [](size_t, size_t, httplib::DataSink&) { return false; });
    finish(-1);
    return;
  }
  if (fault &&
      (fault->mode == FaultMode::kEndlessBody || fault->mode == FaultMode::kEndlessString)) {
    SendEndless(request, response, fault->mode, logIndex);
    finish(200);
    return;
  }
  if (fault && fault->status > 0) {
    int code = fault->status;
    if (!fault->retryAfterRaw.empty()) {
      response.set_header("Retry-After", fault->retryAfterRaw);
    } else if (fault->retryAfterSeconds >= 0 && fault->retryAfterHttpDate) {
      response.set_header("Retry-After", HttpDate(std::chrono::system_clock::now() +
                                                  std::chrono::seconds(fault->retryAfterSeconds)));
    } else if (fault->retryAfterSeconds >= 0) {
      response.set_header("Retry-After", std::to_string(fault->retryAfterSeconds));
    }
    if (code == 429) {
      // API Priority and Fairness answers in plain text, not with a Status.
      response.status = 429;
      response.set_content("Too many requests, please try again later.\n",
                           "text/plain; charset=utf-8");
    } else {
      std::string reason = code == 503   ? "ServiceUnavailable"
                           : code == 504 ? "Timeout"
                           : code >= 500 ? "InternalError"
                                         : "BadRequest";
      json details = json::object();
      if (fault->retryAfterSeconds > 0) details["retryAfterSeconds"] = fault->retryAfterSeconds;
      SendJson(response, code, StatusBody(code, reason, "injected fault", details));
    }
    finish(code);
    return;
  }
  if (!authorized) {
    SendJson(response, 401, StatusBody(401, "Unauthorized", "Unauthorized", json::object()));
    finish(401);
    return;
  }
  try {
    Outcome outcome = Dispatch(request, response, logIndex);
    finish(outcome.status);
  } catch (const StatusError& error) {
    SendJson(response, error.code,
             StatusBody(error.code, error.reason, error.message, error.details));
    finish(error.code);
  } catch (const std::exception& error) {
    SendJson(response, 500, StatusBody(500, "InternalError", error.what(), json::object()));
    finish(500);
  }
}

std::optional<Fault> FakeApiServer::TakeModeFault(const httplib::Request& request, bool listModes,
                                                  size_t logIndex) {
  std::optional<Fault> taken;
  {
    std::lock_guard lock(mutex_);
    const bool isWatch = ParamTrue(request, "watch");
    for (auto& fault : faults_) {
      if (fault.count == 0) continue;
      if (listModes ? !IsListMode(fault.mode) : !IsWatchMode(fault.mode)) continue;
      if (!fault.method.empty() && fault.method != request.method) continue;
      if (!fault.pathPrefix.empty() && request.path.rfind(fault.pathPrefix, 0) != 0) continue;
      if (fault.watchOnly && !isWatch) continue;
      taken = fault;
      if (fault.count > 0) --fault.count;
      if (logIndex < log_.size()) log_[logIndex].fault = std::string(FaultModeName(fault.mode));
      break;
    }
  }
  if (taken) WaitUnlessStopping(std::chrono::milliseconds(taken->latencyMs));
  return taken;
}

void FakeApiServer::SendEndless(const httplib::Request& request, httplib::Response& response,
                                FaultMode mode, size_t logIndex) {
  const bool isWatch = ParamTrue(request, "watch");
  std::string prefix;
  if (isWatch) {
    prefix = R"({"type":"ADDED","object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":")";
  } else {
    prefix = R"({"kind":"List","apiVersion":"v1","metadata":{"resourceVersion":")" +
             CurrentResourceVersion() + R"("},"items":[{"metadata":{"name":")";
  }
  if (mode == FaultMode::kEndlessBody) {
    // Blanks inside the list: valid JSON as far as it goes, and no end in sight.
    prefix.resize(prefix.size() - std::string(R"({"metadata":{"name":")").size());
  }
  const auto deadline = std::chrono::steady_clock::now() + kEndlessFor;
  const std::string filler(64 * 1024, mode == FaultMode::kEndlessBody ? ' ' : 'a');
  // One chunk per call, the prefix first; false (the connection is closed) once the client
  // is gone, the time is up or the server stops.
  auto produce = [this, prefix, filler, deadline, logIndex](uint64_t offset, uint64_t limit,
                                                            httplib::DataSink& sink) {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return false;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::string_view chunk = offset == 0 ? std::string_view(prefix) : std::string_view(filler);
    if (chunk.size() > limit) chunk = chunk.substr(0, limit);
    if (!sink.write(chunk.data(), chunk.size())) return false;
    std::lock_guard lock(mutex_);
    if (logIndex < log_.size()) log_[logIndex].bytesSent += chunk.size();
    return true;
  };
  response.status = 200;
  if (mode == FaultMode::kEndlessBody) {
    response.set_content_provider(kEndlessBodyBytes, "application/json",
                                  [produce](size_t offset, size_t length, httplib::DataSink& sink) {
                                    return produce(offset, length, sink);
                                  });
  } else {
    response.set_chunked_content_provider(
        "application/json", [produce](size_t offset, httplib::DataSink& sink) {
          return produce(offset, std::numeric_limits<uint64_t>::max(), sink);
        });
  }
}

FakeApiServer::Outcome FakeApiServer::Discovery(const std::string& path,
                                                httplib::Response& response) {
  std::lock_guard lock(mutex_);
  auto resourcesOf = [this](const std::string& group, const std::string& version) {
    json resources = json::array();
    for (const auto& [key, type] : types_) {
      (void)key;
      if (type->group != group || type->version != version) continue;
      json resource = {{"name", type->plural},
                       {"singularName", type->singular},
                       {"namespaced", type->namespaced},
                       {"kind", type->kind},
                       {"verbs", {"create", "delete", "get", "list", "patch", "update", "watch"}}};
      if (!type->shortNames.empty()) resource["shortNames"] = type->shortNames;
      if (!type->categories.empty()) resource["categories"] = type->categories;
      resources.push_back(resource);
      if (type->statusSubresource) {
        resources.push_back({{"name", type->plural + "/status"},
                             {"singularName", ""},
                             {"namespaced", type->namespaced},
                             {"kind", type->kind},
                             {"verbs", {"get", "patch", "update"}}});
      }
    }
    return resources;
  };
  std::map<std::string, std::vector<std::string>> groups;  // group -> versions
  for (const auto& [key, type] : types_) {
    (void)key;
    auto& versions = groups[type->group];
    if (std::find(versions.begin(), versions.end(), type->version) == versions.end()) {
      versions.push_back(type->version);
    }
  }
  if (path == "/api") {
    SendJson(response, 200,
             {{"kind", "APIVersions"},
              {"versions", {"v1"}},
              {"serverAddressByClientCIDRs",
               {{{"clientCIDR", "0.0.0.0/0"},
                 {"serverAddress", options_.host + ":" + std::to_string(port_)}}}}});
    return {200};
  }
  if (path == "/apis") {
    json list = {{"kind", "APIGroupList"}, {"apiVersion", "v1"}, {"groups", json::array()}};
    for (const auto& [group, versions] : groups) {
      if (group.empty()) continue;
      json entry = {{"name", group}, {"versions", json::array()}};
      for (const auto& version : versions) {
        entry["versions"].push_back(
            {{"groupVersion", group + "/" + version}, {"version", version}});
      }
      entry["preferredVersion"] = entry["versions"][0];
      list["groups"].push_back(entry);
    }
    SendJson(response, 200, list);
    return {200};
  }
  if (path == "/version") {
    SendJson(response, 200,
             {{"major", "1"},
              {"minor", "32"},
              {"gitVersion", "v1.32.0-cozy-fake"},
              {"gitCommit", "0000000"},
              {"gitTreeState", "clean"},
              {"buildDate", "2025-01-01T00:00:00Z"},
              {"goVersion", "go1.23"},
              {"compiler", "gc"},
              {"platform", "linux/amd64"}});
    return {200};
  }
  if (path == "/openapi/v3") {
    // Just enough for kubectl to see that the server validates fields itself
    // (fieldValidation on PATCH), so it does not need the full OpenAPI schema.
    json paths = json::object();
    for (const auto& [group, versions] : groups) {
      for (const auto& version : versions) {
        std::string gv = group.empty() ? "api/" + version : "apis/" + group + "/" + version;
        paths[gv] = {{"serverRelativeURL",
                      "/openapi/v3/" + gv + "?hash=" + std::to_string(resourceVersion_)}};
      }
    }
    SendJson(response, 200, {{"paths", paths}});
    return {200};
  }
  if (path.rfind("/openapi/v3/", 0) == 0) {
    auto parts = Split(path.substr(std::string("/openapi/v3/").size()));
    std::string group;
    std::string version;
    if (parts.size() == 2 && parts[0] == "api") {
      version = parts[1];
    } else if (parts.size() == 3 && parts[0] == "apis") {
      group = parts[1];
      version = parts[2];
    } else {
      SendPlainNotFound(response);
      return {404};
    }
    json paths = json::object();
    for (const auto& [key, type] : types_) {
      (void)key;
      if (type->group != group || type->version != version) continue;
      std::string base = (group.empty() ? "/api/" + version : "/apis/" + group + "/" + version) +
                         (type->namespaced ? "/namespaces/{namespace}/" : "/") + type->plural +
                         "/{name}";
      json operation = {
          {"x-kubernetes-group-version-kind",
           {{"group", group}, {"version", version}, {"kind", type->kind}}},
          {"parameters",
           {{{"name", "fieldValidation"}, {"in", "query"}, {"schema", {{"type", "string"}}}},
            {{"name", "fieldManager"}, {"in", "query"}, {"schema", {{"type", "string"}}}},
            {{"name", "dryRun"}, {"in", "query"}, {"schema", {{"type", "string"}}}}}},
          {"responses", {{"200", {{"description", "OK"}}}}}};
      paths[base] = {{"patch", operation}};
    }
    if (paths.empty()) {
      SendPlainNotFound(response);
      return {404};
    }
    SendJson(response, 200,
             {{"openapi", "3.0.0"},
              {"info", {{"title", "Kubernetes"}, {"version", "v1.32.0"}}},
              {"paths", paths},
              {"components", {{"schemas", json::object()}}}});
    return {200};
  }
  auto parts = Split(path);
  std::string group;
  std::string version;
  if (parts.size() == 2 && parts[0] == "api") {
    version = parts[1];
  } else if (parts.size() == 3 && parts[0] == "apis") {
    group = parts[1];
    version = parts[2];
  }
  auto known = groups.find(group);
  if (version.empty() || known == groups.end() ||
      std::find(known->second.begin(), known->second.end(), version) == known->second.end()) {
    SendPlainNotFound(response);
    return {404};
  }
  SendJson(response, 200,
           {{"kind", "APIResourceList"},
            {"apiVersion", "v1"},
            {"groupVersion", group.empty() ? version : group + "/" + version},
            {"resources", resourcesOf(group, version)}});
  return {200};
}

json FakeApiServer::Table(const ResourceType& type, const std::vector<json>& objects,
                          const std::string& resourceVersion) const {
  json columns = json::array({{{"name", "Name"},
                               {"type", "string"},
                               {"format", "name"},
                               {"description", "Name must be unique within a namespace."},
                               {"priority", 0}}});
  auto now = std::chrono::system_clock::now();
  auto age = [&now](const json& object) -> json {
    auto created = ParseTimestamp(object["metadata"].value("creationTimestamp", ""));
    if (!created) return "<unknown>";
    return HumanDuration(std::chrono::duration_cast<std::chrono::seconds>(now - *created));
  };
  std::function<json(const json&)> cells;
  auto column = [&columns](const std::string& name, const std::string& columnType,
                           int priority = 0) {
    columns.push_back({{"name", name},
                       {"type", columnType},
                       {"format", ""},
                       {"description", name},
                       {"priority", priority}});
  };
  if (type.custom) {
    json printer = type.columns;
    if (printer.empty()) {
      printer = json::array(
          {{{"name", "Age"}, {"type", "date"}, {"jsonPath", ".metadata.creationTimestamp"}}});
    }
    for (const auto& definition : printer) {
      columns.push_back({{"name", definition.value("name", "")},
                         {"type", definition.value("type", "string")},
                         {"format", definition.value("format", "")},
                         {"description", definition.value("description", "")},
                         {"priority", definition.value("priority", 0)}});
    }
    cells = [printer, age](const json& object) {
      json row = json::array({object["metadata"].value("name", "")});
      for (const auto& definition : printer) {
        std::vector<json> results;
        try {
          results = EvaluateJsonPath(object, definition.value("jsonPath", ""));
        } catch (const std::invalid_argument&) {
        }
        // The API server shows the first match only (its printer-column comment: "simple
        // JSON path" only); a missing value is an empty cell.
        if (results.empty() || results[0].is_null()) {
          row.push_back(nullptr);
          continue;
        }
        const json& value = results[0];
        std::string columnType = definition.value("type", "string");
        if (columnType == "date") {
          auto time = value.is_string() ? ParseTimestamp(value.get<std::string>()) : std::nullopt;
          row.push_back(time ? json(HumanDuration(std::chrono::duration_cast<std::chrono::seconds>(
                                   std::chrono::system_clock::now() - *time)))
                             : json("<invalid>"));
        } else if (columnType == "string") {
          row.push_back(value.is_string() ? value.get<std::string>() : value.dump());
        } else if (columnType == "integer") {
          row.push_back(value.is_number() ? json(value.get<long long>()) : json(nullptr));
        } else {
          row.push_back(value);
        }
      }
      (void)age;
      return row;
    };
  } else if (type.plural == "nodes") {
    column("Status", "string");
    column("Roles", "string");
    column("Age", "string");
    column("Version", "string");
    cells = [age](const json& object) {
      std::string status = "NotReady";
      for (const auto& condition :
           object.value("status", json::object()).value("conditions", json::array())) {
        if (condition.value("type", "") == "Ready" && condition.value("status", "") == "True") {
          status = "Ready";
        }
      }
      std::string roles;
      const json labels = object["metadata"].value("labels", json::object());
      for (const auto& [label, value] : labels.items()) {
        (void)value;
        const std::string prefix = "node-role.kubernetes.io/";
        if (label.rfind(prefix, 0) == 0) {
          roles += (roles.empty() ? "" : ",") + label.substr(prefix.size());
        }
      }
      std::string version = object.value("status", json::object())
                                .value("nodeInfo", json::object())
                                .value("kubeletVersion", "");
      return json::array({object["metadata"].value("name", ""), status,
                          roles.empty() ? "<none>" : roles, age(object), version});
    };
  } else if (type.plural == "pods") {
    column("Ready", "string");
    column("Status", "string");
    column("Restarts", "string");
    column("Age", "string");
    cells = [age](const json& object) {
      size_t containers =
          object.value("spec", json::object()).value("containers", json::array()).size();
      std::string phase = object.value("status", json::object()).value("phase", "");
      return json::array(
          {object["metadata"].value("name", ""),
           std::to_string(phase == "Running" ? containers : 0) + "/" + std::to_string(containers),
           phase, "0", age(object)});
    };
  } else {
    column(type.plural == "customresourcedefinitions" ? "Created At" : "Age", "string");
    cells = [age, &type](const json& object) {
      if (type.plural == "customresourcedefinitions") {
        return json::array({object["metadata"].value("name", ""),
                            object["metadata"].value("creationTimestamp", "")});
      }
      return json::array({object["metadata"].value("name", ""), age(object)});
    };
  }
  json rows = json::array();
  for (const auto& object : objects) {
    rows.push_back({{"cells", cells(object)},
                    {"object",
                     {{"kind", "PartialObjectMetadata"},
                      {"apiVersion", "meta.k8s.io/v1"},
                      {"metadata", object["metadata"]}}}});
  }
  return {{"kind", "Table"},
          {"apiVersion", "meta.k8s.io/v1"},
          {"metadata", {{"resourceVersion", resourceVersion}}},
          {"columnDefinitions", columns},
          {"rows", rows}};
}

namespace {

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

}  // namespace

FakeApiServer::Outcome FakeApiServer::Dispatch(const httplib::Request& request,
                                               httplib::Response& response, size_t logIndex) {
  const std::string& path = request.path;
  if (path == "/healthz" || path == "/readyz" || path == "/livez") {
    response.set_content("ok", "text/plain");
    return {200};
  }
  auto parts = Split(path);
  bool core = parts.size() >= 2 && parts[0] == "api";
  bool grouped = parts.size() >= 3 && parts[0] == "apis";
  if (path == "/api" || path == "/apis" || path == "/version" || path.rfind("/openapi/", 0) == 0 ||
      (core && parts.size() == 2) || (grouped && parts.size() == 3)) {
    return Discovery(path, response);
  }
  if (!core && !grouped) {
    SendPlainNotFound(response);
    return {404};
  }
  std::string group = core ? "" : parts[1];
  std::string version = core ? parts[1] : parts[2];
  std::vector<std::string> rest(parts.begin() + (core ? 2 : 3), parts.end());

  std::shared_ptr<const ResourceType> type;
  std::string ns;
  std::string name;
  std::string subresource;
  {
    std::lock_guard lock(mutex_);
    if (rest.size() >= 3 && rest[0] == "namespaces") {
      auto candidate = FindType(group, version, rest[2]);
      if (candidate && candidate->namespaced && rest.size() <= 5) {
        type = candidate;
        ns = rest[1];
        if (rest.size() >= 4) name = rest[3];
        if (rest.size() == 5) subresource = rest[4];
      }
    }
    if (!type && !rest.empty() && rest.size() <= 3) {
      auto candidate = FindType(group, version, rest[0]);
      // A namespaced kind without a namespace serves only lists and watches.
      if (candidate && (!candidate->namespaced || rest.size() == 1)) {
        type = candidate;
        if (rest.size() >= 2) name = rest[1];
        if (rest.size() == 3) subresource = rest[2];
      }
    }
  }
  if (!type) {
    // The kind is not served here (e.g. its CRD is not loaded): the plain 404, not a Status.
    SendPlainNotFound(response);
    return {404};
  }
  if (!subresource.empty() && (subresource != "status" || !type->statusSubresource)) {
    throw StatusError{404, "NotFound", "the server could not find the requested resource",
                      json::object()};
  }
  const bool statusWrite = subresource == "status";
  const std::string& method = request.method;
  auto notFound = [&type](const std::string& missing) {
    return StatusError{404,
                       "NotFound",
                       type->Qualified() + " \"" + missing + "\" not found",
                       {{"name", missing}, {"group", type->group}, {"kind", type->plural}}};
  };
  bool wantsTable = request.get_header_value("Accept").find("as=Table") != std::string::npos;
  auto withTypeMeta = [&type](json object) {
    object["apiVersion"] = type->ApiVersion();
    object["kind"] = type->kind;
    return object;
  };

  if (method == "GET" && name.empty()) {
    Selectors selectors;
    try {
      if (request.has_param("labelSelector") && !request.get_param_value("labelSelector").empty()) {
        selectors.labels.emplace(request.get_param_value("labelSelector"));
      }
      if (request.has_param("fieldSelector")) {
        selectors.fields = ParseFieldSelector(request.get_param_value("fieldSelector"));
      }
    } catch (const std::invalid_argument& error) {
      throw StatusError{400, "BadRequest", error.what(), json::object()};
    }
    for (const auto& requirement : selectors.fields) {
      bool supported = requirement.field == "metadata.name" ||
                       (type->namespaced && requirement.field == "metadata.namespace") ||
                       std::find(type->fieldLabels.begin(), type->fieldLabels.end(),
                                 requirement.field) != type->fieldLabels.end();
      if (!supported) {
        throw StatusError{400, "BadRequest", "field label not supported: " + requirement.field,
                          json::object()};
      }
    }
    if (ParamTrue(request, "watch")) {
      if (request.has_param("sendInitialEvents")) {
        // Streaming lists are not implemented: informers fall back to LIST on this error.
        throw StatusError{422, "Invalid", "sendInitialEvents is not supported by this server",
                          json::object()};
      }
      Watch(request, response, type, ns, logIndex);
      return {200};
    }
    std::vector<json> items;
    std::string listVersion;
    {
      std::lock_guard lock(mutex_);
      listVersion = std::to_string(resourceVersion_);
      for (const auto& [key, object] : objects_[type->StoreKey()]) {
        (void)key;
        if (!ns.empty() && object["metadata"].value("namespace", "") != ns) continue;
        if (selectors.Matches(object)) items.push_back(object);
      }
    }
    // Pages: `continue` is the offset into this (always fresh) list.
    size_t offset =
        request.has_param("continue") ? std::stoul(request.get_param_value("continue")) : 0;
    size_t limit = request.has_param("limit") ? std::stoul(request.get_param_value("limit")) : 0;
    std::string next;
    if (offset > 0 || (limit > 0 && items.size() > offset + limit)) {
      size_t end = limit > 0 ? std::min(items.size(), offset + limit) : items.size();
      if (end < items.size()) next = std::to_string(end);
      items = std::vector<json>(items.begin() + static_cast<long>(std::min(offset, items.size())),
                                items.begin() + static_cast<long>(end));
    }
    if (wantsTable) {
      SendJson(response, 200, Table(*type, items, listVersion));
      return {200};
    }
    json list = {{"kind", type->listKind},
                 {"apiVersion", type->ApiVersion()},
                 {"metadata", {{"resourceVersion", listVersion}}},
                 {"items", json::array()}};
    if (!next.empty()) list["metadata"]["continue"] = next;
    for (auto& item : items) list["items"].push_back(withTypeMeta(std::move(item)));
    if (auto fault = TakeModeFault(request, /*listModes=*/true, logIndex)) {
      // Valid JSON of the wrong shape: what a broken proxy, a version skew or a bug sends.
      switch (fault->mode) {
        case FaultMode::kListResourceVersionNumber:
          list["metadata"]["resourceVersion"] = std::stoull(listVersion);
          break;
        case FaultMode::kListItemsNotArray: {
          json byName = json::object();
          for (const auto& item : list["items"]) byName[item["metadata"].value("name", "")] = item;
          list["items"] = byName;
          break;
        }
        case FaultMode::kListWithoutMetadata:
          list.erase("metadata");
          break;
        default:
          break;
      }
    }
    SendJson(response, 200, list);
    return {200};
  }

  if (method == "POST" && name.empty() && subresource.empty()) {
    json body = json::parse(request.body, nullptr, false);
    if (body.is_discarded() || !body.is_object()) {
      throw StatusError{400, "BadRequest", "the request body is not a JSON object", json::object()};
    }
    std::string bodyKind = body.value("kind", "");
    if (!bodyKind.empty() && bodyKind != type->kind) {
      throw StatusError{400, "BadRequest",
                        "the kind " + bodyKind + " does not match the resource " + type->plural,
                        json::object()};
    }
    json created;
    {
      std::lock_guard lock(mutex_);
      created = CreateLocked(*type, ns, std::move(body), true);
    }
    SendJson(response, 201, created);
    return {201};
  }

  if (name.empty()) {
    throw StatusError{405, "MethodNotAllowed",
                      "the server does not allow this method on the requested resource",
                      json::object()};
  }
  const std::string key = ObjectKey(type->namespaced ? ns : "", name);

  if (method == "GET") {
    json object;
    std::string listVersion;
    {
      std::lock_guard lock(mutex_);
      auto& store = objects_[type->StoreKey()];
      auto it = store.find(key);
      if (it == store.end()) throw notFound(name);
      object = it->second;
      listVersion = std::to_string(resourceVersion_);
    }
    if (wantsTable) {
      SendJson(response, 200, Table(*type, {object}, listVersion));
    } else {
      SendJson(response, 200, object);
    }
    return {200};
  }

  if (method == "DELETE" && subresource.empty()) {
    if (type->plural == "customresourcedefinitions") {
      // Also stops serving the kind and drops its objects, as a real CRD deletion ends.
      json crd = Object(type->ApiVersion(), type->plural, "", name);
      if (crd.is_null()) throw notFound(name);
      DeleteCrd(name);
      SendJson(response, 200, crd);
      return {200};
    }
    json deleted;
    {
      std::lock_guard lock(mutex_);
      auto& store = objects_[type->StoreKey()];
      auto it = store.find(key);
      if (it == store.end()) throw notFound(name);
      deleted = it->second;
      store.erase(it);
      deleted["metadata"]["resourceVersion"] = std::to_string(++resourceVersion_);
      RecordEventLocked(*type, "DELETED", deleted);
    }
    SendJson(response, 200, deleted);
    return {200};
  }

  if (method == "PUT" || method == "PATCH") {
    json body = json::parse(request.body, nullptr, false);
    if (body.is_discarded()) {
      throw StatusError{400, "BadRequest", "the request body is not valid JSON", json::object()};
    }
    std::string contentType = request.get_header_value("Content-Type");
    if (auto semicolon = contentType.find(';'); semicolon != std::string::npos) {
      contentType = contentType.substr(0, semicolon);
    }
    std::lock_guard lock(mutex_);
    auto& store = objects_[type->StoreKey()];
    auto it = store.find(key);
    if (it == store.end()) throw notFound(name);
    const json old = it->second;
    const std::string currentVersion = old["metadata"].value("resourceVersion", "");
    json updated;
    if (method == "PUT") {
      if (!body.is_object()) {
        throw StatusError{400, "BadRequest", "the body is not an object", json::object()};
      }
      std::string bodyName = body.value("metadata", json::object()).value("name", "");
      if (bodyName != name) {
        throw StatusError{400, "BadRequest",
                          "the name of the object (" + bodyName +
                              ") does not match the name on the URL (" + name + ")",
                          json::object()};
      }
      std::string sent = body["metadata"].value("resourceVersion", "");
      if (sent.empty() && type->custom) {
        throw StatusError{422,
                          "Invalid",
                          type->kind + "." + type->group + " \"" + name +
                              "\" is invalid: metadata.resourceVersion: Invalid value: 0x0: "
                              "must be specified for an update",
                          {{"name", name}, {"group", type->group}, {"kind", type->kind}}};
      }
      updated = body;
    } else if (contentType == "application/merge-patch+json" ||
               (contentType == "application/strategic-merge-patch+json" && !type->custom)) {
      // Built-in kinds take strategic merge patches; this fake applies them as RFC 7386
      // merge patches, which agrees for every patch without list merge keys.
      updated = old;
      updated.merge_patch(body);
    } else if (contentType == "application/json-patch+json") {
      try {
        updated = old.patch(body);
      } catch (const json::exception&) {
        throw StatusError{422,
                          "Invalid",
                          "the server rejected our request due to an error in our request",
                          {{"name", name}, {"group", type->group}, {"kind", type->kind}}};
      }
    } else {
      throw StatusError{415, "UnsupportedMediaType",
                        "the body of the request was in an unknown format - accepted media "
                        "types include: application/json-patch+json, "
                        "application/merge-patch+json",
                        json::object()};
    }
    if (!updated.is_object()) {
      throw StatusError{422, "Invalid", "the patched object is not an object", json::object()};
    }
    std::string sent = updated.value("metadata", json::object()).value("resourceVersion", "");
    if (method == "PUT" || (!sent.empty() && sent != currentVersion)) {
      if (!sent.empty() && sent != currentVersion) {
        throw StatusError{409,
                          "Conflict",
                          "Operation cannot be fulfilled on " + type->Qualified() + " \"" + name +
                              "\": the object has been modified; please apply your "
                              "changes to the latest version and try again",
                          {{"name", name}, {"group", type->group}, {"kind", type->plural}}};
      }
    }
    json result = WriteLocked(*type, key, old, std::move(updated), statusWrite);
    SendJson(response, 200, result);
    return {200};
  }
  throw StatusError{405, "MethodNotAllowed",
                    "the server does not allow this method on the requested resource",
                    json::object()};
}

void FakeApiServer::Watch(const httplib::Request& request, httplib::Response& response,
                          std::shared_ptr<const ResourceType> type, const std::string& ns,
                          size_t logIndex) {
  Selectors selectors;
  if (request.has_param("labelSelector") && !request.get_param_value("labelSelector").empty()) {
    selectors.labels.emplace(request.get_param_value("labelSelector"));
  }
  if (request.has_param("fieldSelector")) {
    selectors.fields = ParseFieldSelector(request.get_param_value("fieldSelector"));
  }
  std::string from =
      request.has_param("resourceVersion") ? request.get_param_value("resourceVersion") : "";
  bool bookmarks = ParamTrue(request, "allowWatchBookmarks");
  int timeoutSeconds = request.has_param("timeoutSeconds")
                           ? std::stoi(request.get_param_value("timeoutSeconds"))
                           : 1800;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutSeconds);

  // Where the stream starts: the current state as ADDED events, or the history after `from`.
  std::vector<json> initial;
  uint64_t position = 0;
  bool expired = false;
  uint64_t dropGeneration = 0;
  uint64_t expireGeneration = 0;
  {
    std::lock_guard lock(mutex_);
    dropGeneration = dropGeneration_;
    expireGeneration = expireGeneration_;
    if (from.empty() || from == "0") {
      for (const auto& [key, object] : objects_[type->StoreKey()]) {
        (void)key;
        if (!ns.empty() && object["metadata"].value("namespace", "") != ns) continue;
        if (selectors.Matches(object)) {
          initial.push_back({{"type", "ADDED"}, {"object", object}});
        }
      }
      position = resourceVersion_;
    } else {
      position = std::stoull(from);
      expired = position < compactedThrough_;
    }
  }
  // A bad event to send after the initial ones (as a frame of text: one mode is not JSON).
  std::string garbled;
  bool closeAtOnce = false;
  // Not spent on a watch that only gets its 410.
  if (auto fault = expired ? std::nullopt : TakeModeFault(request, /*listModes=*/false, logIndex)) {
    json object = {
        {"apiVersion", type->ApiVersion()},
        {"kind", type->kind},
        {"metadata", {{"name", "garbled"}, {"resourceVersion", std::to_string(position)}}}};
    if (type->namespaced) object["metadata"]["namespace"] = ns.empty() ? "default" : ns;
    switch (fault->mode) {
      case FaultMode::kWatchResourceVersionNumber:
        object["metadata"]["resourceVersion"] = position;
        garbled = json{{"type", "ADDED"}, {"object", object}}.dump();
        break;
      case FaultMode::kWatchMetadataMissing:
        object.erase("metadata");
        garbled = json{{"type", "MODIFIED"}, {"object", object}}.dump();
        break;
      case FaultMode::kWatchObjectNotObject:
        garbled = json{{"type", "ADDED"}, {"object", "garbled"}}.dump();
        break;
      case FaultMode::kWatchUnknownType:
        garbled = json{{"type", "RENAMED"}, {"object", object}}.dump();
        break;
      case FaultMode::kWatchNotJson:
        garbled = R"({"type":"ADDED","object":{"metadata":{"name":garbled}}})";
        break;
      case FaultMode::kWatchErrorWrongTypes:
        garbled = json{{"type", "ERROR"},
                       {"object",
                        {{"kind", "Status"},
                         {"apiVersion", "v1"},
                         {"status", "Failure"},
                         {"code", "500"},
                         {"reason", 7},
                         {"message", {"not", "text"}},
                         {"details", {{"retryAfterSeconds", "5"}}}}}}
                      .dump();
        break;
      case FaultMode::kWatchCloseAtOnce:
        closeAtOnce = true;
        break;
      default:
        break;
    }
  }
  auto expiredEvent = [](uint64_t version, uint64_t oldest) {
    return json{{"type", "ERROR"},
                {"object", StatusBody(410, "Expired",
                                      "too old resource version: " + std::to_string(version) +
                                          " (" + std::to_string(oldest) + ")",
                                      json::object())}};
  };
  auto streamer = [this, type, ns, selectors, initial, position, expired, bookmarks, deadline,
                   dropGeneration, expireGeneration, expiredEvent, garbled,
                   closeAtOnce](size_t, httplib::DataSink& sink) mutable {
    auto send = [&sink](const json& event) {
      std::string line = event.dump() + "\n";
      return sink.write(line.data(), line.size());
    };
    if (closeAtOnce) {
      sink.done();
      return true;
    }
    if (expired) {
      uint64_t oldest;
      {
        std::lock_guard lock(mutex_);
        oldest = compactedThrough_ + 1;
      }
      send(expiredEvent(position, oldest));
      sink.done();
      return true;
    }
    for (const auto& event : initial) {
      if (!send(event)) return false;
    }
    if (!garbled.empty()) {
      std::string line = garbled + "\n";
      if (!sink.write(line.data(), line.size())) return false;
      garbled.clear();
    }
    auto nextBookmark = std::chrono::steady_clock::now() + options_.bookmarkInterval;
    while (true) {
      std::vector<json> batch;
      bool end = false;
      bool expire = false;
      uint64_t current = 0;
      {
        std::unique_lock lock(mutex_);
        auto wake = std::min(deadline, bookmarks ? nextBookmark : deadline);
        changed_.wait_until(lock, wake, [&] {
          return stopping_ || dropGeneration_ != dropGeneration ||
                 expireGeneration_ != expireGeneration ||
                 (!history_.empty() && history_.back()->resourceVersion > position);
        });
        current = resourceVersion_;
        if (stopping_ || dropGeneration_ != dropGeneration) {
          end = true;
        } else if (expireGeneration_ != expireGeneration) {
          expire = true;
        } else if (position < compactedThrough_) {
          expire = true;  // the history we would resume from is gone
        } else {
          for (const auto& event : history_) {
            if (event->resourceVersion <= position) continue;
            position = event->resourceVersion;
            if (event->storeKey != type->StoreKey()) continue;
            if (!ns.empty() && event->object["metadata"].value("namespace", "") != ns) continue;
            if (!selectors.Matches(event->object)) continue;
            batch.push_back({{"type", event->type}, {"object", event->object}});
          }
        }
      }
      if (end) break;
      if (expire) {
        send(expiredEvent(position, current));
        break;
      }
      for (const auto& event : batch) {
        if (!send(event)) return false;
      }
      auto now = std::chrono::steady_clock::now();
      if (now >= deadline) break;  // the server's timeout: the stream just ends
      if (bookmarks && now >= nextBookmark) {
        json bookmark = {{"type", "BOOKMARK"},
                         {"object",
                          {{"kind", type->kind},
                           {"apiVersion", type->ApiVersion()},
                           {"metadata", {{"resourceVersion", std::to_string(current)}}}}}};
        if (!send(bookmark)) return false;
        nextBookmark = now + options_.bookmarkInterval;
      }
      if (!sink.is_writable()) return false;
    }
    sink.done();
    return true;
  };
  response.status = 200;
  response.set_chunked_content_provider("application/json", streamer);
}

}  // namespace cozy::fake
