// `kubectl gpu`: the catalog, the GPU nodes and why an order stands as it does, read from a live
// cluster through the user's kubeconfig and answered by the shared model (docs/kubectl-gpu.md).
#pragma once

#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>

#include "controller/model/model.h"

namespace cozy::controller::plugin {

// The exit codes: 0, 1 for a failure of the command itself (an API error other than the ones
// below, an object not found), 2 for bad input: flags, or a kubeconfig that cannot be used (a
// missing file, an unknown context, a server that cannot be reached or refuses the
// credentials).
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;

struct Options {
  std::string command;           // catalog | nodes | why
  std::string kubeconfig;        // --kubeconfig; empty: $KUBECONFIG, then ~/.kube/config
  std::string context;           // --context; empty: the kubeconfig's current-context
  std::string namespaceName;     // -n; empty: the context's namespace, else "default"
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

// JSON as block YAML; a string that a reader could take for a number, a boolean or null (e.g.
// "1", "yes") is quoted, so it stays a string when read back.
std::string ToYaml(const nlohmann::json& document);

}  // namespace cozy::controller::plugin
