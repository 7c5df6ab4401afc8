// `gpu-controller simulate`: the model's view of a snapshot file, for a hoster asking "why
// can't this order be placed?".
#pragma once

#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "controller/model/model.h"

namespace cozy::controller {

// The JSON document `simulate -o json` prints (see docs/controller.md).
nlohmann::json SimulationToJson(const model::ClusterView& view,
                                const std::vector<model::Decision>& decisions);

// The same for people: one aligned table per section.
std::string SimulationToTable(const model::ClusterView& view,
                              const std::vector<model::Decision>& decisions);

// Why one order stands as it does: its decision in the pass (action, node, rule), its tenant's
// budget for its class (which namespace's quota limits it, by which key), the class's room and
// every node serving the class (whether it takes binds, and why not). Null when the snapshot
// has no GPUDevice `ns`/`name`. `simulate --device` and `kubectl gpu why` print it.
nlohmann::json ExplainDevice(const model::Snapshot& snapshot, const model::Model& model,
                             const model::ClusterView& view,
                             const std::vector<model::Decision>& decisions, const std::string& ns,
                             const std::string& name);
// The same for people.
std::string ExplanationToTable(const nlohmann::json& explanation);

enum class OutputFormat { kJson, kTable };

// Reads the snapshot file, runs the model and prints. Returns the exit code: 0, or 2 with one
// line on `err` naming what is wrong and where when the file cannot be read or is malformed.
// `device` ("namespace/name", optional) prints only that order's explanation (ExplainDevice);
// one the snapshot does not hold is bad input too.
int RunSimulate(const std::string& snapshotPath, OutputFormat format, std::ostream& out,
                std::ostream& err, const std::string& device = "");

}  // namespace cozy::controller
