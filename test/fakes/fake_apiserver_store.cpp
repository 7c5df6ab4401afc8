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
    type.requiresResourceVersion = true;  // no unconditional update for custom resources
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
  DeleteCrdLocked(name);
  SettleLocked();
}

void FakeApiServer::DeleteCrdLocked(const std::string& name) {
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

void FakeApiServer::AdmitToNamespaceLocked(const ResourceType& type, const std::string& ns,
                                           const std::string& name) const {
  // The NamespaceLifecycle admission plugin (mutating, so before validation and before
  // generateName: `name` is the name as sent). A missing namespace is the NotFound of a GET of
  // it; one being terminated refuses new content.
  auto namespaces = objects_.find("/namespaces");
  const json* owner = nullptr;
  if (namespaces != objects_.end()) {
    auto it = namespaces->second.find(ObjectKey("", ns));
    if (it != namespaces->second.end()) owner = &it->second;
  }
  if (!owner) {
    throw StatusError{404,
                      "NotFound",
                      "namespaces \"" + ns + "\" not found",
                      {{"name", ns}, {"kind", "namespaces"}}};
  }
  if (IsDeleting(*owner)) {
    // admission.NewForbidden: without a name (generateName), no quoted name.
    json details = {
        {"group", type.group},
        {"kind", type.plural},
        {"causes", json::array({{{"reason", "NamespaceTerminating"},
                                 {"message", "namespace " + ns + " is being terminated"},
                                 {"field", "metadata.namespace"}}})}};
    if (!name.empty()) details["name"] = name;
    throw StatusError{403, "Forbidden",
                      type.Qualified() + (name.empty() ? "" : " \"" + name + "\"") +
                          " is forbidden: unable to create new content in namespace " + ns +
                          " because it is being terminated",
                      details};
  }
}

json FakeApiServer::CreateLocked(const ResourceType& type, const std::string& ns, json object,
                                 bool validate, bool dryRun) {
  if (!object.is_object()) throw StatusError{400, "BadRequest", "the body is not an object"};
  // A kind kept in another's storage is validated and stored in that kind's form; `type`
  // still names it in errors and in the answer.
  const ResourceType& stored = type.storage.empty() ? type : *types_.at(type.storage);
  if (!type.storage.empty()) object = ToStorage(type.group, type.plural, std::move(object));
  json& metadata = object["metadata"];
  if (!metadata.is_object()) metadata = json::object();
  if (type.namespaced) {
    // The create handler, before admission: the body's namespace is the URL's or none.
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
  if (type.namespaced && validate) AdmitToNamespaceLocked(type, ns, metadata.value("name", ""));
  std::string name = metadata.value("name", "");
  std::vector<FieldError> generateNameErrors;
  if (name.empty() && !metadata.value("generateName", "").empty()) {
    const std::string prefix = metadata["generateName"].get<std::string>();
    if (validate) {
      // ValidateObjectMeta: the prefix is validated as a name whose trailing '-' is masked
      // (maskTrailingDash), so "train-" passes and "train." does not. Found on kube-apiserver:
      // the binder's Events named "<device>." were all refused there.
      std::string masked = prefix;
      if (masked.size() > 1 && masked.back() == '-') masked.back() = 'a';
      for (FieldError error : ValidateName(type.custom, type.plural == "namespaces", masked)) {
        error.field = "metadata.generateName";
        const std::string was = "Invalid value: " + json(masked).dump();
        if (error.message.starts_with(was)) {
          error.message =
              "Invalid value: " + json(prefix).dump() + error.message.substr(was.size());
        }
        generateNameErrors.push_back(std::move(error));
      }
    }
    name = prefix + std::to_string(++uidCounter_);
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
  if (validate) {
    // Names (and, for built-in kinds, their fields) as the real validation has them.
    auto errors = generateNameErrors.empty()
                      ? ValidateName(type.custom, type.plural == "namespaces", name)
                      : generateNameErrors;
    if (!type.custom) {
      PrepareBuiltin(type.group, type.plural, object);
      if (type.plural == "resourceslices") PrepareResourceSlice(object, options_.draDeviceTaints);
      for (auto& error : ValidateBuiltin(type.group, type.plural, object)) {
        errors.push_back(std::move(error));
      }
    }
    if (!errors.empty()) throw InvalidError(type.kind, type.group, name, errors);
  }
  auto& store = objects_[type.StoreKey()];
  std::string key = ObjectKey(type.namespaced ? ns : "", name);
  if (store.count(key)) {
    throw StatusError{409,
                      "AlreadyExists",
                      type.Qualified() + " \"" + name + "\" already exists",
                      {{"name", name}, {"group", type.group}, {"kind", type.plural}}};
  }
  object["apiVersion"] = stored.ApiVersion();
  object["kind"] = stored.kind;
  metadata["name"] = name;
  metadata["uid"] = "00000000-0000-4000-8000-" + [this] {
    char text[13];
    std::snprintf(text, sizeof text, "%012llu", static_cast<unsigned long long>(++uidCounter_));
    return std::string(text);
  }();
  metadata["creationTimestamp"] = FormatTimestamp(std::chrono::system_clock::now());
  metadata["generation"] = 1;
  metadata.erase("deletionTimestamp");
  metadata.erase("deletionGracePeriodSeconds");
  metadata.erase("managedFields");
  if (validate && type.statusSubresource && !type.statusOnCreate) {
    // The status strategy: a create carries no status (a pod starts Pending).
    object.erase("status");
    if (type.plural == "pods") object["status"] = {{"phase", "Pending"}};
  }
  if (type.plural == "namespaces" && type.group.empty()) {
    // The namespace strategy: Active, and the namespace controller's finalizer.
    if (!object.contains("status") || !object["status"].is_object())
      object["status"] = json::object();
    if (!object["status"].contains("phase")) object["status"]["phase"] = "Active";
    if (!object.contains("spec") || !object["spec"].is_object()) object["spec"] = json::object();
    if (!object["spec"].contains("finalizers")) object["spec"]["finalizers"] = {"kubernetes"};
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
  // A dry run gets everything a create fills in but a resourceVersion (as etcd's dry run).
  if (dryRun) return FromStorage(type.group, type.plural, std::move(object));
  metadata["resourceVersion"] = std::to_string(++resourceVersion_);
  store[key] = object;
  TrackCollectableLocked(stored.StoreKey(), key, &object);
  RecordEventLocked(stored, "ADDED", object);
  if (type.plural == "customresourcedefinitions") RegisterCrdLocked(object);
  if (!metadata.value("ownerReferences", json::array()).empty()) settleNeeded_ = true;
  return FromStorage(type.group, type.plural, std::move(object));
}

json FakeApiServer::WriteLocked(const ResourceType& type, const std::string& key, const json& old,
                                json updated, bool statusWrite, bool dryRun) {
  // `old` as stored, `updated` as the client wrote it: a kind kept in another's storage is
  // compared, validated and stored in that kind's form, and answered in its own.
  const ResourceType& stored = type.storage.empty() ? type : *types_.at(type.storage);
  if (!type.storage.empty()) updated = ToStorage(type.group, type.plural, std::move(updated));
  auto answer = [&type](json object) {
    return FromStorage(type.group, type.plural, std::move(object));
  };
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
    for (const char* immutable : {"name", "namespace", "uid", "creationTimestamp", "generation",
                                  "deletionTimestamp", "deletionGracePeriodSeconds"}) {
      if (old["metadata"].contains(immutable)) {
        result["metadata"][immutable] = old["metadata"][immutable];
      } else {
        result["metadata"].erase(immutable);
      }
    }
    result["apiVersion"] = stored.ApiVersion();
    result["kind"] = stored.kind;
    std::vector<FieldError> errors;
    if (IsDeleting(old)) {
      // ValidateNoNewFinalizers.
      auto before = Finalizers(old);
      std::string added;
      for (const auto& finalizer : Finalizers(result)) {
        if (std::find(before.begin(), before.end(), finalizer) == before.end() &&
            added.find("\"" + finalizer + "\"") == std::string::npos) {
          added += (added.empty() ? "" : ", ") + ("\"" + finalizer + "\"");
        }
      }
      if (!added.empty()) {
        errors.push_back({"FieldValueForbidden", "metadata.finalizers",
                          "Forbidden: no new finalizers can be added if the object is being "
                          "deleted, found new finalizers []string{" +
                              added + "}"});
      }
    }
    if (!type.custom) {
      if (type.plural == "resourceslices") PrepareResourceSlice(result, options_.draDeviceTaints);
      for (auto& error : ValidateBuiltinUpdate(type.group, type.plural, result, old)) {
        errors.push_back(std::move(error));
      }
    }
    if (!errors.empty()) {
      throw InvalidError(type.kind, type.group, old["metadata"].value("name", ""), errors);
    }
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
    return answer(old);
  }
  if (SpecPart(result, type.statusSubresource) != SpecPart(old, type.statusSubresource)) {
    result["metadata"]["generation"] = old["metadata"].value("generation", 1) + 1;
  }
  // A dry run answers with the object as it would be stored, at the stored resourceVersion.
  if (dryRun) return answer(std::move(result));
  if (result["metadata"].value("ownerReferences", json::array()) !=
      old["metadata"].value("ownerReferences", json::array())) {
    settleNeeded_ = true;
  }
  return answer(CommitLocked(stored, key, std::move(result)));
}

json FakeApiServer::CommitLocked(const ResourceType& type, const std::string& key, json object) {
  object["metadata"]["resourceVersion"] = std::to_string(++resourceVersion_);
  objects_[type.StoreKey()][key] = object;
  TrackCollectableLocked(type.StoreKey(), key, &object);
  RecordEventLocked(type, "MODIFIED", object);
  if (type.plural == "customresourcedefinitions") RegisterCrdLocked(object);
  if (IsDeleting(object)) {
    settleNeeded_ = true;
    bool namespaceHeld =
        type.plural == "namespaces" && type.group.empty() &&
        !object.value("spec", json::object()).value("finalizers", json::array()).empty();
    // The update that drops the last finalizer of an object being deleted deletes it, once its
    // grace period is over (ShouldDeleteDuringUpdate: a Terminating pod waits for its kubelet).
    const json grace = object["metadata"].value("deletionGracePeriodSeconds", json(0));
    const bool graceOver = !grace.is_number_integer() || grace.get<int64_t>() == 0;
    if (Finalizers(object).empty() && !namespaceHeld && graceOver) RemoveLocked(type, key);
  }
  return object;
}

void FakeApiServer::RemoveLocked(const ResourceType& type, const std::string& key) {
  auto& store = objects_[type.StoreKey()];
  auto it = store.find(key);
  if (it == store.end()) return;
  settleNeeded_ = true;
  if (type.plural == "customresourcedefinitions") {
    DeleteCrdLocked(NameOfKey(key));
    return;
  }
  json object = it->second;
  store.erase(it);
  TrackCollectableLocked(type.StoreKey(), key, nullptr);
  object["metadata"]["resourceVersion"] = std::to_string(++resourceVersion_);
  RecordEventLocked(type, "DELETED", object);
}

json FakeApiServer::DeleteLocked(const ResourceType& type, const std::string& key,
                                 const DeleteRequest& request) {
  auto& store = objects_[type.StoreKey()];
  auto it = store.find(key);
  const std::string name = NameOfKey(key);
  if (it == store.end()) {
    throw StatusError{404,
                      "NotFound",
                      type.Qualified() + " \"" + name + "\" not found",
                      {{"name", name}, {"group", type.group}, {"kind", type.plural}}};
  }
  const json old = it->second;
  auto conflict = [&](const std::string& what) {
    return StatusError{409,
                       "Conflict",
                       "Operation cannot be fulfilled on " + type.Qualified() + " \"" + name +
                           "\": Precondition failed: " + what,
                       {{"name", name}, {"group", type.group}, {"kind", type.plural}}};
  };
  const std::string uid = old["metadata"].value("uid", "");
  const std::string version = old["metadata"].value("resourceVersion", "");
  if (!request.uid.empty() && request.uid != uid) {
    throw conflict("UID in precondition: " + request.uid + ", UID in object meta: " + uid);
  }
  if (!request.resourceVersion.empty() && request.resourceVersion != version) {
    throw conflict("ResourceVersion in precondition: " + request.resourceVersion +
                   ", ResourceVersion in object meta: " + version);
  }
  const auto now = FormatTimestamp(std::chrono::system_clock::now());
  if (type.plural == "namespaces" && type.group.empty()) {
    // The namespace registry: the first DELETE makes it Terminating; the namespace controller
    // (FinalizeNamespacesLocked) empties it and removes it.
    if (IsDeleting(old)) {
      bool free = Finalizers(old).empty() &&
                  old.value("spec", json::object()).value("finalizers", json::array()).empty();
      if (free && !request.dryRun) RemoveLocked(type, key);
      return old;
    }
    json updated = old;
    updated["metadata"]["deletionTimestamp"] = now;
    updated["status"]["phase"] = "Terminating";
    if (request.dryRun) return updated;
    return CommitLocked(type, key, std::move(updated));
  }
  if (type.plural == "pods" && type.group.empty()) {
    // The pod registry deletes gracefully (podStrategy.CheckGracefulDelete, BeforeDelete): a
    // pod bound to a node and not finished stays, Terminating, for its grace period (the
    // request's, else spec.terminationGracePeriodSeconds, defaulted to 30) until its kubelet
    // deletes it with grace 0; an unscheduled or finished pod goes at once. A second DELETE
    // may only shorten the grace.
    const json spec = old.value("spec", json::object());
    const json status = old.value("status", json::object());
    int64_t period = request.gracePeriodSeconds.value_or(
        spec.value("terminationGracePeriodSeconds", json(30)).is_number_integer()
            ? spec.value("terminationGracePeriodSeconds", json(30)).get<int64_t>()
            : 30);
    const std::string phase = status.value("phase", "");
    if (spec.value("nodeName", "").empty() || phase == "Succeeded" || phase == "Failed") period = 0;
    if (period < 0) period = 1;
    const json& metadata = old["metadata"];
    const int64_t pending =
        metadata.value("deletionGracePeriodSeconds", json(0)).is_number_integer()
            ? metadata.value("deletionGracePeriodSeconds", json(0)).get<int64_t>()
            : 0;
    if (IsDeleting(old) && pending > 0) {
      if (period >= pending) return old;  // graceful deletion pending: nothing changes
      if (period > 0 || !Finalizers(old).empty()) {
        json updated = old;
        updated["metadata"]["deletionTimestamp"] =
            FormatTimestamp(std::chrono::system_clock::now() + std::chrono::seconds(period));
        updated["metadata"]["deletionGracePeriodSeconds"] = period;
        if (request.dryRun) return updated;
        return CommitLocked(type, key, std::move(updated));
      }
      if (request.dryRun) return old;
      RemoveLocked(type, key);
      return old;
    }
    if (!IsDeleting(old) && period > 0) {
      json updated = old;
      updated["metadata"]["deletionTimestamp"] =
          FormatTimestamp(std::chrono::system_clock::now() + std::chrono::seconds(period));
      updated["metadata"]["deletionGracePeriodSeconds"] = period;
      if (request.propagationPolicy == "Orphan" || request.propagationPolicy == "Foreground") {
        json finalizers = updated["metadata"].value("finalizers", json::array());
        const std::string added =
            request.propagationPolicy == "Orphan" ? "orphan" : "foregroundDeletion";
        if (std::find(finalizers.begin(), finalizers.end(), added) == finalizers.end()) {
          finalizers.push_back(added);
        }
        updated["metadata"]["finalizers"] = finalizers;
      }
      if (request.dryRun) return updated;
      return CommitLocked(type, key, std::move(updated));
    }
  }
  // deletionFinalizersForGarbageCollection: an explicit policy sets the collector's
  // finalizers; none keeps what is there.
  std::vector<std::string> finalizers = Finalizers(old);
  auto drop = [&finalizers](const std::string& finalizer) {
    finalizers.erase(std::remove(finalizers.begin(), finalizers.end(), finalizer),
                     finalizers.end());
  };
  auto add = [&finalizers](const std::string& finalizer) {
    if (std::find(finalizers.begin(), finalizers.end(), finalizer) == finalizers.end()) {
      finalizers.push_back(finalizer);
    }
  };
  if (request.propagationPolicy == "Orphan") {
    add("orphan");
    drop("foregroundDeletion");
  } else if (request.propagationPolicy == "Foreground") {
    add("foregroundDeletion");
    drop("orphan");
  } else if (request.propagationPolicy == "Background") {
    drop("orphan");
    drop("foregroundDeletion");
  }
  if (finalizers.empty() && !IsDeleting(old)) {
    // Nothing holds it: it goes at once.
    json deleted = old;
    if (request.dryRun) return deleted;
    RemoveLocked(type, key);
    return deleted;
  }
  json updated = old;
  if (!IsDeleting(old)) {
    // markAsDeleting: once only, so a second DELETE leaves deletionTimestamp alone.
    updated["metadata"]["deletionTimestamp"] = now;
    updated["metadata"]["deletionGracePeriodSeconds"] = 0;
    updated["metadata"]["generation"] = old["metadata"].value("generation", 1) + 1;
  }
  if (finalizers.empty()) {
    updated["metadata"].erase("finalizers");
  } else {
    updated["metadata"]["finalizers"] = finalizers;
  }
  if (updated == old) return old;
  if (request.dryRun) return updated;
  return CommitLocked(type, key, std::move(updated));
}

std::shared_ptr<const FakeApiServer::ResourceType> FakeApiServer::TypeForStoreLocked(
    const std::string& storeKey) const {
  for (const auto& [key, type] : types_) {
    (void)key;
    // The kind that owns the storage, not one kept in it (core Events, not events.k8s.io's).
    if (type->StoreKey() == storeKey && type->storage.empty()) return type;
  }
  return nullptr;
}

std::shared_ptr<const FakeApiServer::ResourceType> FakeApiServer::TypeForKindLocked(
    const std::string& apiVersion, const std::string& kind) const {
  std::string group =
      apiVersion.find('/') == std::string::npos ? "" : apiVersion.substr(0, apiVersion.find('/'));
  std::shared_ptr<const ResourceType> found;
  for (const auto& [key, type] : types_) {
    (void)key;
    if (type->group == group && type->kind == kind) {
      if (type->ApiVersion() == apiVersion) return type;
      found = type;
    }
  }
  return found;
}

void FakeApiServer::SettleLocked() {
  // Each pass acts on what the last one changed; a few rounds reach the fixed point (the bound
  // only guards against a cycle of owner references).
  for (int round = 0; settleNeeded_ && round < 1000; ++round) {
    settleNeeded_ = false;
    CollectGarbageLocked();
    FinalizeNamespacesLocked();
  }
}

void FakeApiServer::TrackCollectableLocked(const std::string& storeKey, const std::string& key,
                                           const json* object) {
  bool collectable = false;
  if (object != nullptr && object->contains("metadata")) {
    const json& metadata = (*object)["metadata"];
    const auto references = metadata.find("ownerReferences");
    collectable = references != metadata.end() && references->is_array() && !references->empty();
    if (!collectable && IsDeleting(*object)) {
      for (const std::string& finalizer : Finalizers(*object)) {
        collectable = collectable || finalizer == "orphan" || finalizer == "foregroundDeletion";
      }
    }
  }
  if (collectable) {
    collectable_.emplace(storeKey, key);
  } else {
    collectable_.erase({storeKey, key});
  }
}

void FakeApiServer::CollectGarbageLocked() {
  // The objects it can act on (collectable_: every other object is left as it is below), and
  // the dependents of every owner uid.
  struct Place {
    std::string storeKey;
    std::string key;
  };
  auto find = [this](const Place& place) -> json* {
    auto store = objects_.find(place.storeKey);
    if (store == objects_.end()) return nullptr;
    auto it = store->second.find(place.key);
    return it == store->second.end() ? nullptr : &it->second;
  };
  std::map<std::string, std::vector<Place>> dependents;
  std::vector<Place> all;
  for (auto entry = collectable_.begin(); entry != collectable_.end();) {
    const Place place{entry->first, entry->second};
    const json* object = find(place);
    if (object == nullptr) {
      entry = collectable_.erase(entry);  // its store went whole (a CRD deleted)
      continue;
    }
    ++entry;
    for (const auto& reference : object->at("metadata").value("ownerReferences", json::array())) {
      dependents[reference.value("uid", "")].push_back(place);
    }
    all.push_back(place);
  }
  for (const auto& place : all) {
    json* found = find(place);
    if (!found) continue;
    auto type = TypeForStoreLocked(place.storeKey);
    if (!type) continue;
    const std::string uid = (*found)["metadata"].value("uid", "");
    auto finalizers = Finalizers(*found);
    auto has = [&finalizers](const char* name) {
      return std::find(finalizers.begin(), finalizers.end(), name) != finalizers.end();
    };
    if (IsDeleting(*found) && has("orphan")) {
      // Orphan: the dependents lose their reference to it, then the finalizer goes.
      for (const auto& dependent : dependents[uid]) {
        json* object = find(dependent);
        auto dependentType = TypeForStoreLocked(dependent.storeKey);
        if (!object || !dependentType) continue;
        json updated = *object;
        json kept = json::array();
        for (const auto& reference : updated["metadata"]["ownerReferences"]) {
          if (reference.value("uid", "") != uid) kept.push_back(reference);
        }
        if (kept.empty()) {
          updated["metadata"].erase("ownerReferences");
        } else {
          updated["metadata"]["ownerReferences"] = kept;
        }
        if (updated != *object) CommitLocked(*dependentType, dependent.key, std::move(updated));
      }
      found = find(place);
      if (!found) continue;
      json updated = *found;
      finalizers.erase(std::remove(finalizers.begin(), finalizers.end(), "orphan"),
                       finalizers.end());
      updated["metadata"]["finalizers"] = finalizers;
      if (finalizers.empty()) updated["metadata"].erase("finalizers");
      CommitLocked(*type, place.key, std::move(updated));
      continue;
    }
    if (IsDeleting(*found) && has("foregroundDeletion")) {
      // Foreground: every dependent is deleted; those with blockOwnerDeletion hold the owner.
      bool blocked = false;
      for (const auto& dependent : dependents[uid]) {
        json* object = find(dependent);
        auto dependentType = TypeForStoreLocked(dependent.storeKey);
        if (!object || !dependentType) continue;
        if (!IsDeleting(*object)) {
          DeleteRequest request;
          const std::string dependentUid = (*object)["metadata"].value("uid", "");
          request.propagationPolicy = dependents.count(dependentUid) ? "Foreground" : "Background";
          DeleteLocked(*dependentType, dependent.key, request);
          object = find(dependent);
          if (!object) continue;
        }
        for (const auto& reference :
             (*object)["metadata"].value("ownerReferences", json::array())) {
          if (reference.value("uid", "") == uid && reference.value("blockOwnerDeletion", false)) {
            blocked = true;
          }
        }
      }
      found = find(place);
      if (!found || blocked) continue;
      json updated = *found;
      finalizers.erase(std::remove(finalizers.begin(), finalizers.end(), "foregroundDeletion"),
                       finalizers.end());
      updated["metadata"]["finalizers"] = finalizers;
      if (finalizers.empty()) updated["metadata"].erase("finalizers");
      CommitLocked(*type, place.key, std::move(updated));
      continue;
    }
    // Background: an object whose owners are all gone goes; dangling references beside a
    // live owner are dropped. An owner of a kind this server does not serve counts as live
    // (the real collector cannot resolve it either and leaves the object).
    const json references = (*found)["metadata"].value("ownerReferences", json::array());
    if (references.empty() || IsDeleting(*found)) continue;
    const std::string ns = (*found)["metadata"].value("namespace", "");
    json solid = json::array();
    bool dangling = false;
    bool waiting = false;
    for (const auto& reference : references) {
      auto ownerType =
          TypeForKindLocked(reference.value("apiVersion", ""), reference.value("kind", ""));
      if (!ownerType) {
        solid.push_back(reference);
        continue;
      }
      auto store = objects_.find(ownerType->StoreKey());
      const json* owner = nullptr;
      if (store != objects_.end()) {
        auto it = store->second.find(
            ObjectKey(ownerType->namespaced ? ns : "", reference.value("name", "")));
        if (it != store->second.end() &&
            it->second["metadata"].value("uid", "") == reference.value("uid", "")) {
          owner = &it->second;
        }
      }
      if (!owner) {
        dangling = true;
      } else if (auto ownerFinalizers = Finalizers(*owner);
                 IsDeleting(*owner) && std::find(ownerFinalizers.begin(), ownerFinalizers.end(),
                                                 "foregroundDeletion") != ownerFinalizers.end()) {
        waiting = true;
      } else {
        solid.push_back(reference);
      }
    }
    if (solid.empty() && !waiting) {
      DeleteLocked(*type, place.key, DeleteRequest{});
    } else if (!solid.empty() && dangling) {
      json updated = *found;
      updated["metadata"]["ownerReferences"] = solid;
      CommitLocked(*type, place.key, std::move(updated));
    }
  }
}

void FakeApiServer::FinalizeNamespacesLocked() {
  auto namespaceType = FindType("", "v1", "namespaces");
  std::vector<std::string> terminating;
  for (const auto& [key, object] : objects_["/namespaces"]) {
    if (IsDeleting(object)) terminating.push_back(NameOfKey(key));
  }
  for (const auto& ns : terminating) {
    // The namespace controller deletes the content (each as a DELETE: finalizers hold it)...
    size_t remaining = 0;
    for (auto& [storeKey, store] : objects_) {
      auto type = TypeForStoreLocked(storeKey);
      if (!type || !type->namespaced) continue;
      std::vector<std::string> keys;
      for (auto it = store.lower_bound(ns + "/");
           it != store.end() && it->first.rfind(ns + "/", 0) == 0; ++it) {
        keys.push_back(it->first);
      }
      for (const auto& key : keys) {
        auto it = store.find(key);
        if (it != store.end() && !IsDeleting(it->second)) DeleteLocked(*type, key, DeleteRequest{});
      }
      for (auto it = store.lower_bound(ns + "/");
           it != store.end() && it->first.rfind(ns + "/", 0) == 0; ++it) {
        ++remaining;
      }
    }
    auto& namespaces = objects_["/namespaces"];
    auto it = namespaces.find(ObjectKey("", ns));
    if (it == namespaces.end() || remaining > 0) continue;
    // ...then, once it is empty, drops its `kubernetes` finalizer, and the namespace goes.
    json updated = it->second;
    json kept = json::array();
    for (const auto& finalizer :
         updated.value("spec", json::object()).value("finalizers", json::array())) {
      if (finalizer != "kubernetes") kept.push_back(finalizer);
    }
    if (kept != updated.value("spec", json::object()).value("finalizers", json::array())) {
      updated["spec"]["finalizers"] = kept;
      if (kept.empty()) updated["spec"].erase("finalizers");
      CommitLocked(*namespaceType, ObjectKey("", ns), std::move(updated));
    } else if (Finalizers(updated).empty() && kept.empty()) {
      RemoveLocked(*namespaceType, ObjectKey("", ns));
    }
  }
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
      json created = CreateLocked(*type, ns, object, false);
      SettleLocked();
      return created;
    }
  }
  throw std::invalid_argument("fake API server: no served kind " + apiVersion + " " + kind);
}

json FakeApiServer::Object(const std::string& apiVersion, const std::string& plural,
                           const std::string& ns, const std::string& name) const {
  std::lock_guard lock(mutex_);
  const auto slash = apiVersion.find('/');
  std::string group = slash == std::string::npos ? "" : apiVersion.substr(0, slash);
  std::string version = slash == std::string::npos ? apiVersion : apiVersion.substr(slash + 1);
  // Through the kind's storage, in the kind's own form (events.k8s.io/v1 Events as such).
  auto type = FindType(group, version, plural);
  auto store = objects_.find(type ? type->StoreKey() : group + "/" + plural);
  if (store == objects_.end()) return nullptr;
  auto it = store->second.find(ObjectKey(ns, name));
  if (it == store->second.end()) return nullptr;
  return FromStorage(group, plural, it->second);
}

std::string FakeApiServer::CurrentResourceVersion() const {
  std::lock_guard lock(mutex_);
  return std::to_string(resourceVersion_);
}

}  // namespace cozy::fake
