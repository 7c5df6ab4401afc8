#include "agent/status/units.h"

#include <algorithm>
#include <utility>

namespace cozy::agent {
namespace {

using ResourceId = std::pair<std::string, std::string>;  // (resource name, device ID)

struct Tally {
  int64_t allocatable = 0;
  int64_t allocated = 0;
};

}  // namespace

std::string_view ToString(Health health) {
  switch (health) {
    case Health::kHealthy:
      return "Healthy";
    case Health::kUnhealthy:
      return "Unhealthy";
    case Health::kUnadvertised:
      return "Unadvertised";
  }
  return "Unadvertised";
}

std::string_view ToString(IgnoredReason reason) {
  switch (reason) {
    case IgnoredReason::kUnknownShape:
      return "unknownShape";
    case IgnoredReason::kNoMatch:
      return "noMatch";
    case IgnoredReason::kNotGpu:
      return "notGpu";
  }
  return "unknownShape";
}

bool IsFinalPodPhase(std::string_view phase) { return phase == "Succeeded" || phase == "Failed"; }

UnitReport CountUnits(const sysfs::HostScan& host, const podresources::Allocation& allocation,
                      const PodPhases& podPhases,
                      const std::set<sysfs::PciAddress>& previouslyAdvertised,
                      const NvmlGpuAddresses& nvmlGpus) {
  // Sets de-duplicate: a device on two NUMA nodes, an ID shared by two containers of a pod,
  // the same ID listed again by a stale entry.
  std::set<ResourceId> allocatableIds;
  for (const auto& [resource, devices] : allocation.allocatable) {
    for (const auto& device : devices) {
      allocatableIds.emplace(resource, device.id);
    }
  }
  std::set<ResourceId> allocatedIds;
  for (const auto& pod : allocation.pods) {
    const auto phase = podPhases.find(pod.podNamespace + "/" + pod.name);
    if (phase != podPhases.end() && IsFinalPodPhase(phase->second)) {
      continue;
    }
    for (const auto& container : pod.containers) {
      for (const auto& [resource, ids] : container.devices) {
        for (const auto& id : ids) {
          allocatedIds.emplace(resource, id);
        }
      }
    }
  }
  std::set<ResourceId> allIds = allocatableIds;
  allIds.insert(allocatedIds.begin(), allocatedIds.end());

  const Resolver resolver(host, nvmlGpus);
  std::map<sysfs::PciAddress, std::map<std::string, Tally>> perFunction;
  std::map<std::string, Tally> unplaced;
  std::set<std::string> resourceNames;
  UnitReport report;

  for (const auto& key : allIds) {
    const auto& [resource, id] = key;
    const Resolution resolution = resolver.Resolve(id);
    const int64_t allocatable = allocatableIds.contains(key) ? 1 : 0;
    const int64_t allocated = allocatedIds.contains(key) ? 1 : 0;
    const bool nvmlShaped =
        resolution.shape == DeviceIdShape::kNvmlGpu || resolution.shape == DeviceIdShape::kNvmlMig;
    if (nvmlShaped) {
      // Pods request GPUs by this name whether or not the IDs can be placed.
      resourceNames.insert(resource);
    }
    switch (resolution.kind) {
      case ResolutionKind::kFunctions: {
        bool onGpu = false;
        for (const auto& address : resolution.functions) {
          const sysfs::PciFunction* function = host.Find(address);
          if (function == nullptr || !function->isGpu) {
            continue;
          }
          onGpu = true;
          Tally& tally = perFunction[address][resource];
          tally.allocatable += allocatable;
          tally.allocated += allocated;
        }
        if (onGpu) {
          resourceNames.insert(resource);
        } else {
          ++report.ignored.notGpu;
          report.ignoredIds.push_back({resource, id, IgnoredReason::kNotGpu});
        }
        break;
      }
      case ResolutionKind::kNvmlUnplaced: {
        Tally& tally = unplaced[resource];
        tally.allocatable += allocatable;
        tally.allocated += allocated;
        break;
      }
      case ResolutionKind::kNoMatch:
        ++report.ignored.noMatch;
        report.ignoredIds.push_back({resource, id, IgnoredReason::kNoMatch});
        break;
      case ResolutionKind::kUnknownShape:
        ++report.ignored.unknownShape;
        report.ignoredIds.push_back({resource, id, IgnoredReason::kUnknownShape});
        break;
    }
  }

  report.advertised = previouslyAdvertised;
  for (const auto& function : host.functions) {
    if (!function.isGpu) {
      continue;
    }
    FunctionUnits units;
    units.address = function.address;
    if (const auto it = perFunction.find(function.address); it != perFunction.end()) {
      for (const auto& [resource, tally] : it->second) {
        units.resources.push_back({resource, tally.allocatable, tally.allocated});
        units.allocatable += tally.allocatable;
        units.allocated += tally.allocated;
      }
    }
    if (units.allocatable > 0) {
      units.health = Health::kHealthy;
      report.advertised.insert(function.address);
    } else if (units.allocated > 0 || previouslyAdvertised.contains(function.address)) {
      // kubelet drops an unhealthy device from the allocatable list but keeps it on the pod
      // that holds it; a device that vanished from the list after being in it went unhealthy.
      units.health = Health::kUnhealthy;
    } else {
      units.health = Health::kUnadvertised;
    }
    report.functions.push_back(std::move(units));
  }
  report.resourceNames.assign(resourceNames.begin(), resourceNames.end());
  for (const auto& [resource, tally] : unplaced) {
    report.unplaced.push_back({resource, tally.allocatable, tally.allocated});
  }
  // allIds is ordered, so ignoredIds already is; sort anyway to keep the contract local.
  std::sort(report.ignoredIds.begin(), report.ignoredIds.end());
  return report;
}

}  // namespace cozy::agent
