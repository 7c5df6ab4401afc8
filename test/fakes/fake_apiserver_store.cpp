// The object store: creates, writes, the event history, CRDs becoming kinds, deletion with
// finalizers, garbage collection by owner references and namespace termination.
#include "test/fakes/fake_apiserver_internal.h"

#include <algorithm>
#include <cstdio>

namespace cozy::fake {
using namespace internal;  // NOLINT

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

}  // namespace cozy::fake
