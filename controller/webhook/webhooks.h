// The three admission webhooks (docs/controller.md, "Admission webhooks"): what they read, what
// they write, how long they wait. The rules themselves are pure and live in controller/admission
// (and the model under it); this is their I/O.
//
// - /validate/gpudevices: an order is refused at once when it cannot be met now (E1-E4).
// - /mutate/virtualmachineinstances: every refusal check first, so a dry run or a refused
//   start leaves no trace (E5); then the template devices are created and marked (E6), the
//   whole set is attached and asked for with optimistic concurrency (E7), and the webhook
//   waits a bounded time for the leader's binder to place it on one node (E8). A reinvocation
//   (after virt-api's own mutator) finds its own answered request and writes nothing (E9).
// - /mutate/pods: the virt-launcher pod is pinned to its devices' node (E13).
//
// Every replica serves them from its own warm caches (G3). Writes go through a client of their
// own, whose requests are bounded well inside the API server's webhook timeout.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/gpudevice.h"
#include "controller/admission/review.h"
#include "controller/model/model.h"
#include "controller/model/snapshot.h"
#include "controller/webhook/server.h"
#include "kube/client.h"

namespace cozy::controller::webhook {

// The cluster as one replica's caches show it, with the model built over it once per state.
struct Prepared {
  model::Snapshot snapshot;
  std::unique_ptr<model::Model> model;  // over `snapshot`; null when the model refused it
  std::string modelError;               // why it is null
  std::set<std::string> gpuResourceNames;
  bool rawNamesForbidden = false;
};

// What the webhooks need of the replica (the daemon implements it over its caches; tests over
// plain values).
class ClusterSource {
 public:
  virtual ~ClusterSource() = default;
  // Whether the caches the webhooks read have listed; before that every answer is a refusal
  // that says so (failurePolicy Fail reads an error the same way).
  virtual bool Synced() const = 0;
  // The snapshot and model for the state the caches show now (built again only when they
  // changed).
  virtual std::shared_ptr<const Prepared> Prepare() = 0;
  // A device as the cache shows it now (nullptr: not there).
  virtual std::shared_ptr<const api::GpuDevice> Device(const std::string& ns,
                                                       const std::string& name) const = 0;
  // The devices the cache shows attached to a VMI name in a namespace.
  virtual std::vector<std::shared_ptr<const api::GpuDevice>> AttachedTo(
      const std::string& ns, const std::string& vmiName) const = 0;
  // How many times the caches have changed: read before looking, then wait for the next.
  virtual uint64_t Generation() const { return 0; }
  // Returns once the caches changed since `seen` (Generation), or at `until`: a waiter wakes
  // when what it waits for may be there, not on a poll (E8's wait; docs/controller.md, "Admission
  // webhooks"). Without a signal, sleeps.
  virtual void WaitForChange(uint64_t seen, std::chrono::steady_clock::time_point until) const {
    (void)seen;
    std::this_thread::sleep_until(until);
  }
};

struct WebhookOptions {
  // The longest the VMI webhook waits for the binder's answer (E8), also bounded by the API
  // server's own timeout (less a margin).
  std::chrono::milliseconds bindWait{std::chrono::seconds(8)};
  // A request answered this recently, for the same VMI name, counts as the caller's own (E9).
  std::chrono::seconds recentAnswer{std::chrono::minutes(2)};
  // The longest the VMI webhook waits between looks at the binder's answer when no cache change
  // wakes it first (ClusterSource::WaitForChange).
  std::chrono::milliseconds pollInterval{250};
  // E14: the user KubeVirt's controller creates launcher pods as (--kubevirt-controller-user).
  std::string kubevirtControllerUser = "system:serviceaccount:cozy-kubevirt:kubevirt-controller";
};

struct WebhookStats {
  std::map<std::string, int64_t> answers;  // "<webhook>/<allowed|refused|error>"
  std::vector<double> latencies;           // seconds, since the last TakeStats
  int64_t templatesCreated = 0;
  int64_t attachments = 0;
  int64_t attachConflicts = 0;
  int64_t reinvocations = 0;  // E9: a recent own answer found, nothing written
  // Of those, found only by reading the API server: the cache lagged another replica's writes.
  int64_t reinvocationsReadLive = 0;
  int64_t bindTimeouts = 0;
  int64_t rollbacks = 0;
};

class Webhooks {
 public:
  inline static const std::string kFieldManager = "gpu-controller-webhook";

  Webhooks(kube::Client& client, ClusterSource& cluster, WebhookOptions options = {});

  // Registers the three paths on `server`; the VMI webhook takes a wait slot from it.
  void Register(Server& server);

  nlohmann::json ValidateGpuDevice(const nlohmann::json& review, const RequestContext& context);
  nlohmann::json MutateVmi(const nlohmann::json& review, const RequestContext& context);
  nlohmann::json MutatePod(const nlohmann::json& review, const RequestContext& context);

  // Counters since the start; latencies since the last call.
  WebhookStats TakeStats();

 private:
  // The frame every webhook runs in (docs/controller.md, "Admission webhooks"): the review
  // decoded, the early answers, then the webhook's own rule as a function from the request and
  // its context to the response, which is encoded, timed and counted under `webhook` (an
  // exception counts as an error and goes on to the server, which answers 500).
  using Handler = std::function<admission::AdmissionResponse(const admission::AdmissionRequest&,
                                                             const RequestContext&)>;
  nlohmann::json Serve(std::string_view webhook, const nlohmann::json& review,
                       const RequestContext& context, const Handler& handle);
  std::optional<admission::AdmissionResponse> Early(
      const admission::AdmissionRequest& request) const;
  admission::AdmissionResponse CheckOrder(const admission::AdmissionRequest& request);
  admission::AdmissionResponse PinLauncher(const admission::AdmissionRequest& request);
  admission::AdmissionResponse StartVmi(const admission::AdmissionRequest& request,
                                        const RequestContext& context);
  void Count(std::string_view webhook, std::string_view result, double seconds);

  kube::Client& client_;
  ClusterSource& cluster_;
  WebhookOptions options_;
  Server* server_ = nullptr;
  std::mutex mutex_;
  WebhookStats stats_;
};

}  // namespace cozy::controller::webhook
