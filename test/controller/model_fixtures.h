// Small builders for model snapshots, so each test states only what its rule is about.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "api/keys.h"
#include "controller/model/model.h"
#include "controller/model/snapshot.h"

namespace cozy::model::testing {

inline const std::string kA100 = "nvidia.com/GA100";
inline const std::string kA2Vgpu = "nvidia.com/NVIDIA_A2-4Q";

inline api::GpuClass MakeClass(const std::string& name, const std::string& resource,
                               api::GpuMode mode = api::GpuMode::kPassthrough,
                               std::optional<int64_t> maxCount = std::nullopt) {
  api::GpuClass gpuClass;
  gpuClass.metadata.name = name;
  gpuClass.spec.vendor = "NVIDIA";
  gpuClass.spec.model = name;
  gpuClass.spec.mode = mode;
  gpuClass.spec.maxCount = maxCount;
  gpuClass.spec.source.devicePlugin.resourceName = resource;
  return gpuClass;
}

inline Node MakeNode(const std::string& name) {
  Node node;
  node.name = name;
  node.ready = true;
  return node;
}

// A GPUNode whose functions each serve `perFunction` units of `resource`.
inline api::GpuNodeInventory MakeGpuNode(const std::string& node, const std::string& resource,
                                         int functions, int64_t perFunction = 1) {
  api::GpuNodeInventory inventory;
  inventory.nodeName = node;
  inventory.resourceNames = {resource};
  for (int i = 0; i < functions; ++i) {
    api::InventoryDevice device;
    device.pciAddress = "0000:" + std::to_string(10 + i) + ":00.0";
    device.resources.push_back({resource, perFunction, 0});
    device.allocatable = perFunction;
    device.health = perFunction > 0 ? "Healthy" : "Unhealthy";
    inventory.devices.push_back(device);
  }
  return inventory;
}

inline api::GpuDevice MakeDevice(const std::string& ns, const std::string& name,
                                 const std::string& className, int64_t count,
                                 std::optional<api::DevicePhase> phase = std::nullopt,
                                 const std::string& node = "", const std::string& vmi = "") {
  api::GpuDevice device;
  device.metadata.namespaceName = ns;
  device.metadata.name = name;
  device.spec.className = className;
  device.spec.count = count;
  device.status.phase = phase;
  if (!node.empty()) {
    device.status.nodeName = node;
  }
  if (!vmi.empty()) {
    device.status.attachment = api::Attachment{vmi, vmi + "-uid", ""};
  }
  return device;
}

inline api::GpuDevice Bound(const std::string& ns, const std::string& name,
                            const std::string& className, int64_t count, const std::string& node,
                            const std::string& vmi = "") {
  return MakeDevice(ns, name, className, count, api::DevicePhase::kBound, node, vmi);
}

inline api::GpuDevice Lost(const std::string& ns, const std::string& name,
                           const std::string& className, int64_t count,
                           const std::string& vmi = "") {
  return MakeDevice(ns, name, className, count, api::DevicePhase::kLost, "", vmi);
}

inline api::GpuDevice Pending(const std::string& ns, const std::string& name,
                              const std::string& className, int64_t count,
                              const std::string& vmi = "") {
  return MakeDevice(ns, name, className, count, std::nullopt, "", vmi);
}

inline Pod MakePod(const std::string& ns, const std::string& name, const std::string& node,
                   const std::string& resource, int64_t units) {
  Pod pod;
  pod.namespaceName = ns;
  pod.name = name;
  pod.uid = name + "-uid";
  pod.nodeName = node;
  pod.phase = "Running";
  Container container;
  container.name = "main";
  container.requests[resource] = std::to_string(units);
  container.limits[resource] = std::to_string(units);
  pod.containers.push_back(container);
  return pod;
}

// A VMI whose status.activePods lists the given pod UIDs.
inline VirtualMachineInstance MakeVmi(const std::string& ns, const std::string& name,
                                      std::vector<std::string> activePodUids) {
  return VirtualMachineInstance{ns, name, name + "-uid", "", std::move(activePodUids), {}, "", ""};
}

// A tenant namespace labelled with each ancestor, as the tenant chart does, and as a tenant
// namespace for the chart's policies (F18: the two agree).
inline Namespace MakeTenant(const std::string& name, const std::vector<std::string>& ancestors) {
  Namespace ns{name, {{std::string(api::kTenantNamespaceLabel), ""}}};
  for (const std::string& ancestor : ancestors) {
    ns.labels[std::string(api::kTenantLabelPrefix) + ancestor] = "";
  }
  return ns;
}

inline ResourceQuota MakeQuota(const std::string& ns, ResourceList hard) {
  return ResourceQuota{ns, "gpu", std::move(hard)};
}

// A decision as one line, for comparing two passes' decisions and naming the one that differs.
inline std::string DescribeDecision(const Decision& d) {
  return d.deviceNamespace + "/" + d.deviceName + " " + std::string(ToString(d.action)) + " " +
         d.node + (d.startRefused ? " (start refused)" : "") + ": " + d.reason;
}

// The seeds of a property test: the fixed one and one drawn for this run, or the one
// COZY_PROPERTY_SEED names (a failure prints its seed to replay).
inline std::vector<uint32_t> PropertySeeds(uint32_t fixed) {
  if (const char* replay = std::getenv("COZY_PROPERTY_SEED")) {
    return {static_cast<uint32_t>(std::strtoul(replay, nullptr, 10))};
  }
  return {fixed, std::random_device{}()};
}

}  // namespace cozy::model::testing
