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

enum class OutputFormat { kJson, kTable };

// Reads the snapshot file, runs the model and prints. Returns the exit code: 0, or 2 with one
// line on `err` naming what is wrong and where when the file cannot be read or is malformed.
int RunSimulate(const std::string& snapshotPath, OutputFormat format, std::ostream& out,
                std::ostream& err);

}  // namespace cozy::controller
