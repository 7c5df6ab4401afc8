#include "controller/binder/node_conditions.h"

#include <string>
#include <unordered_map>
#include <vector>

#include "api/keys.h"
#include "api/time.h"
#include "controller/kinds.h"
#include "controller/model/readers.h"
#include "kube/errors.h"
#include "runtime/log.h"

namespace cozy::controller {
namespace {

// A node whose only obstacle is its taints takes the binds of the classes that select it and
// tolerate them (a tainted GPU pool, docs/install.md, "GPU nodes behind a taint"): True, naming
// those classes.
api::Condition TakesBinds(const model::Node* node, const std::string& name,
                          const std::vector<api::GpuClass>& classes) {
  api::Condition condition;
  condition.type = std::string(api::kTakesBindsCondition);
  if (node == nullptr) {
    condition.status = "False";
    condition.reason = "NodeMissing";
    condition.message = "no Node named " + name;
    return condition;
  }
  const model::NodeEligibility eligibility = model::CheckNodeEligibility(*node, {});
  if (eligibility.eligible) {
    condition.status = "True";
    condition.reason = "Eligible";
    condition.message = "schedulable, Ready and without a taint a VM must tolerate";
    return condition;
  }
  if (!eligibility.cordoned && node->ready) {
    std::string tolerating;
    for (const api::GpuClass& gpuClass : classes) {
      const auto& selector = gpuClass.spec.nodeSelector;
      if (!gpuClass.spec.tolerations.empty() && (!selector || selector->Matches(node->labels)) &&
          model::CheckNodeEligibility(*node, gpuClass.spec.tolerations).eligible) {
        tolerating += (tolerating.empty() ? "" : ", ") + gpuClass.metadata.name;
      }
    }
    if (!tolerating.empty()) {
      condition.status = "True";
      condition.reason = "Eligible";
      condition.message = "schedulable and Ready; its taints are tolerated by class " + tolerating;
      return condition;
    }
  }
  condition.status = "False";
  condition.reason = eligibility.cordoned ? "Cordoned" : (!node->ready ? "NotReady" : "Tainted");
  for (const std::string& reason : eligibility.reasons) {
    condition.message += (condition.message.empty() ? "" : "; ") + reason;
  }
  return condition;
}

}  // namespace

int64_t WriteNodeConditions(kube::Client& client, const kube::WriteOptions& write,
                            const kube::Leadership& leadership, const model::Snapshot& snapshot,
                            std::chrono::system_clock::time_point now) {
  std::unordered_map<std::string, const model::Node*> nodes;
  for (const model::Node& node : snapshot.nodes) {
    nodes[node.name] = &node;
  }
  int64_t writes = 0;
  for (const api::GpuNodeInventory& gpuNode : snapshot.gpuNodes) {
    auto found = nodes.find(gpuNode.nodeName);
    api::Condition wanted = TakesBinds(found == nodes.end() ? nullptr : found->second,
                                       gpuNode.nodeName, snapshot.classes);
    nlohmann::json conditions = nlohmann::json::array();
    bool same = false;
    bool present = false;
    for (const api::Condition& condition : gpuNode.conditions) {
      if (condition.type != wanted.type) {
        conditions.push_back(api::ToJson(condition));
        continue;
      }
      present = true;
      same = condition.status == wanted.status && condition.reason == wanted.reason &&
             condition.message == wanted.message;
      // The transition time moves only when the status does.
      wanted.lastTransitionTime =
          condition.status == wanted.status ? condition.lastTransitionTime : api::FormatTime(now);
    }
    if (present && same) {
      continue;
    }
    if (wanted.lastTransitionTime.empty()) {
      wanted.lastTransitionTime = api::FormatTime(now);
    }
    conditions.push_back(api::ToJson(wanted));
    if (!leadership.Leading()) {
      break;
    }
    try {
      // The list replaces the stored one: conditional on the version it was built from, so a
      // condition another writer added since is not lost (a 409 is read again next pass).
      client.MergePatchAt(kGpuNodes.Path("", gpuNode.nodeName, "status"),
                          {{"status", {{"conditions", conditions}}}}, gpuNode.resourceVersion,
                          write);
      ++writes;
    } catch (const kube::ApiError& error) {
      runtime::LogWarning("GPUNode condition write failed",
                          runtime::LogFields{{"node", gpuNode.nodeName}, {"error", error.what()}});
      if (error.kind() == kube::ErrorKind::kDeadlineExceeded) break;  // no longer leading
    }
  }
  return writes;
}

}  // namespace cozy::controller
