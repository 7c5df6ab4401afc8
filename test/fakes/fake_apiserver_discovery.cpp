// Discovery (/api, /apis, /version, /openapi/v3) and kubectl's Table output.
#include "test/fakes/fake_apiserver_internal.h"

#include <algorithm>
#include <functional>

namespace cozy::fake {
using namespace internal;  // NOLINT

FakeApiServer::Outcome FakeApiServer::Discovery(const std::string& path,
                                                httplib::Response& response) {
  std::lock_guard lock(mutex_);
  auto resourcesOf = [this](const std::string& group, const std::string& version) {
    json resources = json::array();
    for (const auto& [key, type] : types_) {
      (void)key;
      if (type->group != group || type->version != version) continue;
      json resource = {
          {"name", type->plural},
          {"singularName", type->singular},
          {"namespaced", type->namespaced},
          {"kind", type->kind},
          {"verbs",
           {"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}}};
      if (!type->shortNames.empty()) resource["shortNames"] = type->shortNames;
      if (!type->categories.empty()) resource["categories"] = type->categories;
      resources.push_back(resource);
      if (type->plural == "namespaces" && type->group.empty()) {
        resources.push_back({{"name", "namespaces/finalize"},
                             {"singularName", ""},
                             {"namespaced", false},
                             {"kind", "Namespace"},
                             {"verbs", {"update"}}});
      }
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
  } else if (type.group.empty() && type.plural == "namespaces") {
    column("Status", "string");
    column("Age", "string");
    cells = [age](const json& object) {
      return json::array({object["metadata"].value("name", ""),
                          object.value("status", json::object()).value("phase", ""), age(object)});
    };
  } else if (type.group.empty() && (type.plural == "configmaps" || type.plural == "secrets")) {
    const bool secret = type.plural == "secrets";
    if (secret) column("Type", "string");
    column("Data", "integer");
    column("Age", "string");
    cells = [age, secret](const json& object) {
      size_t count = object.value("data", json::object()).size() +
                     object.value("binaryData", json::object()).size();
      json row = json::array({object["metadata"].value("name", "")});
      if (secret) row.push_back(object.value("type", ""));
      row.push_back(count);
      row.push_back(age(object));
      return row;
    };
  } else if (type.group == "coordination.k8s.io" && type.plural == "leases") {
    column("Holder", "string");
    column("Age", "string");
    cells = [age](const json& object) {
      json holder = object.value("spec", json::object()).value("holderIdentity", json());
      return json::array({object["metadata"].value("name", ""),
                          holder.is_string() ? holder : json(""), age(object)});
    };
  } else if (type.plural == "events" && (type.group.empty() || type.group == "events.k8s.io")) {
    // The same columns for both APIs (one printer for the one stored kind).
    column("Type", "string");
    column("Reason", "string");
    column("Object", "string");
    column("Message", "string");
    cells = [](const json& shown) {
      const json object = shown.value("apiVersion", "") == "events.k8s.io/v1"
                              ? ToStorage("events.k8s.io", "events", shown)
                              : shown;
      const json involved = object.value("involvedObject", json::object());
      std::string kind = involved.value("kind", "");
      std::transform(kind.begin(), kind.end(), kind.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      return json::array({object["metadata"].value("name", ""), object.value("type", ""),
                          object.value("reason", ""), kind + "/" + involved.value("name", ""),
                          object.value("message", "")});
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

}  // namespace cozy::fake
