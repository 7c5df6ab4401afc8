// What the model's parts share (not part of its face, which is model.h): the index a snapshot
// is read into, budgets and usage. The binder pass's planner is pass_planner.h, seen only by the
// pass's own files. The parts, by job:
// index.cpp (reading and indexing the snapshot), budgets.cpp (budgets, remaining budgets and the
// budget check of an order), views.cpp (the cluster view and a node's class), sets.cpp (grouping
// devices into the sets the pass takes) and pass.cpp (the pass: its steps and placement).
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "api/quantity.h"
#include "controller/model/model.h"

namespace cozy::model {

inline constexpr size_t kNone = std::numeric_limits<size_t>::max();

struct ClassInfo {
  const api::GpuClass* gpuClass = nullptr;
  size_t resource = kNone;
  std::optional<int64_t> maxCount;
  std::vector<char> servesNode;  // by node index: its nodeSelector selects the node
  // By node index: it serves the node, and the node takes binds with the class's tolerations
  // (C7): where the class's orders may be placed.
  std::vector<char> takes;
  std::vector<size_t> nodes;  // the node indices it selects, by name
};

// Usage a namespace's budgets are checked against: its own and its sub-tenants'.
struct Usage {
  std::vector<int64_t> byClass;            // GPUs ordered, any phase
  std::vector<int64_t> devicesByResource;  // GPUs ordered of classes on each resource name
  std::vector<int64_t> rawPodsByResource;  // pod units no attached device covers
  int64_t total = 0;

  void Add(const Usage& other, int64_t sign) {
    auto addAll = [sign](std::vector<int64_t>& into, const std::vector<int64_t>& from) {
      into.resize(std::max(into.size(), from.size()), 0);
      for (size_t i = 0; i < from.size(); ++i) {
        into[i] = api::AddUnits(into[i], sign * from[i]);
      }
    };
    addAll(byClass, other.byClass);
    addAll(devicesByResource, other.devicesByResource);
    addAll(rawPodsByResource, other.rawPodsByResource);
    total = api::AddUnits(total, sign * other.total);
  }
};

// By namespace; the keys view the snapshot's and the tenant tree's strings.
using UsageBy = std::unordered_map<std::string_view, Usage>;

inline int64_t Get(const std::vector<int64_t>& values, size_t index) {
  return index < values.size() ? values[index] : 0;
}

inline void AddAt(std::vector<int64_t>& values, size_t index, int64_t amount) {
  if (values.size() <= index) {
    values.resize(index + 1, 0);
  }
  values[index] = api::AddUnits(values[index], amount);
}

struct Limit {
  int64_t value = 0;
  std::string key;
};

// The GPU budgets one namespace declares: the smallest over its ResourceQuotas, since each
// quota caps on its own.
struct Budget {
  std::map<size_t, Limit> byClass;
  std::optional<Limit> total;
  std::map<size_t, Limit> raw;  // by resource
  // C2: a GPU or raw key of one of its quotas does not read: every order in the namespace and
  // below is refused, with this description of the key (no other tenant's).
  std::optional<std::string> unreadable;
};

// (class or resource id, GPUs), ascending by id.
using Counts = std::span<const std::pair<size_t, int64_t>>;

inline int64_t CountOf(Counts counts, size_t id) {
  for (const auto& [at, count] : counts) {
    if (at == id) {
      return count;
    }
  }
  return 0;
}

// What a set of devices needs on one node. The counts view the pass's own arrays.
struct Needs {
  Counts byResource;
  Counts byClass;
  int64_t total = 0;
  std::string_view unknownClass;  // set when a member names no existing class
};

const Usage& UsageOf(const UsageBy& usageBy, std::string_view ns);

class UsageTable;  // index.cpp: each namespace's own usage while Build counts it

struct Model::Index {
  const Snapshot& snapshot;
  std::vector<std::string> resources;
  std::map<std::string, size_t, std::less<>> resourceIds;
  std::vector<ClassInfo> classes;  // by name
  std::map<std::string, size_t, std::less<>> classIds;
  std::vector<const Node*> nodes;  // by name
  // Hash lookups, viewing the snapshot's strings, wherever the model looks up per device or
  // pod: ordered maps of strings cost a compare per tree level and a cache miss per node, which
  // made the model grow faster than the cluster. Nothing iterates them.
  std::unordered_map<std::string_view, size_t> nodeIds;
  std::vector<NodeEligibility> eligibility;  // without tolerations
  std::vector<char> takesBinds;              // eligibility[n].eligible, a byte a node
  std::optional<std::chrono::system_clock::time_point> now;  // the snapshot's, if it has one
  std::vector<char> hasGpuNode;
  // By node * resources.size() + resource.
  std::vector<int64_t> units;  // served: allocatable of the GPUNode's devices, and slice devices
  // Each device of gpu-agent's slices ("<pool>/<device>") a class may sell: its node, and the
  // resources an allocated claim of it holds a unit of (docs/dra.md, "One unit, one path"): the
  // dra classes' units of its PCI ID when no device plugin advertises its function, else the
  // function's device-plugin resources, which count it already.
  struct SliceUnit {
    size_t node = kNone;
    std::vector<size_t> resources;
  };
  // Shared with the next model while the slices, GPUNodes, nodes and classes stay the same.
  using SliceUnits = std::unordered_map<std::string, SliceUnit>;
  std::shared_ptr<const SliceUnits> sliceUnits = std::make_shared<const SliceUnits>();
  // By node: its dra units are not known (the slices cannot be read, or a node with a GPUNode
  // has no slice of gpu-agent's pool: kubelet deletes its node's slices when it starts, and the
  // agent puts them back). Such a node serves each dra class's resource what its Bound devices
  // hold there (PresumeDraUnits), no more and no less. Empty when none.
  std::vector<char> draPresumed;
  // `units` has presumed units in it: the next model counts its own rather than take these.
  bool unitsPresumed = false;
  std::vector<int64_t> bound;  // held by Bound devices
  std::vector<int64_t> raw;    // held by pods no device holding units covers
  TenantTree tenants;
  LauncherIndex launchers;
  std::map<std::string, Budget, std::less<>> budgets;
  UsageBy usage;                    // every device
  UsageBy pendingUsage;             // Pending devices only
  std::vector<size_t> deviceClass;  // by device; kNone: unknown class
  // By device: where a Bound device with a node name sits, as a node index, or an index past
  // the nodes for a name no Node has (goneNodes); kNone when the device is not placed. The pass
  // compares and looks up these numbers rather than the names in the devices.
  std::vector<size_t> placedOn;
  std::vector<api::DevicePhase> phase;  // by device
  std::vector<int64_t> ordered;         // by device: spec.count
  // Each VMI's attached devices (matching UID or none) as ranges of one array, by VMI index:
  // the coverage readers use these numbers instead of reaching back into the devices.
  std::vector<size_t> attachedVmi;  // by device: the VMI's index, kNone for none
  std::vector<char> attached;       // by device: it carries an attachment (its VMI or not)
  std::vector<char> requestWaits;   // by device: a bind request waits (RequestPending)
  std::vector<size_t> vmiDevicesAt;
  std::vector<size_t> vmiDevices;
  // By VMI index: a launcher pod of it (its activePods lists the pod, C11) holds GPUs and is in
  // no final phase, bound to a node or not yet: the VM starts, or runs, where the pod webhook
  // pinned that pod (E13), before KubeVirt writes the VMI's status.nodeName.
  std::vector<char> launching;
  std::vector<std::string_view> goneNodes;
  // Keys view the snapshot's own strings, which outlive the index.
  std::unordered_map<NameKey, size_t, NameKeyHash> vmis;  // to the VMI's index
  // Each VMI's index, by its address (the snapshot's VMIs are shared, not one array).
  std::unordered_map<const VirtualMachineInstance*, size_t> vmiIndex;
  // Namespaces of devices and pods by number. The table owns its keys: a lookup per device then
  // compares against a short string in a small table, not one inside some far-away device.
  std::unordered_map<std::string, size_t> nsIds;
  std::vector<const std::string*> nsNames;  // by number: the table's own key
  std::vector<size_t> nsOf;                 // by device: its namespace's number
  size_t devicesRead = 0;  // devices read from their objects (the rest: copied, Build)
  // Inputs read the way that fails closed for their own owner (InputProblem): GPUNode reports
  // (kept with the units they were counted in), pods' requests and budgets; `problems` is all
  // three, in that order.
  std::vector<InputProblem> unitProblems;
  std::vector<InputProblem> podProblems;
  std::vector<InputProblem> budgetProblems;
  std::vector<InputProblem> problems;
  // Each namespace with a pod's problem in its subtree (the pod's namespace and its ancestors):
  // the first such problem, which a refusal of an order there names.
  std::unordered_map<std::string_view, std::string> problemIn;

  size_t NamespaceId(const std::string& ns) {
    const auto [it, added] = nsIds.try_emplace(ns, nsNames.size());
    if (added) {
      nsNames.push_back(&it->first);
    }
    return it->second;
  }

  explicit Index(const Snapshot& s) : snapshot(s), tenants(s.namespaces), launchers(s.vmis) {}

  size_t At(size_t node, size_t resource) const { return node * resources.size() + resource; }
  bool IsNode(size_t placed) const { return placed < nodes.size(); }
  std::string_view NodeName(size_t placed) const {
    return IsNode(placed) ? std::string_view(nodes[placed]->name)
                          : goneNodes[placed - nodes.size()];
  }
  int64_t Free(size_t node, size_t resource) const {
    const size_t at = At(node, resource);
    return units[at] - bound[at] - raw[at];  // each at most api::kMaxUnitsSum: no overflow
  }
  const api::GpuDevice& Device(size_t index) const { return snapshot.devices[index]; }

  // Devices attached to the VMI, which is one of the snapshot's; a device naming another UID
  // was attached to an earlier VMI of the same name.
  // The VMI the device is attached to, or nullptr (none, gone, or another UID).
  const VirtualMachineInstance* AttachedVmi(size_t device) const {
    return attachedVmi[device] == kNone ? nullptr : &snapshot.vmis[attachedVmi[device]];
  }
  std::span<const size_t> AttachedTo(const VirtualMachineInstance& vmi) const {
    const size_t v = vmiIndex.at(&vmi);
    return std::span<const size_t>(vmiDevices)
        .subspan(vmiDevicesAt[v], vmiDevicesAt[v + 1] - vmiDevicesAt[v]);
  }

  // Budget coverage: every attached device covers its launcher pod, a Lost one included, since
  // a Lost device still counts itself against the budget.
  void BudgetCoverage(const VirtualMachineInstance& vmi, std::vector<int64_t>& covered) const {
    covered.assign(resources.size(), 0);
    for (const size_t device : AttachedTo(vmi)) {
      if (deviceClass[device] != kNone) {
        covered[classes[deviceClass[device]].resource] += ordered[device];
      }
    }
  }

  // Capacity coverage: only a device holding units on the pod's node covers it; a Lost device
  // holds none, so its launcher's GPU is counted on the node.
  void CapacityCoverage(const VirtualMachineInstance& vmi, size_t node,
                        std::vector<int64_t>& covered) const {
    covered.assign(resources.size(), 0);
    for (const size_t device : AttachedTo(vmi)) {
      if (deviceClass[device] != kNone && placedOn[device] == node) {
        covered[classes[deviceClass[device]].resource] += ordered[device];
      }
    }
  }

  // Reads the snapshot. With `previous` (the index of an earlier snapshot, alive for the call),
  // what this snapshot shares with that one is taken from it rather than read again: the
  // classes' and nodes' tables when the nodes are the very same objects and the classes equal,
  // the units when the GPUNodes are too, and each device's numbers when it is the very same
  // object (docs/controller.md, "The model before lends the next one what did not change"). What is
  // built is the same either way, field for field.
  void Build(const Index* previous = nullptr);
  // Build's steps, in the order it takes them (index.cpp), then ReadBudgets (budgets.cpp).
  void IndexClassesAndNodes();
  void TakeClassesAndNodes(const Index& previous);
  void CountUnits();
  // CountUnits' part for the dra classes: gpu-agent's slices.
  void CountSliceUnits();
  // Each device's own numbers (class, phase, count, namespace, placement, attachment): read
  // from the device, or copied from `previous` for a device object it read (nullptr: none).
  void ReadDevices(const Index* previous);
  void ReadDevice(size_t d);
  // The index of the VMI the device is attached to (its name, and its UID where the attachment
  // names one), or kNone.
  size_t AttachedVmiOf(const api::GpuDevice& device) const;
  // What the devices add up to, from their numbers alone: units held, usage, gone nodes.
  void CountDevices(UsageTable& ownUsage, UsageTable& ownPending);
  void GroupVmiDevices();
  void CountPods(UsageTable& ownUsage);
  // Units held by allocated claims of gpu-agent's devices (sliceUnits), on their nodes.
  void CountClaims();
  // The dra units of the nodes in draPresumed: what their Bound devices hold (CountDevices).
  void PresumeDraUnits();
  void SumUsage(const UsageTable& ownUsage, const UsageTable& ownPending);
  void ReadBudgets();
  RemainingBudget Remaining(std::string_view tenant, size_t classId, const UsageBy& usageBy) const;
  // Why the order cannot be made in the tenant, or nullopt. `chain` is a buffer to reuse.
  std::optional<std::string> CheckBudgets(std::string_view tenant, const Needs& needs,
                                          const UsageBy& usageBy,
                                          std::vector<std::string_view>& chain) const;
};

// Adds `count` at `id` in a short list kept ascending by id.
inline void AddCount(std::vector<std::pair<size_t, int64_t>>& counts, size_t id, int64_t count) {
  auto it = std::lower_bound(counts.begin(), counts.end(), id,
                             [](const auto& entry, size_t key) { return entry.first < key; });
  if (it != counts.end() && it->first == id) {
    it->second = api::AddUnits(it->second, count);
  } else {
    counts.insert(it, {id, count});
  }
}

}  // namespace cozy::model
