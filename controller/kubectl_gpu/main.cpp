// kubectl-gpu: the `kubectl gpu` plugin. kubectl finds it on PATH and runs it with the words
// after `gpu`; it reads the cluster through the user's kubeconfig (docs/kubectl-gpu.md).
#include <CLI/CLI.hpp>
#include <iostream>

#include "controller/kubectl_gpu/plugin.h"

int main(int argc, char** argv) {
  namespace plugin = cozy::controller::plugin;
  CLI::App app{
      "kubectl gpu: what GPUs the cluster has and why an order is not placed, as the GPU "
      "controller's model sees the cluster now",
      "kubectl gpu"};
  app.set_version_flag("--version", std::string(COZY_VERSION));
  app.require_subcommand(1);
  app.fallthrough();  // the global flags also after the command, as kubectl takes them

  plugin::Options options;
  app.add_option("--kubeconfig", options.kubeconfig,
                 "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)");
  app.add_option("--context", options.context, "kubeconfig context (default: current-context)");
  app.add_option("-n,--namespace", options.namespaceName,
                 "Namespace of `why`'s order (default: the context's namespace, else default)");
  app.add_option("--controller-namespace", options.controllerNamespace,
                 "Namespace gpu-controller is installed in, whose settings ConfigMap is read "
                 "(default: cozy-system, else the one namespace holding it)");
  app.add_option("-o,--output", options.output, "Output format: table, json or yaml")
      ->check(CLI::IsMember({"table", "json", "yaml"}))
      ->capture_default_str();

  CLI::App* catalog = app.add_subcommand(
      "catalog", "GPUClasses with their total, used and free units (free: on nodes taking binds)");
  catalog->add_flag("--nodes", options.perNode, "Also each class's units per node");
  app.add_subcommand("nodes",
                     "GPUNodes with their functions and units, and whether each takes binds "
                     "(and why not)");
  CLI::App* why = app.add_subcommand(
      "why",
      "Why a GPUDevice order is pending, refused or placed: its decision, its budget, "
      "the class's room and the nodes serving it");
  why->add_option("DEVICE", options.device, "The GPUDevice's name")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& success) {
    return app.exit(success);
  } catch (const CLI::ParseError& error) {
    app.exit(error);
    return plugin::kExitBadInput;
  }
  options.command = app.get_subcommands().front()->get_name();
  return plugin::Run(options, std::cout, std::cerr);
}
