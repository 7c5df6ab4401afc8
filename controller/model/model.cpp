#include "controller/model/model.h"

#include <algorithm>
#include <array>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <unordered_map>

#include "api/json_field.h"
#include "api/keys.h"
#include "api/quantity.h"
#include "controller/model/errors.h"

namespace cozy::model {
namespace {

constexpr size_t kNone = std::numeric_limits<size_t>::max();

struct ClassInfo {
  const api::GpuClass* gpuClass = nullptr;
  size_t resource = kNone;
  std::optional<int64_t> maxCount;
  std::vector<char> servesNode;  // by node index: its nodeSelector selects the node
  std::vector<size_t> nodes;     // the node indices it selects, by name
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
        into[i] += sign * from[i];
      }
    };
    addAll(byClass, other.byClass);
    addAll(devicesByResource, other.devicesByResource);
    addAll(rawPodsByResource, other.rawPodsByResource);
    total += sign * other.total;
  }
};

// By namespace; the keys view the snapshot's and the tenant tree's strings.
using UsageBy = std::unordered_map<std::string_view, Usage>;

// Each namespace's own usage while the devices and pods are counted: one row per namespace
// number in flat arrays, so counting a device adds to a few neighbouring numbers rather than to
// three small arrays of its own somewhere on the heap.
class UsageTable {
 public:
  UsageTable(size_t classes, size_t resources) : classes_(classes), resources_(resources) {}

  void Add(size_t ns, int64_t count) { Row(total_, ns, 1)[0] += count; }
  void AddClass(size_t ns, size_t classId, size_t resource, int64_t count) {
    Row(byClass_, ns, classes_)[classId] += count;
    Row(devices_, ns, resources_)[resource] += count;
  }
  void AddRawPod(size_t ns, size_t resource, int64_t units) {
    Row(rawPods_, ns, resources_)[resource] += units;
  }
  size_t Rows() const { return total_.size(); }
  Usage Of(size_t ns) const {
    Usage usage;
    auto row = [ns](const std::vector<int64_t>& values, size_t width) {
      const size_t at = ns * width;
      return at < values.size()
                 ? std::vector<int64_t>(values.begin() + static_cast<std::ptrdiff_t>(at),
                                        values.begin() + static_cast<std::ptrdiff_t>(at + width))
                 : std::vector<int64_t>(width, 0);
    };
    usage.byClass = row(byClass_, classes_);
    usage.devicesByResource = row(devices_, resources_);
    usage.rawPodsByResource = row(rawPods_, resources_);
    usage.total = ns < total_.size() ? total_[ns] : 0;
    return usage;
  }

 private:
  // The row of namespace `ns`, growing the table (and the totals) to hold it.
  int64_t* Row(std::vector<int64_t>& values, size_t ns, size_t width) {
    if (total_.size() <= ns) {
      total_.resize(ns + 1, 0);
    }
    if (values.size() < (ns + 1) * width) {
      values.resize((ns + 1) * width, 0);
    }
    return values.data() + ns * width;
  }

  size_t classes_;
  size_t resources_;
  std::vector<int64_t> total_;
  std::vector<int64_t> byClass_;
  std::vector<int64_t> devices_;
  std::vector<int64_t> rawPods_;
};

int64_t Get(const std::vector<int64_t>& values, size_t index) {
  return index < values.size() ? values[index] : 0;
}

void AddAt(std::vector<int64_t>& values, size_t index, int64_t amount) {
  if (values.size() <= index) {
    values.resize(index + 1, 0);
  }
  values[index] += amount;
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
};

void Lower(std::optional<Limit>& slot, Limit limit) {
  if (!slot || limit.value < slot->value) {
    slot = std::move(limit);
  }
}

void Lower(std::map<size_t, Limit>& slots, size_t index, Limit limit) {
  const auto it = slots.find(index);
  if (it == slots.end() || limit.value < it->second.value) {
    slots[index] = std::move(limit);
  }
}

// (class or resource id, GPUs), ascending by id.
using Counts = std::span<const std::pair<size_t, int64_t>>;

int64_t CountOf(Counts counts, size_t id) {
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

}  // namespace

std::string_view ToString(Action action) {
  switch (action) {
    case Action::kBind:
      return "bind";
    case Action::kMove:
      return "move";
    case Action::kLost:
      return "lost";
    case Action::kRefuse:
      return "refuse";
    case Action::kKeep:
      break;
  }
  return "keep";
}

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
  std::vector<char> hasGpuNode;
  // By node * resources.size() + resource.
  std::vector<int64_t> units;  // served: allocatable of the GPUNode's devices
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
  std::vector<size_t> vmiDevicesAt;
  std::vector<size_t> vmiDevices;
  std::vector<std::string_view> goneNodes;
  // Keys view the snapshot's own strings, which outlive the index.
  std::unordered_map<NameKey, const VirtualMachineInstance*, NameKeyHash> vmis;
  // Namespaces of devices and pods by number. The table owns its keys: a lookup per device then
  // compares against a short string in a small table, not one inside some far-away device.
  std::unordered_map<std::string, size_t> nsIds;
  std::vector<const std::string*> nsNames;  // by number: the table's own key
  std::vector<size_t> nsOf;                 // by device: its namespace's number

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
    return units[at] - bound[at] - raw[at];
  }
  const api::GpuDevice& Device(size_t index) const { return snapshot.devices[index]; }

  // Devices attached to the VMI, which is one of the snapshot's; a device naming another UID
  // was attached to an earlier VMI of the same name.
  // The VMI the device is attached to, or nullptr (none, gone, or another UID).
  const VirtualMachineInstance* AttachedVmi(size_t device) const {
    return attachedVmi[device] == kNone ? nullptr : &snapshot.vmis[attachedVmi[device]];
  }
  std::span<const size_t> AttachedTo(const VirtualMachineInstance& vmi) const {
    const size_t v = static_cast<size_t>(&vmi - snapshot.vmis.data());
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

  void Build();
  void ReadBudgets();
  RemainingBudget Remaining(std::string_view tenant, size_t classId, const UsageBy& usageBy) const;
  // Why the order cannot be made in the tenant, or nullopt. `chain` is a buffer to reuse.
  std::optional<std::string> CheckBudgets(std::string_view tenant, const Needs& needs,
                                          const UsageBy& usageBy,
                                          std::vector<std::string_view>& chain) const;
};

void Model::Index::Build() {
  // Classes and the resource names they sell, by name.
  std::vector<const api::GpuClass*> sortedClasses;
  for (const api::GpuClass& gpuClass : snapshot.classes) {
    sortedClasses.push_back(&gpuClass);
  }
  std::sort(sortedClasses.begin(), sortedClasses.end(),
            [](const api::GpuClass* a, const api::GpuClass* b) {
              return a->metadata.name < b->metadata.name;
            });
  for (const api::GpuClass* gpuClass : sortedClasses) {
    const std::string& resourceName = gpuClass->ResourceName();
    auto [it, inserted] = resourceIds.try_emplace(resourceName, resources.size());
    if (inserted) {
      resources.push_back(resourceName);
    }
    classIds[gpuClass->metadata.name] = classes.size();
    classes.push_back(ClassInfo{gpuClass, it->second, ResolveMaxCount(gpuClass->spec), {}, {}});
  }

  for (const Node& node : snapshot.nodes) {
    nodes.push_back(&node);
  }
  std::sort(nodes.begin(), nodes.end(),
            [](const Node* a, const Node* b) { return a->name < b->name; });
  nodeIds.reserve(nodes.size());
  eligibility.reserve(nodes.size());
  for (size_t n = 0; n < nodes.size(); ++n) {
    nodeIds[nodes[n]->name] = n;
    eligibility.push_back(CheckNodeEligibility(*nodes[n], {}));
    takesBinds.push_back(eligibility.back().eligible ? 1 : 0);
  }
  for (ClassInfo& info : classes) {
    info.servesNode.resize(nodes.size(), 0);
    for (size_t n = 0; n < nodes.size(); ++n) {
      const std::optional<api::LabelSelector>& selector = info.gpuClass->spec.nodeSelector;
      if (!selector || selector->Matches(nodes[n]->labels)) {
        info.servesNode[n] = 1;
        info.nodes.push_back(n);
      }
    }
  }

  // Units a node serves: its GPU functions' allocatable per resource, so an mdev parent serves
  // as many as kubelet lists; counted here once for every caller.
  const size_t cells = nodes.size() * resources.size();
  units.assign(cells, 0);
  bound.assign(cells, 0);
  raw.assign(cells, 0);
  hasGpuNode.assign(nodes.size(), 0);
  for (const api::GpuNodeInventory& gpuNode : snapshot.gpuNodes) {
    const auto node = nodeIds.find(gpuNode.nodeName);
    if (node == nodeIds.end()) {
      continue;  // its Node is gone; the GPUNode goes with it
    }
    hasGpuNode[node->second] = 1;
    for (const api::InventoryDevice& device : gpuNode.devices) {
      for (const api::InventoryResource& resource : device.resources) {
        if (const auto r = resourceIds.find(resource.name); r != resourceIds.end()) {
          units[At(node->second, r->second)] += resource.allocatable;
        }
      }
    }
  }

  // Devices: class, the units Bound ones hold, attachments, and budget usage.
  // By namespace number; only summed below, so order does not matter.
  UsageTable ownUsage(classes.size(), resources.size());
  UsageTable ownPending(classes.size(), resources.size());

  deviceClass.assign(snapshot.devices.size(), kNone);
  nsOf.assign(snapshot.devices.size(), kNone);
  placedOn.assign(snapshot.devices.size(), kNone);
  phase.resize(snapshot.devices.size());
  ordered.resize(snapshot.devices.size());
  attachedVmi.assign(snapshot.devices.size(), kNone);
  vmis.reserve(snapshot.vmis.size());
  for (const VirtualMachineInstance& vmi : snapshot.vmis) {
    vmis[{vmi.namespaceName, vmi.name}] = &vmi;
  }
  std::unordered_map<std::string_view, size_t> goneIds;
  for (size_t d = 0; d < snapshot.devices.size(); ++d) {
    const api::GpuDevice& device = snapshot.devices[d];
    const std::string& ns = device.metadata.namespaceName;
    phase[d] = device.Phase();
    ordered[d] = device.spec.count;
    const bool placed = phase[d] == api::DevicePhase::kBound && device.status.nodeName &&
                        !device.status.nodeName->empty();
    if (placed) {
      const std::string& nodeName = *device.status.nodeName;
      if (const auto n = nodeIds.find(nodeName); n != nodeIds.end()) {
        placedOn[d] = n->second;
      } else {
        const auto [gone, added] = goneIds.try_emplace(nodeName, nodes.size() + goneNodes.size());
        if (added) {
          goneNodes.push_back(nodeName);
        }
        placedOn[d] = gone->second;
      }
    }
    nsOf[d] = NamespaceId(ns);
    ownUsage.Add(nsOf[d], device.spec.count);
    const bool pending = phase[d] == api::DevicePhase::kPending;
    if (pending) {
      ownPending.Add(nsOf[d], device.spec.count);
    }
    if (device.status.attachment) {
      const api::Attachment& attachment = *device.status.attachment;
      const auto vmi = vmis.find({ns, attachment.vmiName});
      if (vmi != vmis.end() &&
          (attachment.vmiUid.empty() || attachment.vmiUid == vmi->second->uid)) {
        attachedVmi[d] = static_cast<size_t>(vmi->second - snapshot.vmis.data());
      }
    }
    const auto c = classIds.find(device.spec.className);
    if (c == classIds.end()) {
      continue;
    }
    deviceClass[d] = c->second;
    const size_t resource = classes[c->second].resource;
    ownUsage.AddClass(nsOf[d], c->second, resource, device.spec.count);
    if (pending) {
      ownPending.AddClass(nsOf[d], c->second, resource, device.spec.count);
    }
    if (placed && IsNode(placedOn[d])) {
      bound[At(placedOn[d], resource)] += device.spec.count;
    }
  }
  vmiDevicesAt.assign(snapshot.vmis.size() + 1, 0);
  for (const size_t v : attachedVmi) {
    if (v != kNone) {
      ++vmiDevicesAt[v + 1];
    }
  }
  for (size_t v = 0; v < snapshot.vmis.size(); ++v) {
    vmiDevicesAt[v + 1] += vmiDevicesAt[v];
  }
  vmiDevices.resize(vmiDevicesAt.back());
  {
    std::vector<size_t> next(vmiDevicesAt.begin(), vmiDevicesAt.end() - 1);
    for (size_t d = 0; d < attachedVmi.size(); ++d) {
      if (attachedVmi[d] != kNone) {
        vmiDevices[next[attachedVmi[d]]++] = d;
      }
    }
  }

  // Pods: what no attached device covers is raw-name usage, for budgets (every pod still
  // holding devices) and for the node it runs on.
  const std::set<std::string> resourceNames(resources.begin(), resources.end());
  std::vector<int64_t> budgetCovered, capacityCovered;  // by resource, reused for every pod
  for (const Pod& pod : snapshot.pods) {
    if (!PodHoldsDevices(pod)) {
      continue;
    }
    const std::map<std::string, int64_t> requests = PodResourceRequests(pod, resourceNames);
    if (requests.empty()) {
      continue;
    }
    const VirtualMachineInstance* launcherOf = launchers.LauncherOf(pod);
    const auto node = nodeIds.find(pod.nodeName);
    budgetCovered.assign(resources.size(), 0);
    capacityCovered.assign(resources.size(), 0);
    if (launcherOf) {
      BudgetCoverage(*launcherOf, budgetCovered);
      if (node != nodeIds.end()) {
        CapacityCoverage(*launcherOf, node->second, capacityCovered);
      }
    }
    for (const auto& [name, requested] : requests) {
      const size_t r = resourceIds.find(name)->second;
      ownUsage.AddRawPod(NamespaceId(pod.namespaceName), r,
                         std::max<int64_t>(0, requested - budgetCovered[r]));
      if (node != nodeIds.end()) {
        raw[At(node->second, r)] += std::max<int64_t>(0, requested - capacityCovered[r]);
      }
    }
  }

  // A budget caps the declaring tenant's whole subtree: add each namespace's own usage to
  // itself and to every ancestor.
  std::vector<std::string_view> chain;
  for (size_t id = 0; id < ownUsage.Rows(); ++id) {
    const Usage own = ownUsage.Of(id);
    tenants.BudgetChain(*nsNames[id], chain);
    for (const std::string_view member : chain) {
      usage[member].Add(own, 1);
    }
  }
  for (size_t id = 0; id < ownPending.Rows(); ++id) {
    const Usage own = ownPending.Of(id);
    if (own.total == 0) {
      continue;  // no Pending device in the namespace
    }
    tenants.BudgetChain(*nsNames[id], chain);
    for (const std::string_view member : chain) {
      pendingUsage[member].Add(own, 1);
    }
  }
  ReadBudgets();
}

void Model::Index::ReadBudgets() {
  for (const ResourceQuota& quota : snapshot.quotas) {
    for (const auto& [key, text] : quota.hard) {
      const bool gpuKey = key.starts_with(api::kBudgetKeyPrefix);
      std::optional<size_t> rawResource;
      if (!gpuKey && key.starts_with(api::kRawQuotaKeyPrefix)) {
        const auto r =
            resourceIds.find(std::string_view(key).substr(api::kRawQuotaKeyPrefix.size()));
        if (r != resourceIds.end()) {
          rawResource = r->second;
        }
      }
      if (!gpuKey && !rawResource) {
        continue;
      }
      // A budget that cannot be read fails every caller; none may skip it and pass.
      const api::QuantityResult parsed = api::ParseWholeQuantity(text);
      if (!parsed.value) {
        throw InvalidSnapshot("ResourceQuota " + quota.namespaceName + "/" + quota.name,
                              api::JoinPath("spec.hard", key), parsed.error);
      }
      Budget& budget = budgets[quota.namespaceName];
      Limit limit{*parsed.value, key};
      if (rawResource) {
        Lower(budget.raw, *rawResource, std::move(limit));
        continue;
      }
      const std::string_view className = std::string_view(key).substr(api::kBudgetKeyPrefix.size());
      if (className == api::kTotalBudgetName) {
        Lower(budget.total, std::move(limit));
      } else if (const auto c = classIds.find(className); c != classIds.end()) {
        Lower(budget.byClass, c->second, std::move(limit));
      }
    }
  }
}

namespace {

// One budget that caps class `classId` in a namespace of the chain.
struct Constraint {
  enum class Kind { kClass, kTotal, kRaw };
  Kind kind;
  const Limit* limit;
  int64_t used;
  bool blocked;  // a raw key with no GPU key beside it: blocks the class outright
};

template <typename Visit>
void ForEachConstraint(const Budget& budget, const Usage& used, size_t classId, size_t resource,
                       Visit visit) {
  const auto classLimit = budget.byClass.find(classId);
  if (classLimit != budget.byClass.end()) {
    visit(Constraint{Constraint::Kind::kClass, &classLimit->second, Get(used.byClass, classId),
                     false});
  }
  if (budget.total) {
    visit(Constraint{Constraint::Kind::kTotal, &*budget.total, used.total, false});
  }
  // A raw key blocks a class until the same tenant also declares a GPU key covering it; then
  // it caps devices and raw-name pods together.
  if (const auto rawLimit = budget.raw.find(resource); rawLimit != budget.raw.end()) {
    const bool gpuKey = classLimit != budget.byClass.end() || budget.total.has_value();
    visit(Constraint{Constraint::Kind::kRaw, &rawLimit->second,
                     Get(used.devicesByResource, resource) + Get(used.rawPodsByResource, resource),
                     !gpuKey});
  }
}

const Usage& UsageOf(const UsageBy& usageBy, std::string_view ns) {
  static const Usage kNoUsage;
  const auto it = usageBy.find(ns);
  return it == usageBy.end() ? kNoUsage : it->second;
}

}  // namespace

RemainingBudget Model::Index::Remaining(std::string_view tenant, size_t classId,
                                        const UsageBy& usageBy) const {
  RemainingBudget result;
  std::vector<std::string_view> chain;
  tenants.BudgetChain(tenant, chain);
  for (const std::string_view ns : chain) {
    const auto budget = budgets.find(ns);
    if (budget == budgets.end()) {
      continue;
    }
    ForEachConstraint(budget->second, UsageOf(usageBy, ns), classId, classes[classId].resource,
                      [&](const Constraint& constraint) {
                        const int64_t left =
                            constraint.blocked
                                ? 0
                                : std::max<int64_t>(0, constraint.limit->value - constraint.used);
                        if (!result.remaining || left < *result.remaining) {
                          result = RemainingBudget{left, std::string(ns), constraint.limit->key,
                                                   constraint.blocked};
                        }
                      });
  }
  return result;
}

std::optional<std::string> Model::Index::CheckBudgets(std::string_view tenant, const Needs& needs,
                                                      const UsageBy& usageBy,
                                                      std::vector<std::string_view>& chain) const {
  tenants.BudgetChain(tenant, chain);
  for (const std::string_view ns : chain) {
    const auto budget = budgets.find(ns);
    if (budget == budgets.end()) {
      continue;
    }
    std::optional<std::string> refusal;
    for (const auto& [classId, count] : needs.byClass) {
      const size_t resource = classes[classId].resource;
      const std::string& className = classes[classId].gpuClass->metadata.name;
      ForEachConstraint(budget->second, UsageOf(usageBy, ns), classId, resource,
                        [&](const Constraint& constraint) {
                          if (refusal) {
                            return;
                          }
                          if (constraint.blocked) {
                            const std::string name(ns);
                            refusal = "the raw quota key " + constraint.limit->key + " of " + name +
                                      " blocks class " + className + " until " + name +
                                      " also declares " + api::ClassBudgetKey(className) + " or " +
                                      std::string(api::kTotalBudgetKey);
                            return;
                          }
                          const std::string& key = constraint.limit->key;
                          int64_t need = count;
                          if (constraint.kind == Constraint::Kind::kTotal) {
                            need = needs.total;
                          } else if (constraint.kind == Constraint::Kind::kRaw) {
                            need = CountOf(needs.byResource, resource);
                          }
                          if (constraint.used + need > constraint.limit->value) {
                            refusal = "the budget " + key + " of " + std::string(ns) + " is " +
                                      std::to_string(constraint.limit->value) + " with " +
                                      std::to_string(constraint.used) + " used; the order needs " +
                                      std::to_string(need);
                          }
                        });
      if (refusal) {
        return refusal;
      }
    }
  }
  return std::nullopt;
}

Model::Model(const Snapshot& snapshot) : index_(std::make_unique<Index>(snapshot)) {
  index_->Build();
}

Model::~Model() = default;

RemainingBudget Model::Remaining(std::string_view tenant, std::string_view className) const {
  const auto c = index_->classIds.find(className);
  if (c == index_->classIds.end()) {
    return {};
  }
  return index_->Remaining(tenant, c->second, index_->usage);
}

std::optional<NodeClassView> Model::NodeClass(std::string_view node,
                                              std::string_view className) const {
  const Index& ix = *index_;
  const auto n = ix.nodeIds.find(node);
  const auto c = ix.classIds.find(className);
  if (n == ix.nodeIds.end() || c == ix.classIds.end() ||
      !ix.classes[c->second].servesNode[n->second]) {
    return std::nullopt;
  }
  const size_t at = ix.At(n->second, ix.classes[c->second].resource);
  const int64_t used = ix.bound[at] + ix.raw[at];
  return NodeClassView{ix.units[at], used, std::max<int64_t>(0, ix.units[at] - used)};
}

ClusterView Model::View() const {
  const Index& ix = *index_;
  ClusterView view;
  view.gpuResourceNames = EffectiveGpuResourceNames(ix.snapshot.settings, ix.snapshot.gpuNodes,
                                                    ix.snapshot.permittedHostDevices);
  for (const ClassInfo& info : ix.classes) {
    ClassView classView{info.gpuClass->metadata.name, info.maxCount, 0, 0};
    for (size_t n : info.nodes) {
      classView.units += ix.units[ix.At(n, info.resource)];
      if (ix.eligibility[n].eligible) {
        classView.free += std::max<int64_t>(0, ix.Free(n, info.resource));
      }
    }
    view.classes.push_back(std::move(classView));
  }
  for (size_t n = 0; n < ix.nodes.size(); ++n) {
    if (!ix.hasGpuNode[n]) {
      continue;
    }
    NodeView nodeView{ix.nodes[n]->name, ix.eligibility[n].eligible, ix.eligibility[n].reasons, {}};
    for (const ClassInfo& info : ix.classes) {
      const size_t at = ix.At(n, info.resource);
      const int64_t used = ix.bound[at] + ix.raw[at];
      if (info.servesNode[n] && (ix.units[at] > 0 || used > 0)) {
        nodeView.classes[info.gpuClass->metadata.name] =
            NodeClassView{ix.units[at], used, std::max<int64_t>(0, ix.units[at] - used)};
      }
    }
    view.nodes.push_back(std::move(nodeView));
  }
  for (const std::string& tenant : ix.tenants.Tenants()) {
    TenantView tenantView{tenant, {}};
    const Usage& used = UsageOf(ix.usage, tenant);
    for (size_t c = 0; c < ix.classes.size(); ++c) {
      tenantView.classes[ix.classes[c].gpuClass->metadata.name] =
          TenantClassView{Get(used.byClass, c), ix.Remaining(tenant, c, ix.usage)};
    }
    view.tenants.push_back(std::move(tenantView));
  }
  return view;
}

// ---- the binder pass ----
//
// The pass touches every device, so it works on numbers: the index's class and node of each
// device, sets as ranges of one member array, needs as ranges of one count array, and one
// buffer of sort keys. Apart from the decisions it returns it makes a handful of allocations
// per pass rather than several per device, which kept its time growing faster than the cluster.

namespace {

// The devices one VM names (or one unattached order) move, go Lost and are rebound together.
struct DeviceSet {
  std::string_view key;  // "ns/vmi <name> <uid>" or "ns/<device>": sets are taken in its order
  std::string_view namespaceName;
  std::string_view name;  // the VMI's name for an attached set, the device's for an order
  bool attached = false;
  const VirtualMachineInstance* vmi = nullptr;
  std::span<const size_t> members;  // device indices, ascending
  size_t node = kNone;              // where the first member is placed, as Index::placedOn
  std::string_view created;         // the earliest member's creationTimestamp
  bool memberDeleting = false;      // a member has a deletionTimestamp
  // A member is being deleted, or its class is, or it orders more than its class allows: a new
  // order is refused (BindNew reads the members only then).
  bool checkMembers = false;
  Needs needs;

  // "the set of VMI vm1" or "order gpu-1", for messages.
  std::string Description() const {
    return (attached ? "the set of VMI " : "order ") + std::string(name);
  }
};

std::string DescribeNeeds(const Needs& needs, const std::vector<std::string>& resources) {
  std::string text;
  for (const auto& [resource, count] : needs.byResource) {
    text += (text.empty() ? "" : " and ") + std::to_string(count) + " unit" +
            (count == 1 ? "" : "s") + " of " + resources[resource];
  }
  return text;
}

// Adds `count` at `id` in a short list kept ascending by id.
void AddCount(std::vector<std::pair<size_t, int64_t>>& counts, size_t id, int64_t count) {
  auto it = std::lower_bound(counts.begin(), counts.end(), id,
                             [](const auto& entry, size_t key) { return entry.first < key; });
  if (it != counts.end() && it->first == id) {
    it->second += count;
  } else {
    counts.insert(it, {id, count});
  }
}

}  // namespace

class PassPlanner {
 public:
  explicit PassPlanner(const Model::Index& ix) : ix_(ix) {
    free_.resize(ix.units.size());
    for (size_t i = 0; i < free_.size(); ++i) {
      free_[i] = ix.units[i] - ix.bound[i] - ix.raw[i];
    }
    // Budgets of new orders are checked against what exists besides new orders, plus the
    // orders this pass accepts, in order.
    passUsage_ = ix.usage;
    for (const auto& [ns, pending] : ix.pendingUsage) {
      passUsage_[ns].Add(pending, -1);
    }
    classesByResource_.resize(ix.resources.size());
    byFree_.resize(ix.classes.size());
    for (size_t c = 0; c < ix.classes.size(); ++c) {
      classesByResource_[ix.classes[c].resource].push_back(c);
      for (size_t node : ix.classes[c].nodes) {
        if (ix.takesBinds[node]) {
          byFree_[c].emplace(FreeAt(node, ix.classes[c].resource), node);
        }
      }
    }
    // Nodes that hold more than they serve; none becomes so during the pass (sets are placed
    // only where they fit).
    overfull_.assign(ix.nodes.size(), 0);
    for (size_t n = 0; n < ix.nodes.size(); ++n) {
      for (size_t r = 0; r < ix.resources.size(); ++r) {
        overfull_[n] = static_cast<char>(overfull_[n] || FreeAt(n, r) < 0);
      }
    }
    // One decision per device: sized once, not regrown (each regrowth touches fresh pages).
    decisions_.reserve(ix.snapshot.devices.size());
    GroupSets();
  }

  std::vector<Decision> Run() {
    // Each kind of set in the order it is taken: by key (the sets' own order), new orders
    // oldest first, then by key.
    const std::vector<DeviceSet*>& mixed = steps_[static_cast<size_t>(State::kMixed)];
    const std::vector<DeviceSet*>& held = steps_[static_cast<size_t>(State::kHeld)];
    const std::vector<DeviceSet*>& lost = steps_[static_cast<size_t>(State::kLost)];
    std::vector<DeviceSet*>& fresh = steps_[static_cast<size_t>(State::kNew)];
    std::stable_sort(fresh.begin(), fresh.end(), [](const DeviceSet* a, const DeviceSet* b) {
      return a->created < b->created;
    });
    for (const DeviceSet* set : mixed) {
      Gather(*set);
    }
    MoveHeld(held);
    for (const DeviceSet* set : lost) {
      Rebind(*set);
    }
    for (const DeviceSet* set : fresh) {
      BindNew(*set);
    }
    return std::move(decisions_);
  }

 private:
  enum class State { kHeld, kLost, kNew, kMixed };

  const api::GpuDevice& Device(size_t d) const { return ix_.Device(d); }
  bool IsPlaced(size_t d) const { return ix_.placedOn[d] != kNone; }

  // Sets: the devices attached to one VMI (same namespace, name and UID), and every other
  // device alone; built in the order of their keys.
  //
  // The device records are read once, in their own order; everything after works on numbers and
  // buffers a few bytes per device, so the sets are written in the order they are taken and no
  // step reaches into a large array at random (each such step missed the cache once the cluster
  // outgrew it, and made the pass grow faster than the cluster).
  void GroupSets() {
    const std::vector<api::GpuDevice>& devices = ix_.snapshot.devices;
    // Each device's set, each set's key in one buffer, and each device's name and creation time
    // in others. Attached sets are found by key in a table that owns its keys (one entry per
    // VMI, small enough to stay in cache); every other device starts its own set.
    std::vector<size_t> setOf(devices.size());
    std::vector<size_t> leaders;  // each set's first device
    std::vector<SetKey> keys;     // each set's key in keys_
    std::vector<size_t> createdAt(devices.size() + 1);
    std::vector<char> deleting(devices.size());
    leaders.reserve(devices.size());
    keys.reserve(devices.size());
    nameAt_.reserve(devices.size() + 1);
    std::unordered_map<std::string, size_t> attachedSets;
    std::string key;
    for (size_t d = 0; d < devices.size(); ++d) {
      const api::GpuDevice& device = devices[d];
      nameAt_.push_back(names_.size());
      names_ += device.metadata.name;
      createdAt[d] = created_.size();
      created_ += device.metadata.creationTimestamp;
      deleting[d] = device.metadata.deletionTimestamp.has_value() ? 1 : 0;
      const std::string& ns = device.metadata.namespaceName;
      key.assign(ns);
      key += '/';
      SetKey at{
          Offset(keys_.size()), 0, Offset(ns.size()), 0, 0, device.status.attachment.has_value()};
      if (device.status.attachment) {
        const api::Attachment& attachment = *device.status.attachment;
        key += "vmi ";
        at.nameAt = Offset(key.size());
        at.nameSize = Offset(attachment.vmiName.size());
        key += attachment.vmiName;
        key += ' ';
        key += attachment.vmiUid;
        const auto [it, added] = attachedSets.try_emplace(key, leaders.size());
        setOf[d] = it->second;
        if (!added) {
          continue;
        }
      } else {
        at.nameAt = Offset(key.size());
        at.nameSize = Offset(device.metadata.name.size());
        key += device.metadata.name;
        setOf[d] = leaders.size();
      }
      at.size = Offset(key.size());
      keys_ += key;
      leaders.push_back(d);
      keys.push_back(at);
    }
    nameAt_.push_back(names_.size());
    createdAt[devices.size()] = created_.size();
    // The buffers are complete: views into them stay put from here on.
    auto keyOf = [this, &keys](size_t s) {
      return std::string_view(keys_).substr(keys[s].at, keys[s].size);
    };
    auto createdOf = [this, &createdAt](size_t d) {
      return std::string_view(created_).substr(createdAt[d], createdAt[d + 1] - createdAt[d]);
    };

    // Members as ranges of one array, in device order.
    std::vector<size_t> start(leaders.size() + 1, 0);
    for (const size_t set : setOf) {
      ++start[set + 1];
    }
    for (size_t s = 0; s < leaders.size(); ++s) {
      start[s + 1] += start[s];
    }
    std::vector<size_t> members(devices.size());  // by set in their first devices' order
    {
      std::vector<size_t> next(start.begin(), start.end() - 1);
      for (size_t d = 0; d < devices.size(); ++d) {
        members[next[setOf[d]]++] = d;
      }
    }

    // The sets in key order, each from its members' numbers, and sorted into the steps that take
    // them as they are made. Counts go to one array per kind, sized for the worst case (a count
    // per device) so the views into them stay put; sets_ too, for the pointers.
    const std::vector<size_t> order = OrderByKey(leaders, keys, keyOf);
    sets_.reserve(order.size());
    classCounts_.reserve(devices.size());
    resourceCounts_.reserve(devices.size());
    keyMembers_.reserve(devices.size());
    std::vector<std::pair<size_t, int64_t>> byClass, byResource;
    for (const size_t s : order) {
      const size_t leader = leaders[s];
      DeviceSet set;
      set.key = keyOf(s);
      set.namespaceName = set.key.substr(0, keys[s].nsSize);
      set.name = set.key.substr(keys[s].nameAt, keys[s].nameSize);
      set.attached = keys[s].attached;
      set.vmi = ix_.AttachedVmi(leader);
      // The members again, in the sets' order, so every later step reads them in sequence.
      keyMembers_.insert(keyMembers_.end(), members.begin() + static_cast<std::ptrdiff_t>(start[s]),
                         members.begin() + static_cast<std::ptrdiff_t>(start[s + 1]));
      set.members = std::span<const size_t>(
          keyMembers_.data() + keyMembers_.size() - (start[s + 1] - start[s]),
          start[s + 1] - start[s]);
      set.node = ix_.placedOn[set.members.front()];
      set.created = createdOf(leader);
      byClass.clear();
      byResource.clear();
      for (const size_t d : set.members) {
        set.created = std::min(set.created, createdOf(d));
        set.memberDeleting = set.memberDeleting || deleting[d] != 0;
        const size_t c = ix_.deviceClass[d];
        set.needs.total += ix_.ordered[d];
        if (c == kNone) {
          set.needs.unknownClass = devices[d].spec.className;  // rare: read the record
          continue;
        }
        const ClassInfo& info = ix_.classes[c];
        set.checkMembers = set.checkMembers || info.gpuClass->metadata.deletionTimestamp ||
                           (info.maxCount && ix_.ordered[d] > *info.maxCount);
        AddCount(byClass, c, ix_.ordered[d]);
        AddCount(byResource, info.resource, ix_.ordered[d]);
      }
      set.checkMembers = set.checkMembers || set.memberDeleting;
      set.needs.byClass = Counts(classCounts_.data() + classCounts_.size(), byClass.size());
      set.needs.byResource =
          Counts(resourceCounts_.data() + resourceCounts_.size(), byResource.size());
      classCounts_.insert(classCounts_.end(), byClass.begin(), byClass.end());
      resourceCounts_.insert(resourceCounts_.end(), byResource.begin(), byResource.end());
      // A held set that stays is decided while at hand and not kept: its members are all its
      // keep decisions need. The other sets wait for their steps.
      const State state = Classify(set);
      if (state == State::kHeld && StaysPut(set)) {
        staying_.push_back({set.node, nullptr, set.members});
      } else {
        sets_.push_back(set);
        steps_[static_cast<size_t>(state)].push_back(&sets_.back());
      }
    }
  }

  // An offset into the pass's buffers, which hold a few bytes per device: 4 GiB of keys is
  // beyond any snapshot this process could hold.
  static uint32_t Offset(size_t value) {
    if (value > std::numeric_limits<uint32_t>::max()) {
      throw std::length_error("placement pass: buffer offset past 4 GiB");
    }
    return static_cast<uint32_t>(value);
  }

  // Where a set's key, and its namespace and name within it, sit in keys_. Kept small: the
  // sort reads these at random.
  struct SetKey {
    uint32_t at;
    uint32_t size;
    uint32_t nsSize;
    uint32_t nameAt;  // within the key
    uint32_t nameSize;
    bool attached;
  };

  // The sets by key, "ns/..." compared as bytes, without one big sort by strings: namespaces are
  // ranked by "ns/" (different namespaces differ within that prefix, since a namespace holds no
  // '/'), the sets are bucketed by that rank, and only the few sets of one namespace are sorted
  // by the rest of their keys. A tenant's sets are a small group however large the cluster, so
  // this grows with the cluster rather than by n log n over long shared prefixes.
  template <typename KeyOf>
  std::vector<size_t> OrderByKey(const std::vector<size_t>& leaders,
                                 const std::vector<SetKey>& keys, const KeyOf& keyOf) const {
    const std::vector<const std::string*>& names = ix_.nsNames;
    std::vector<size_t> byName(names.size());
    for (size_t i = 0; i < byName.size(); ++i) {
      byName[i] = i;
    }
    std::sort(byName.begin(), byName.end(),
              [&names](size_t a, size_t b) { return SlashedLess(*names[a], *names[b]); });
    std::vector<size_t> rank(names.size());
    for (size_t i = 0; i < byName.size(); ++i) {
      rank[byName[i]] = i;
    }
    std::vector<size_t> bucketAt(names.size() + 1, 0);
    for (const size_t leader : leaders) {
      ++bucketAt[rank[ix_.nsOf[leader]] + 1];
    }
    for (size_t r = 0; r < names.size(); ++r) {
      bucketAt[r + 1] += bucketAt[r];
    }
    std::vector<size_t> order(leaders.size());
    std::vector<size_t> next(bucketAt.begin(), bucketAt.end() - 1);
    for (size_t s = 0; s < leaders.size(); ++s) {
      order[next[rank[ix_.nsOf[leaders[s]]]]++] = s;
    }
    for (size_t r = 0; r < names.size(); ++r) {
      const auto first = order.begin() + static_cast<std::ptrdiff_t>(bucketAt[r]);
      const auto last = order.begin() + static_cast<std::ptrdiff_t>(bucketAt[r + 1]);
      std::sort(first, last, [&keys, &keyOf](size_t a, size_t b) {
        return keyOf(a).substr(keys[a].nsSize) < keyOf(b).substr(keys[b].nsSize);
      });
    }
    return order;
  }

  // a + "/" < b + "/", as bytes, without building either.
  static bool SlashedLess(std::string_view a, std::string_view b) {
    const size_t common = std::min(a.size(), b.size());
    if (const int c = a.substr(0, common).compare(b.substr(0, common)); c != 0) {
      return c < 0;
    }
    if (a.size() == b.size()) {
      return false;
    }
    const auto slash = static_cast<unsigned char>('/');
    return a.size() < b.size() ? slash < static_cast<unsigned char>(b[common])
                               : static_cast<unsigned char>(a[common]) < slash;
  }

  State Classify(const DeviceSet& set) const {
    size_t placed = 0, lostCount = 0, pending = 0;
    bool oneNode = true;
    const size_t firstNode = set.node;
    for (const size_t d : set.members) {
      if (IsPlaced(d)) {
        ++placed;
        oneNode = oneNode && ix_.placedOn[d] == firstNode;
      } else if (ix_.phase[d] == api::DevicePhase::kPending) {
        ++pending;
      } else {
        ++lostCount;  // Lost, or Bound without a node
      }
    }
    const size_t size = set.members.size();
    if (placed == size && oneNode) {
      return State::kHeld;
    }
    if (lostCount == size) {
      return State::kLost;
    }
    if (pending == size) {
      return State::kNew;
    }
    return State::kMixed;
  }

  void Decide(const DeviceSet& set, Action action, std::string_view node,
              const std::string& reason) {
    for (const size_t d : set.members) {
      Decide(d, action, node, reason);
    }
  }

  // The namespace comes from the index's table of namespaces and the name from the pass's own
  // copy of the names: the decisions go out in set order, and reaching into the device records
  // (hundreds of bytes each) in that order missed the cache once they outgrew it.
  void Decide(size_t d, Action action, std::string_view node, const std::string& reason) {
    decisions_.push_back(Decision{*ix_.nsNames[ix_.nsOf[d]],
                                  names_.substr(nameAt_[d], nameAt_[d + 1] - nameAt_[d]), action,
                                  std::string(node), reason});
  }

  int64_t FreeAt(size_t node, size_t resource) const { return free_[ix_.At(node, resource)]; }

  // Every change of free units goes through here, keeping byFree_ in step. The tree's node is
  // moved to its new place, not freed and allocated again.
  void AdjustFree(size_t node, size_t resource, int64_t delta) {
    int64_t& free = free_[ix_.At(node, resource)];
    if (ix_.takesBinds[node]) {
      for (const size_t c : classesByResource_[resource]) {
        if (ix_.classes[c].servesNode[node]) {
          auto entry = byFree_[c].extract({free, node});
          entry.value().first = free + delta;
          byFree_[c].insert(std::move(entry));
        }
      }
    }
    free += delta;
  }

  void Take(size_t node, const Needs& needs, int64_t sign) {
    for (const auto& [resource, count] : needs.byResource) {
      AdjustFree(node, resource, -sign * count);
    }
  }

  // Gives back what the set's Bound members hold on their nodes.
  void ReleasePlaced(const DeviceSet& set) {
    for (const size_t d : set.members) {
      if (ix_.IsNode(ix_.placedOn[d]) && ix_.deviceClass[d] != kNone) {
        AdjustFree(ix_.placedOn[d], ix_.classes[ix_.deviceClass[d]].resource, Device(d).spec.count);
      }
    }
  }

  bool Eligible(const DeviceSet& set, size_t node) const {
    if (set.vmi && !set.vmi->tolerations.empty()) {
      return CheckNodeEligibility(*ix_.nodes[node], set.vmi->tolerations).eligible;
    }
    return ix_.takesBinds[node] != 0;
  }

  // How many units would be left free on the node after placing the set, or nullopt when it
  // does not fit: the smaller, the fuller the node.
  std::optional<int64_t> Slack(const DeviceSet& set, size_t node) {
    if (!Eligible(set, node)) {
      return std::nullopt;
    }
    for (const auto& [classId, count] : set.needs.byClass) {
      if (!ix_.classes[classId].servesNode[node]) {
        return std::nullopt;
      }
    }
    int64_t slack = 0;
    for (const auto& [resource, count] : set.needs.byResource) {
      const int64_t left = FreeAt(node, resource) - count;
      if (left < 0) {
        return std::nullopt;
      }
      slack += left;
    }
    return slack;
  }

  // The fullest eligible node with room for the whole set; ties go to the first by name.
  size_t FindTarget(const DeviceSet& set, size_t exclude) {
    if (set.needs.byClass.empty()) {
      return kNone;
    }
    // The common shape, one class and no tolerations of its own: the first node of the class's
    // free-units order with enough room. Other sets look at every node of their first class.
    if (set.needs.byClass.size() == 1 && (!set.vmi || set.vmi->tolerations.empty())) {
      const std::set<std::pair<int64_t, size_t>>& order = byFree_[set.needs.byClass.front().first];
      auto it = order.lower_bound({set.needs.byResource.front().second, 0});
      while (it != order.end() && it->second == exclude) {
        ++it;
      }
      return it == order.end() ? kNone : it->second;
    }
    size_t best = kNone;
    int64_t bestSlack = 0;
    for (const size_t node : ix_.classes[set.needs.byClass.front().first].nodes) {
      if (node == exclude) {
        continue;
      }
      const std::optional<int64_t> slack = Slack(set, node);
      if (slack && (best == kNone || *slack < bestSlack)) {
        best = node;
        bestSlack = *slack;
      }
    }
    return best;
  }

  std::string NoRoom(const DeviceSet& set) const {
    return "no eligible node has room for " + DescribeNeeds(set.needs, ix_.resources);
  }

  std::string ClassMissing(const DeviceSet& set) const {
    return "class " + std::string(set.needs.unknownClass) + " does not exist";
  }

  // Step 1: a set left partly Lost or split over nodes is gathered onto one node, preferring
  // the node that already holds most of it, or sent whole to Lost.
  void Gather(const DeviceSet& set) {
    if (!set.needs.unknownClass.empty()) {
      Decide(set, Action::kKeep, "", ClassMissing(set));
      return;
    }
    ReleasePlaced(set);
    // (node, members it holds) for the members' nodes that exist; node indices follow names.
    std::vector<std::pair<size_t, int64_t>> holding;
    for (const size_t d : set.members) {
      if (ix_.IsNode(ix_.placedOn[d])) {
        AddCount(holding, ix_.placedOn[d], 1);
      }
    }
    std::stable_sort(holding.begin(), holding.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
    size_t target = kNone;
    for (const auto& [node, count] : holding) {
      if (Slack(set, node)) {
        target = node;
        break;
      }
    }
    if (target == kNone) {
      target = FindTarget(set, kNone);
    }
    if (target == kNone) {
      Decide(set, Action::kLost, "",
             set.Description() + " cannot be gathered onto one node: " + NoRoom(set));
      return;
    }
    Take(target, set.needs, 1);
    const std::string& name = ix_.nodes[target]->name;
    const std::string reason = "gathering " + set.Description() + " onto " + name;
    for (const size_t d : set.members) {
      Action action = Action::kBind;
      if (IsPlaced(d)) {
        action = ix_.placedOn[d] == target ? Action::kKeep : Action::kMove;
      }
      Decide(d, action, name, reason);
    }
  }

  struct Leaving {
    DeviceSet* set;
    size_t node;  // kNone when the node is gone
    std::string reason;
  };

  // The common case of a held set, decided from numbers: it stays on a node that takes binds (so
  // no taint that its tolerations could matter for) and serves every class of the set.
  // A node holding more than it serves (EvictOverCapacity) is left to MoveHeld, whole.
  bool StaysPut(const DeviceSet& set) const {
    const size_t n = set.node;
    return set.needs.unknownClass.empty() && ix_.IsNode(n) && ix_.takesBinds[n] && !overfull_[n] &&
           std::all_of(set.needs.byClass.begin(), set.needs.byClass.end(),
                       [this, n](const auto& entry) {
                         return ix_.classes[entry.first].servesNode[n] != 0;
                       });
  }

  // A held set that stays, with its members at hand: the keep decisions go out by node, and
  // reaching into the sets in that order missed the cache once they outgrew it.
  struct Staying {
    size_t node;
    DeviceSet* set;  // null for those StaysPut kept: never on a node EvictOverCapacity looks at
    std::span<const size_t> members;
  };

  // Step 2: held sets stay unless their node cannot keep them.
  void MoveHeld(const std::vector<DeviceSet*>& held) {
    std::vector<Leaving> mustLeave;
    std::vector<Leaving> cordoned;
    // Held sets that StaysPut kept were put here as the sets were made; a set this loop keeps
    // sits on a node that does not take binds, so never on the same node as those.
    std::vector<Staying>& staying = staying_;
    for (DeviceSet* set : held) {
      const size_t n = set->node;
      const std::string nodeName(ix_.NodeName(n));
      if (!set->needs.unknownClass.empty()) {
        Decide(*set, Action::kKeep, nodeName, ClassMissing(*set) + "; left in place");
        continue;
      }
      if (!ix_.IsNode(n)) {
        mustLeave.push_back({set, kNone, "node " + nodeName + " is gone"});
        continue;
      }
      const Node& node = *ix_.nodes[n];
      std::string problem;
      if (!node.ready) {
        problem = "node " + nodeName + " is not Ready";
      }
      for (const auto& [classId, count] : set->needs.byClass) {
        if (problem.empty() && !ix_.classes[classId].servesNode[n]) {
          problem = "node " + nodeName + " no longer matches the nodeSelector of class " +
                    ix_.classes[classId].gpuClass->metadata.name;
        }
      }
      if (problem.empty()) {
        // Taints the set does not tolerate; the cordon is judged on its own below.
        static const std::vector<Toleration> kNoTolerations;
        if (std::optional<std::string> taint =
                UntoleratedTaint(node, set->vmi ? set->vmi->tolerations : kNoTolerations)) {
          problem = "node " + nodeName + ": " + *taint;
        }
      }
      if (!problem.empty()) {
        mustLeave.push_back({set, n, problem});
      } else if (node.unschedulable) {
        cordoned.push_back({set, n, ""});
      } else {
        staying.push_back({n, set, set->members});
      }
    }
    // By node, keeping the key order on each node: a counting sort, linear in the sets.
    {
      std::vector<size_t> at(ix_.nodes.size() + 1, 0);
      for (const Staying& entry : staying) {
        ++at[entry.node + 1];
      }
      for (size_t n = 0; n < ix_.nodes.size(); ++n) {
        at[n + 1] += at[n];
      }
      std::vector<Staying> byNode(staying.size());
      for (const Staying& entry : staying) {
        byNode[at[entry.node]++] = entry;
      }
      staying = std::move(byNode);
    }
    for (const Leaving& leaving : mustLeave) {
      ReleasePlaced(*leaving.set);
    }
    EvictOverCapacity(staying, cordoned, mustLeave);

    for (const Leaving& leaving : mustLeave) {
      const size_t target = FindTarget(*leaving.set, leaving.node);
      if (target == kNone) {
        Decide(*leaving.set, Action::kLost, "", leaving.reason + "; " + NoRoom(*leaving.set));
        continue;
      }
      Take(target, leaving.set->needs, 1);
      Decide(*leaving.set, Action::kMove, ix_.nodes[target]->name, leaving.reason);
    }
    for (const Leaving& leaving : cordoned) {
      DeviceSet& set = *leaving.set;
      const std::string& nodeName = ix_.nodes[leaving.node]->name;
      std::string stayingClass;
      for (const auto& [classId, count] : set.needs.byClass) {
        if (ix_.classes[classId].gpuClass->spec.onCordon == api::OnCordon::kStay) {
          stayingClass = ix_.classes[classId].gpuClass->metadata.name;
        }
      }
      if (!stayingClass.empty()) {
        Decide(set, Action::kKeep, nodeName,
               "node " + nodeName + " is cordoned; class " + stayingClass + " has onCordon Stay");
        continue;
      }
      Take(leaving.node, set.needs, -1);
      const size_t target = FindTarget(set, leaving.node);
      if (target == kNone) {
        Take(leaving.node, set.needs, 1);
        Decide(set, Action::kKeep, nodeName,
               "node " + nodeName + " is cordoned, but no other eligible node has room");
        continue;
      }
      Take(target, set.needs, 1);
      Decide(set, Action::kMove, ix_.nodes[target]->name, "node " + nodeName + " is cordoned");
    }
    static const std::string kHeld = "held";
    for (const Staying& entry : staying) {
      for (const size_t d : entry.members) {
        Decide(d, Action::kKeep, ix_.nodes[entry.node]->name, kHeld);
      }
    }
  }

  // A node that serves fewer units than its bound devices and pods hold (a function failed, an
  // mdev parent lost slots) cannot keep every set: sets leave, last by name first, until the
  // rest fit. Which function a device sits on is not recorded, so no set is preferred.
  void EvictOverCapacity(std::vector<Staying>& staying, std::vector<Leaving>& cordoned,
                         std::vector<Leaving>& mustLeave) {
    // Only nodes holding more than they serve are looked at; the others keep every set.
    std::map<size_t, std::vector<std::pair<DeviceSet*, bool>>> onNode;  // set, is cordoned
    for (size_t node = 0; node < ix_.nodes.size(); ++node) {
      for (size_t r = 0; r < ix_.resources.size(); ++r) {
        if (FreeAt(node, r) < 0) {
          onNode[node];  // also for a node holding only cordoned sets
          break;
        }
      }
    }
    if (onNode.empty()) {
      return;
    }
    for (auto& [node, sets] : onNode) {
      const auto range =
          std::equal_range(staying.begin(), staying.end(), Staying{node, nullptr, {}},
                           [](const Staying& a, const Staying& b) { return a.node < b.node; });
      for (auto it = range.first; it != range.second; ++it) {
        sets.emplace_back(it->set, false);
      }
    }
    for (const Leaving& leaving : cordoned) {
      if (const auto it = onNode.find(leaving.node); it != onNode.end()) {
        it->second.emplace_back(leaving.set, true);
      }
    }
    std::set<const DeviceSet*> evicted;
    for (auto& [node, sets] : onNode) {
      std::sort(sets.begin(), sets.end(),
                [](const auto& a, const auto& b) { return a.first->key > b.first->key; });
      for (size_t r = 0; r < ix_.resources.size(); ++r) {
        if (FreeAt(node, r) >= 0) {
          continue;
        }
        const size_t at = ix_.At(node, r);
        const std::string reason = "node " + ix_.nodes[node]->name + " serves " +
                                   std::to_string(ix_.units[at]) + " units of " + ix_.resources[r] +
                                   " but " + std::to_string(ix_.bound[at] + ix_.raw[at]) +
                                   " are held";
        for (const auto& [set, isCordoned] : sets) {
          if (FreeAt(node, r) >= 0) {
            break;
          }
          if (evicted.contains(set) || CountOf(set->needs.byResource, r) == 0) {
            continue;
          }
          evicted.insert(set);
          ReleasePlaced(*set);
          mustLeave.push_back({set, node, reason});
        }
      }
    }
    std::erase_if(staying,
                  [&evicted](const Staying& entry) { return evicted.contains(entry.set); });
    std::erase_if(cordoned,
                  [&evicted](const Leaving& leaving) { return evicted.contains(leaving.set); });
  }

  // Step 3: Lost sets are rebound before new orders take the room.
  void Rebind(const DeviceSet& set) {
    if (!set.needs.unknownClass.empty()) {
      Decide(set, Action::kLost, "", ClassMissing(set));
      return;
    }
    const size_t target = FindTarget(set, kNone);
    if (target == kNone) {
      Decide(set, Action::kLost, "", NoRoom(set));
      return;
    }
    Take(target, set.needs, 1);
    Decide(set, Action::kBind, ix_.nodes[target]->name,
           "rebinding " + set.Description() + " onto the fullest node with room");
  }

  // Step 4: new orders, oldest first, onto the fullest node with room.
  void BindNew(const DeviceSet& set) {
    if (!set.needs.unknownClass.empty()) {
      Decide(set, Action::kRefuse, "", ClassMissing(set));
      return;
    }
    for (size_t i = 0; set.checkMembers && i < set.members.size(); ++i) {
      const api::GpuDevice& device = Device(set.members[i]);
      const ClassInfo& info = ix_.classes[ix_.deviceClass[set.members[i]]];
      if (info.gpuClass->metadata.deletionTimestamp) {
        Decide(set, Action::kRefuse, "",
               "class " + info.gpuClass->metadata.name + " is being deleted");
        return;
      }
      if (info.maxCount && device.spec.count > *info.maxCount) {
        Decide(set, Action::kRefuse, "",
               device.metadata.name + " orders " + std::to_string(device.spec.count) +
                   " GPUs; class " + info.gpuClass->metadata.name + " allows at most " +
                   std::to_string(*info.maxCount));
        return;
      }
      if (device.metadata.deletionTimestamp) {
        Decide(set, Action::kRefuse, "", device.metadata.name + " is being deleted");
        return;
      }
    }
    if (std::optional<std::string> refusal =
            ix_.CheckBudgets(set.namespaceName, set.needs, passUsage_, chain_)) {
      Decide(set, Action::kRefuse, "", *refusal);
      return;
    }
    const size_t target = FindTarget(set, kNone);
    if (target == kNone) {
      Decide(set, Action::kRefuse, "", NoRoom(set));
      return;
    }
    Take(target, set.needs, 1);
    Usage booked;
    for (const auto& [classId, count] : set.needs.byClass) {
      AddAt(booked.byClass, classId, count);
    }
    for (const auto& [resource, count] : set.needs.byResource) {
      AddAt(booked.devicesByResource, resource, count);
    }
    booked.total = set.needs.total;
    ix_.tenants.BudgetChain(set.namespaceName, chain_);
    for (const std::string_view ns : chain_) {
      passUsage_[ns].Add(booked, 1);
    }
    static const std::string kFullest = "the fullest eligible node with room";
    Decide(set, Action::kBind, ix_.nodes[target]->name, kFullest);
  }

  const Model::Index& ix_;
  std::vector<int64_t> free_;  // by node and resource, as Index::At
  // Per class, the nodes it selects that take binds, ordered by free units of its resource name
  // then by name: the fullest node with room is a lookup rather than a scan.
  std::vector<std::set<std::pair<int64_t, size_t>>> byFree_;
  std::vector<std::vector<size_t>> classesByResource_;
  UsageBy passUsage_;
  std::vector<std::string_view> chain_;  // BudgetChain's buffer
  // What the sets view: members, needs and keys of every set, each in one array.
  std::vector<size_t> keyMembers_;  // each set's members, the sets in key order
  std::vector<std::pair<size_t, int64_t>> classCounts_;
  std::vector<std::pair<size_t, int64_t>> resourceCounts_;
  std::string keys_;
  std::string created_;
  std::vector<DeviceSet> sets_;                   // by key
  std::array<std::vector<DeviceSet*>, 4> steps_;  // by State: the sets each step takes, by key
  std::vector<Staying> staying_;  // held sets StaysPut kept, by key until MoveHeld orders them
  std::vector<char> overfull_;    // by node
  std::vector<Decision> decisions_;
  std::string names_;           // every device's name, in device order
  std::vector<size_t> nameAt_;  // by device: where its name starts in names_, then the end
};

std::vector<Decision> Model::PlanPass() const { return PassPlanner(*index_).Run(); }

}  // namespace cozy::model
