// The REST handlers: routing a path to its kind, lists, get, create, update, patch, delete.
#include "test/fakes/fake_apiserver_internal.h"

#include <algorithm>

namespace cozy::fake {
using namespace internal;  // NOLINT

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
  const bool finalizeWrite = subresource == "finalize" && type->plural == "namespaces" &&
                             type->group.empty() && request.method == "PUT";
  if (!subresource.empty() && !finalizeWrite &&
      (subresource != "status" || !type->statusSubresource)) {
    throw StatusError{404, "NotFound", "the server could not find the requested resource",
                      json::object()};
  }
  const bool statusWrite = subresource == "status";
  const std::string& method = request.method;
  // dryRun (query, and a DeleteOptions body): only "All" is known.
  std::vector<std::string> dryRunValues;
  for (size_t i = 0; i < request.get_param_value_count("dryRun"); ++i) {
    dryRunValues.push_back(request.get_param_value("dryRun", i));
  }
  json deleteOptions = json::object();
  if (method == "DELETE" && !request.body.empty()) {
    deleteOptions = json::parse(request.body, nullptr, false);
    if (deleteOptions.is_discarded() || !deleteOptions.is_object()) {
      throw StatusError{400, "BadRequest", "the DeleteOptions body is not a JSON object",
                        json::object()};
    }
    for (const auto& value : deleteOptions.value("dryRun", json::array())) {
      if (value.is_string()) dryRunValues.push_back(value.get<std::string>());
    }
  }
  const std::string optionsKind = method == "POST"    ? "CreateOptions"
                                  : method == "PUT"   ? "UpdateOptions"
                                  : method == "PATCH" ? "PatchOptions"
                                                      : "DeleteOptions";
  auto invalidOptions = [&optionsKind](const std::string& field, const std::string& message) {
    return StatusError{
        422,
        "Invalid",
        optionsKind + ".meta.k8s.io \"\" is invalid: " + field + ": " + message,
        {{"group", "meta.k8s.io"},
         {"kind", optionsKind},
         {"causes",
          json::array(
              {{{"reason", "FieldValueNotSupported"}, {"field", field}, {"message", message}}})}}};
  };
  bool dryRun = false;
  if (method != "GET" && !dryRunValues.empty()) {
    std::string list;
    for (const auto& value : dryRunValues) list += (list.empty() ? "\"" : ", \"") + value + "\"";
    for (const auto& value : dryRunValues) {
      if (value != "All") {
        throw invalidOptions(
            "dryRun", "Unsupported value: []string{" + list + "}: supported values: \"All\"");
      }
    }
    dryRun = true;
  }
  DeleteRequest deletion;
  deletion.dryRun = dryRun;
  if (method == "DELETE") {
    deletion.propagationPolicy = deleteOptions.value("propagationPolicy", "");
    if (request.has_param("propagationPolicy")) {
      deletion.propagationPolicy = request.get_param_value("propagationPolicy");
    }
    if (deletion.propagationPolicy.empty() && deleteOptions.contains("orphanDependents") &&
        deleteOptions["orphanDependents"].is_boolean()) {
      deletion.propagationPolicy =
          deleteOptions["orphanDependents"].get<bool>() ? "Orphan" : "Background";
    }
    if (!deletion.propagationPolicy.empty() && deletion.propagationPolicy != "Foreground" &&
        deletion.propagationPolicy != "Background" && deletion.propagationPolicy != "Orphan") {
      throw invalidOptions("propagationPolicy",
                           "Unsupported value: \"" + deletion.propagationPolicy +
                               "\": supported values: \"Foreground\", \"Background\", "
                               "\"Orphan\", \"nil\"");
    }
    if (deleteOptions.contains("gracePeriodSeconds") &&
        deleteOptions["gracePeriodSeconds"].is_number_integer()) {
      deletion.gracePeriodSeconds = deleteOptions["gracePeriodSeconds"].get<int64_t>();
    }
    if (request.has_param("gracePeriodSeconds")) {
      try {
        deletion.gracePeriodSeconds = std::stoll(request.get_param_value("gracePeriodSeconds"));
      } catch (const std::exception&) {
        throw invalidOptions("gracePeriodSeconds", "not an integer");
      }
    }
    const json preconditions = deleteOptions.value("preconditions", json::object());
    if (preconditions.is_object()) {
      deletion.uid = preconditions.value("uid", "");
      deletion.resourceVersion = preconditions.value("resourceVersion", "");
    }
  }
  auto notFound = [&type](const std::string& missing) {
    return StatusError{404,
                       "NotFound",
                       type->Qualified() + " \"" + missing + "\" not found",
                       {{"name", missing}, {"group", type->group}, {"kind", type->plural}}};
  };
  bool wantsTable = request.get_header_value("Accept").find("as=Table") != std::string::npos;
  // An object already in this kind's form, with its apiVersion and kind.
  auto shownAs = [&type](json object) {
    object["apiVersion"] = type->ApiVersion();
    object["kind"] = type->kind;
    return object;
  };
  // What admission sees of this request; its options as the real server sends them
  // (a PATCH arrives as UPDATE with UpdateOptions: handlers/patch.go).
  auto admissionFor = [&](const std::string& operation) {
    Admission admission;
    admission.type = type;
    admission.operation = operation;
    admission.subresource = subresource;
    admission.ns = type->namespaced ? ns : "";
    admission.name = name;
    admission.dryRun = dryRun;
    admission.user = UserFor(request);
    json options = operation == "DELETE" ? deleteOptions : json::object();
    options["apiVersion"] = "meta.k8s.io/v1";
    options["kind"] = operation == "CREATE"   ? "CreateOptions"
                      : operation == "UPDATE" ? "UpdateOptions"
                                              : "DeleteOptions";
    if (dryRun) options["dryRun"] = json::array({"All"});
    if (operation != "DELETE" && request.has_param("fieldManager")) {
      options["fieldManager"] = request.get_param_value("fieldManager");
    }
    admission.options = options;
    return admission;
  };
  // An object as this kind shows it: converted from its storage's form (events.k8s.io/v1
  // Events), then with its apiVersion and kind.
  auto withTypeMeta = [&type](json object) {
    object = FromStorage(type->group, type->plural, std::move(object));
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
    // Pages: `continue` names the last key of the page before (hex, opaque to clients), as the
    // real server's token carries etcd's last key: the next page starts after it, whatever was
    // added or removed before it meanwhile, and only the page's objects are copied.
    std::string startAfter;
    if (request.has_param("continue")) {
      const std::string token = request.get_param_value("continue");
      if (token.size() % 2 != 0 ||
          token.find_first_not_of("0123456789abcdef") != std::string::npos) {
        throw StatusError{400, "BadRequest", "continue key is not valid", json::object()};
      }
      for (size_t i = 0; i < token.size(); i += 2) {
        startAfter.push_back(static_cast<char>(std::stoi(token.substr(i, 2), nullptr, 16)));
      }
    }
    size_t limit = request.has_param("limit") ? std::stoul(request.get_param_value("limit")) : 0;
    std::vector<json> items;
    std::string listVersion;
    std::string next;
    {
      std::lock_guard lock(mutex_);
      listVersion = std::to_string(resourceVersion_);
      const auto& store = objects_[type->StoreKey()];
      auto it = startAfter.empty() ? store.begin() : store.upper_bound(startAfter);
      std::string lastKey;
      for (; it != store.end(); ++it) {
        const auto& [key, object] = *it;
        if (!ns.empty() && object["metadata"].value("namespace", "") != ns) continue;
        json shown =
            type->storage.empty() ? json() : FromStorage(type->group, type->plural, object);
        if (!selectors.Matches(type->storage.empty() ? object : shown)) continue;
        if (limit > 0 && items.size() == limit) {
          // One more matches: there is a next page, after the last key of this one.
          static const char* const kHex = "0123456789abcdef";
          for (char c : lastKey) {
            const auto byte = static_cast<unsigned char>(c);
            next.push_back(kHex[byte >> 4]);
            next.push_back(kHex[byte & 15]);
          }
          break;
        }
        items.push_back(type->storage.empty() ? object : std::move(shown));
        lastKey = key;
      }
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
    bool admit = false;
    {
      std::lock_guard lock(mutex_);
      admit = AdmissionConfiguredLocked();
      // NamespaceLifecycle comes before the webhooks in the admission chain.
      if (admit && type->namespaced) {
        AdmitToNamespaceLocked(*type, ns, body.value("metadata", json::object()).value("name", ""));
      }
    }
    if (admit) {
      // Mutating webhooks see the decoded object (namespace set, no uid yet); validating
      // ones the object as it would be stored (a dry run of the create).
      Admission admission = admissionFor("CREATE");
      if (!body.contains("metadata") || !body["metadata"].is_object()) {
        body["metadata"] = json::object();
      }
      if (type->namespaced) {
        // The create handler's check comes before admission (CreateLocked repeats it).
        const std::string bodyNs = body["metadata"].value("namespace", "");
        if (!bodyNs.empty() && bodyNs != ns) {
          throw StatusError{400, "BadRequest",
                            "the namespace of the provided object does not match the namespace "
                            "sent on the request"};
        }
        body["metadata"]["namespace"] = ns;
      }
      body["apiVersion"] = type->ApiVersion();
      body["kind"] = type->kind;
      admission.name = body["metadata"].value("name", "");
      admission.object = body;
      body = AdmitMutating(admission, response);
      {
        std::lock_guard lock(mutex_);
        admission.object = shownAs(CreateLocked(*type, ns, body, true, /*dryRun=*/true));
      }
      // A generated name is the one validating webhooks saw.
      if (body["metadata"].value("name", "").empty()) {
        body["metadata"]["name"] = admission.object["metadata"].value("name", "");
      }
      AdmitValidating(admission, response);
    }
    json created;
    {
      std::lock_guard lock(mutex_);
      created = CreateLocked(*type, ns, std::move(body), true, dryRun);
      SettleLocked();
    }
    SendJson(response, 201, created);
    return {201};
  }

  if (method == "DELETE" && name.empty() && subresource.empty()) {
    // deletecollection: each object the selectors pick, as its own DELETE.
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
    json list = {{"kind", type->listKind},
                 {"apiVersion", type->ApiVersion()},
                 {"metadata", json::object()},
                 {"items", json::array()}};
    std::unique_lock lock(mutex_);
    std::vector<std::string> keys;
    for (const auto& [key, object] : objects_[type->StoreKey()]) {
      if (!ns.empty() && object["metadata"].value("namespace", "") != ns) continue;
      if (selectors.Matches(FromStorage(type->group, type->plural, object))) keys.push_back(key);
    }
    const bool admit = AdmissionConfiguredLocked();
    for (const auto& key : keys) {
      if (!objects_[type->StoreKey()].count(key)) continue;
      if (admit) {
        // Each object's DELETE is admitted on its own, without the lock; a denial ends the
        // collection there (what was deleted stays deleted), as the first error of the real
        // server's parallel deletes does.
        json existing = withTypeMeta(objects_[type->StoreKey()][key]);
        lock.unlock();
        Admission admission = admissionFor("DELETE");
        admission.name = NameOfKey(key);
        admission.oldObject = std::move(existing);
        AdmitMutating(admission, response);
        AdmitValidating(admission, response);
        lock.lock();
        if (!objects_[type->StoreKey()].count(key)) continue;
      }
      list["items"].push_back(withTypeMeta(DeleteLocked(*type, key, deletion)));
    }
    SettleLocked();
    list["metadata"]["resourceVersion"] = std::to_string(resourceVersion_);
    SendJson(response, 200, list);
    return {200};
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
      object = FromStorage(type->group, type->plural, it->second);
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
    if (type->group.empty() && type->plural == "namespaces" &&
        std::find_if(std::begin(kImmortalNamespaces), std::end(kImmortalNamespaces),
                     [&name](const char* immortal) { return name == immortal; }) !=
            std::end(kImmortalNamespaces)) {
      // The NamespaceLifecycle admission plugin, before the object is looked at (dryRun too).
      throw StatusError{
          403,
          "Forbidden",
          "namespaces \"" + name + "\" is forbidden: this namespace may not be deleted",
          {{"name", name}, {"kind", "namespaces"}}};
    }
    json existing;
    {
      std::lock_guard lock(mutex_);
      if (AdmissionConfiguredLocked()) {
        auto& store = objects_[type->StoreKey()];
        if (auto it = store.find(key); it != store.end()) existing = withTypeMeta(it->second);
      }
    }
    if (!existing.is_null()) {
      // DELETE: oldObject is the object, object is null, options the DeleteOptions.
      Admission admission = admissionFor("DELETE");
      admission.oldObject = existing;
      AdmitMutating(admission, response);
      AdmitValidating(admission, response);
    }
    json deleted;
    {
      std::lock_guard lock(mutex_);
      deleted = FromStorage(type->group, type->plural, DeleteLocked(*type, key, deletion));
      SettleLocked();
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
    std::unique_lock lock(mutex_);
    auto& store = objects_[type->StoreKey()];
    auto it = store.find(key);
    if (it == store.end()) throw notFound(name);
    // As stored, and as this kind shows it (the one a patch applies to).
    const json stored = it->second;
    const json old =
        type->storage.empty() ? stored : FromStorage(type->group, type->plural, stored);
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
      if (sent.empty() && type->requiresResourceVersion) {
        throw StatusError{422,
                          "Invalid",
                          type->kind + "." + type->group + " \"" + name +
                              "\" is invalid: metadata.resourceVersion: Invalid value: 0x0: "
                              "must be specified for an update",
                          {{"name", name}, {"group", type->group}, {"kind", type->kind}}};
      }
      updated = body;
    } else if (contentType == "application/merge-patch+json") {
      updated = old;
      updated.merge_patch(body);
    } else if (contentType == "application/strategic-merge-patch+json" && !type->custom) {
      // Built-in kinds take strategic merge patches (kubectl apply sends them): lists with a
      // merge key merge element by element, and the patch's directives are obeyed, not stored.
      updated = StrategicMergePatch(old, body);
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
    if (finalizeWrite) {
      // /finalize: only spec.finalizers is taken.
      json finalized = old;
      finalized["spec"]["finalizers"] =
          updated.value("spec", json::object()).value("finalizers", json::array());
      if (finalized["spec"]["finalizers"].empty()) finalized["spec"].erase("finalizers");
      updated = finalized;
    } else if (!statusWrite && type->plural == "namespaces" && type->group.empty() &&
               updated.is_object()) {
      // The namespace strategy: spec.finalizers changes only through /finalize.
      const json spec = old.value("spec", json::object());
      if (spec.contains("finalizers")) {
        updated["spec"]["finalizers"] = spec["finalizers"];
      } else if (updated.contains("spec") && updated["spec"].is_object()) {
        updated["spec"].erase("finalizers");
      }
    }
    if (AdmissionConfiguredLocked()) {
      // UPDATE admission without the lock: mutating webhooks, the built-in validation (a dry
      // run of the write), validating webhooks. A write that lands meanwhile is a 409 (the
      // real server retries a patch on it; this fake does not).
      const std::string storedVersion = stored["metadata"].value("resourceVersion", "");
      auto unchanged = [&] {
        auto& now = objects_[type->StoreKey()];
        auto found = now.find(key);
        if (found == now.end()) throw notFound(name);
        if (found->second["metadata"].value("resourceVersion", "") != storedVersion) {
          throw StatusError{409,
                            "Conflict",
                            "Operation cannot be fulfilled on " + type->Qualified() + " \"" + name +
                                "\": the object has been modified; please apply your "
                                "changes to the latest version and try again",
                            {{"name", name}, {"group", type->group}, {"kind", type->plural}}};
        }
      };
      lock.unlock();  // (admissionFor takes it to read the user)
      Admission admission = admissionFor("UPDATE");
      admission.oldObject = shownAs(old);
      admission.object = shownAs(updated);
      updated = AdmitMutating(admission, response);
      lock.lock();
      unchanged();
      admission.object =
          shownAs(WriteLocked(*type, key, stored, updated, statusWrite, /*dryRun=*/true));
      lock.unlock();
      AdmitValidating(admission, response);
      lock.lock();
      unchanged();
    }
    json result = WriteLocked(*type, key, stored, std::move(updated), statusWrite, dryRun);
    SettleLocked();
    SendJson(response, 200, result);
    return {200};
  }
  throw StatusError{405, "MethodNotAllowed",
                    "the server does not allow this method on the requested resource",
                    json::object()};
}

}  // namespace cozy::fake
