#include "controller/webhook/vm_start.h"

#include <algorithm>
#include <utility>

#include "api/device_references.h"
#include "api/keys.h"
#include "kube/errors.h"
#include "runtime/log.h"

namespace cozy::controller::webhook {

using nlohmann::json;
using runtime::LogFields;

VmStart::VmStart(Parts parts, const admission::AdmissionRequest& request, std::string name,
                 Clock::time_point deadline)
    : parts_(std::move(parts)),
      request_(request),
      name_(std::move(name)),
      started_(Clock::now()),
      deadline_(deadline) {
  cached_ = [this](const std::string& member) {
    return parts_.cluster.Device(request_.namespaceName, member);
  };
}

admission::AdmissionResponse VmStart::Run() {
  if (auto refusal = Check()) return admission::Refuse(request_, *refusal);
  if (request_.dryRun) return admission::Allow(request_, patch_);  // E5: nothing written
  if (OwnAnswered()) {
    parts_.count(&WebhookStats::reinvocations);
    return admission::Allow(request_, patch_);
  }
  std::optional<std::string> refusal;
  try {
    refusal = CreateTemplates();
    for (size_t i = 0; !refusal && i < members_.size(); ++i) refusal = Attach(members_[i]);
    if (!refusal) refusal = AwaitPlacement();
  } catch (...) {
    Undo();  // the server answers the error; what was written goes first
    throw;
  }
  if (refusal) {
    Undo();
    return admission::Refuse(request_, *refusal);
  }
  return admission::Allow(request_, patch_);
}

// E5: every refusal check before any write.
std::optional<std::string> VmStart::Check() {
  const json& vmi = request_.object;
  const std::string annotation = StringAt(
      vmi, {"metadata", "annotations", std::string(api::kDeviceReferenceAnnotation).c_str()});
  if (annotation.empty()) {
    return "VirtualMachineInstance " + name_ + " carries the " +
           std::string(api::kDeviceReferenceLabel) + " label but no " +
           std::string(api::kDeviceReferenceAnnotation) + " annotation naming its GPU devices";
  }
  input_.namespaceName = request_.namespaceName;
  input_.vmiName = name_;
  input_.now = NowText();
  try {
    input_.references = api::ParseDeviceReferences(annotation);
  } catch (const std::exception& error) {
    return "the " + std::string(api::kDeviceReferenceAnnotation) + " annotation of " + name_ +
           " cannot be read: " + error.what();
  }
  const std::shared_ptr<const Prepared> prepared = parts_.cluster.Prepare();
  if (!prepared->model) return "the GPU catalog cannot be read: " + prepared->modelError;
  try {
    input_.entries = admission::OwnGpuEntries(vmi, prepared->gpuResourceNames);
  } catch (const std::exception& error) {
    return std::string("the VirtualMachineInstance cannot be read: ") + error.what();
  }
  input_.rawNamesForbidden = prepared->rawNamesForbidden;
  members_ = admission::StartMembers(input_.references, name_);
  if (auto inUse = admission::InUseByRunningVmi(members_, request_.namespaceName, cached_,
                                                prepared->snapshot.vmis)) {
    return inUse;
  }
  plan_ = admission::PlanVmiStart(prepared->snapshot, *prepared->model, input_);
  if (plan_.refusal) return plan_.refusal;
  patch_ = admission::VmiGpuPatch(vmi, plan_.devices);
  return std::nullopt;
}

// E9: a reinvocation (or a retry) finds the request it made for this VMI answered: the set is
// its own, and nothing is written again. The cache first; a VMI that already carries this
// webhook's gpus entries was mutated by a call before this one, which may have run on another
// replica whose writes this replica's cache does not show yet: for it, the API server is read
// too, rather than attach and request again.
bool VmStart::OwnAnswered() {
  const auto now = std::chrono::system_clock::now();
  const std::chrono::seconds recent = parts_.options.recentAnswer;
  if (admission::AnsweredOwnSet(members_, name_, cached_, now, recent)) return true;
  if (input_.entries.webhook.empty() || PastDeadline()) return false;
  const admission::DeviceReader live =
      [this](const std::string& member) -> std::shared_ptr<const api::GpuDevice> {
    try {
      return std::make_shared<const api::GpuDevice>(
          api::GpuDeviceFromJson(parts_.client.Get(DevicePath(request_.namespaceName, member))));
    } catch (const std::exception&) {
      return nullptr;  // gone or unreadable: not a set this request can call its own
    }
  };
  if (!admission::AnsweredOwnSet(members_, name_, live, now, recent)) return false;
  parts_.count(&WebhookStats::reinvocationsReadLive);
  return true;
}

namespace {

// The API server stops waiting at the webhook's deadline: no write is started after it (the VMI
// will not be created, so what is written would only wait for the attachment grace).
const char* const kLate =
    "the API server's webhook timeout ran out while the VM's GPUs were being attached; nothing "
    "was kept, start the VM again";

}  // namespace

// E6: the template devices, marked so the controller deletes them with their VMI.
std::optional<std::string> VmStart::CreateTemplates() {
  const std::string& ns = request_.namespaceName;
  const kube::WriteOptions write{false, Webhooks::kFieldManager};
  for (const json& device : plan_.templateDevices) {
    const std::string deviceName = StringAt(device, {"metadata", "name"});
    if (PastDeadline()) return kLate;
    try {
      const json made = parts_.client.Create(Collection(ns), device, write);
      undo_.Created(deviceName, StringAt(made, {"metadata", "uid"}));
      parts_.count(&WebhookStats::templatesCreated);
    } catch (const kube::ApiError& error) {
      if (error.kind() != kube::ErrorKind::kAlreadyExists) {
        return "template GPUDevice " + deviceName + " could not be created: " + error.what();
      }
      // Left by an earlier try for this VMI: it is ours if it is marked, asks for the same and
      // is attached to nothing else.
      const api::GpuDevice existing =
          api::GpuDeviceFromJson(parts_.client.Get(DevicePath(ns, deviceName)));
      if (auto refusal = admission::LeftoverTemplateRefusal(
              existing, name_, StringAt(device, {"spec", "className"}))) {
        return refusal;
      }
    }
  }
  return std::nullopt;
}

// E7: attaches one member and asks for placement, conditional on the version read, so of two
// VMIs racing for one device exactly one attaches it.
std::optional<std::string> VmStart::Attach(const std::string& member) {
  const std::string& ns = request_.namespaceName;
  const kube::WriteOptions write{false, Webhooks::kFieldManager};
  for (int attempt = 0; attempt < 4; ++attempt) {
    if (PastDeadline()) return kLate;
    api::GpuDevice current;
    try {
      current = api::GpuDeviceFromJson(parts_.client.Get(DevicePath(ns, member)));
    } catch (const kube::ApiError& error) {
      if (error.kind() == kube::ErrorKind::kNotFound) {
        return "GPUDevice " + member + " was deleted while the VM was starting";
      }
      return "GPUDevice " + member + " cannot be read: " + error.what();
    }
    if (auto refusal = admission::AttachRefusal(current, name_)) return refusal;
    const json status = admission::AttachmentStatus(name_, request_.uid, input_.now);
    try {
      parts_.client.MergePatchAt(DevicePath(ns, member, true), {{"status", status}},
                                 current.metadata.resourceVersion, write);
      undo_.Attached(member);
      parts_.count(&WebhookStats::attachments);
      return std::nullopt;
    } catch (const kube::ApiError& error) {
      if (error.kind() != kube::ErrorKind::kConflict) {
        return "GPUDevice " + member + " could not be attached: " + error.what();
      }
      parts_.count(&WebhookStats::attachConflicts);
    }
  }
  return "GPUDevice " + member + " kept changing; try again";
}

// E8: the leader's binder places the set on one node, or says why not; waits a bounded time.
std::optional<std::string> VmStart::AwaitPlacement() {
  const auto deadline = std::min(deadline_, started_ + parts_.options.bindWait);
  while (true) {
    // The deadline first: an answer that comes after the API server gave up is no Allow.
    if (Clock::now() >= deadline) {
      parts_.count(&WebhookStats::bindTimeouts);
      const auto waited =
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started_).count();
      return "gpu-controller's binder did not place the GPUs of " + name_ + " within " +
             std::to_string(waited) +
             " ms (is its leader running?); nothing was kept, start the VM again";
    }
    // Read before looking: a change after this wakes the wait below at once.
    const uint64_t seen = parts_.cluster.Generation();
    const admission::Placement placement =
        admission::ReadPlacement(members_, cached_, request_.uid);
    if (placement.state == admission::Placement::State::kRefused) return placement.refusal;
    if (placement.state == admission::Placement::State::kPlaced) {
      runtime::LogInfo("vm gpus placed", LogFields{{"vmi", request_.namespaceName + "/" + name_},
                                                   {"node", placement.node},
                                                   {"devices", std::to_string(members_.size())}});
      return std::nullopt;
    }
    parts_.cluster.WaitForChange(seen,
                                 std::min(deadline, Clock::now() + parts_.options.pollInterval));
  }
}

// The undo list, newest first. An attachment is cleared only while the device still holds this
// request (a later start may have taken it since); a template device is deleted only as the object
// this request created (a device of that name made since has another uid, and the API server
// refuses the delete, 409). What fails here is logged: the reconciler clears an attachment whose
// VMI never appears (D18), and a template device whose VMI never appears.
void VmStart::Undo() {
  if (undo_.Empty()) return;
  parts_.count(&WebhookStats::rollbacks);
  const std::string& ns = request_.namespaceName;
  for (const admission::StartUndo::Step& step : undo_.Steps()) {
    try {
      if (step.kind == admission::StartUndo::Step::Kind::kDetach) {
        Detach(step.device);
      } else {
        kube::DeleteOptions options;
        options.preconditionUid = step.uid;
        parts_.client.Delete(DevicePath(ns, step.device), options);
      }
    } catch (const std::exception& error) {
      runtime::LogWarning(step.kind == admission::StartUndo::Step::Kind::kDetach
                              ? "attachment not rolled back"
                              : "template device not rolled back",
                          LogFields{{"device", ns + "/" + step.device}, {"error", error.what()}});
    }
  }
}

// Clears this request's attachment, conditional on the version read. The binder may write the
// device between that read and the patch (its answer to the bind request, D4), so a conflict reads
// again, as Attach does: the attachment goes while the device still holds this request.
void VmStart::Detach(const std::string& device) {
  const std::string& ns = request_.namespaceName;
  const kube::WriteOptions write{false, Webhooks::kFieldManager};
  for (int attempt = 1;; ++attempt) {
    // Only the fields the undo needs, read raw: a device whose other fields no longer decode is
    // still detached.
    const json current = parts_.client.Get(DevicePath(ns, device));
    if (StringAt(current, {"status", "bindRequest", "id"}) != request_.uid) return;
    try {
      parts_.client.MergePatchAt(DevicePath(ns, device, true),
                                 {{"status", {{"attachment", nullptr}, {"bindRequest", nullptr}}}},
                                 StringAt(current, {"metadata", "resourceVersion"}), write);
      return;
    } catch (const kube::ApiError& error) {
      if (error.kind() != kube::ErrorKind::kConflict || attempt == kDetachAttempts) throw;
    }
  }
}

}  // namespace cozy::controller::webhook
