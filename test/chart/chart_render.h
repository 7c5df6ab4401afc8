// A chart rendered by the real `helm template` (Helm pinned in tools/helm/go.mod, built by
// scripts/cluster.sh into its tools' directory), split into its documents for the tests.
#pragma once

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace cozy::chart {

// helm failed (a template error, a missing binary); the message carries helm's stderr.
class RenderError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Release {
  std::string name = "gpu";
  std::string ns = "cozy-gpu";
  // What the cluster serves beyond the built-in APIs (`--api-versions`, the chart's
  // .Capabilities.APIVersions), e.g. "cilium.io/v2/CiliumNetworkPolicy".
  std::vector<std::string> apiVersions;
};

struct RenderedDocument {
  std::string source;  // templates/<file>, from helm's `# Source: <chart>/templates/<file>`
  std::string text;    // one YAML document, without the `# Source` line
};

// The helm binary the tests run (COZY_HELM).
std::filesystem::path HelmBinary();

// `helm template RELEASE CHART_DIR --namespace NS -f VALUES` with `overrides` (may be null) as
// the values file, split into documents; documents holding no object (comments only) are
// dropped.
std::vector<RenderedDocument> RenderChart(const std::filesystem::path& chartDir,
                                          const YAML::Node& overrides, const Release& release = {});

}  // namespace cozy::chart
