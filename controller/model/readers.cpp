#include "controller/model/readers.h"

#include <algorithm>
#include <array>
#include <cstdio>

#include "api/json_field.h"
#include "api/keys.h"
#include "api/quantity.h"
#include "api/validation.h"

namespace cozy::model {

std::string InputProblem::Describe() const {
  return kind + " " + (namespaceName.empty() ? name : namespaceName + "/" + name) + ": " + field +
         ": " + problem;
}

std::string ReadAsCeiling(std::string_view text, const api::QuantityResult& parsed,
                          std::string_view beyond) {
  const std::string why =
      parsed.value ? "\"" + std::string(text) + "\" is past " + std::to_string(api::kMaxUnits)
                   : parsed.error;
  return why + "; read as " + std::to_string(api::kMaxUnits) + " units, " +
         (parsed.value || parsed.tooLarge ? "more than any " + std::string(beyond) + " has"
                                          : std::string("as if it held everything it could"));
}

// ---- tenants ----

TenantTree::TenantTree(const std::vector<Namespace>& namespaces) {
  std::set<std::string> tenants;
  for (const Namespace& ns : namespaces) {
    std::vector<std::string> ancestors;
    for (const auto& [key, value] : ns.labels) {
      if (key.starts_with(api::kTenantLabelPrefix)) {
        std::string ancestor = key.substr(api::kTenantLabelPrefix.size());
        if (!ancestor.empty() && ancestor != ns.name) {
          ancestors.push_back(ancestor);
        }
        tenants.insert(ns.name);
      }
    }
    for (const std::string& ancestor : ancestors) {
      tenants.insert(ancestor);
    }
    ancestors_[ns.name] = std::move(ancestors);
  }
  // Nearest first: an ancestor with more ancestors of its own sits deeper, nearer the tenant.
  // One missing from the snapshot sorts as the root.
  auto depth = [this](const std::string& name) -> size_t {
    const auto it = ancestors_.find(name);
    return it == ancestors_.end() ? 0 : it->second.size();
  };
  std::map<std::string, size_t> depths;
  for (const auto& [name, ancestors] : ancestors_) {
    depths[name] = depth(name);
  }
  for (auto& [name, ancestors] : ancestors_) {
    std::sort(ancestors.begin(), ancestors.end(),
              [&depths](const std::string& a, const std::string& b) {
                const size_t depthA = depths.contains(a) ? depths.at(a) : 0;
                const size_t depthB = depths.contains(b) ? depths.at(b) : 0;
                return depthA != depthB ? depthA > depthB : a < b;
              });
  }
  tenants_.assign(tenants.begin(), tenants.end());
}

bool TenantTree::IsTenant(std::string_view name) const {
  return std::binary_search(tenants_.begin(), tenants_.end(), name);
}

void TenantTree::BudgetChain(std::string_view name, std::vector<std::string_view>& chain) const {
  chain.clear();
  chain.push_back(name);
  if (const auto it = ancestors_.find(name); it != ancestors_.end()) {
    chain.insert(chain.end(), it->second.begin(), it->second.end());
  }
}

// ---- pods ----

namespace {

using Units = std::map<std::string, int64_t>;

// `field()` names where the text stands, made only for the error: every pod change the
// controller reads passes here, and a path string per quantity was most of this reader's work.
// A quantity past api::kMaxUnits, or one that does not read, is api::kMaxUnits, and a problem.
template <typename Field>
int64_t ReadUnits(const Pod& pod, const Field& field, const std::string& text,
                  std::vector<InputProblem>* problems) {
  const api::QuantityResult parsed = api::ParseWholeQuantity(text);
  if (parsed.value && *parsed.value <= api::kMaxUnits) {
    return *parsed.value;
  }
  if (problems != nullptr) {
    problems->push_back(InputProblem{"Pod", pod.namespaceName, pod.name, field(),
                                     ReadAsCeiling(text, parsed, "node")});
  }
  return api::kMaxUnits;
}

// `path()`: where the container stands ("spec.containers[0]"), for an error only.
template <typename Path>
Units ContainerRequests(const Pod& pod, const Container& container, const Path& path,
                        const std::set<std::string>& names, std::vector<InputProblem>* problems) {
  Units units;
  for (const std::string& name : names) {
    if (const auto it = container.requests.find(name); it != container.requests.end()) {
      units[name] = ReadUnits(
          pod, [&] { return api::JoinPath(path() + ".resources.requests", name); }, it->second,
          problems);
    } else if (const auto limit = container.limits.find(name); limit != container.limits.end()) {
      units[name] = ReadUnits(
          pod, [&] { return api::JoinPath(path() + ".resources.limits", name); }, limit->second,
          problems);
    }
  }
  return units;
}

void Add(Units& into, const Units& from) {
  for (const auto& [name, value] : from) {
    int64_t& sum = into[name];  // one lookup: this runs for every container of every pod
    sum = api::AddUnits(sum, value);
  }
}

void Max(Units& into, const Units& from) {
  for (const auto& [name, value] : from) {
    into[name] = std::max(into[name], value);
  }
}

}  // namespace

std::map<std::string, int64_t> PodResourceRequests(const Pod& pod,
                                                   const std::set<std::string>& resourceNames,
                                                   std::vector<InputProblem>* problems) {
  Units requests;
  for (size_t i = 0; i < pod.containers.size(); ++i) {
    Add(requests,
        ContainerRequests(
            pod, pod.containers[i], [i] { return "spec.containers[" + std::to_string(i) + "]"; },
            resourceNames, problems));
  }
  // Init containers run one at a time, each next to the sidecars started before it; sidecars
  // then keep running next to the app containers.
  Units sidecars;
  Units initPeak;
  for (size_t i = 0; i < pod.initContainers.size(); ++i) {
    const Container& container = pod.initContainers[i];
    Units own = ContainerRequests(
        pod, container, [i] { return "spec.initContainers[" + std::to_string(i) + "]"; },
        resourceNames, problems);
    if (container.restartAlways) {
      Add(requests, own);
      Add(sidecars, own);
      Max(initPeak, sidecars);
    } else {
      Add(own, sidecars);
      Max(initPeak, own);
    }
  }
  Max(requests, initPeak);
  for (const auto& [name, text] : pod.overhead) {
    if (resourceNames.contains(name)) {
      requests[name] = api::AddUnits(
          requests[name], ReadUnits(
                              pod, [&name = name] { return api::JoinPath("spec.overhead", name); },
                              text, problems));
    }
  }
  std::erase_if(requests, [](const auto& entry) { return entry.second == 0; });
  for (auto& [name, units] : requests) {
    units = api::ClampUnits(units);
  }
  return requests;
}

bool PodHoldsDevices(const Pod& pod) { return pod.phase != "Succeeded" && pod.phase != "Failed"; }

bool PodAsksForExtendedResources(const Pod& pod) {
  const auto extended = [](const ResourceList& list) {
    return std::any_of(list.begin(), list.end(), [](const auto& entry) {
      return entry.first.find('/') != std::string::npos;
    });
  };
  const auto asks = [&](const std::vector<Container>& containers) {
    return std::any_of(containers.begin(), containers.end(), [&](const Container& container) {
      return extended(container.requests) || extended(container.limits);
    });
  };
  return asks(pod.containers) || asks(pod.initContainers) || extended(pod.overhead);
}

bool PodKeyIsExtendedResource(const std::vector<std::string>& path, const std::string& key) {
  if (key.find('/') == std::string::npos || path.empty() || path[0] != "spec") return false;
  if (path.size() == 2) return path[1] == "overhead";
  return path.size() == 5 && (path[1] == "containers" || path[1] == "initContainers") &&
         path[2] == "[]" && path[3] == "resources" &&
         (path[4] == "requests" || path[4] == "limits");
}

bool PodChangeMatters(const Pod* before, const Pod* after) {
  if (before != nullptr && after != nullptr && *before == *after) return false;
  return (before != nullptr && PodAsksForExtendedResources(*before)) ||
         (after != nullptr && PodAsksForExtendedResources(*after));
}

size_t NameKeyHash::operator()(const NameKey& key) const {
  const size_t first = std::hash<std::string_view>{}(key.first);
  return first ^ (std::hash<std::string_view>{}(key.second) + 0x9e3779b97f4a7c15ULL + (first << 6) +
                  (first >> 2));
}

LauncherIndex::LauncherIndex(const SharedVector<VirtualMachineInstance>& vmis) {
  size_t uids = 0;
  for (const VirtualMachineInstance& vmi : vmis) {
    uids += vmi.activePodUids.size();
  }
  byPod_.reserve(uids);
  for (const VirtualMachineInstance& vmi : vmis) {
    for (const std::string& uid : vmi.activePodUids) {
      byPod_[{vmi.namespaceName, uid}] = &vmi;
    }
  }
}

const VirtualMachineInstance* LauncherIndex::LauncherOf(const Pod& pod) const {
  if (pod.uid.empty()) {
    return nullptr;
  }
  const auto it = byPod_.find({pod.namespaceName, pod.uid});
  return it == byPod_.end() ? nullptr : it->second;
}

std::map<std::string, int64_t> PodRawUsage(
    const Pod& pod, const std::set<std::string>& resourceNames,
    const VirtualMachineInstance* launches,
    std::span<const std::shared_ptr<const api::GpuDevice>> devices,
    std::span<const std::shared_ptr<const api::GpuClass>> classes) {
  std::map<std::string, int64_t> usage = PodResourceRequests(pod, resourceNames);
  if (launches != nullptr) {
    for (const auto& device : devices) {
      const auto& attachment = device->status.attachment;
      if (!attachment || device->metadata.namespaceName != launches->namespaceName ||
          attachment->vmiName != launches->name ||
          (!attachment->vmiUid.empty() && attachment->vmiUid != launches->uid)) {
        continue;
      }
      for (const auto& gpuClass : classes) {
        if (gpuClass->metadata.name != device->spec.className) continue;
        if (auto held = usage.find(gpuClass->ResourceName()); held != usage.end()) {
          held->second -= std::min(held->second, api::ClampUnits(device->spec.count));
        }
        break;
      }
    }
  }
  std::erase_if(usage, [](const auto& entry) { return entry.second <= 0; });
  return usage;
}

// ---- nodes ----

bool Tolerates(const Toleration& toleration, const Taint& taint) {
  if (!toleration.effect.empty() && toleration.effect != taint.effect) {
    return false;
  }
  if (toleration.op == "Exists") {
    return toleration.key.empty() || toleration.key == taint.key;
  }
  if (toleration.op.empty() || toleration.op == "Equal") {
    return toleration.key == taint.key && toleration.value == taint.value;
  }
  return false;  // Gt, Lt and anything unknown
}

namespace {

// Whether the taint is one the model leaves to the cordon and the Ready condition, or one no
// scheduling decision depends on.
bool IsSchedulingTaint(const Taint& taint) {
  if (taint.effect != "NoSchedule" && taint.effect != "NoExecute") {
    return false;
  }
  return taint.key != api::kTaintUnschedulable && taint.key != api::kTaintNotReady &&
         taint.key != api::kTaintUnreachable;
}

std::string Describe(const Taint& taint) {
  return "taint " + taint.key + (taint.value.empty() ? "" : "=") + taint.value + ":" +
         taint.effect + " not tolerated";
}

bool Tolerated(const Taint& taint, const std::vector<Toleration>& tolerations) {
  return std::any_of(
      tolerations.begin(), tolerations.end(),
      [&taint](const Toleration& toleration) { return Tolerates(toleration, taint); });
}

}  // namespace

std::optional<std::string> UntoleratedTaint(const Node& node,
                                            const std::vector<Toleration>& tolerations) {
  for (const Taint& taint : node.taints) {
    if (IsSchedulingTaint(taint) && !Tolerated(taint, tolerations)) {
      return Describe(taint);
    }
  }
  return std::nullopt;
}

std::string_view ConditionOfTaint(std::string_view key) {
  if (key == api::kTaintMemoryPressure) return "MemoryPressure";
  if (key == api::kTaintDiskPressure) return "DiskPressure";
  if (key == api::kTaintPidPressure) return "PIDPressure";
  if (key == api::kTaintNetworkUnavailable) return "NetworkUnavailable";
  return "";
}

std::optional<UntoleratedTaintInfo> HeldSetTaint(const Node& node,
                                                 const std::vector<Toleration>& tolerations) {
  std::optional<UntoleratedTaintInfo> found;
  for (const Taint& taint : node.taints) {
    if (!IsSchedulingTaint(taint) || Tolerated(taint, tolerations)) {
      continue;
    }
    const std::string_view condition = ConditionOfTaint(taint.key);
    if (condition.empty()) {
      return UntoleratedTaintInfo{Describe(taint), condition};
    }
    if (!found) {
      found = UntoleratedTaintInfo{Describe(taint), condition};
    }
  }
  return found;
}

NodeEligibility CheckNodeEligibility(const Node& node, const std::vector<Toleration>& tolerations) {
  NodeEligibility result;
  result.cordoned = node.unschedulable;
  if (node.unschedulable) {
    result.reasons.emplace_back("cordoned");
  }
  if (!node.ready) {
    result.reasons.emplace_back("not Ready");
  }
  for (const Taint& taint : node.taints) {
    if (IsSchedulingTaint(taint) && !Tolerated(taint, tolerations)) {
      result.reasons.push_back(Describe(taint));
    }
  }
  result.eligible = result.reasons.empty();
  return result;
}

// ---- names ----

namespace {

bool IsNvidiaSelector(std::string_view selector) {
  const std::string_view vendor = selector.substr(0, selector.find(':'));
  if (vendor.size() != 4) {
    return false;
  }
  std::string lower;
  for (char c : vendor) {
    lower += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  }
  return lower == "10de";
}

}  // namespace

std::set<std::string> EffectiveGpuResourceNames(const Settings& settings,
                                                const SharedVector<api::GpuNodeInventory>& gpuNodes,
                                                const PermittedHostDevices& permitted,
                                                const std::vector<api::GpuClass>& classes) {
  std::set<std::string> names(settings.resourceNames.begin(), settings.resourceNames.end());
  for (const api::GpuClass& gpuClass : classes) {
    if (!gpuClass.IsDra()) names.insert(gpuClass.ResourceName());  // a dra class asks for none
  }
  // Every node reports much the same few names: each distinct one is judged once.
  std::set<std::string_view> reported;
  for (const api::GpuNodeInventory& gpuNode : gpuNodes) {
    reported.insert(gpuNode.resourceNames.begin(), gpuNode.resourceNames.end());
  }
  for (const std::string_view name : reported) {
    // B11: what no extended resource name is stays out (the model names it: InputProblem).
    if (api::CheckGpuResourceName(name).empty()) names.emplace(name);
  }
  for (const PciHostDevice& device : permitted.pciHostDevices) {
    if (IsNvidiaSelector(device.pciVendorSelector)) {
      names.insert(device.resourceName);
    }
  }
  for (const MediatedHostDevice& device : permitted.mediatedDevices) {
    names.insert(device.resourceName);
  }
  names.erase("");
  return names;
}

bool IsPermittedHostDevice(const PermittedHostDevices& permitted, std::string_view resourceName) {
  return std::any_of(permitted.pciHostDevices.begin(), permitted.pciHostDevices.end(),
                     [&](const PciHostDevice& d) { return d.resourceName == resourceName; }) ||
         std::any_of(permitted.mediatedDevices.begin(), permitted.mediatedDevices.end(),
                     [&](const MediatedHostDevice& d) { return d.resourceName == resourceName; });
}

std::string TemplateDeviceName(std::string_view vmiName, std::string_view templateName) {
  return api::JoinSubdomain(vmiName, templateName);
}

std::optional<int64_t> ResolveMaxCount(const api::GpuClassSpec& spec) {
  if (spec.maxCount) {
    return spec.maxCount;
  }
  if (spec.mode == api::GpuMode::kVgpu) {
    return 1;
  }
  return std::nullopt;
}

std::string ClassOrderRefusal(const api::GpuClass& gpuClass, const std::optional<int64_t>& maxCount,
                              int64_t count) {
  const std::string& name = gpuClass.metadata.name;
  if (gpuClass.metadata.deletionTimestamp) {
    return "class " + name + " is being deleted and takes no new orders";
  }
  if (maxCount && count > *maxCount) {
    return "class " + name + " allows at most " + std::to_string(*maxCount) +
           (*maxCount == 1 ? " GPU" : " GPUs") + " per order";
  }
  return "";
}

}  // namespace cozy::model
