#include "controller/reconciler/plan.h"

#include <algorithm>
#include <map>
#include <set>
#include <span>
#include <stdexcept>

#include "api/keys.h"
#include "api/time.h"
#include "api/usage_record.h"
#include "controller/model/readers.h"

namespace cozy::controller {
namespace {

using Clock = std::chrono::system_clock;

bool HasFinalizer(const api::ObjectMeta& meta, std::string_view finalizer) {
  return std::find(meta.finalizers.begin(), meta.finalizers.end(), finalizer) !=
         meta.finalizers.end();
}

// The merge patch that sets metadata.finalizers to the list with `finalizer` added or removed.
// A merge patch replaces a list whole, so the action carries the resourceVersion it was read
// at: a finalizer someone added since is never dropped (the write conflicts instead).
nlohmann::json FinalizersPatch(const api::ObjectMeta& meta, std::string_view finalizer, bool add) {
  nlohmann::json list = nlohmann::json::array();
  for (const std::string& item : meta.finalizers) {
    if (item != finalizer) {
      list.push_back(item);
    }
  }
  if (add) {
    list.push_back(finalizer);
  }
  return {{"metadata", {{"finalizers", list}}}};
}

Action ObjectAction(ActionKind kind, const api::ObjectMeta& meta, nlohmann::json body,
                    std::string reason) {
  return Action{kind,     meta.namespaceName, meta.name,    meta.resourceVersion,
                meta.uid, std::move(body),    std::nullopt, std::move(reason)};
}

Clock::time_point FloorToSecond(Clock::time_point time) {
  return std::chrono::time_point_cast<std::chrono::seconds>(time) > time
             ? std::chrono::time_point_cast<std::chrono::seconds>(time) - std::chrono::seconds(1)
             : std::chrono::time_point_cast<std::chrono::seconds>(time);
}

bool IsTemplateDevice(const api::GpuDevice& device) {
  auto it = device.metadata.labels.find(std::string(api::kTemplateDeviceLabel));
  return it != device.metadata.labels.end() && it->second == api::kTemplateDeviceLabelValue;
}

// What one device's attachment asks for, and whether a VMI uses (or may use) the device.
struct AttachmentVerdict {
  bool inUse = false;
  std::optional<Action> action;
};

AttachmentVerdict JudgeAttachment(const api::GpuDevice& device, const ReconcileInput& input,
                                  Plan& plan) {
  AttachmentVerdict verdict;
  const api::Attachment& attachment = *device.status.attachment;
  const api::ObjectMeta& meta = device.metadata;
  const bool deleting = meta.deletionTimestamp.has_value();
  const VmiState vmi = input.vmis(meta.namespaceName, attachment.vmiName);
  if (vmi.presence == VmiState::Presence::kUnknown) {
    // G7: a VMI that cannot be told is never read as gone.
    ++plan.waiting.vmisUnknown;
    if (plan.waiting.vmisUnknown == 1) {
      plan.waiting.vmisUnknownWhy = "VMI " + meta.namespaceName + "/" + attachment.vmiName +
                                    (vmi.why.empty() ? std::string() : ": " + vmi.why);
    }
    verdict.inUse = true;
    return verdict;
  }
  const std::string who = "VMI " + meta.namespaceName + "/" + attachment.vmiName;
  auto ended = [&](const std::string& why) {
    if (deleting) {
      return;  // released below; nothing else to change on a device that goes
    }
    if (IsTemplateDevice(device)) {
      verdict.action = ObjectAction(ActionKind::kDeleteTemplateDevice, meta, nullptr,
                                    "template device of " + who + ", which " + why);
    } else {
      verdict.action = ObjectAction(ActionKind::kClearAttachment, meta,
                                    {{"status", {{"attachment", nullptr}}}}, who + " " + why);
    }
  };
  if (!attachment.vmiUid.empty()) {
    if (vmi.presence == VmiState::Presence::kPresent && vmi.uid == attachment.vmiUid) {
      verdict.inUse = true;
    } else {
      ended(vmi.presence == VmiState::Presence::kPresent ? "was replaced by another of its name"
                                                         : "has ended");
    }
    return verdict;
  }
  // Not matched yet: the webhook attached at the VMI's CREATE admission.
  if (attachment.attachedAt.empty()) {
    verdict.inUse = true;
    if (!deleting) {
      verdict.action =
          ObjectAction(ActionKind::kStampAttachment, meta,
                       {{"status", {{"attachment", {{"attachedAt", api::FormatTime(input.now)}}}}}},
                       "attachment to " + who + " has no attachedAt: the grace counts from now");
    }
    return verdict;
  }
  const std::optional<Clock::time_point> attachedAt = api::ParseTime(attachment.attachedAt);
  if (vmi.presence == VmiState::Presence::kPresent && attachedAt) {
    const std::optional<Clock::time_point> created = api::ParseTime(vmi.creationTimestamp);
    // creationTimestamp has whole seconds; a VMI made in the second of the attachment counts.
    if (created && *created >= FloorToSecond(*attachedAt)) {
      verdict.inUse = true;
      if (!deleting) {
        verdict.action =
            ObjectAction(ActionKind::kMatchAttachment, meta,
                         {{"status", {{"attachment", {{"vmiUID", vmi.uid}}}}}}, who + " appeared");
      }
      return verdict;
    }
  }
  const Clock::time_point deadline = (attachedAt ? *attachedAt : input.now) + input.attachmentGrace;
  if (!attachedAt || input.now >= deadline) {
    ended(attachedAt ? "did not appear within the attachment grace"
                     : "has an attachedAt that does not read (" + attachment.attachedAt + ")");
    return verdict;
  }
  ++plan.waiting.attachmentsInGrace;
  verdict.inUse = true;
  if (!plan.wakeAt || deadline < *plan.wakeAt) {
    plan.wakeAt = deadline;
  }
  return verdict;
}

}  // namespace

std::string_view ToString(ActionKind kind) {
  switch (kind) {
    case ActionKind::kAddClassFinalizer:
      return "add-class-finalizer";
    case ActionKind::kRemoveClassFinalizer:
      return "remove-class-finalizer";
    case ActionKind::kAddDeviceFinalizer:
      return "add-device-finalizer";
    case ActionKind::kRemoveDeviceFinalizer:
      return "remove-device-finalizer";
    case ActionKind::kStampAttachment:
      return "stamp-attachment";
    case ActionKind::kMatchAttachment:
      return "match-attachment";
    case ActionKind::kClearAttachment:
      return "clear-attachment";
    case ActionKind::kReleaseDevice:
      return "release-device";
    case ActionKind::kDeleteTemplateDevice:
      return "delete-template-device";
    case ActionKind::kApplyMonitor:
      return "apply-usage-monitor";
    case ActionKind::kDeleteMonitor:
      return "delete-usage-monitor";
    case ActionKind::kApplyRecord:
      return "apply-usage-record";
    case ActionKind::kDeleteRecord:
      return "delete-usage-record";
    case ActionKind::kApplySettings:
      return "apply-settings";
  }
  return "unknown";
}

std::string_view TargetKind(ActionKind kind) {
  switch (kind) {
    case ActionKind::kAddClassFinalizer:
    case ActionKind::kRemoveClassFinalizer:
      return api::kGpuClassKind;
    case ActionKind::kApplyMonitor:
    case ActionKind::kDeleteMonitor:
      return api::kWorkloadMonitorKind;
    case ActionKind::kApplyRecord:
    case ActionKind::kDeleteRecord:
      return api::kWorkloadKind;
    case ActionKind::kApplySettings:
      return "ConfigMap";
    case ActionKind::kAddDeviceFinalizer:
    case ActionKind::kRemoveDeviceFinalizer:
    case ActionKind::kStampAttachment:
    case ActionKind::kMatchAttachment:
    case ActionKind::kClearAttachment:
    case ActionKind::kReleaseDevice:
    case ActionKind::kDeleteTemplateDevice:
      return api::kGpuDeviceKind;
  }
  // Every kind is named above, so -Wswitch names a new one that is not; none reaches here.
  throw std::logic_error("TargetKind: an action kind out of range");
}

std::string Action::Key() const {
  std::string key(TargetKind(kind));
  key += ":";
  if (!namespaceName.empty()) {
    key += namespaceName + "/";
  }
  return key + name;
}

namespace {

// What the device step leaves for the usage objects' step.
struct Holdings {
  std::set<std::string> recordsWanted;  // record keys to keep or write
  std::set<std::string> namespacesHolding;
};

// Writes the record `parts` describe under `key` ("namespace/name") unless the stored one says
// it already; `reason()` is asked only for a write.
template <class Reason>
void PlanRecord(const ReconcileInput& input, const std::string& key,
                const api::UsageRecordParts& parts, Plan& plan, Reason reason) {
  const auto stored = input.records.find(key);
  if (stored != input.records.end() && api::UsageRecordCurrent(*stored->second, parts)) return;
  Action apply{ActionKind::kApplyRecord, parts.namespaceName, parts.name, "", "",
               api::UsageRecord(parts),  std::nullopt,        reason()};
  if (stored != input.records.end()) {
    apply.stored = *stored->second;
    apply.resourceVersion = stored->second->at("metadata").value("resourceVersion", std::string());
  }
  plan.actions.push_back(std::move(apply));
}

void PlanClasses(const ReconcileInput& input, Plan& plan) {
  // Classes (D15): every class carries the protection finalizer; a deleting one loses it
  // when no device names it any more. New orders of it are the policy's to refuse (F5).
  std::set<std::string> classesHeld;
  for (const auto& device : input.devices) {
    classesHeld.insert(device->spec.className);
  }
  for (const auto& gpuClass : input.classes) {
    const api::ObjectMeta& meta = gpuClass->metadata;
    const bool has = HasFinalizer(meta, api::kClassFinalizer);
    if (!meta.deletionTimestamp) {
      if (!has) {
        plan.actions.push_back(ObjectAction(ActionKind::kAddClassFinalizer, meta,
                                            FinalizersPatch(meta, api::kClassFinalizer, true),
                                            "every class is protected while devices hold it"));
      }
    } else if (has) {
      if (classesHeld.count(meta.name) != 0) {
        ++plan.waiting.classesWithHolders;
      } else {
        plan.actions.push_back(ObjectAction(ActionKind::kRemoveClassFinalizer, meta,
                                            FinalizersPatch(meta, api::kClassFinalizer, false),
                                            "deleting and no device holds it"));
      }
    }
  }
}

// Devices: attachments (D14, D18), the finalizer (D13) and which records stay.
void PlanDevices(const ReconcileInput& input, Plan& plan, Holdings& holdings) {
  std::set<std::string>& recordsWanted = holdings.recordsWanted;
  std::set<std::string>& namespacesHolding = holdings.namespacesHolding;
  for (const auto& devicePtr : input.devices) {
    const api::GpuDevice& device = *devicePtr;
    const api::ObjectMeta& meta = device.metadata;
    const bool deleting = meta.deletionTimestamp.has_value();
    AttachmentVerdict verdict;
    if (device.status.attachment && !device.status.attachment->vmiName.empty()) {
      verdict = JudgeAttachment(device, input, plan);
      if (verdict.action) {
        plan.actions.push_back(std::move(*verdict.action));
      }
    }
    const std::string recordKey = meta.namespaceName + "/" + api::UsageRecordName(meta.name);
    const bool recordStored = input.records.count(recordKey) != 0;
    const bool has = HasFinalizer(meta, api::kDeviceFinalizer);
    if (!deleting) {
      if (!has) {
        plan.actions.push_back(ObjectAction(ActionKind::kAddDeviceFinalizer, meta,
                                            FinalizersPatch(meta, api::kDeviceFinalizer, true),
                                            "a held device stays until no VMI uses it"));
      }
      if (api::HoldsUsage(device)) {
        recordsWanted.insert(recordKey);
        namespacesHolding.insert(meta.namespaceName);
        if (!input.usageRecords) {
          continue;
        }
        if (input.monitors.count(meta.namespaceName) == 0) {
          continue;  // the monitor first (planned below); its records in the pass after
        }
        PlanRecord(input, recordKey, api::DeviceUsage(device), plan, [&] {
          return "device " + meta.Key() + " holds " + std::to_string(device.spec.count) +
                 " of class " + device.spec.className;
        });
      }
      continue;
    }
    // Deleting: the device, its binding and its record stay while a VMI uses it (D13).
    if (verdict.inUse) {
      if (has) {
        ++plan.waiting.devicesInUse;
      }
      if (recordStored) {
        recordsWanted.insert(recordKey);
        namespacesHolding.insert(meta.namespaceName);
      }
      continue;
    }
    if (!has) {
      continue;
    }
    // D19: a usage record lives exactly as long as the device holds units. Our finalizer is the
    // last one in the way of the object's end, or another's (a tenant's `example.com/hold`)
    // keeps the device, still Bound and counted as held, after ours is gone: then its units
    // are released first, and its record and our finalizer follow in the passes after.
    const bool othersKeepIt = std::any_of(
        meta.finalizers.begin(), meta.finalizers.end(),
        [](const std::string& finalizer) { return finalizer != api::kDeviceFinalizer; });
    if (othersKeepIt && api::HoldsUsage(device)) {
      if (recordStored) {
        recordsWanted.insert(recordKey);
        namespacesHolding.insert(meta.namespaceName);
      }
      plan.actions.push_back(ObjectAction(
          ActionKind::kReleaseDevice, meta,
          {{"status",
            {{"phase", api::ToString(api::DevicePhase::kPending)}, {"nodeName", nullptr}}}},
          "deleted, no VMI uses it, and another finalizer keeps it: its units are released "
          "before its usage record and finalizer go"));
      continue;
    }
    if (input.usageRecords && recordStored) {
      continue;  // the record goes first (below); the finalizer in the pass after
    }
    plan.actions.push_back(ObjectAction(ActionKind::kRemoveDeviceFinalizer, meta,
                                        FinalizersPatch(meta, api::kDeviceFinalizer, false),
                                        "released and no VMI uses it"));
  }
}

// Pods' raw-name usage (C11): a pod on a node, not finished, holding GPUs of a class's resource
// name that no device covers has a record of those units. Whether its GPUs are covered is told
// by the one launcher reader (model::LauncherIndex, C12) over a read of the VMI the pod claims
// by its controller owner reference: only that VMI's status.activePods holding the pod's UID
// makes it the launcher, whose attached devices then cover it (model::PodRawUsage). A claimed
// VMI that cannot be told now leaves the pod's record as it is.
void PlanPods(const ReconcileInput& input, Plan& plan, Holdings& holdings) {
  std::set<std::string> resourceNames;
  for (const auto& gpuClass : input.classes) resourceNames.insert(gpuClass->ResourceName());
  // The devices attached to each VMI (namespace, name), gathered once: a launcher's coverage
  // reads its own VMI's, never every device of the cluster.
  std::map<std::pair<std::string_view, std::string_view>,
           std::vector<std::shared_ptr<const api::GpuDevice>>>
      attached;
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
    model::SharedVector<model::VirtualMachineInstance> claimed;
    if (!pod.claimedVmi.empty()) {
      const VmiState vmi = input.vmis(pod.namespaceName, pod.claimedVmi);
      if (vmi.presence == VmiState::Presence::kUnknown) {
        ++plan.waiting.vmisUnknown;
        if (plan.waiting.vmisUnknownWhy.empty()) plan.waiting.vmisUnknownWhy = vmi.why;
        if (input.records.count(recordKey) != 0) {
          holdings.recordsWanted.insert(recordKey);
          holdings.namespacesHolding.insert(pod.namespaceName);
        }
        continue;
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
    const std::map<std::string, int64_t> usage =
        model::PodRawUsage(pod, resourceNames, launches, itsDevices, input.classes);
    if (usage.empty()) continue;
    holdings.recordsWanted.insert(recordKey);
    holdings.namespacesHolding.insert(pod.namespaceName);
    if (input.monitors.count(pod.namespaceName) == 0) {
      continue;  // the monitor first (PlanUsageObjects); its records in the pass after
    }
    PlanRecord(input, recordKey,
               api::PodUsage(pod.namespaceName, pod.name, pod.uid, usage, pod.phase == "Running"),
               plan, [&] {
                 std::string what;
                 for (const auto& [name, units] : usage) {
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
      holdings.recordsWanted.insert(key);
      holdings.namespacesHolding.insert(record->at("metadata").value("namespace", std::string()));
    }
  }
}

// Usage records and their namespaces' monitors: written for what devices and pods hold, deleted
// once nothing does (a monitor after its namespace's last record).
void PlanUsageObjects(const ReconcileInput& input, Plan& plan, const Holdings& holdings) {
  const std::set<std::string>& recordsWanted = holdings.recordsWanted;
  const std::set<std::string>& namespacesHolding = holdings.namespacesHolding;
  for (const std::string& ns : namespacesHolding) {
    const nlohmann::json desired = api::UsageMonitor(ns);
    auto stored = input.monitors.find(ns);
    if (stored != input.monitors.end() && api::UsageObjectCurrent(*stored->second, desired)) {
      continue;
    }
    Action apply{ActionKind::kApplyMonitor,
                 ns,
                 std::string(api::kUsageMonitorName),
                 "",
                 "",
                 desired,
                 std::nullopt,
                 "namespace " + ns + " holds devices"};
    if (stored != input.monitors.end()) {
      apply.stored = *stored->second;
      apply.resourceVersion =
          stored->second->at("metadata").value("resourceVersion", std::string());
    }
    plan.actions.push_back(std::move(apply));
  }
  std::set<std::string> namespacesWithRecords;
  for (const auto& [key, recordPtr] : input.records) {
    const nlohmann::json& record = *recordPtr;
    const nlohmann::json& metadata = record.at("metadata");
    // A monitor goes only once its namespace has no records left (the pass after).
    namespacesWithRecords.insert(metadata.value("namespace", std::string()));
    if (recordsWanted.count(key) != 0) {
      continue;
    }
    plan.actions.push_back(Action{
        ActionKind::kDeleteRecord, metadata.value("namespace", std::string()),
        metadata.value("name", std::string()), metadata.value("resourceVersion", std::string()),
        metadata.value("uid", std::string()), nullptr, std::nullopt,
        "nothing it was written for holds GPUs now (" + api::UsageRecordOwner(record) + ")"});
  }
  for (const auto& [ns, monitorPtr] : input.monitors) {
    const nlohmann::json& monitor = *monitorPtr;
    if (namespacesHolding.count(ns) != 0 || namespacesWithRecords.count(ns) != 0) {
      continue;
    }
    const nlohmann::json& metadata = monitor.at("metadata");
    plan.actions.push_back(Action{
        ActionKind::kDeleteMonitor, ns, metadata.value("name", std::string()),
        metadata.value("resourceVersion", std::string()), metadata.value("uid", std::string()),
        nullptr, std::nullopt, "namespace " + ns + " holds no devices"});
  }
}

// The settings ConfigMap (D17, G10).
void PlanSettings(const ReconcileInput::Settings& settings, Plan& plan) {
  nlohmann::json data = nlohmann::json::object();
  for (const auto& [key, value] : settings.data) {
    data[key] = value;
  }
  const nlohmann::json desired = {
      {"apiVersion", "v1"},
      {"kind", "ConfigMap"},
      {"metadata",
       {{"name", settings.name},
        {"namespace", settings.namespaceName},
        {"labels", {{"app.kubernetes.io/managed-by", "gpu-controller"}}}}},
      {"data", data}};
  if (!settings.stored || settings.stored->value("data", nlohmann::json::object()) != data) {
    Action apply{ActionKind::kApplySettings,
                 settings.namespaceName,
                 settings.name,
                 "",
                 "",
                 desired,
                 settings.stored,
                 "the settings the admission policies read"};
    if (settings.stored) {
      apply.resourceVersion =
          settings.stored->at("metadata").value("resourceVersion", std::string());
    }
    plan.actions.push_back(std::move(apply));
  }
}

}  // namespace

// Four reconcilers in one pass, each planning its own objects in this order: classes,
// devices, usage objects, settings.
Plan PlanReconcile(const ReconcileInput& input) {
  Plan plan;
  PlanClasses(input, plan);
  Holdings holdings;
  PlanDevices(input, plan, holdings);
  if (input.usageRecords) {
    if (input.podRecords) {
      PlanPods(input, plan, holdings);
    } else {
      KeepPodRecords(input, holdings);
    }
    PlanUsageObjects(input, plan, holdings);
  }
  if (input.settings) {
    PlanSettings(*input.settings, plan);
  }
  return plan;
}

}  // namespace cozy::controller
