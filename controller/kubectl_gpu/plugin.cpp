#include "controller/kubectl_gpu/plugin.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>

#include "api/keys.h"
#include "controller/kinds.h"
#include "controller/simulate.h"
#include "controller/snapshot_json.h"
#include "controller/table.h"
#include "controller/watched.h"
#include "kube/client.h"
#include "kube/config.h"
#include "kube/errors.h"

namespace cozy::controller::plugin {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// A kubeconfig or server the command cannot use: printed as is, exit 2.
struct Unusable {
  std::string message;
};

json OptionalNumber(const std::optional<int64_t>& value) {
  return value ? json(*value) : json(nullptr);
}

std::string Text(const json& value, const char* none) {
  if (value.is_null()) return none;
  return value.is_string() ? value.get<std::string>() : value.dump();
}

// The kubeconfig file as kubectl picks it: --kubeconfig, else the first file of $KUBECONFIG
// that exists (kubectl merges them; the first one found is where a context usually lives),
// else ~/.kube/config.
fs::path KubeconfigPath(const std::string& flag) {
  if (!flag.empty()) {
    if (!fs::exists(flag)) throw Unusable{"kubeconfig " + flag + " (--kubeconfig): no such file"};
    return flag;
  }
  if (const char* env = std::getenv("KUBECONFIG"); env != nullptr && *env != '\0') {
    std::stringstream list(env);
    std::string entry;
    while (std::getline(list, entry, ':')) {
      if (!entry.empty() && fs::exists(entry)) return entry;
    }
    throw Unusable{std::string("kubeconfig: no file of KUBECONFIG=") + env + " exists"};
  }
  const char* home = std::getenv("HOME");
  const fs::path file = fs::path(home == nullptr ? "" : home) / ".kube" / "config";
  if (!fs::exists(file)) {
    throw Unusable{"kubeconfig " + file.string() +
                   ": no such file (give --kubeconfig or set KUBECONFIG)"};
  }
  return file;
}

struct Kind {
  std::string kind;
  std::string apiVersion;
  std::string path;
  bool optional;  // unserved (its CRD or KubeVirt not installed): no items, not an error
};

// What the model reads (each kind of the table with a snapshot member, controller/watched.h), as
// `simulate` reads them from a file. A kind outside the core group may be unserved. The core
// kinds, which every cluster serves, are read first: credentials the server refuses fail on the
// first read, of the namespaces.
std::vector<Kind> Kinds() {
  std::vector<Kind> kinds;
  ForEachWatched([&kinds](const auto& watched) {
    if (!InSnapshot(watched)) return;
    kinds.push_back({std::string(watched.objectKind), watched.kind.ApiVersion(),
                     watched.kind.Path(), !watched.kind.group.empty()});
  });
  std::stable_partition(kinds.begin(), kinds.end(),
                        [](const Kind& kind) { return !kind.optional; });
  return kinds;
}

// Pages of 500, as kubectl reads a large list.
const kube::ListOptions kListOptions{"", "", "", 500, {}};

// The settings ConfigMap gpu-controller publishes in its own namespace (its --namespace, the
// chart's release namespace): in --controller-namespace when given; else in cozy-system, the
// default, else in the one namespace that has a ConfigMap of that name. Null when none is found,
// with a warning saying why: without it the hoster's extra GPU resource names are not counted.
json ReadSettings(kube::Client& client, const std::string& controllerNamespace,
                  std::vector<std::string>& warnings) {
  const std::string name(api::kSettingsConfigMapName);
  const std::string first = controllerNamespace.empty()
                                ? std::string(api::kDefaultControllerNamespace)
                                : controllerNamespace;
  const std::string consequence =
      ": the hoster's extra GPU resource names (gpu.resourceNames) are not counted";
  try {
    return client.Get(kConfigMaps.Path(first, name));
  } catch (const kube::ApiError& error) {
    if (error.kind() != kube::ErrorKind::kNotFound) throw;
  }
  if (!controllerNamespace.empty()) {
    warnings.push_back("no ConfigMap " + name + " in namespace " + controllerNamespace +
                       " (--controller-namespace), where a running gpu-controller publishes it" +
                       consequence);
    return nullptr;
  }
  json list;
  try {
    list = client.List(kConfigMaps.Path(),
                       kube::ListOptions{"", "metadata.name=" + name, "", 500, {}});
  } catch (const kube::ApiError& error) {
    if (error.kind() != kube::ErrorKind::kForbidden) throw;
    warnings.push_back("no ConfigMap " + name + " in namespace " + first +
                       ", and listing ConfigMaps of every namespace is forbidden: give the "
                       "namespace gpu-controller is installed in as --controller-namespace" +
                       consequence);
    return nullptr;
  }
  std::vector<std::string> found;
  for (const json& item : list["items"]) {
    found.push_back(item["metadata"].value("namespace", ""));
  }
  if (found.size() == 1) return std::move(list["items"][0]);
  if (found.empty()) {
    warnings.push_back("no ConfigMap " + name +
                       " in any namespace: gpu-controller has not published its settings" +
                       consequence);
  } else {
    warnings.push_back("a ConfigMap " + name + " in each of the namespaces " + Join(found, ", ") +
                       ": give the one gpu-controller is installed in as --controller-namespace" +
                       consequence);
  }
  return nullptr;
}

// The cluster as one Kubernetes List, each item with its kind, for DecodeSnapshotList.
json ReadCluster(kube::Client& client, const std::string& controllerNamespace,
                 std::vector<std::string>& warnings) {
  json items = json::array();
  for (const Kind& kind : Kinds()) {
    json list;
    try {
      list = client.List(kind.path, kListOptions);
    } catch (const kube::ApiError& error) {
      if (kind.optional && error.kind() == kube::ErrorKind::kResourceNotServed) continue;
      throw;
    }
    for (json& item : list["items"]) {
      item["kind"] = kind.kind;
      item["apiVersion"] = kind.apiVersion;
      items.push_back(std::move(item));
    }
  }
  json settings = ReadSettings(client, controllerNamespace, warnings);
  // An install whose webhooks answer any TLS client (--webhook-allow-unauthenticated-callers).
  if (settings.is_object() && settings.contains("data") && settings["data"].is_object() &&
      settings["data"].value(std::string(api::kSettingsWebhookCallersKey), std::string()) ==
          api::kWebhookCallersUnauthenticated) {
    warnings.push_back(
        "the GPU admission webhooks answer any TLS client that reaches them (the controller "
        "runs with --webhook-allow-unauthenticated-callers, the chart with "
        "gpu.webhook.allowUnauthenticatedCallers): give them the API server's webhook client CA "
        "(docs/install.md, \"Who may call the webhooks\")");
  }
  if (!settings.is_null()) {
    settings["kind"] = "ConfigMap";
    settings["apiVersion"] = "v1";
    items.push_back(std::move(settings));
  }
  return {{"apiVersion", "v1"}, {"kind", "List"}, {"items", std::move(items)}};
}

void Print(const json& document, const std::string& output, const std::string& table,
           std::ostream& out) {
  if (output == "json") {
    out << document.dump(2) << "\n";
  } else if (output == "yaml") {
    out << ToYaml(document);
  } else {
    out << table;
  }
}

// A string a YAML reader could take for something else: empty, a YAML 1.1 boolean or null
// word, or one that starts like a number. yaml-cpp quotes the rest where their characters
// need it.
bool NeedsQuotes(const std::string& text) {
  if (text.empty()) return true;
  std::string lower;
  for (const char c : text) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* word : {"true", "false", "yes", "no", "on", "off", "y", "n", "null", "~"}) {
    if (lower == word) return true;
  }
  return std::isdigit(static_cast<unsigned char>(text[0])) != 0 || text[0] == '+' ||
         text[0] == '-' || text[0] == '.';
}

void EmitString(YAML::Emitter& emitter, const std::string& text) {
  if (NeedsQuotes(text)) emitter << YAML::DoubleQuoted;
  emitter << text;
}

void EmitYaml(YAML::Emitter& emitter, const json& value) {
  if (value.empty() && (value.is_object() || value.is_array())) {
    emitter << YAML::Flow << (value.is_object() ? YAML::BeginMap : YAML::BeginSeq)
            << (value.is_object() ? YAML::EndMap : YAML::EndSeq);
  } else if (value.is_object()) {
    emitter << YAML::BeginMap;
    for (const auto& [key, member] : value.items()) {
      emitter << YAML::Key;
      EmitString(emitter, key);
      emitter << YAML::Value;
      EmitYaml(emitter, member);
    }
    emitter << YAML::EndMap;
  } else if (value.is_array()) {
    emitter << YAML::BeginSeq;
    for (const json& item : value) EmitYaml(emitter, item);
    emitter << YAML::EndSeq;
  } else if (value.is_string()) {
    EmitString(emitter, value.get<std::string>());
  } else if (value.is_null()) {
    emitter << YAML::Null;
  } else if (value.is_boolean()) {
    emitter << YAML::TrueFalseBool << value.get<bool>();
  } else {
    emitter << value.dump();  // numbers as JSON writes them
  }
}

}  // namespace

std::vector<std::string> OrderNamespacesWithoutTenantLabel(const json& cluster) {
  std::set<std::string> labelled, ordering;
  for (const json& item : cluster.value("items", json::array())) {
    const json metadata = item.value("metadata", json::object());
    const std::string kind = item.value("kind", "");
    if (kind == "Namespace" &&
        metadata.value("labels", json::object()).contains(api::kTenantNamespaceLabel)) {
      labelled.insert(metadata.value("name", ""));
    } else if (kind == "GPUDevice") {
      ordering.insert(metadata.value("namespace", ""));
    }
  }
  std::vector<std::string> missing;
  for (const std::string& ns : ordering) {
    if (!labelled.contains(ns)) missing.push_back(ns);
  }
  return missing;
}

std::string ToYaml(const json& document) {
  YAML::Emitter emitter;
  emitter.SetIndent(2);
  EmitYaml(emitter, document);
  return std::string(emitter.c_str()) + "\n";
}

json CatalogToJson(const model::ClusterView& view, bool perNode) {
  json classes = json::array();
  for (const model::ClassView& c : view.classes) {
    json nodes = json::array();
    for (const model::NodeView& node : view.nodes) {
      const auto it = node.classes.find(c.name);
      if (it == node.classes.end()) continue;
      nodes.push_back({{"name", node.name},
                       {"takesBinds", node.eligible},
                       {"units", it->second.units},
                       {"used", it->second.used},
                       {"free", it->second.free}});
    }
    json entry = {
        {"name", c.name},   {"source", c.source}, {"maxCount", OptionalNumber(c.maxCount)},
        {"units", c.units}, {"used", c.used},     {"free", c.free}};
    if (perNode) entry["nodes"] = std::move(nodes);
    classes.push_back(std::move(entry));
  }
  return {{"classes", std::move(classes)}};
}

std::string CatalogToTable(const json& catalog, bool perNode) {
  std::ostringstream out;
  if (!perNode) {
    Table table({"CLASS", "UNITS", "USED", "FREE", "MAXCOUNT", "SOURCE"});
    for (const json& c : catalog["classes"]) {
      table.Add({c["name"].get<std::string>(), c["units"].dump(), c["used"].dump(),
                 c["free"].dump(), Text(c["maxCount"], "-"), c["source"].get<std::string>()});
    }
    table.Print(out);
    return out.str();
  }
  Table table({"CLASS", "NODE", "TAKES BINDS", "UNITS", "USED", "FREE"});
  for (const json& c : catalog["classes"]) {
    table.Add({c["name"].get<std::string>(), "(all)", "-", c["units"].dump(), c["used"].dump(),
               c["free"].dump()});
    for (const json& node : c["nodes"]) {
      table.Add({c["name"].get<std::string>(), node["name"].get<std::string>(),
                 node["takesBinds"].get<bool>() ? "yes" : "no", node["units"].dump(),
                 node["used"].dump(), node["free"].dump()});
    }
  }
  table.Print(out);
  return out.str();
}

json NodesToJson(const model::Snapshot& snapshot, const model::ClusterView& view) {
  json nodes = json::array();
  for (const api::GpuNodeInventory& gpuNode : snapshot.gpuNodes) {
    int64_t units = 0, allocated = 0;
    for (const api::InventoryDevice& device : gpuNode.devices) {
      units += device.allocatable;
      allocated += device.allocated;
    }
    json entry = {{"name", gpuNode.nodeName},
                  {"functions", gpuNode.devices.size()},
                  {"resourceNames", gpuNode.resourceNames},
                  {"units", units},
                  {"allocated", allocated}};
    const model::NodeView* nodeView = nullptr;
    for (const model::NodeView& candidate : view.nodes) {
      if (candidate.name == gpuNode.nodeName) nodeView = &candidate;
    }
    json classes = json::object();
    if (nodeView != nullptr) {
      for (const auto& [name, c] : nodeView->classes) {
        classes[name] = {{"units", c.units}, {"used", c.used}, {"free", c.free}};
      }
    }
    entry["classes"] = std::move(classes);
    entry["takesBinds"] = nodeView != nullptr && nodeView->eligible;
    entry["reasons"] = nodeView != nullptr ? json(nodeView->reasons)
                                           : json::array({"no Node named " + gpuNode.nodeName});
    // What the binder last wrote (the TakesBinds condition), beside the model's answer now.
    json condition = nullptr;
    for (const api::Condition& c : gpuNode.conditions) {
      if (c.type == api::kTakesBindsCondition) {
        condition = {{"status", c.status}, {"reason", c.reason}, {"message", c.message}};
      }
    }
    entry["condition"] = std::move(condition);
    nodes.push_back(std::move(entry));
  }
  return {{"nodes", std::move(nodes)}};
}

std::string NodesToTable(const json& nodes) {
  std::ostringstream out;
  Table table({"NODE", "FUNCTIONS", "UNITS", "ALLOCATED", "CLASSES", "TAKES BINDS", "WHY NOT"});
  for (const json& node : nodes["nodes"]) {
    std::vector<std::string> classes;
    for (const auto& [name, c] : node["classes"].items()) {
      classes.push_back(name + " " + c["free"].dump() + "/" + c["units"].dump() + " free");
    }
    table.Add({node["name"].get<std::string>(), node["functions"].dump(), node["units"].dump(),
               node["allocated"].dump(), classes.empty() ? "-" : Join(classes, ", "),
               node["takesBinds"].get<bool>() ? "yes" : "no",
               Join(node["reasons"].get<std::vector<std::string>>(), "; ")});
  }
  table.Print(out);
  return out.str();
}

int Run(const Options& options, std::ostream& out, std::ostream& err) {
  std::string where;  // "context C of kubeconfig F (server S)", for messages
  try {
    const fs::path file = KubeconfigPath(options.kubeconfig);
    kube::ClientConfig config;
    try {
      config = kube::LoadKubeconfig(file, options.context);
    } catch (const kube::ConfigError& error) {
      throw Unusable{error.what()};
    }
    where = "context \"" + config.contextName + "\" of kubeconfig " + file.string() + " (server " +
            config.server + ")";
    const std::string ns =
        options.namespaceName.empty() ? config.namespace_ : options.namespaceName;
    kube::ClientOptions clientOptions;
    clientOptions.maxRetries = 1;
    clientOptions.qps = 0;
    clientOptions.userAgent = "kubectl-gpu";
    kube::Client client(config, clientOptions);

    std::vector<std::string> warnings;
    const json list = ReadCluster(client, options.controllerNamespace, warnings);
    for (const std::string& unlabelled : OrderNamespacesWithoutTenantLabel(list)) {
      warnings.push_back("namespace " + unlabelled + " has GPU orders but not the label " +
                         std::string(api::kTenantNamespaceLabel) +
                         ": the chart's raw-name and usage-monitor policies do not cover it "
                         "(docs/install.md, \"Tenant namespaces\")");
    }
    for (const std::string& warning : warnings) err << "kubectl gpu: warning: " << warning << "\n";
    const model::Snapshot snapshot = DecodeSnapshotList(list);
    const model::Model model(snapshot);
    for (const model::InputProblem& problem : model.Problems()) {
      err << "kubectl gpu: warning: " << problem.Describe() << "\n";
    }
    const model::ClusterView view = model.View();
    if (options.command == "catalog") {
      const json catalog = CatalogToJson(view, options.perNode);
      Print(catalog, options.output, CatalogToTable(catalog, options.perNode), out);
    } else if (options.command == "nodes") {
      const json nodes = NodesToJson(snapshot, view);
      Print(nodes, options.output, NodesToTable(nodes), out);
    } else {
      const std::vector<model::Decision> decisions = model.PlanPass();
      const json explanation = ExplainDevice(snapshot, model, view, decisions, ns, options.device);
      if (explanation.is_null()) {
        err << "kubectl gpu why: no GPUDevice " << options.device << " in namespace " << ns << "\n";
        return kExitFailure;
      }
      Print(explanation, options.output, ExplanationToTable(explanation), out);
    }
    return 0;
  } catch (const Unusable& unusable) {
    err << "kubectl gpu: " << unusable.message << "\n";
    return kExitBadInput;
  } catch (const kube::ApiError& error) {
    switch (error.kind()) {
      case kube::ErrorKind::kTransport:
        err << "kubectl gpu: cannot reach the API server of " << where << ": " << error.message()
            << "\n";
        return kExitBadInput;
      case kube::ErrorKind::kUnauthorized:
      case kube::ErrorKind::kForbidden:
        err << "kubectl gpu: the API server refused the credentials of " << where << ": "
            << error.httpStatus() << " " << error.method() << " " << error.path() << ": "
            << error.message() << "\n";
        return kExitBadInput;
      default:
        err << "kubectl gpu: " << error.what() << "\n";
        return kExitFailure;
    }
  } catch (const SnapshotError& error) {
    err << "kubectl gpu: the cluster's objects: " << error.what() << "\n";
    return kExitFailure;
  } catch (const std::exception& error) {
    err << "kubectl gpu: " << error.what() << "\n";
    return kExitFailure;
  }
}

}  // namespace cozy::controller::plugin
