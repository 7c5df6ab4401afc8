// Reading a snapshot into the index every other part works on: classes, nodes and the units
// they serve, each device's numbers, VMI attachments, and every tenant's usage.
#include "controller/model/model_internal.h"

#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include "api/dra.h"
#include "api/keys.h"
#include "api/time.h"
#include "api/validation.h"

namespace cozy::model {

// Each namespace's own usage while the devices and pods are counted: one row per namespace
// number in flat arrays, so counting a device adds to a few neighbouring numbers rather than to
// three small arrays of its own somewhere on the heap.
class UsageTable {
 public:
  UsageTable(size_t classes, size_t resources) : classes_(classes), resources_(resources) {}

  void Add(size_t ns, int64_t count) { Sum(Row(total_, ns, 1)[0], count); }
  void AddClass(size_t ns, size_t classId, size_t resource, int64_t count) {
    Sum(Row(byClass_, ns, classes_)[classId], count);
    Sum(Row(devices_, ns, resources_)[resource], count);
  }
  void AddRawPod(size_t ns, size_t resource, int64_t units) {
    Sum(Row(rawPods_, ns, resources_)[resource], units);
  }
  size_t Rows() const { return total_.size(); }
  // Whether anything was counted under `ns` (a number kept from an earlier index may not be).
  bool Touched(size_t ns) const { return ns < touched_.size() && touched_[ns] != 0; }
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
  static void Sum(int64_t& into, int64_t amount) { into = api::AddUnits(into, amount); }

  // The row of namespace `ns`, growing the table (and the totals) to hold it.
  int64_t* Row(std::vector<int64_t>& values, size_t ns, size_t width) {
    if (total_.size() <= ns) {
      total_.resize(ns + 1, 0);
      touched_.resize(ns + 1, 0);
    }
    touched_[ns] = 1;
    if (values.size() < (ns + 1) * width) {
      values.resize((ns + 1) * width, 0);
    }
    return values.data() + ns * width;
  }

  size_t classes_;
  size_t resources_;
  std::vector<int64_t> total_;
  std::vector<char> touched_;
  std::vector<int64_t> byClass_;
  std::vector<int64_t> devices_;
  std::vector<int64_t> rawPods_;
};

void Model::Index::Build(const Index* previous) {
  // The same nodes and classes: their tables, and each device's numbers, hold as they were.
  const bool sameNodes = previous != nullptr &&
                         snapshot.nodes.SameElements(previous->snapshot.nodes) &&
                         snapshot.classes == previous->snapshot.classes;
  if (sameNodes) {
    TakeClassesAndNodes(*previous);
  } else {
    IndexClassesAndNodes();
  }
  if (!snapshot.now.empty()) {
    now = api::ParseTime(snapshot.now);
  }
  if (sameNodes && snapshot.gpuNodes.SameElements(previous->snapshot.gpuNodes) &&
      snapshot.resourceSlices.SameElements(previous->snapshot.resourceSlices) &&
      snapshot.draUnknown == previous->snapshot.draUnknown && !previous->unitsPresumed) {
    units = previous->units;
    sliceUnits = previous->sliceUnits;
    draPresumed = previous->draPresumed;
    hasGpuNode = previous->hasGpuNode;
    unitProblems = previous->unitProblems;
    bound.assign(units.size(), 0);
    raw.assign(units.size(), 0);
  } else {
    CountUnits();
  }
  // Each namespace's own usage, by namespace number; only summed at the end, so order does
  // not matter.
  UsageTable ownUsage(classes.size(), resources.size());
  UsageTable ownPending(classes.size(), resources.size());
  ReadDevices(sameNodes ? previous : nullptr);
  CountDevices(ownUsage, ownPending);
  GroupVmiDevices();
  CountPods(ownUsage);
  CountClaims();
  PresumeDraUnits();
  SumUsage(ownUsage, ownPending);
  ReadBudgets();
  problems = unitProblems;
  problems.insert(problems.end(), podProblems.begin(), podProblems.end());
  problems.insert(problems.end(), budgetProblems.begin(), budgetProblems.end());
  // F18: a namespace of the tenant tree the raw-name and usage-monitor policies do not select
  // (the chart's policy refuses making one; this names one made before it).
  for (const Namespace& ns : snapshot.namespaces) {
    const bool tenant = std::any_of(ns.labels.begin(), ns.labels.end(), [](const auto& label) {
      return label.first.starts_with(api::kTenantLabelPrefix);
    });
    if (tenant && !ns.labels.contains(std::string(api::kTenantNamespaceLabel))) {
      problems.push_back(InputProblem{
          "Namespace", "", ns.name, "metadata.labels",
          "carries a " + std::string(api::kTenantLabelPrefix) + " label but not " +
              std::string(api::kTenantNamespaceLabel) +
              ": the GPU raw-name and usage-monitor policies do not cover it; label it"});
    }
  }
}

void Model::Index::IndexClassesAndNodes() {
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
    std::string resourceName = gpuClass->UnitsName();
    auto [it, inserted] = resourceIds.try_emplace(resourceName, resources.size());
    if (inserted) {
      resources.push_back(resourceName);
    }
    classIds[gpuClass->metadata.name] = classes.size();
    classes.push_back(ClassInfo{gpuClass, it->second, ResolveMaxCount(gpuClass->spec), {}, {}, {}});
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
    info.takes.resize(nodes.size(), 0);
    const std::vector<Toleration>& tolerations = info.gpuClass->spec.tolerations;
    for (size_t n = 0; n < nodes.size(); ++n) {
      const std::optional<api::LabelSelector>& selector = info.gpuClass->spec.nodeSelector;
      if (!selector || selector->Matches(nodes[n]->labels)) {
        info.servesNode[n] = 1;
        info.nodes.push_back(n);
        // A class without tolerations takes what every pod may; one with them is checked
        // against the node's taints (C7; docs/install.md, "GPU nodes behind a taint").
        info.takes[n] =
            tolerations.empty()
                ? takesBinds[n]
                : static_cast<char>(CheckNodeEligibility(*nodes[n], tolerations).eligible);
      }
    }
  }
}

void Model::Index::TakeClassesAndNodes(const Index& previous) {
  resources = previous.resources;
  resourceIds = previous.resourceIds;
  classes = previous.classes;
  classIds = previous.classIds;
  // Equal classes in the same order: each points at its equal in this snapshot.
  for (ClassInfo& info : classes) {
    info.gpuClass =
        &snapshot.classes[static_cast<size_t>(info.gpuClass - previous.snapshot.classes.data())];
  }
  // The very same Node objects, whose names the table views.
  nodes = previous.nodes;
  nodeIds = previous.nodeIds;
  eligibility = previous.eligibility;
  takesBinds = previous.takesBinds;
}

void Model::Index::CountUnits() {
  // Units a node serves: its GPU functions' allocatable per resource, so an mdev parent serves
  // as many as kubelet lists; counted here once for every caller.
  const size_t cells = nodes.size() * resources.size();
  units.assign(cells, 0);
  bound.assign(cells, 0);
  raw.assign(cells, 0);
  hasGpuNode.assign(nodes.size(), 0);
  unitProblems.clear();
  // B11's verdict on each name, judged once: the nodes of a cluster report a few names, each
  // thousands of times.
  std::unordered_map<std::string_view, std::string> verdicts;
  for (const api::GpuNodeInventory& gpuNode : snapshot.gpuNodes) {
    const auto node = nodeIds.find(gpuNode.nodeName);
    if (node == nodeIds.end()) {
      continue;  // its Node is gone; the GPUNode goes with it
    }
    hasGpuNode[node->second] = 1;
    for (size_t i = 0; i < gpuNode.resourceNames.size(); ++i) {
      const std::string& name = gpuNode.resourceNames[i];
      auto verdict = verdicts.find(name);
      if (verdict == verdicts.end()) {
        verdict = verdicts.emplace(name, api::CheckGpuResourceName(name)).first;
      }
      if (const std::string& why = verdict->second; !why.empty()) {
        unitProblems.push_back(InputProblem{"GPUNode", "", gpuNode.nodeName,
                                            "status.resourceNames[" + std::to_string(i) + "]",
                                            why + "; it is not taken as a GPU name"});
      }
    }
    for (size_t i = 0; i < gpuNode.devices.size(); ++i) {
      const api::InventoryDevice& device = gpuNode.devices[i];
      for (size_t j = 0; j < device.resources.size(); ++j) {
        const api::InventoryResource& resource = device.resources[j];
        const auto r = resourceIds.find(resource.name);
        if (r == resourceIds.end()) continue;
        // A report out of range moves only its own node's room: it is read as at most
        // api::kMaxUnits, and the sum saturates (docs/controller.md, "Inputs out of range").
        const int64_t allocatable = api::ClampUnits(resource.allocatable);
        if (allocatable != resource.allocatable) {
          unitProblems.push_back(
              InputProblem{"GPUNode", "", gpuNode.nodeName,
                           "status.devices[" + std::to_string(i) + "].resources[" +
                               std::to_string(j) + "].allocatable",
                           std::to_string(resource.allocatable) + " is out of range; read as " +
                               std::to_string(allocatable)});
        }
        int64_t& served = units[At(node->second, r->second)];
        served = api::AddUnits(served, allocatable);
      }
    }
  }
  CountSliceUnits();
}

void Model::Index::CountSliceUnits() {
  auto counted = std::make_shared<SliceUnits>();
  sliceUnits = counted;
  draPresumed.clear();
  bool anyDra = false;
  for (const ClassInfo& info : classes) anyDra = anyDra || info.gpuClass->IsDra();
  if (!anyDra) return;
  // A node with a GPUNode whose slice is not there, or every such node while no slice can be
  // read: its dra units are not known now (PresumeDraUnits), which is not "none".
  draPresumed = hasGpuNode;
  if (!snapshot.draUnknown.empty()) return;
  for (const ResourceSlice& slice : snapshot.resourceSlices) {
    const auto node = nodeIds.find(slice.nodeName);
    if (slice.driver == api::kDraDriver && slice.pool == slice.nodeName && node != nodeIds.end()) {
      draPresumed[node->second] = 0;
    }
  }
  if (snapshot.resourceSlices.empty()) return;
  // Each node's GPU functions a device plugin advertises, with their resources the classes sell.
  std::unordered_map<std::string_view, const api::GpuNodeInventory*> gpuNodeOf;
  for (const api::GpuNodeInventory& gpuNode : snapshot.gpuNodes) {
    gpuNodeOf.emplace(gpuNode.nodeName, &gpuNode);
  }
  for (const ResourceSlice& slice : snapshot.resourceSlices) {
    const auto node = nodeIds.find(slice.nodeName);
    const auto gpuNode = gpuNodeOf.find(slice.nodeName);
    // Another driver's, another node's pool, a node gone, or one without a GPUNode (whose
    // functions nobody can tell apart from a device plugin's): no units.
    if (slice.driver != api::kDraDriver || slice.pool != slice.nodeName || node == nodeIds.end() ||
        gpuNode == gpuNodeOf.end()) {
      continue;
    }
    for (const SliceDevice& device : slice.devices) {
      const auto function = std::find_if(
          gpuNode->second->devices.begin(), gpuNode->second->devices.end(),
          [&](const api::InventoryDevice& d) { return d.pciAddress == device.pciAddress; });
      if (device.pciAddress.empty() || function == gpuNode->second->devices.end()) continue;
      SliceUnit unit{node->second, {}};
      if (function->resources.empty()) {
        // No device plugin advertises the function: a unit of the dra classes of its PCI ID.
        const auto r = resourceIds.find(api::DraUnitsName(device.vendorId + ":" + device.deviceId));
        if (r == resourceIds.end()) continue;
        unit.resources.push_back(r->second);
        int64_t& served = units[At(node->second, r->second)];
        served = api::AddUnits(served, 1);
      } else {
        // A device plugin advertises it too: its units are counted there, once; a claim of it
        // holds one of them.
        for (const api::InventoryResource& resource : function->resources) {
          if (const auto r = resourceIds.find(resource.name); r != resourceIds.end()) {
            unit.resources.push_back(r->second);
          }
        }
      }
      counted->emplace(slice.pool + "/" + device.name, std::move(unit));
    }
  }
}

void Model::Index::CountClaims() {
  if (sliceUnits->empty()) return;
  // The nodes of the Bound devices of dra classes ("namespace/name"), made on first use: the
  // reconciler's claim of such a device holds what the device already counts there.
  std::unordered_map<std::string, size_t> boundDra;
  bool indexed = false;
  auto coveredOn = [&](const ResourceClaim& claim) -> size_t {
    if (!indexed) {
      indexed = true;
      for (size_t d = 0; d < placedOn.size(); ++d) {
        if (IsNode(placedOn[d]) && deviceClass[d] != kNone &&
            classes[deviceClass[d]].gpuClass->IsDra()) {
          boundDra.emplace(Device(d).metadata.namespaceName + "/" + Device(d).metadata.name,
                           placedOn[d]);
        }
      }
    }
    const auto device = boundDra.find(claim.namespaceName + "/" + claim.forDevice);
    return device == boundDra.end() ? kNone : device->second;
  };
  for (const ResourceClaim& claim : snapshot.resourceClaims) {
    const size_t covered = claim.forDevice.empty() ? kNone : coveredOn(claim);
    for (const ClaimDevice& device : claim.devices) {
      const auto unit = sliceUnits->find(device.pool + "/" + device.device);
      if (unit == sliceUnits->end() || unit->second.node == covered) continue;
      for (const size_t r : unit->second.resources) {
        int64_t& held = raw[At(unit->second.node, r)];
        held = api::AddUnits(held, 1);
      }
    }
  }
}

void Model::Index::PresumeDraUnits() {
  unitsPresumed = false;
  if (std::find(draPresumed.begin(), draPresumed.end(), 1) == draPresumed.end()) return;
  std::vector<size_t> draResources;
  for (const ClassInfo& info : classes) {
    if (info.gpuClass->IsDra()) draResources.push_back(info.resource);
  }
  for (size_t n = 0; n < draPresumed.size(); ++n) {
    if (!draPresumed[n]) continue;
    for (const size_t r : draResources) {
      const size_t at = At(n, r);
      if (bound[at] > units[at]) {
        units[at] = bound[at];
        unitsPresumed = true;
      }
    }
  }
}

// A placement on a node no Node has, numbered only once every device is read (CountDevices),
// in device order, so a device's numbers do not depend on which devices were read before it.
constexpr size_t kGoneNode = kNone - 1;

void Model::Index::ReadDevices(const Index* previous) {
  const size_t count = snapshot.devices.size();
  deviceClass.assign(count, kNone);
  nsOf.assign(count, kNone);
  placedOn.assign(count, kNone);
  phase.assign(count, api::DevicePhase::kPending);
  ordered.assign(count, 0);
  attachedVmi.assign(count, kNone);
  attached.assign(count, 0);
  requestWaits.assign(count, 0);
  vmis.reserve(snapshot.vmis.size());
  vmiIndex.reserve(snapshot.vmis.size());
  for (size_t v = 0; v < snapshot.vmis.size(); ++v) {
    const VirtualMachineInstance& vmi = snapshot.vmis[v];
    vmis[{vmi.namespaceName, vmi.name}] = v;
    vmiIndex.emplace(&vmi, v);
  }
  if (previous == nullptr) {
    for (size_t d = 0; d < count; ++d) ReadDevice(d);
    return;
  }
  // The namespaces keep their numbers, so a copied device's still holds. A namespace left
  // with nothing in it keeps a number that nothing counts under (UsageTable::Touched).
  nsIds = previous->nsIds;
  nsNames.assign(nsIds.size(), nullptr);
  for (const auto& [name, id] : nsIds) nsNames[id] = &name;
  // The VMIs' numbers hold when the VMIs are the very same objects; otherwise the attachment of
  // a copied device is looked up again.
  const bool sameVmis = snapshot.vmis.SameElements(previous->snapshot.vmis);
  // Both lists are in the cache's key order ("namespace/name"): a walk of the two meets each
  // device that is in both. Any order is correct (only the very same object is copied); an
  // order other than the cache's only reads more devices afresh.
  const auto& current = snapshot.devices.Items();
  const auto& before = previous->snapshot.devices.Items();
  auto keyLess = [](const api::GpuDevice& a, const api::GpuDevice& b) {
    const std::string_view an = a.metadata.namespaceName, bn = b.metadata.namespaceName;
    const size_t common = std::min(an.size(), bn.size());
    if (const int c = an.substr(0, common).compare(bn.substr(0, common)); c != 0) return c < 0;
    if (an.size() != bn.size()) {  // one namespace is a prefix of the other: '/' decides
      return an.size() < bn.size() ? '/' < bn[common] : an[common] < '/';
    }
    return a.metadata.name < b.metadata.name;
  };
  size_t j = 0;
  for (size_t d = 0; d < count; ++d) {
    while (j < before.size() && before[j] != current[d] && keyLess(*before[j], *current[d])) ++j;
    if (j >= before.size() || before[j] != current[d]) {
      ReadDevice(d);
      if (j < before.size() && !keyLess(*current[d], *before[j])) ++j;  // the same key, changed
      continue;
    }
    deviceClass[d] = previous->deviceClass[j];
    nsOf[d] = previous->nsOf[j];
    const size_t placed = previous->placedOn[j];
    placedOn[d] = placed == kNone || previous->IsNode(placed) ? placed : kGoneNode;
    phase[d] = previous->phase[j];
    ordered[d] = previous->ordered[j];
    attached[d] = previous->attached[j];
    requestWaits[d] = previous->requestWaits[j];
    // The device object is reached only where it has an attachment to look up.
    if (attached[d]) {
      attachedVmi[d] = sameVmis ? previous->attachedVmi[j] : AttachedVmiOf(*current[d]);
    }
    ++j;
  }
}

void Model::Index::ReadDevice(size_t d) {
  ++devicesRead;
  const api::GpuDevice& device = snapshot.devices[d];
  phase[d] = device.Phase();
  ordered[d] = api::ClampUnits(device.spec.count);
  if (phase[d] == api::DevicePhase::kBound && device.status.nodeName &&
      !device.status.nodeName->empty()) {
    const auto n = nodeIds.find(*device.status.nodeName);
    placedOn[d] = n != nodeIds.end() ? n->second : kGoneNode;
  }
  requestWaits[d] = device.RequestPending() ? 1 : 0;
  nsOf[d] = NamespaceId(device.metadata.namespaceName);
  attached[d] = device.status.attachment ? 1 : 0;
  attachedVmi[d] = AttachedVmiOf(device);
  if (const auto c = classIds.find(device.spec.className); c != classIds.end()) {
    deviceClass[d] = c->second;
  }
}

size_t Model::Index::AttachedVmiOf(const api::GpuDevice& device) const {
  if (!device.status.attachment) return kNone;
  const api::Attachment& attachment = *device.status.attachment;
  const auto vmi = vmis.find({device.metadata.namespaceName, attachment.vmiName});
  if (vmi == vmis.end() ||
      (!attachment.vmiUid.empty() && attachment.vmiUid != snapshot.vmis[vmi->second].uid)) {
    return kNone;
  }
  return vmi->second;
}

void Model::Index::CountDevices(UsageTable& ownUsage, UsageTable& ownPending) {
  std::unordered_map<std::string_view, size_t> goneIds;
  for (size_t d = 0; d < placedOn.size(); ++d) {
    if (placedOn[d] == kGoneNode) {
      const std::string_view nodeName = *Device(d).status.nodeName;
      const auto [gone, added] = goneIds.try_emplace(nodeName, nodes.size() + goneNodes.size());
      if (added) {
        goneNodes.push_back(nodeName);
      }
      placedOn[d] = gone->second;
    }
    ownUsage.Add(nsOf[d], ordered[d]);
    const bool pending = phase[d] == api::DevicePhase::kPending;
    if (pending) {
      ownPending.Add(nsOf[d], ordered[d]);
    }
    if (deviceClass[d] == kNone) {
      continue;
    }
    const size_t resource = classes[deviceClass[d]].resource;
    ownUsage.AddClass(nsOf[d], deviceClass[d], resource, ordered[d]);
    if (pending) {
      ownPending.AddClass(nsOf[d], deviceClass[d], resource, ordered[d]);
    }
    if (placedOn[d] != kNone && IsNode(placedOn[d])) {
      int64_t& held = bound[At(placedOn[d], resource)];
      held = api::AddUnits(held, ordered[d]);
    }
  }
}

// Each VMI's attached devices as ranges of one array (Index::AttachedTo).
void Model::Index::GroupVmiDevices() {
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
}

void Model::Index::CountPods(UsageTable& ownUsage) {
  // Pods: what no attached device covers is raw-name usage, for budgets (every pod still
  // holding devices) and for the node it runs on.
  const std::set<std::string> resourceNames(resources.begin(), resources.end());
  std::vector<int64_t> budgetCovered, capacityCovered;  // by resource, reused for every pod
  podProblems.clear();
  launching.assign(snapshot.vmis.size(), 0);
  std::vector<std::string_view> chain;
  for (const Pod& pod : snapshot.pods) {
    if (!PodHoldsDevices(pod)) {
      continue;
    }
    // A request out of range or unreadable is read as api::kMaxUnits: the pod holds everything
    // it could on its own node and in its own tenant chain, and nothing anywhere else.
    const size_t problemsBefore = podProblems.size();
    const std::map<std::string, int64_t> requests =
        PodResourceRequests(pod, resourceNames, &podProblems);
    if (podProblems.size() != problemsBefore) {
      tenants.BudgetChain(pod.namespaceName, chain);
      for (const std::string_view member : chain) {
        problemIn.try_emplace(member, podProblems[problemsBefore].Describe());
      }
    }
    if (requests.empty()) {
      continue;
    }
    const VirtualMachineInstance* launcherOf = launchers.LauncherOf(pod);
    const auto node = nodeIds.find(pod.nodeName);
    budgetCovered.assign(resources.size(), 0);
    capacityCovered.assign(resources.size(), 0);
    if (launcherOf) {
      launching[vmiIndex.at(launcherOf)] = 1;
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
        int64_t& held = raw[At(node->second, r)];
        held = api::AddUnits(held, std::max<int64_t>(0, requested - capacityCovered[r]));
      }
    }
  }
}

void Model::Index::SumUsage(const UsageTable& ownUsage, const UsageTable& ownPending) {
  // A budget caps the declaring tenant's whole subtree: add each namespace's own usage to
  // itself and to every ancestor.
  std::vector<std::string_view> chain;
  for (size_t id = 0; id < ownUsage.Rows(); ++id) {
    if (!ownUsage.Touched(id)) {
      continue;  // a namespace kept from an earlier index that holds nothing now
    }
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
}

}  // namespace cozy::model
