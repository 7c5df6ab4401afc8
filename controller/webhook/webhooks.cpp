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

void Webhooks::Count(std::string_view webhook, std::string_view result, double seconds) {
  std::lock_guard lock(mutex_);
  ++stats_.answers[std::string(webhook) + "/" + std::string(result)];
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
std::optional<admission::AdmissionResponse> Webhooks::Early(
    const admission::AdmissionRequest& request) const {
  if (request.operation != admission::Operation::kCreate) return admission::Allow(request);
  if (!cluster_.Synced()) {
    return admission::Refuse(request,
                             "gpu-controller is starting and has not read the GPU catalog yet; "
                             "try again in a few seconds");
  }
  return std::nullopt;
}

json Webhooks::Serve(std::string_view webhook, const json& review, const RequestContext& context,
                     const Handler& handle) {
  const auto started = Clock::now();
  try {
    const admission::AdmissionRequest request = admission::DecodeAdmissionReview(review);
    std::optional<admission::AdmissionResponse> early = Early(request);
    const admission::AdmissionResponse response = early ? *early : handle(request, context);
    Count(webhook, response.allowed ? "allowed" : "refused", Seconds(started));
    return Encode(response);
  } catch (...) {
    Count(webhook, "error", Seconds(started));
    throw;  // the server answers the error; the API server's failurePolicy decides
  }
}

json Webhooks::ValidateGpuDevice(const json& review, const RequestContext& context) {
  return Serve(kGpuDevices.plural, review, context,
               [this](const admission::AdmissionRequest& request, const RequestContext&) {
                 return CheckOrder(request);
               });
}

json Webhooks::MutateVmi(const json& review, const RequestContext& context) {
  return Serve(kVmis.plural, review, context,
               [this](const admission::AdmissionRequest& request, const RequestContext& call) {
                 return StartVmi(request, call);
               });
}

json Webhooks::MutatePod(const json& review, const RequestContext& context) {
  return Serve(kPods.plural, review, context,
               [this](const admission::AdmissionRequest& request, const RequestContext&) {
                 return PinLauncher(request);
               });
}

// E1-E4: the order as the CRD reads it, then the model's refusals.
admission::AdmissionResponse Webhooks::CheckOrder(const admission::AdmissionRequest& request) {
  try {
    json object = request.object;
    if (StringAt(object, {"metadata", "namespace"}).empty()) {
      object["metadata"]["namespace"] = request.namespaceName;
    }
    const api::GpuDevice order = api::GpuDeviceFromJson(object);
    const std::shared_ptr<const Prepared> prepared = cluster_.Prepare();
    if (!prepared->model) {
      return admission::Refuse(request, "the GPU catalog cannot be read: " + prepared->modelError);
    }
    if (auto refusal = admission::CheckOrder(*prepared->model, prepared->snapshot, order)) {
      return admission::Refuse(request, *refusal);
    }
    return admission::Allow(request);
  } catch (const api::DecodeError& error) {
    return admission::Refuse(request, std::string("the GPUDevice is not valid: ") + error.what());
  }
}

// E13, E14: a launcher KubeVirt's controller creates is pinned to its GPUs' node
// (admission::PlanLauncherPin); its devices are read past the cache while the cache does not
// show them placed, as it may lag the VMI webhook's writes by a moment.
admission::AdmissionResponse Webhooks::PinLauncher(const admission::AdmissionRequest& request) {
  if (const auto why = admission::WhyNotALauncher(request, options_.kubevirtControllerUser)) {
    return admission::Refuse(request, *why);
  }
  const std::string& ns = request.namespaceName;
  const std::string vmiName = admission::LauncherVmiName(request.object).value_or("");
  std::vector<api::GpuDevice> devices;
  for (const auto& device : cluster_.AttachedTo(ns, vmiName)) devices.push_back(*device);
  if (!admission::AllPlaced(devices)) {
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
  const admission::LauncherPin pin =
      admission::PlanLauncherPin(ns, vmiName, devices, cluster_.Prepare()->snapshot.classes);
  if (pin.refusal) return admission::Refuse(request, *pin.refusal);
  return admission::Allow(request,
                          admission::PodPinPatch(request.object, pin.node, pin.tolerations));
}

// E5-E9: a VM start (VmStart), while this replica has a wait slot for it.
admission::AdmissionResponse Webhooks::StartVmi(const admission::AdmissionRequest& request,
                                                const RequestContext& context) {
  const std::optional<Server::WaitSlot> slot =
      server_ ? server_->TryWait() : std::optional<Server::WaitSlot>();
  if (server_ && !slot) {
    return admission::Refuse(request,
                             "too many VM starts are waiting for GPU placement on this "
                             "gpu-controller replica; try again in a few seconds");
  }
  const std::string name =
      request.name.empty() ? StringAt(request.object, {"metadata", "name"}) : request.name;
  auto count = [this](int64_t WebhookStats::*counter) {
    std::lock_guard lock(mutex_);
    ++(stats_.*counter);
  };
  VmStart start({client_, cluster_, options_, count}, request, name, context.deadline);
  return start.Run();
}

}  // namespace cozy::controller::webhook
