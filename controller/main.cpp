// gpu-controller: the GPU catalog's controller. Today it offers `simulate`, the shared model run
// offline on a snapshot file; the binder and the webhooks join it in later issues.
#include <CLI/CLI.hpp>
#include <iostream>

#include "controller/simulate.h"

int main(int argc, char** argv) {
  CLI::App app{"gpu-controller: GPU catalog controller for KubeVirt VMs"};
  app.set_version_flag("--version", std::string(COZY_VERSION));
  app.require_subcommand(1);

  CLI::App* simulate = app.add_subcommand(
      "simulate", "Print the model's view of a cluster snapshot (a Kubernetes List as JSON)");
  std::string snapshotPath;
  std::string output = "json";
  simulate->add_option("--snapshot", snapshotPath, "The snapshot file")->required();
  simulate->add_option("-o,--output", output, "Output format")
      ->check(CLI::IsMember({"json", "table"}));

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& success) {
    return app.exit(success);
  } catch (const CLI::ParseError& error) {
    app.exit(error);
    return 2;  // bad input, like a malformed snapshot
  }
  if (simulate->parsed()) {
    return cozy::controller::RunSimulate(snapshotPath,
                                         output == "table" ? cozy::controller::OutputFormat::kTable
                                                           : cozy::controller::OutputFormat::kJson,
                                         std::cout, std::cerr);
  }
  return 2;
}
