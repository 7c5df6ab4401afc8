#include "controller/webhook/webhooks.h"

#include <algorithm>
#include <optional>

#include "api/device_references.h"
#include "api/keys.h"
#include "api/time.h"
#include "controller/admission/orders.h"
#include "controller/admission/pod.h"
#include "controller/admission/review.h"
#include "controller/admission/start.h"
#include "controller/admission/vmi.h"
#include "controller/kinds.h"
#include "controller/model/readers.h"
#include "controller/snapshot_json.h"
#include "kube/errors.h"
#include "kube/watch.h"
#include "runtime/log.h"

namespace cozy::controller::webhook {
namespace {

using nlohmann::json;
using runtime::LogFields;
using Clock = std::chrono::steady_clock;

std::string Collection(const std::string& ns) { return kGpuDevices.Path(ns); }
std::string DevicePath(const std::string& ns, const std::string& name, bool status = false) {
  return kGpuDevices.Path(ns, name, status ? "status" : "");
}

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

const json* Find(const json& object, std::initializer_list<const char*> path) {
  const json* at = &object;
  for (const char* key : path) {
    if (!at->is_object()) return nullptr;
    auto it = at->find(key);
    if (it == at->end()) return nullptr;
    at = &*it;
  }
  return at;
}

std::string StringAt(const json& object, std::initializer_list<const char*> path) {
  const json* at = Find(object, path);
  return at && at->is_string() ? at->get<std::string>() : "";
}

json Encode(const admission::AdmissionResponse& response) {
  return admission::EncodeAdmissionReview(response);
}

std::string NowText() { return api::FormatTime(std::chrono::system_clock::now()); }

}  // namespace

Webhooks::Webhooks(kube::Client& client, ClusterSource& cluster, WebhookOptions options)
    : client_(client), cluster_(cluster), options_(options) {}

void Webhooks::Register(Server& server) {
  server_ = &server;
  server.Handle("/validate/gpudevices", [this](const json& review, const RequestContext& context) {
    return ValidateGpuDevice(review, context);
  });
  server.Handle("/mutate/virtualmachineinstances",
                [this](const json& review, const RequestContext& context) {
                  return MutateVmi(review, context);
                });
  server.Handle("/mutate/pods", [this](const json& review, const RequestContext& context) {
    return MutatePod(review, context);
  });
}

void Webhooks::Count(const std::string& webhook, const json& answer, double seconds) {
  const json* allowed = Find(answer, {"response", "allowed"});
  const std::string result =
      allowed && allowed->is_boolean() ? (allowed->get<bool>() ? "allowed" : "refused") : "error";
  std::lock_guard lock(mutex_);
  ++stats_.answers[webhook + "/" + result];
  stats_.latencies.push_back(seconds);
}

WebhookStats Webhooks::TakeStats() {
  std::lock_guard lock(mutex_);
  WebhookStats stats = stats_;
  stats_.latencies.clear();
  return stats;
}

// What every webhook answers before looking at the object: only CREATE is checked (the rules
// send nothing else; an UPDATE that reaches here anyway is let through), and nothing is decided
// before the caches have listed.
std::optional<json> Webhooks::Early(const admission::AdmissionRequest& request) const {
  if (request.operation != admission::Operation::kCreate) {
    return Encode(admission::Allow(request));
  }
  if (!cluster_.Synced()) {
    return Encode(admission::Refuse(request,
                                    "gpu-controller is starting and has not read the GPU catalog "
                                    "yet; try again in a few seconds"));
  }
  return std::nullopt;
}

json Webhooks::ValidateGpuDevice(const json& review, const RequestContext&) {
  const auto started = Clock::now();
  const admission::AdmissionRequest request = admission::DecodeAdmissionReview(review);
  json answer;
  if (auto early = Early(request)) {
    answer = std::move(*early);
  } else {
    try {
      json object = request.object;
      if (StringAt(object, {"metadata", "namespace"}).empty()) {
        object["metadata"]["namespace"] = request.namespaceName;
      }
      const api::GpuDevice order = api::GpuDeviceFromJson(object);
      const std::shared_ptr<const Prepared> prepared = cluster_.Prepare();
      if (!prepared->model) {
        answer = Encode(
            admission::Refuse(request, "the GPU catalog cannot be read: " + prepared->modelError));
      } else if (auto refusal =
                     admission::CheckOrder(*prepared->model, prepared->snapshot, order)) {
        answer = Encode(admission::Refuse(request, *refusal));
      } else {
        answer = Encode(admission::Allow(request));
      }
    } catch (const api::DecodeError& error) {
      answer = Encode(
          admission::Refuse(request, std::string("the GPUDevice is not valid: ") + error.what()));
    }
  }
  Count(std::string(kGpuDevices.plural), answer, Seconds(started));
  return answer;
}

json Webhooks::MutatePod(const json& review, const RequestContext&) {
  const auto started = Clock::now();
  const admission::AdmissionRequest request = admission::DecodeAdmissionReview(review);
  json answer;
  const std::string ns = request.namespaceName;
  if (auto early = Early(request)) {
    answer = std::move(*early);
  } else {
    const std::string vmiName = admission::LauncherVmiName(request.object).value_or("");
    if (const auto why = admission::WhyNotALauncher(request, options_.kubevirtControllerUser)) {
      answer = Encode(admission::Refuse(request, *why));
    } else {
      std::vector<api::GpuDevice> devices;
      for (const auto& device : cluster_.AttachedTo(ns, vmiName)) devices.push_back(*device);
      const auto placed = [&] {
        return !devices.empty() && std::all_of(devices.begin(), devices.end(), [](const auto& d) {
          return d.Phase() == api::DevicePhase::kBound && d.status.nodeName;
        });
      };
      if (!placed()) {
        // The cache may lag the VMI webhook's writes by a moment: ask the API server.
        devices.clear();
        kube::ListOptions pages;
        pages.limit = 500;
        const json list = client_.List(Collection(ns), pages);
        for (const json& item : list["items"]) {
          std::optional<api::GpuDevice> device;
          try {
            device = api::GpuDeviceFromJson(item);
          } catch (const std::exception&) {
            continue;  // as the caches do: an object that does not decode is no one's GPU
          }
          if (device->status.attachment && device->status.attachment->vmiName == vmiName) {
            devices.push_back(std::move(*device));
          }
        }
      }
      std::set<std::string> nodes;
      std::string notPlaced;
      for (const api::GpuDevice& device : devices) {
        if (device.Phase() == api::DevicePhase::kBound && device.status.nodeName) {
          nodes.insert(*device.status.nodeName);
        } else if (notPlaced.empty()) {
          notPlaced = "GPUDevice " + device.metadata.name + " is " +
                      std::string(api::ToString(device.Phase())) + ", not bound to a node";
        }
      }
      if (devices.empty()) {
        answer = Encode(admission::Refuse(request, "no GPUDevice in namespace " + ns +
                                                       " is attached to VirtualMachineInstance " +
                                                       vmiName + ": its GPUs were not attached"));
      } else if (!notPlaced.empty()) {
        answer = Encode(admission::Refuse(
            request, notPlaced + "; the launcher of " + vmiName + " would start without it"));
      } else if (nodes.size() != 1) {
        answer = Encode(admission::Refuse(
            request, "the GPUDevices of " + vmiName + " are bound to different nodes"));
      } else {
        // The tolerations of the devices' classes (docs/install.md, "GPU nodes behind a taint"):
        // the binder placed the set where they let it go, so the launcher carries them, and the pin
        // keeps it there.
        std::vector<api::Toleration> tolerations;
        const std::shared_ptr<const Prepared> prepared = cluster_.Prepare();
        for (const api::GpuDevice& device : devices) {
          for (const api::GpuClass& gpuClass : prepared->snapshot.classes) {
            if (gpuClass.metadata.name == device.spec.className) {
              tolerations.insert(tolerations.end(), gpuClass.spec.tolerations.begin(),
                                 gpuClass.spec.tolerations.end());
            }
          }
        }
        answer = Encode(admission::Allow(
            request, admission::PodPinPatch(request.object, *nodes.begin(), tolerations)));
      }
    }
  }
  Count(std::string(kPods.plural), answer, Seconds(started));
  return answer;
}

json Webhooks::MutateVmi(const json& review, const RequestContext& context) {
  const auto started = Clock::now();
  const admission::AdmissionRequest request = admission::DecodeAdmissionReview(review);
  json answer;
  if (auto early = Early(request)) {
    answer = std::move(*early);
  } else {
    const std::optional<Server::WaitSlot> slot =
        server_ ? server_->TryWait() : std::optional<Server::WaitSlot>();
    if (server_ && !slot) {
      answer = Encode(admission::Refuse(request,
                                        "too many VM starts are waiting for GPU placement on this "
                                        "gpu-controller replica; try again in a few seconds"));
    } else {
      const std::string name =
          request.name.empty() ? StringAt(request.object, {"metadata", "name"}) : request.name;
      answer = StartVmi(request, name, context);
    }
  }
  Count(std::string(kVmis.plural), answer, Seconds(started));
  return answer;
}

json Webhooks::StartVmi(const admission::AdmissionRequest& request, const std::string& name,
                        const RequestContext& context) {
  const auto started = Clock::now();
  const std::string& ns = request.namespaceName;
  const json& vmi = request.object;
  auto refuseNow = [&](const std::string& message) {
    return Encode(admission::Refuse(request, message));
  };
  const std::string annotation = StringAt(
      vmi, {"metadata", "annotations", std::string(api::kDeviceReferenceAnnotation).c_str()});
  if (annotation.empty()) {
    return refuseNow("VirtualMachineInstance " + name + " carries the " +
                     std::string(api::kDeviceReferenceLabel) + " label but no " +
                     std::string(api::kDeviceReferenceAnnotation) +
                     " annotation naming its GPU devices");
  }
  admission::VmiInput input;
  input.namespaceName = ns;
  input.vmiName = name;
  input.now = NowText();
  try {
    input.references = api::ParseDeviceReferences(annotation);
  } catch (const std::exception& error) {
    return refuseNow("the " + std::string(api::kDeviceReferenceAnnotation) + " annotation of " +
                     name + " cannot be read: " + error.what());
  }
  const std::shared_ptr<const Prepared> prepared = cluster_.Prepare();
  if (!prepared->model) {
    return refuseNow("the GPU catalog cannot be read: " + prepared->modelError);
  }
  const model::Snapshot& snapshot = prepared->snapshot;
  try {
    input.entries = admission::OwnGpuEntries(vmi, prepared->gpuResourceNames);
  } catch (const std::exception& error) {
    return refuseNow(std::string("the VirtualMachineInstance cannot be read: ") + error.what());
  }
  input.rawNamesForbidden = prepared->rawNamesForbidden;

  // E5: every refusal check before any write.
  const std::vector<std::string> members = admission::StartMembers(input.references, name);
  const admission::DeviceReader cached = [&](const std::string& member) {
    return cluster_.Device(ns, member);
  };
  if (auto inUse = admission::InUseByRunningVmi(members, ns, cached, snapshot.vmis)) {
    return refuseNow(*inUse);
  }
  const admission::VmiStartPlan plan = admission::PlanVmiStart(snapshot, *prepared->model, input);
  if (plan.refusal) return refuseNow(*plan.refusal);
  const json patch = admission::VmiGpuPatch(vmi, plan.devices);
  if (request.dryRun) return Encode(admission::Allow(request, patch));  // E5: nothing written

  // E9: a reinvocation (or a retry) finds the request it made for this VMI answered: the set is
  // its own, and nothing is written again. The cache first; a VMI that already carries this
  // webhook's gpus entries was mutated by a call before this one, which may have run on another
  // replica whose writes this replica's cache does not show yet: for it, the API server is read
  // too, rather than attach and request again (E9).
  {
    const auto now = std::chrono::system_clock::now();
    bool own = admission::AnsweredOwnSet(members, name, cached, now, options_.recentAnswer);
    if (!own && !input.entries.webhook.empty() && Clock::now() < context.deadline) {
      const admission::DeviceReader live =
          [&](const std::string& member) -> std::shared_ptr<const api::GpuDevice> {
        try {
          return std::make_shared<const api::GpuDevice>(
              api::GpuDeviceFromJson(client_.Get(DevicePath(ns, member))));
        } catch (const std::exception&) {
          return nullptr;  // gone or unreadable: not a set this request can call its own
        }
      };
      own = admission::AnsweredOwnSet(members, name, live, now, options_.recentAnswer);
      if (own) {
        std::lock_guard lock(mutex_);
        ++stats_.reinvocationsReadLive;
      }
    }
    if (own) {
      std::lock_guard lock(mutex_);
      ++stats_.reinvocations;
      return Encode(admission::Allow(request, patch));
    }
  }

  const kube::WriteOptions write{false, kFieldManager};
  std::vector<std::string> created;  // "name" of each template device this request created
  std::map<std::string, std::string> createdUids;
  std::vector<std::string> attached;
  auto refuse = [&](const std::string& message) {
    Rollback(ns, attached, created, createdUids, request.uid);
    return Encode(admission::Refuse(request, message));
  };
  // The API server stops waiting at the context's deadline: no write is started after it (the
  // VMI will not be created, so what is written would only wait for the attachment grace).
  auto pastDeadline = [&] { return Clock::now() >= context.deadline; };
  const std::string lateMessage =
      "the API server's webhook timeout ran out while the VM's GPUs were being attached; nothing "
      "was kept, start the VM again";

  // E6: the template devices, marked so the controller deletes them with their VMI.
  for (const json& device : plan.templateDevices) {
    const std::string deviceName = StringAt(device, {"metadata", "name"});
    if (pastDeadline()) return refuse(lateMessage);
    try {
      const json made = client_.Create(Collection(ns), device, write);
      created.push_back(deviceName);
      createdUids[deviceName] = StringAt(made, {"metadata", "uid"});
      std::lock_guard lock(mutex_);
      ++stats_.templatesCreated;
    } catch (const kube::ApiError& error) {
      if (error.kind() != kube::ErrorKind::kAlreadyExists) {
        return refuse("template GPUDevice " + deviceName +
                      " could not be created: " + error.what());
      }
      // Left by an earlier try for this VMI: it is ours if it is marked, asks for the same and
      // is attached to nothing else.
      const api::GpuDevice existing =
          api::GpuDeviceFromJson(client_.Get(DevicePath(ns, deviceName)));
      if (auto refusal = admission::LeftoverTemplateRefusal(
              existing, name, StringAt(device, {"spec", "className"}))) {
        return refuse(*refusal);
      }
    }
  }

  // E7: attach each member and ask for placement, each write conditional on the version read,
  // so of two VMIs racing for one device exactly one attaches it.
  const std::string& now = input.now;
  for (const std::string& member : members) {
    bool done = false;
    for (int attempt = 0; attempt < 4 && !done; ++attempt) {
      if (pastDeadline()) return refuse(lateMessage);
      api::GpuDevice current;
      try {
        current = api::GpuDeviceFromJson(client_.Get(DevicePath(ns, member)));
      } catch (const kube::ApiError& error) {
        if (error.kind() == kube::ErrorKind::kNotFound) {
          return refuse("GPUDevice " + member + " was deleted while the VM was starting");
        }
        return refuse("GPUDevice " + member + " cannot be read: " + error.what());
      }
      if (auto refusal = admission::AttachRefusal(current, name)) return refuse(*refusal);
      const json status = admission::AttachmentStatus(name, request.uid, now);
      try {
        client_.MergePatchAt(DevicePath(ns, member, true), {{"status", status}},
                             current.metadata.resourceVersion, write);
        attached.push_back(member);
        done = true;
        std::lock_guard lock(mutex_);
        ++stats_.attachments;
      } catch (const kube::ApiError& error) {
        if (error.kind() != kube::ErrorKind::kConflict) {
          return refuse("GPUDevice " + member + " could not be attached: " + error.what());
        }
        std::lock_guard lock(mutex_);
        ++stats_.attachConflicts;
      }
    }
    if (!done) return refuse("GPUDevice " + member + " kept changing; try again");
  }

  // E8: the leader's binder places the set on one node, or says why not; wait a bounded time.
  const auto deadline = std::min(context.deadline, started + options_.bindWait);
  while (true) {
    // The deadline first: an answer that comes after the API server gave up is no Allow.
    if (Clock::now() >= deadline) {
      {
        std::lock_guard lock(mutex_);
        ++stats_.bindTimeouts;
      }
      const auto waited =
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started).count();
      return refuse("gpu-controller's binder did not place the GPUs of " + name + " within " +
                    std::to_string(waited) +
                    " ms (is its leader running?); nothing was kept, start the VM again");
    }
    // Read before looking: a change after this wakes the wait below at once.
    const uint64_t seen = cluster_.Generation();
    const admission::Placement placement = admission::ReadPlacement(members, cached, request.uid);
    if (placement.state == admission::Placement::State::kRefused) return refuse(placement.refusal);
    if (placement.state == admission::Placement::State::kPlaced) {
      runtime::LogInfo("vm gpus placed", LogFields{{"vmi", ns + "/" + name},
                                                   {"node", placement.node},
                                                   {"devices", std::to_string(members.size())}});
      return Encode(admission::Allow(request, patch));
    }
    cluster_.WaitForChange(seen, std::min(deadline, Clock::now() + options_.pollInterval));
  }
}

void Webhooks::Rollback(const std::string& ns, const std::vector<std::string>& attached,
                        const std::vector<std::string>& created,
                        const std::map<std::string, std::string>& createdUids,
                        const std::string& requestId) {
  if (attached.empty() && created.empty()) return;
  {
    std::lock_guard lock(mutex_);
    ++stats_.rollbacks;
  }
  const kube::WriteOptions write{false, kFieldManager};
  for (const std::string& member : admission::AttachmentsToRollBack(attached, created)) {
    try {
      // Only the fields the rollback needs, read raw: a device whose other fields no longer
      // decode is still rolled back.
      const json current = client_.Get(DevicePath(ns, member));
      if (StringAt(current, {"status", "bindRequest", "id"}) != requestId) continue;
      client_.MergePatchAt(DevicePath(ns, member, true),
                           {{"status", {{"attachment", nullptr}, {"bindRequest", nullptr}}}},
                           StringAt(current, {"metadata", "resourceVersion"}), write);
    } catch (const std::exception& error) {
      // The reconciler clears an attachment whose VMI never appears (D18).
      runtime::LogWarning("attachment not rolled back",
                          LogFields{{"device", ns + "/" + member}, {"error", error.what()}});
    }
  }
  for (const std::string& member : created) {
    try {
      // Only the object this request created: a device of that name made since (another
      // start, the tenant) has another uid, and the API server refuses the delete (409).
      kube::DeleteOptions options;
      if (auto uid = createdUids.find(member); uid != createdUids.end()) {
        options.preconditionUid = uid->second;
      }
      client_.Delete(DevicePath(ns, member), options);
    } catch (const std::exception& error) {
      runtime::LogWarning("template device not rolled back",
                          LogFields{{"device", ns + "/" + member}, {"error", error.what()}});
    }
  }
}

}  // namespace cozy::controller::webhook
