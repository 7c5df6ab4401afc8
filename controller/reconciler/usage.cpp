#include <map>
#include <set>
#include <span>

#include "api/keys.h"
#include "api/usage_record.h"
#include "controller/model/readers.h"
#include "controller/reconciler/reconcilers.h"
#include "controller/reconciler/shared.h"

namespace cozy::controller {

using namespace reconciler;

namespace {

// What devices and pods hold: the records to keep or write, and their namespaces.
struct Holdings {
  std::set<std::string> recordsWanted;  // record keys
  std::set<std::string> namespacesHolding;
  void Hold(const std::string& recordKey, const std::string& ns) {
    recordsWanted.insert(recordKey);
    namespacesHolding.insert(ns);
  }
};

Target RecordTarget(std::string ns, std::string name) {
  return InNamespace(api::kWorkloadKind, kWorkloads, std::move(ns), std::move(name));
}

// Writes the record `parts` describe under `key` ("namespace/name") unless the stored one says
// it already; `reason()` is asked only for a write.
template <class Reason>
void PlanRecord(const ReconcileInput& input, const std::string& key,
                const api::UsageRecordParts& parts, controller::Plan& plan, Reason reason) {
  const auto stored = input.records.find(key);
  if (stored != input.records.end() && api::UsageRecordCurrent(*stored->second, parts)) return;
  plan.actions.push_back(ApplyAction(
      "apply-usage-record", RecordTarget(parts.namespaceName, parts.name), api::UsageRecord(parts),
      stored != input.records.end() ? stored->second.get() : nullptr, reason()));
}

// Devices' records (D13, D16, D19): a device that holds units has one, written once its
// namespace's monitor is there; a deleting one keeps its record while a VMI uses it or until
// its units are released.
void PlanDevices(const ReconcileInput& input, controller::Plan& plan, Holdings& holdings) {
  for (const auto& devicePtr : input.devices) {
    const api::GpuDevice& device = *devicePtr;
    const api::ObjectMeta& meta = device.metadata;
    const std::string recordKey = meta.namespaceName + "/" + api::UsageRecordName(meta.name);
    if (meta.deletionTimestamp) {
      if (input.records.count(recordKey) != 0 && DeletingDeviceKeepsRecord(device, input)) {
        holdings.Hold(recordKey, meta.namespaceName);
      }
      continue;
    }
    if (!api::HoldsUsage(device)) continue;
    holdings.Hold(recordKey, meta.namespaceName);
    if (input.monitors.count(meta.namespaceName) == 0) {
      continue;  // the monitor first (PlanUsageObjects); its records in the pass after
    }
    PlanRecord(input, recordKey, api::DeviceUsage(device), plan, [&] {
      return "device " + meta.Key() + " holds " + std::to_string(device.spec.count) + " of class " +
             device.spec.className;
    });
  }
}

// The devices attached to each VMI (namespace, name), gathered once: a launcher's coverage
// reads its own VMI's, never every device of the cluster.
using Attached = std::map<std::pair<std::string_view, std::string_view>,
                          std::vector<std::shared_ptr<const api::GpuDevice>>>;

// One pod's raw-name usage: what it holds that no device covers; nullopt when its claimed VMI
// cannot be told now (its record then stays as it is).
std::optional<std::map<std::string, int64_t>> RawUsage(const ReconcileInput& input,
                                                       const model::Pod& pod,
                                                       const std::set<std::string>& resourceNames,
                                                       const Attached& attached,
                                                       controller::Plan& plan) {
  model::SharedVector<model::VirtualMachineInstance> claimed;
  if (!pod.claimedVmi.empty()) {
    const VmiState vmi = input.vmis(pod.namespaceName, pod.claimedVmi);
    if (vmi.presence == VmiState::Presence::kUnknown) {
      ++plan.waiting.vmisUnknown;
      if (plan.waiting.vmisUnknownWhy.empty()) plan.waiting.vmisUnknownWhy = vmi.why;
      return std::nullopt;
    }
    if (vmi.object) claimed = {*vmi.object};
  }
  const model::LauncherIndex launchers(claimed);
  const model::VirtualMachineInstance* launches = launchers.LauncherOf(pod);
  std::span<const std::shared_ptr<const api::GpuDevice>> itsDevices;
  if (launches != nullptr) {
    const auto found = attached.find({launches->namespaceName, launches->name});
    if (found != attached.end()) itsDevices = found->second;
  }
  return model::PodRawUsage(pod, resourceNames, launches, itsDevices, input.classes);
}

// Pods' raw-name usage (C11): a pod on a node, not finished, holding GPUs of a class's resource
// name that no device covers has a record of those units. Whether its GPUs are covered is told
// by the one launcher reader (model::LauncherIndex, C12) over a read of the VMI the pod claims
// by its controller owner reference: only that VMI's status.activePods holding the pod's UID
// makes it the launcher, whose attached devices then cover it (model::PodRawUsage). A claimed
// VMI that cannot be told now leaves the pod's record as it is.
void PlanPods(const ReconcileInput& input, controller::Plan& plan, Holdings& holdings) {
  std::set<std::string> resourceNames;
  for (const auto& gpuClass : input.classes) {
    if (!gpuClass->IsDra()) resourceNames.insert(gpuClass->ResourceName());
  }
  Attached attached;
  for (const auto& device : input.devices) {
    if (device->status.attachment) {
      attached[{device->metadata.namespaceName, device->status.attachment->vmiName}].push_back(
          device);
    }
  }
  for (const auto& podPtr : input.pods) {
    const model::Pod& pod = *podPtr;
    if (pod.nodeName.empty() || !model::PodHoldsDevices(pod)) continue;
    const std::string recordKey = pod.namespaceName + "/" + api::PodUsageRecordName(pod.name);
    const auto usage = RawUsage(input, pod, resourceNames, attached, plan);
    if (!usage) {
      if (input.records.count(recordKey) != 0) holdings.Hold(recordKey, pod.namespaceName);
      continue;
    }
    if (usage->empty()) continue;
    holdings.Hold(recordKey, pod.namespaceName);
    if (input.monitors.count(pod.namespaceName) == 0) {
      continue;  // the monitor first (PlanUsageObjects); its records in the pass after
    }
    PlanRecord(input, recordKey,
               api::PodUsage(pod.namespaceName, pod.name, pod.uid, *usage, pod.phase == "Running"),
               plan, [&] {
                 std::string what;
                 for (const auto& [name, units] : *usage) {
                   what += (what.empty() ? "" : ", ") + std::to_string(units) + " " + name;
                 }
                 return "pod " + pod.namespaceName + "/" + pod.name + " holds " + what +
                        " that no device covers";
               });
  }
}

// What the pods' step leaves alone when it cannot run: every stored record of a pod stays.
void KeepPodRecords(const ReconcileInput& input, Holdings& holdings) {
  for (const auto& [key, record] : input.records) {
    if (api::UsageRecordOwner(*record).starts_with("Pod ")) {
      holdings.Hold(key, record->at("metadata").value("namespace", std::string()));
    }
  }
}

// Usage records and their namespaces' monitors: written for what devices and pods hold, deleted
// once nothing does (a monitor after its namespace's last record).
void PlanUsageObjects(const ReconcileInput& input, controller::Plan& plan,
                      const Holdings& holdings) {
  for (const std::string& ns : holdings.namespacesHolding) {
    const nlohmann::json desired = api::UsageMonitor(ns);
    auto stored = input.monitors.find(ns);
    if (stored != input.monitors.end() && api::UsageObjectCurrent(*stored->second, desired)) {
      continue;
    }
    plan.actions.push_back(
        ApplyAction("apply-usage-monitor",
                    InNamespace(api::kWorkloadMonitorKind, kWorkloadMonitors, ns,
                                std::string(api::kUsageMonitorName)),
                    desired, stored != input.monitors.end() ? stored->second.get() : nullptr,
                    "namespace " + ns + " holds devices"));
  }
  std::set<std::string> namespacesWithRecords;
  for (const auto& [key, recordPtr] : input.records) {
    const nlohmann::json& metadata = recordPtr->at("metadata");
    const std::string ns = metadata.value("namespace", std::string());
    // A monitor goes only once its namespace has no records left (the pass after).
    namespacesWithRecords.insert(ns);
    if (holdings.recordsWanted.count(key) != 0) continue;
    plan.actions.push_back(DeleteAction(
        "delete-usage-record", RecordTarget(ns, metadata.value("name", std::string())), *recordPtr,
        "nothing it was written for holds GPUs now (" + api::UsageRecordOwner(*recordPtr) + ")"));
  }
  for (const auto& [ns, monitorPtr] : input.monitors) {
    if (holdings.namespacesHolding.count(ns) != 0 || namespacesWithRecords.count(ns) != 0) {
      continue;
    }
    plan.actions.push_back(
        DeleteAction("delete-usage-monitor",
                     InNamespace(api::kWorkloadMonitorKind, kWorkloadMonitors, ns,
                                 monitorPtr->at("metadata").value("name", std::string())),
                     *monitorPtr, "namespace " + ns + " holds no devices"));
  }
}

}  // namespace

controller::Plan UsageRecords::Plan(const ReconcileInput& input) const {
  controller::Plan plan;
  Holdings holdings;
  PlanDevices(input, plan, holdings);
  if (input.podRecords) {
    PlanPods(input, plan, holdings);
  } else {
    KeepPodRecords(input, holdings);
  }
  PlanUsageObjects(input, plan, holdings);
  return plan;
}

}  // namespace cozy::controller
