#include "controller/reconciler/plan.h"

#include <algorithm>

#include "api/keys.h"
#include "api/time.h"
#include "api/usage_record.h"
#include "controller/reconciler/reconcilers.h"
#include "controller/reconciler/shared.h"

namespace cozy::controller {

bool Has(const ReconcileInput& input, Part part) {
  switch (part) {
    case Part::kClasses:
    case Part::kDevices:
    case Part::kVmiLookup:
      return true;
    case Part::kUsageObjects:
      return input.usageRecords;
    case Part::kSettings:
      return input.settings.has_value();
    case Part::kDraDeviceClasses:
      return input.deviceClasses.has_value();
    case Part::kDraClaims:
      return input.draClaims.has_value();
  }
  return false;
}

std::string Action::Key() const {
  std::string key(target.kind);
  key += ":";
  if (!target.namespaceName.empty()) {
    key += target.namespaceName + "/";
  }
  return key + target.name;
}

Plan PlanReconcile(const ReconcileInput& input, const Reconcilers& reconcilers) {
  Plan plan;
  for (const auto& reconciler : reconcilers) {
    const std::vector<Part> reads = reconciler->Reads();
    if (!std::all_of(reads.begin(), reads.end(), [&](Part part) { return Has(input, part); })) {
      continue;
    }
    Plan own = reconciler->Plan(input);
    for (Action& action : own.actions) {
      action.reconciler = std::string(reconciler->Name());
      plan.actions.push_back(std::move(action));
    }
    plan.waiting.devicesInUse += own.waiting.devicesInUse;
    plan.waiting.classesWithHolders += own.waiting.classesWithHolders;
    plan.waiting.attachmentsInGrace += own.waiting.attachmentsInGrace;
    plan.waiting.vmisUnknown += own.waiting.vmisUnknown;
    if (plan.waiting.vmisUnknownWhy.empty())
      plan.waiting.vmisUnknownWhy = own.waiting.vmisUnknownWhy;
    if (own.wakeAt && (!plan.wakeAt || *own.wakeAt < *plan.wakeAt)) plan.wakeAt = own.wakeAt;
  }
  return plan;
}

Plan PlanReconcile(const ReconcileInput& input) {
  static const Reconcilers standard = StandardReconcilers();
  return PlanReconcile(input, standard);
}

namespace reconciler {

using Clock = std::chrono::system_clock;

Target ClassTarget(const api::ObjectMeta& meta) {
  return Target{api::kGpuClassKind, kGpuClasses, "", meta.name, ""};
}

Target DeviceTarget(const api::ObjectMeta& meta, std::string subresource) {
  return Target{api::kGpuDeviceKind, kGpuDevices, meta.namespaceName, meta.name,
                std::move(subresource)};
}

Target InNamespace(std::string_view kind, const Kind& resource, std::string namespaceName,
                   std::string name) {
  return Target{kind, resource, std::move(namespaceName), std::move(name), ""};
}

Action ObjectAction(std::string what, Target target, Verb verb, const api::ObjectMeta& meta,
                    nlohmann::json body, std::string reason) {
  Action action;
  action.what = std::move(what);
  action.target = std::move(target);
  action.verb = verb;
  action.resourceVersion = meta.resourceVersion;
  action.uid = meta.uid;
  action.body = std::move(body);
  action.reason = std::move(reason);
  return action;
}

Action ApplyAction(std::string what, Target target, nlohmann::json desired,
                   const nlohmann::json* stored, std::string reason) {
  Action action;
  action.what = std::move(what);
  action.target = std::move(target);
  action.verb = Verb::kApply;
  action.body = std::move(desired);
  action.reason = std::move(reason);
  if (stored != nullptr) {
    action.stored = *stored;
    action.resourceVersion = stored->at("metadata").value("resourceVersion", std::string());
  }
  return action;
}

Action DeleteAction(std::string what, Target target, const nlohmann::json& stored,
                    std::string reason) {
  const nlohmann::json& metadata = stored.at("metadata");
  Action action;
  action.what = std::move(what);
  action.target = std::move(target);
  action.verb = Verb::kDelete;
  action.resourceVersion = metadata.value("resourceVersion", std::string());
  action.uid = metadata.value("uid", std::string());
  action.body = nullptr;
  action.reason = std::move(reason);
  return action;
}

bool HasFinalizer(const api::ObjectMeta& meta, std::string_view finalizer) {
  return std::find(meta.finalizers.begin(), meta.finalizers.end(), finalizer) !=
         meta.finalizers.end();
}

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

namespace {

Clock::time_point FloorToSecond(Clock::time_point time) {
  return std::chrono::time_point_cast<std::chrono::seconds>(time) > time
             ? std::chrono::time_point_cast<std::chrono::seconds>(time) - std::chrono::seconds(1)
             : std::chrono::time_point_cast<std::chrono::seconds>(time);
}

bool IsTemplateDevice(const api::GpuDevice& device) {
  auto it = device.metadata.labels.find(std::string(api::kTemplateDeviceLabel));
  return it != device.metadata.labels.end() && it->second == api::kTemplateDeviceLabelValue;
}

const VmiState& AttachedVmi(const api::GpuDevice& device, const ReconcileInput& input) {
  const std::string key = device.metadata.namespaceName + "/" + device.metadata.name;
  auto found = input.attachedVmis.find(key);
  if (found == input.attachedVmis.end()) {
    found = input.attachedVmis
                .emplace(key, input.vmis(device.metadata.namespaceName,
                                         device.status.attachment->vmiName))
                .first;
  }
  return found->second;
}

// The attachment's VMI, unmatched yet (the webhook attached at the VMI's CREATE admission):
// stamped, matched, waiting in its grace, or ended once the grace is over.
template <class Ended>
void JudgeUnmatched(const api::GpuDevice& device, const ReconcileInput& input, const VmiState& vmi,
                    AttachmentVerdict& verdict, Ended ended) {
  const api::Attachment& attachment = *device.status.attachment;
  const api::ObjectMeta& meta = device.metadata;
  const bool deleting = meta.deletionTimestamp.has_value();
  const std::string who = "VMI " + meta.namespaceName + "/" + attachment.vmiName;
  if (attachment.attachedAt.empty()) {
    verdict.inUse = true;
    if (!deleting) {
      verdict.action =
          ObjectAction("stamp-attachment", DeviceTarget(meta, "status"), Verb::kMergePatch, meta,
                       {{"status", {{"attachment", {{"attachedAt", api::FormatTime(input.now)}}}}}},
                       "attachment to " + who + " has no attachedAt: the grace counts from now");
    }
    return;
  }
  const std::optional<Clock::time_point> attachedAt = api::ParseTime(attachment.attachedAt);
  if (vmi.presence == VmiState::Presence::kPresent && attachedAt) {
    const std::optional<Clock::time_point> created = api::ParseTime(vmi.creationTimestamp);
    // creationTimestamp has whole seconds; a VMI made in the second of the attachment counts.
    if (created && *created >= FloorToSecond(*attachedAt)) {
      verdict.inUse = true;
      if (!deleting) {
        verdict.action =
            ObjectAction("match-attachment", DeviceTarget(meta, "status"), Verb::kMergePatch, meta,
                         {{"status", {{"attachment", {{"vmiUID", vmi.uid}}}}}}, who + " appeared");
      }
      return;
    }
  }
  const Clock::time_point deadline = (attachedAt ? *attachedAt : input.now) + input.attachmentGrace;
  if (!attachedAt || input.now >= deadline) {
    ended(attachedAt ? "did not appear within the attachment grace"
                     : "has an attachedAt that does not read (" + attachment.attachedAt + ")");
    return;
  }
  verdict.inUse = true;
  verdict.graceEnds = deadline;
}

}  // namespace

AttachmentVerdict JudgeAttachment(const api::GpuDevice& device, const ReconcileInput& input) {
  AttachmentVerdict verdict;
  const api::Attachment& attachment = *device.status.attachment;
  const api::ObjectMeta& meta = device.metadata;
  const VmiState& vmi = AttachedVmi(device, input);
  const std::string who = "VMI " + meta.namespaceName + "/" + attachment.vmiName;
  if (vmi.presence == VmiState::Presence::kUnknown) {
    // G7: a VMI that cannot be told is never read as gone.
    verdict.vmiUnknown = true;
    verdict.why = who + (vmi.why.empty() ? std::string() : ": " + vmi.why);
    verdict.inUse = true;
    return verdict;
  }
  auto ended = [&](const std::string& why) {
    if (meta.deletionTimestamp) {
      return;  // released by the devices' reconciler; nothing else to change on a device that goes
    }
    if (IsTemplateDevice(device)) {
      verdict.action = ObjectAction("delete-template-device", DeviceTarget(meta), Verb::kDelete,
                                    meta, nullptr, "template device of " + who + ", which " + why);
    } else {
      verdict.action =
          ObjectAction("clear-attachment", DeviceTarget(meta, "status"), Verb::kMergePatch, meta,
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
  JudgeUnmatched(device, input, vmi, verdict, ended);
  return verdict;
}

bool DeletingDeviceKeepsRecord(const api::GpuDevice& device, const ReconcileInput& input) {
  if (device.status.attachment && !device.status.attachment->vmiName.empty() &&
      JudgeAttachment(device, input).inUse) {
    return true;  // D13: the device, its binding and its record stay while a VMI uses it
  }
  const api::ObjectMeta& meta = device.metadata;
  // D19: released first while another finalizer keeps it; the record goes in the pass after.
  const bool othersKeepIt =
      std::any_of(meta.finalizers.begin(), meta.finalizers.end(),
                  [](const std::string& finalizer) { return finalizer != api::kDeviceFinalizer; });
  return HasFinalizer(meta, api::kDeviceFinalizer) && othersKeepIt && api::HoldsUsage(device);
}

}  // namespace reconciler
}  // namespace cozy::controller
