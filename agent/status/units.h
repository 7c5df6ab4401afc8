// Units per GPU function and resource, and health (DESIGN §4.4): what kubelet's device
// plugins serve from each function and how much of it pods hold. Pure: values in, values out.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "agent/status/resolver.h"
#include "podresources/allocation.h"
#include "sysfs/host_scan.h"

namespace cozy::agent {

enum class Health {
  kHealthy,       // kubelet lists at least one of its devices as allocatable
  kUnhealthy,     // none allocatable, but a pod holds one or a plugin advertised it on this run
  kUnadvertised,  // no plugin device names it
};

// "Healthy" | "Unhealthy" | "Unadvertised", as in GPUNode status.
std::string_view ToString(Health health);

struct ResourceUnits {
  std::string name;
  int64_t allocatable = 0;
  int64_t allocated = 0;

  bool operator==(const ResourceUnits&) const = default;
};

struct FunctionUnits {
  sysfs::PciAddress address;
  std::vector<ResourceUnits> resources;  // sorted by name; only resources that name it
  int64_t allocatable = 0;               // sum over resources
  int64_t allocated = 0;
  Health health = Health::kUnadvertised;
};

struct UnplacedUnits {
  std::string resourceName;
  int64_t allocatable = 0;
  int64_t allocated = 0;

  bool operator==(const UnplacedUnits&) const = default;
};

enum class IgnoredReason {
  kUnknownShape,  // fits no shape ("kvm0", "card0-1")
  kNoMatch,       // a shape naming nothing here ("0" over a non-vfio group, a gone mdev)
  kNotGpu,        // names only non-GPU functions (a NIC VF's resource)
};

// "unknownShape" | "noMatch" | "notGpu": for metric labels and logs.
std::string_view ToString(IgnoredReason reason);

// An ID that counted nowhere, with why: for a metric and one debug log line each.
struct IgnoredId {
  std::string resourceName;
  std::string id;
  IgnoredReason reason = IgnoredReason::kUnknownShape;

  auto operator<=>(const IgnoredId&) const = default;
};

struct IgnoredCounts {
  int64_t unknownShape = 0;  // fits no shape ("kvm0", "card0-1")
  int64_t noMatch = 0;       // a shape naming nothing here ("0" over a non-vfio group)
  int64_t notGpu = 0;        // names only non-GPU functions (a NIC VF's resource)
};

// "namespace/name" -> pod phase ("Pending", "Running", "Succeeded", "Failed", "Unknown").
using PodPhases = std::map<std::string, std::string>;

struct UnitReport {
  std::vector<FunctionUnits> functions;    // every GPU function of the host, by address
  std::vector<std::string> resourceNames;  // sorted, unique
  std::vector<UnplacedUnits> unplaced;     // sorted by resource name
  IgnoredCounts ignored;                   // distinct (resource, ID) pairs, each counted once
  std::vector<IgnoredId> ignoredIds;       // sorted, unique
  // Functions any plugin has advertised on this run: the input set plus every function with
  // allocatable > 0 now. Feed it to the next call.
  std::set<sysfs::PciAddress> advertised;
};

// Counts units from one pod-resources answer.
// - allocatable: IDs of GetAllocatableResources resolving to the function, de-duplicated by
//   (resource, ID) since kubelet lists a device on two NUMA nodes twice.
// - allocated: IDs in List of pods not Succeeded/Failed (a pod missing from `podPhases` is
//   active), each (resource, ID) counted once however many containers list it.
// Only GPU functions (PciFunction::isGpu) carry units; IDs naming only other functions do not
// make their resource a GPU resource.
UnitReport CountUnits(const sysfs::HostScan& host, const podresources::Allocation& allocation,
                      const PodPhases& podPhases,
                      const std::set<sysfs::PciAddress>& previouslyAdvertised,
                      const NvmlGpuAddresses& nvmlGpus = {});

// Whether a pod phase is final: kubelet 1.32/1.33 still list such pods with devices that a
// new pod may already hold.
bool IsFinalPodPhase(std::string_view phase);

}  // namespace cozy::agent
