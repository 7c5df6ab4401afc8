// chart-render: renders a chart as `helm template` would, with the subset test/chart knows.
//   chart-render CHART_DIR [-f VALUES] [--name NAME] [--namespace NS]
// Exit 0 with the manifests on stdout; 2 with a one-line reason on stderr.
#include <iostream>
#include <string>

#include "test/chart/chart_render.h"

int main(int argc, char** argv) {
  std::string chart;
  YAML::Node overrides;
  cozy::chart::Release release;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      const bool hasValue = i + 1 < argc;
      if (arg == "-f" && hasValue) {
        overrides = cozy::chart::MergeValues(overrides, YAML::LoadFile(argv[++i]));
      } else if (arg == "--name" && hasValue) {
        release.name = argv[++i];
      } else if (arg == "--namespace" && hasValue) {
        release.ns = argv[++i];
      } else if (chart.empty() && !arg.starts_with("-")) {
        chart = arg;
      } else {
        throw std::runtime_error(
            "usage: chart-render CHART_DIR [-f VALUES] [--name NAME] "
            "[--namespace NS]");
      }
    }
    if (chart.empty()) throw std::runtime_error("usage: chart-render CHART_DIR [-f VALUES]");
    for (const auto& document : cozy::chart::RenderChart(chart, overrides, release)) {
      std::cout << "---\n# Source: " << document.source << "\n" << document.text;
      if (!document.text.ends_with("\n")) std::cout << "\n";
    }
  } catch (const std::exception& error) {
    std::cerr << "chart-render: " << error.what() << "\n";
    return 2;
  }
  return 0;
}
