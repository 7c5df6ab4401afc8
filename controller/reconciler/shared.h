// What the standard reconcilers (reconcilers.h) share: the targets of the objects they write, the
// actions they make of them, and the one judgement of a device's attachment that the devices'
// and the usage records' reconcilers both read.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "api/gpudevice.h"
#include "controller/reconciler/plan.h"

namespace cozy::controller::reconciler {

Target ClassTarget(const api::ObjectMeta& meta);
Target DeviceTarget(const api::ObjectMeta& meta, std::string subresource = "");
Target InNamespace(std::string_view kind, const Kind& resource, std::string namespaceName,
                   std::string name);

// An action on the object `meta` describes, at the version and uid it was read at.
Action ObjectAction(std::string what, Target target, Verb verb, const api::ObjectMeta& meta,
                    nlohmann::json body, std::string reason);
// Writes `desired`: created when `stored` is null, else updated over it at its resourceVersion.
Action ApplyAction(std::string what, Target target, nlohmann::json desired,
                   const nlohmann::json* stored, std::string reason);
// Deletes the stored object at its uid and resourceVersion.
Action DeleteAction(std::string what, Target target, const nlohmann::json& stored,
                    std::string reason);

bool HasFinalizer(const api::ObjectMeta& meta, std::string_view finalizer);
// The merge patch that sets metadata.finalizers to the list with `finalizer` added or removed.
// A merge patch replaces a list whole, so the action carries the resourceVersion it was read
// at: a finalizer someone added since is never dropped (the write conflicts instead).
nlohmann::json FinalizersPatch(const api::ObjectMeta& meta, std::string_view finalizer, bool add);

// What one device's attachment asks for, and whether a VMI uses (or may use) the device.
struct AttachmentVerdict {
  bool inUse = false;
  std::optional<Action> action;
  bool vmiUnknown = false;  // G7: the VMI cannot be told now (`why` says why)
  std::string why;
  std::optional<std::chrono::system_clock::time_point> graceEnds;  // waiting for its VMI (D18)
};
// The verdict on `device`'s attachment (it has one naming a VMI). Its VMI is looked up once a
// pass, whichever reconciler asks first.
AttachmentVerdict JudgeAttachment(const api::GpuDevice& device, const ReconcileInput& input);

// D13, D19: whether a deleting device keeps its usage record this pass (a VMI uses it, or
// another finalizer keeps it while it holds units and its release is planned).
bool DeletingDeviceKeepsRecord(const api::GpuDevice& device, const ReconcileInput& input);

}  // namespace cozy::controller::reconciler
