// Objects the controller's tests and benchmarks build clusters from, written once: a Ready Node,
// a GPUNode's status serving units of one resource name on one NVIDIA function, an A100 class.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace cozy::testing {

// A Node whose Ready condition is True.
inline nlohmann::json ReadyNode(const std::string& name) {
  return {{"apiVersion", "v1"},
          {"kind", "Node"},
          {"metadata", {{"name", name}}},
          {"status", {{"conditions", {{{"type", "Ready"}, {"status", "True"}}}}}}};
}

// The status an agent publishes for a node with one healthy A100 function serving `units` of
// `resourceName` (an mdev parent serves several from one function), none allocated.
inline nlohmann::json GpuNodeStatus(int units,
                                    const std::string& resourceName = "nvidia.com/GA100") {
  return {
      {"resourceNames", {resourceName}},
      {"summary", {{"gpus", 1}}},
      {"devices",
       {{{"pciAddress", "0000:3b:00.0"},
         {"vendorID", "10de"},
         {"deviceID", "20b5"},
         {"classCode", "030200"},
         {"health", "Healthy"},
         {"allocatable", units},
         {"allocated", 0},
         {"resources", {{{"name", resourceName}, {"allocatable", units}, {"allocated", 0}}}}}}}};
}

// A passthrough A100 GPUClass named `name` on `resourceName`, on every node.
inline nlohmann::json GpuClassObject(const std::string& name,
                                     const std::string& resourceName = "nvidia.com/GA100") {
  return {{"apiVersion", "gpu.cozystack.io/v1alpha1"},
          {"kind", "GPUClass"},
          {"metadata", {{"name", name}}},
          {"spec",
           {{"vendor", "nvidia"},
            {"model", "A100"},
            {"mode", "passthrough"},
            {"source", {{"devicePlugin", {{"resourceName", resourceName}}}}}}}};
}

// The whole GPUNode object with that status.
inline nlohmann::json GpuNodeObject(const std::string& node, int units) {
  return {{"apiVersion", "gpu.cozystack.io/v1alpha1"},
          {"kind", "GPUNode"},
          {"metadata", {{"name", node}}},
          {"status", GpuNodeStatus(units)}};
}

}  // namespace cozy::testing
