// A test-only renderer of the Helm template subset the cozy-gpu chart is written in
// (docs/install.md, "Template subset"). Helm is not installable on the build machines; this
// renders charts/gpu as `helm template` would, and refuses anything outside the subset, so
// the documented subset stays the one the chart uses.
#pragma once

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace cozy::chart {

// A template outside the subset, a value that is missing, or a malformed template. The
// message names the file and line.
class RenderError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Release {
  std::string name = "gpu";
  std::string ns = "cozy-gpu";
};

// What `.Chart`, `.Release` and `.Values` refer to.
struct Context {
  YAML::Node values;
  YAML::Node chart;  // Chart.yaml
  Release release;
};

// Renders one template's text. `file` names it in errors.
std::string RenderTemplate(const std::string& text, const Context& context,
                           const std::string& file = "template");

// Helm's values merge: maps merge key by key, anything else replaces, null deletes the key.
YAML::Node MergeValues(const YAML::Node& base, const YAML::Node& overrides);

// toYaml as Helm prints it: block style, quoted strings stay quoted, no trailing newline.
std::string ToYaml(const YAML::Node& node);

// toJson as Helm prints it: compact, map keys sorted (Go's encoding/json), unquoted numbers,
// booleans and nulls as JSON's, every other scalar a string. Unlike Go, <, > and & stay as they
// are (Go writes \u003c, \u003e, \u0026).
std::string ToJson(const YAML::Node& node);

struct RenderedDocument {
  std::string source;  // templates/<file>
  std::string text;    // one YAML document
};

// Renders every template of a chart directory with its values.yaml merged with `overrides`
// (may be null), split into documents; documents empty after rendering are dropped.
std::vector<RenderedDocument> RenderChart(const std::filesystem::path& chartDir,
                                          const YAML::Node& overrides, const Release& release = {});

}  // namespace cozy::chart
