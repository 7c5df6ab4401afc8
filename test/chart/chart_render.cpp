#include "test/chart/chart_render.h"

#include <unistd.h>
#include <fstream>
#include <sstream>
#include <string_view>

#include "test/support/fixture_host.h"

namespace cozy::chart {
namespace {

// The values as a values file, each scalar as it was written: one that was quoted (the tag
// "!") stays a string, a plain one is read again as Helm reads it (a number, a boolean, null).
void Emit(YAML::Emitter& out, const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      out << YAML::BeginMap;
      for (const auto& entry : node) {
        out << YAML::Key << YAML::DoubleQuoted << entry.first.Scalar() << YAML::Value;
        Emit(out, entry.second);
      }
      out << YAML::EndMap;
      break;
    case YAML::NodeType::Sequence:
      out << YAML::BeginSeq;
      for (const auto& item : node) Emit(out, item);
      out << YAML::EndSeq;
      break;
    case YAML::NodeType::Scalar:
      if (node.Tag() == "!") out << YAML::DoubleQuoted;
      out << node.Scalar();
      break;
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      out << YAML::Null;
      break;
  }
}

// Splits `helm template`'s output: documents separated by `---` lines, each opened by
// `# Source: <chart>/<path>`.
std::vector<RenderedDocument> SplitDocuments(const std::string& output) {
  std::vector<RenderedDocument> documents;
  RenderedDocument current;
  const auto flush = [&] {
    bool empty = true;
    try {
      const YAML::Node probe = YAML::Load(current.text);  // comments only: Null
      empty = !probe.IsDefined() || probe.IsNull();
    } catch (const YAML::Exception&) {
      empty = false;  // the test that parses it says what is wrong
    }
    if (!empty) documents.push_back(current);
    current = {};
  };
  constexpr std::string_view kSource = "# Source: ";
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    std::string_view trimmed = line;
    while (!trimmed.empty() &&
           (trimmed.back() == ' ' || trimmed.back() == '\t' || trimmed.back() == '\r')) {
      trimmed.remove_suffix(1);
    }
    if (trimmed == "---") {
      flush();
    } else if (current.source.empty() && current.text.empty() && line.starts_with(kSource)) {
      const std::string path = line.substr(kSource.size());
      const size_t slash = path.find('/');  // after the chart's name
      current.source = slash == std::string::npos ? path : path.substr(slash + 1);
    } else {
      current.text += line + "\n";
    }
  }
  flush();
  return documents;
}

}  // namespace

std::filesystem::path HelmBinary() { return COZY_HELM; }

std::vector<RenderedDocument> RenderChart(const std::filesystem::path& chartDir,
                                          const YAML::Node& overrides, const Release& release) {
  const std::filesystem::path helm = HelmBinary();
  if (::access(helm.c_str(), X_OK) != 0) {
    throw RenderError(helm.string() +
                      " is not built (scripts/cluster.sh build builds it from tools/helm/go.mod)");
  }
  const testing::TempDir scratch;
  std::string command =
      testing::ShellQuote(helm.string()) + " template " + testing::ShellQuote(release.name) + " " +
      testing::ShellQuote(chartDir.string()) + " --namespace " + testing::ShellQuote(release.ns);
  for (const std::string& apiVersion : release.apiVersions) {
    command += " --api-versions " + testing::ShellQuote(apiVersion);
  }
  if (overrides.IsDefined() && !overrides.IsNull()) {
    YAML::Emitter out;
    Emit(out, overrides);
    const std::filesystem::path values = scratch.path() / "values.yaml";
    std::ofstream(values) << out.c_str() << "\n";
    command += " -f " + testing::ShellQuote(values.string());
  }
  const testing::CommandResult result = testing::RunCommand(command);
  if (result.exitCode != 0) {
    throw RenderError("helm template " + chartDir.string() + " failed (exit " +
                      std::to_string(result.exitCode) + "): " + result.err);
  }
  return SplitDocuments(result.out);
}

}  // namespace cozy::chart
