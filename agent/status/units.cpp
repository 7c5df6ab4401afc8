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

// The IDs kubelet lists, as sets: they de-duplicate a device on two NUMA nodes, an ID shared by
// two containers of a pod, the same ID listed again by a stale entry. A pod in a final phase
// holds nothing (A7).
struct ListedIds {
  std::set<ResourceId> allocatable;
  std::set<ResourceId> allocated;
};

ListedIds ListIds(const podresources::Allocation& allocation, const PodPhases& podPhases) {
  ListedIds listed;
  for (const auto& [resource, devices] : allocation.allocatable) {
    for (const auto& device : devices) {
      listed.allocatable.emplace(resource, device.id);
    }
  }
  for (const auto& pod : allocation.pods) {
    const auto phase = podPhases.find(pod.podNamespace + "/" + pod.name);
    if (phase != podPhases.end() && IsFinalPodPhase(phase->second)) {
      continue;
    }
    for (const auto& container : pod.containers) {
      for (const auto& [resource, ids] : container.devices) {
        for (const auto& id : ids) {
          listed.allocated.emplace(resource, id);
        }
      }
    }
  }
  return listed;
}

// Every listed ID resolved and counted: on the GPU functions it names, as NVML-shaped and
// unplaced, or ignored with its reason.
struct Tallies {
  std::map<sysfs::PciAddress, std::map<std::string, Tally>> perFunction;
  std::map<std::string, Tally> unplaced;
  std::set<std::string> resourceNames;
};

void Ignore(UnitReport& report, const ResourceId& key, IgnoredReason reason) {
  switch (reason) {
    case IgnoredReason::kUnknownShape:
      ++report.ignored.unknownShape;
      break;
    case IgnoredReason::kNoMatch:
      ++report.ignored.noMatch;
      break;
    case IgnoredReason::kNotGpu:
      ++report.ignored.notGpu;
      break;
  }
  report.ignoredIds.push_back({key.first, key.second, reason});
}

Tallies TallyIds(const sysfs::HostScan& host, const ListedIds& ids,
                 const NvmlGpuAddresses& nvmlGpus, UnitReport& report) {
  std::set<ResourceId> allIds = ids.allocatable;
  allIds.insert(ids.allocated.begin(), ids.allocated.end());
  const Resolver resolver(host, nvmlGpus);
  Tallies tallies;
  for (const auto& key : allIds) {
    const auto& [resource, id] = key;
    const Resolution resolution = resolver.Resolve(id);
    const int64_t allocatable = ids.allocatable.contains(key) ? 1 : 0;
    const int64_t allocated = ids.allocated.contains(key) ? 1 : 0;
    if (resolution.shape == DeviceIdShape::kNvmlGpu ||
        resolution.shape == DeviceIdShape::kNvmlMig) {
      // Pods request GPUs by this name whether or not the IDs can be placed.
      tallies.resourceNames.insert(resource);
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
          Tally& tally = tallies.perFunction[address][resource];
          tally.allocatable += allocatable;
          tally.allocated += allocated;
        }
        if (onGpu) {
          tallies.resourceNames.insert(resource);
        } else {
          Ignore(report, key, IgnoredReason::kNotGpu);
        }
        break;
      }
      case ResolutionKind::kNvmlUnplaced: {
        Tally& tally = tallies.unplaced[resource];
        tally.allocatable += allocatable;
        tally.allocated += allocated;
        break;
      }
      case ResolutionKind::kNoMatch:
        Ignore(report, key, IgnoredReason::kNoMatch);
        break;
      case ResolutionKind::kUnknownShape:
        Ignore(report, key, IgnoredReason::kUnknownShape);
        break;
    }
  }
  return tallies;
}

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
  UnitReport report;
  const Tallies tallies = TallyIds(host, ListIds(allocation, podPhases), nvmlGpus, report);
  const auto& perFunction = tallies.perFunction;
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
  report.resourceNames.assign(tallies.resourceNames.begin(), tallies.resourceNames.end());
  for (const auto& [resource, tally] : tallies.unplaced) {
    report.unplaced.push_back({resource, tally.allocatable, tally.allocated});
  }
  // allIds is ordered, so ignoredIds already is; sort anyway to keep the contract local.
  std::sort(report.ignoredIds.begin(), report.ignoredIds.end());
  return report;
}

}  // namespace cozy::agent
