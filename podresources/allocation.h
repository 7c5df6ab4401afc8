// What kubelet's pod-resources API says about device-plugin devices, as a plain value: the
// allocatable devices and the devices each listed pod's containers hold. No gRPC types leak
// out, so the agent's pure resolution code depends on this header alone.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace cozy::podresources {

// One device as kubelet lists it. A device on two NUMA nodes is listed twice by kubelet (one
// entry per node); the entries are kept as they came and consumers de-duplicate by
// (resource, id).
struct AllocatableDevice {
  std::string id;
  // Absent when kubelet sent no topology (or an empty node list: "no NUMA preference" in the
  // device-plugin contract). Present with {0} for NUMA node 0, although node 0 arrives with
  // its ID left off the wire (proto3 default).
  std::optional<std::vector<int64_t>> numaNodes;

  bool operator==(const AllocatableDevice&) const = default;
};

struct ContainerAllocation {
  std::string name;
  // resource name -> device IDs in kubelet's order (may repeat an ID, once per NUMA node).
  std::map<std::string, std::vector<std::string>> devices;

  bool operator==(const ContainerAllocation&) const = default;
};

struct PodAllocation {
  std::string podNamespace;
  std::string name;
  std::vector<ContainerAllocation> containers;

  bool operator==(const PodAllocation&) const = default;
};

struct Allocation {
  // resource name -> devices from GetAllocatableResources, in kubelet's order.
  std::map<std::string, std::vector<AllocatableDevice>> allocatable;
  // Pods from List, in kubelet's order. Pods in a final phase may be among them (kubelet
  // 1.32/1.33), and kubelet does not say which: pod phases come from elsewhere.
  std::vector<PodAllocation> pods;

  bool operator==(const Allocation&) const = default;
};

}  // namespace cozy::podresources
