// How `gpu-agent scan` prints a GPUNode as YAML or as a table for people (JSON: status_builder.h,
// RenderGpuNodeJson).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace cozy::agent {

// YAML as kubectl prints it: strings that would read back as another type are quoted.
std::string RenderYaml(const nlohmann::json& object);
// One line per GPU function: address, IDs, model, driver, IOMMU group, NUMA, SR-IOV, mdev/vGPU.
std::string RenderTable(const nlohmann::json& gpuNode);

}  // namespace cozy::agent
