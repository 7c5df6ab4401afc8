// `kubectl gpu`: the catalog, the GPU nodes and why an order stands as it does, read from a live
// cluster through the user's kubeconfig and answered by the shared model (docs/kubectl-gpu.md).
#pragma once

#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "controller/model/model.h"

namespace cozy::controller::plugin {

// The exit codes: 0, 1 for a failure of the command itself (an API error other than the ones
// below, an object not found), 2 for bad input: flags, or a kubeconfig that cannot be used (a
// missing file, an unknown context, a server that cannot be reached or refuses the
// credentials).
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;

struct Options {
  std::string command;        // catalog | nodes | why
  std::string kubeconfig;     // --kubeconfig; empty: $KUBECONFIG, then ~/.kube/config
  std::string context;        // --context; empty: the kubeconfig's current-context
  std::string namespaceName;  // -n; empty: the context's namespace, else "default"
  // --controller-namespace: where gpu-controller is installed (the chart's release namespace,
  // its --namespace), whose settings ConfigMap is read. Empty: cozy-system
  // (api::kDefaultControllerNamespace), else the one namespace holding a ConfigMap of that name.
  std::string controllerNamespace;
  std::string output = "table";  // table | json | yaml
  bool perNode = false;          // catalog --nodes
  std::string device;            // why DEVICE
};

// Runs one command; returns its exit code, with one line on `err` when it fails.
int Run(const Options& options, std::ostream& out, std::ostream& err);

// The documents each command prints with -o json (and, as YAML, -o yaml).
nlohmann::json CatalogToJson(const model::ClusterView& view, bool perNode);
std::string CatalogToTable(const nlohmann::json& catalog, bool perNode);
nlohmann::json NodesToJson(const model::Snapshot& snapshot, const model::ClusterView& view);
std::string NodesToTable(const nlohmann::json& nodes);

// The namespaces holding GPUDevices (orders) whose Namespace, in `cluster` (a Kubernetes List
// of kinded items, as the plugin reads the cluster), lacks the label
// gpu.cozystack.io/tenant-namespace (api::kTenantNamespaceLabel): the chart's raw-name and
// usage-monitor policies do not cover them (docs/install.md, "Tenant namespaces"). Sorted.
std::vector<std::string> OrderNamespacesWithoutTenantLabel(const nlohmann::json& cluster);

// JSON as block YAML; a string that a reader could take for a number, a boolean or null (e.g.
// "1", "yes") is quoted, so it stays a string when read back.
std::string ToYaml(const nlohmann::json& document);

}  // namespace cozy::controller::plugin
