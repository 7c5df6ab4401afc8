// One VM start through the VMI webhook (docs/controller.md, "Admission webhooks"), as an object
// that runs its steps in order:
//   1. Check: every refusal check, before any write (E5); a dry run stops here.
//   2. Own: a reinvocation finds its own answered request and writes nothing again (E9).
//   3. Create the template devices, marked so the controller deletes them with the VMI (E6).
//   4. Attach each member and ask for placement, each write conditional on the version read (E7).
//   5. Wait a bounded time for the leader's binder to place the set on one node (E8).
// Each write goes on one list of what to undo (admission::StartUndo); a refusal after the first
// write undoes it, so a refused start leaves nothing behind (E5).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "controller/admission/review.h"
#include "controller/admission/start.h"
#include "controller/admission/vmi.h"
#include "controller/webhook/json_paths.h"
#include "controller/webhook/webhooks.h"
#include "kube/client.h"

namespace cozy::controller::webhook {

class VmStart {
 public:
  // What a start needs of the webhooks: the client it writes with, the caches it reads, the
  // options, and a counter to bump (under the webhooks' lock).
  struct Parts {
    kube::Client& client;
    ClusterSource& cluster;
    const WebhookOptions& options;
    std::function<void(int64_t WebhookStats::*counter)> count;
  };
  // `deadline`: the API server's own timeout, less a margin; no write starts after it.
  VmStart(Parts parts, const admission::AdmissionRequest& request, std::string name,
          Clock::time_point deadline);

  // The answer: allowed with the VMI's gpus patch, or refused with the tenant's reason.
  admission::AdmissionResponse Run();

 private:
  std::optional<std::string> Check();
  bool OwnAnswered();
  std::optional<std::string> CreateTemplates();
  std::optional<std::string> Attach(const std::string& member);
  std::optional<std::string> AwaitPlacement();
  void Undo();
  void Detach(const std::string& device);  // throws what the last attempt met
  static constexpr int kDetachAttempts = 4;
  bool PastDeadline() const { return Clock::now() >= deadline_; }

  Parts parts_;
  const admission::AdmissionRequest& request_;
  const std::string name_;
  const Clock::time_point started_;
  const Clock::time_point deadline_;
  admission::VmiInput input_;
  std::vector<std::string> members_;
  admission::VmiStartPlan plan_;
  nlohmann::json patch_;
  admission::DeviceReader cached_;
  admission::StartUndo undo_;
};

}  // namespace cozy::controller::webhook
