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
#include "controller/webhook/json_paths.h"
#include "controller/webhook/vm_start.h"
#include "kube/errors.h"
#include "kube/watch.h"
#include "runtime/log.h"

namespace cozy::controller::webhook {

using nlohmann::json;

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
  auto count = [this](int64_t WebhookStats::*counter) {
    std::lock_guard lock(mutex_);
    ++(stats_.*counter);
  };
  VmStart start({client_, cluster_, options_, count}, request, name, context.deadline);
  return start.Run();
}

}  // namespace cozy::controller::webhook
