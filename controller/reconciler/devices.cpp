#include <algorithm>

#include "api/keys.h"
#include "api/usage_record.h"
#include "controller/reconciler/reconcilers.h"
#include "controller/reconciler/shared.h"

namespace cozy::controller {

using namespace reconciler;

namespace {

// The attachment's verdict, its action planned and its wait counted.
AttachmentVerdict Attachment(const api::GpuDevice& device, const ReconcileInput& input,
                             controller::Plan& plan) {
  AttachmentVerdict verdict;
  if (!device.status.attachment || device.status.attachment->vmiName.empty()) return verdict;
  verdict = JudgeAttachment(device, input);
  if (verdict.action) plan.actions.push_back(std::move(*verdict.action));
  if (verdict.vmiUnknown && ++plan.waiting.vmisUnknown == 1) {
    plan.waiting.vmisUnknownWhy = verdict.why;
  }
  if (verdict.graceEnds) {
    ++plan.waiting.attachmentsInGrace;
    if (!plan.wakeAt || *verdict.graceEnds < *plan.wakeAt) plan.wakeAt = verdict.graceEnds;
  }
  return verdict;
}

// A deleting device: it stays while a VMI uses it (D13); released first while another finalizer
// keeps it holding units (D19); our finalizer goes after its usage record.
void PlanDeleting(const api::GpuDevice& device, const ReconcileInput& input, bool inUse,
                  controller::Plan& plan) {
  const api::ObjectMeta& meta = device.metadata;
  const bool has = HasFinalizer(meta, api::kDeviceFinalizer);
  if (inUse) {
    if (has) ++plan.waiting.devicesInUse;
    return;
  }
  if (!has) return;
  // D19: a usage record lives exactly as long as the device holds units. Our finalizer is the
  // last one in the way of the object's end, or another's (a tenant's `example.com/hold`)
  // keeps the device, still Bound and counted as held, after ours is gone: then its units
  // are released first, and its record and our finalizer follow in the passes after.
  const bool othersKeepIt =
      std::any_of(meta.finalizers.begin(), meta.finalizers.end(),
                  [](const std::string& finalizer) { return finalizer != api::kDeviceFinalizer; });
  if (othersKeepIt && api::HoldsUsage(device)) {
    plan.actions.push_back(ObjectAction(
        "release-device", DeviceTarget(meta, "status"), Verb::kMergePatch, meta,
        {{"status", {{"phase", api::ToString(api::DevicePhase::kPending)}, {"nodeName", nullptr}}}},
        "deleted, no VMI uses it, and another finalizer keeps it: its units are released "
        "before its usage record and finalizer go"));
    return;
  }
  const std::string recordKey = meta.namespaceName + "/" + api::UsageRecordName(meta.name);
  if (input.usageRecords && input.records.count(recordKey) != 0) {
    return;  // the record goes first (UsageRecords); the finalizer in the pass after
  }
  plan.actions.push_back(ObjectAction(
      "remove-device-finalizer", DeviceTarget(meta), Verb::kMergePatch, meta,
      FinalizersPatch(meta, api::kDeviceFinalizer, false), "released and no VMI uses it"));
}

}  // namespace

controller::Plan DeviceLifecycle::Plan(const ReconcileInput& input) const {
  controller::Plan plan;
  for (const auto& devicePtr : input.devices) {
    const api::GpuDevice& device = *devicePtr;
    const api::ObjectMeta& meta = device.metadata;
    const AttachmentVerdict verdict = Attachment(device, input, plan);
    if (meta.deletionTimestamp) {
      PlanDeleting(device, input, verdict.inUse, plan);
    } else if (!HasFinalizer(meta, api::kDeviceFinalizer)) {
      plan.actions.push_back(ObjectAction("add-device-finalizer", DeviceTarget(meta),
                                          Verb::kMergePatch, meta,
                                          FinalizersPatch(meta, api::kDeviceFinalizer, true),
                                          "a held device stays until no VMI uses it"));
    }
  }
  return plan;
}

}  // namespace cozy::controller
