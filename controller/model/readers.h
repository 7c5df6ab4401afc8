// The model's small pure readers, each one rule of the design notes: tenant ancestry, a pod's
// GPU usage, which pod is a VMI's launcher, node eligibility, the GPU resource-name set,
// template device names and a class's maxCount. The Model composes them; tests hit each alone.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "api/gpuclass.h"
#include "api/gpudevice.h"
#include "api/gpunode_types.h"
#include "api/quantity.h"
#include "controller/model/snapshot.h"

namespace cozy::model {

// An input the model reads the way that fails closed for its own owner alone (docs/controller.md,
// "Inputs out of range"): a quantity past kMaxUnits is read as kMaxUnits, one that does not read
// as a quantity at all as kMaxUnits too (a pod holding everything it could), a budget that does
// not read as refusing every order below it. It is named here so that a hoster sees it (an
// Event, gpu_controller_model_input_problems, `kubectl gpu`), and never stops a decision about
// anyone else.
struct InputProblem {
  std::string kind;           // "Pod", "ResourceQuota", "GPUNode", "Namespace"
  std::string namespaceName;  // "" for a cluster-scoped object
  std::string name;
  std::string field;    // spec.containers[0].resources.requests["nvidia.com/x"]
  std::string problem;  // "\"10E\" is too large; read as 1099511627776 units"
  // "Pod tenant-a/p1: spec.containers[0]...: \"10E\" is too large; read as ..."
  std::string Describe() const;
  bool operator==(const InputProblem&) const = default;
};

// Why a quantity of `text` is read as api::kMaxUnits, for an InputProblem: past it (in range of
// int64 or not: "more than any <beyond> has"), or not a quantity at all ("as if it held
// everything it could").
std::string ReadAsCeiling(std::string_view text, const api::QuantityResult& parsed,
                          std::string_view beyond);

// Tenant ancestry: a tenant namespace's ancestors are the namespaces its
// `tenant.cozystack.io/<ancestor>` labels name.
class TenantTree {
 public:
  explicit TenantTree(const std::vector<Namespace>& namespaces);

  // Every namespace that carries a tenant label or is named by one, sorted.
  const std::vector<std::string>& Tenants() const { return tenants_; }
  bool IsTenant(std::string_view name) const;
  // The namespace, then its ancestors nearest first (parent, ..., root): whose budgets cap an
  // order made in it. Written into a buffer the caller reuses (per order, the pass allocates
  // nothing); the views live as long as the tree and `name`.
  void BudgetChain(std::string_view name, std::vector<std::string_view>& chain) const;

 private:
  std::map<std::string, std::vector<std::string>, std::less<>> ancestors_;  // nearest first
  std::vector<std::string> tenants_;
};

// Units of each listed resource a pod requests, by the scheduler's arithmetic: the larger of
// the app containers plus sidecars (restartable init containers) and the largest init container
// (plus the sidecars started before it), plus the pod overhead. A request defaults to the
// limit, as for extended resources. A quantity it cannot read, or one past api::kMaxUnits, counts
// as api::kMaxUnits (the pod holds everything it could) and is added to `problems` where given;
// each resource's total is at most api::kMaxUnits.
std::map<std::string, int64_t> PodResourceRequests(const Pod& pod,
                                                   const std::set<std::string>& resourceNames,
                                                   std::vector<InputProblem>* problems = nullptr);

// Whether kubelet still holds the pod's devices: every phase but Succeeded and Failed.
bool PodHoldsDevices(const Pod& pod);

// Whether a pod asks for an extended resource (a name with a domain, "nvidia.com/GA100") in a
// container's or init container's requests or limits, or in its overhead. The resources the
// model counts are device plugins' and KubeVirt's, which are all extended resources, so a pod
// that asks for none (cpu and memory only: most of a cluster's pods) never counts in a
// decision, whatever the resource names are set to.
bool PodAsksForExtendedResources(const Pod& pod);
// The same question of a pod's JSON, one key at a time (a kube::SkimWants): whether `key`, at
// `path` under the pod, is an extended resource's name in a container's or init container's
// requests or limits, or in the pod's overhead. A pod with no such key is one
// PodAsksForExtendedResources says no to; the watch of pods then builds no document of it.
bool PodKeyIsExtendedResource(const std::vector<std::string>& path, const std::string& key);
// The pod cache's change filter (kube::Cache::SetChangeFilter; docs/controller.md, "Who wakes for a
// change"): a pod's change can change a decision only when it asks for an extended resource, before
// or after, and the model reads something different in it. A status heartbeat, or a pod of cpu and
// memory starting and ending, wakes no pass.
bool PodChangeMatters(const Pod* before, const Pod* after);

// (namespace, name), viewing strings that outlive the map it keys, and its hash.
using NameKey = std::pair<std::string_view, std::string_view>;
struct NameKeyHash {
  size_t operator()(const NameKey& key) const;
};

// A pod is a VMI's launcher only when that VMI lists the pod's UID in status.activePods;
// owner references and labels are written by whoever creates the pod and prove nothing.
class LauncherIndex {
 public:
  // Views the VMIs' strings: `vmis` must outlive the index.
  explicit LauncherIndex(const SharedVector<VirtualMachineInstance>& vmis);
  // A temporary list (a std::vector converted on the way in, say) would leave it dangling.
  explicit LauncherIndex(SharedVector<VirtualMachineInstance>&& vmis) = delete;
  // The VMI the pod launches, or nullptr: the pod's GPUs are then raw-name usage.
  const VirtualMachineInstance* LauncherOf(const Pod& pod) const;

 private:
  std::unordered_map<NameKey, const VirtualMachineInstance*, NameKeyHash> byPod_;  // (ns, pod UID)
};

// What a pod holds as raw-name usage for budgets and usage records (C11, C14): its requests of
// `resourceNames` (PodResourceRequests), less, when it is `launches`' launcher (LauncherIndex
// said so), the units of every device attached to that VMI (a Lost one too), each under its
// class's resource name. A device is attached to the VMI when its attachment names the VMI in its
// namespace, and its UID where it names one. Resources left at 0 are left out. The model counts
// the same in its tenants' raw-name usage (Model::Index::CountPods).
std::map<std::string, int64_t> PodRawUsage(
    const Pod& pod, const std::set<std::string>& resourceNames,
    const VirtualMachineInstance* launches,
    std::span<const std::shared_ptr<const api::GpuDevice>> devices,
    std::span<const std::shared_ptr<const api::GpuClass>> classes);

// Gt and Lt tolerations tolerate nothing: the scheduler ignores them where their feature gate
// is off.
bool Tolerates(const Toleration& toleration, const Taint& taint);

struct NodeEligibility {
  bool eligible = false;
  bool cordoned = false;             // spec.unschedulable, never a taint
  std::vector<std::string> reasons;  // why not eligible, for people
};

// A node takes binds only when it is schedulable, Ready and carries no NoSchedule or NoExecute
// taint the tolerations do not tolerate. The unschedulable, not-ready and unreachable taints
// are left to the first two checks, so a stale taint neither blocks nor counts as a cordon.
NodeEligibility CheckNodeEligibility(const Node& node, const std::vector<Toleration>& tolerations);

// The taint check of CheckNodeEligibility alone: the first NoSchedule or NoExecute taint the
// tolerations do not tolerate, described for people, or nullopt.
std::optional<std::string> UntoleratedTaint(const Node& node,
                                            const std::vector<Toleration>& tolerations);

// The node condition behind a taint kube-controller-manager writes from it (memory, disk and
// PID pressure, network unavailable), or "" for any other taint.
std::string_view ConditionOfTaint(std::string_view key);

// A held set's view of a node's untolerated taints (docs/controller.md, "Placement", step 2): the
// first one that does not come from a node condition, or else the first that does, described for
// people, with that condition's type (empty for the former). Nullopt when every taint is tolerated.
struct UntoleratedTaintInfo {
  std::string description;
  std::string_view condition;
};
std::optional<UntoleratedTaintInfo> HeldSetTaint(const Node& node,
                                                 const std::vector<Toleration>& tolerations);

// The effective GPU resource-name set: the hoster's list, every GPUNode's resourceNames, every
// class's resource name, and the NVIDIA (vendor 10de) and mediated entries of KubeVirt's
// permittedHostDevices. A PCI entry of another vendor, such as a ConnectX VF, stays out, and so
// does a GPUNode's name that is no extended resource name (B11: "cpu" from one node's agent).
std::set<std::string> EffectiveGpuResourceNames(const Settings& settings,
                                                const SharedVector<api::GpuNodeInventory>& gpuNodes,
                                                const PermittedHostDevices& permitted,
                                                const std::vector<api::GpuClass>& classes);

// Whether KubeVirt permits the resource name at all: every PCI and mediated entry counts here,
// whatever its vendor.
bool IsPermittedHostDevice(const PermittedHostDevices& permitted, std::string_view resourceName);

// The name of the device a VMI's deviceTemplate creates: "<vmi>-<template>", or, when that
// leaves the 253 characters of a DNS subdomain, its prefix and a hash of both names. Stable and
// distinct per (VMI, template).
std::string TemplateDeviceName(std::string_view vmiName, std::string_view templateName);

// maxCount as a reader must apply it: the class's own, else 1 for vgpu and no limit
// (nullopt) for passthrough. The CRD carries no default because it depends on the mode.
std::optional<int64_t> ResolveMaxCount(const api::GpuClassSpec& spec);

// The rules a class sets an order of `count` GPUs before any room or budget, said once for the
// order webhook (E1) and the binder (D9): a class being deleted takes no new orders, and an order
// over the class's resolved maxCount is refused. "" when the order meets both; else why, naming
// the class ("class a100 allows at most 2 GPUs per order"), for the caller to put after its own
// naming of the order.
std::string ClassOrderRefusal(const api::GpuClass& gpuClass, const std::optional<int64_t>& maxCount,
                              int64_t count);

}  // namespace cozy::model
