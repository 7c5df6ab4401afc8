#include "controller/reconciler/apply.h"

#include <stdexcept>

#include "api/keys.h"
#include "api/usage_record.h"
#include "controller/kinds.h"
#include "kube/errors.h"
#include "kube/leader_election.h"
#include "runtime/log.h"

namespace cozy::controller {
namespace {

using runtime::LogFields;

// The stored object with the desired one's labels, owner references, spec, status and data
// laid over it: what an update sends, so fields others own (annotations, a hoster's labels)
// are kept.
nlohmann::json Overlay(nlohmann::json stored, const nlohmann::json& desired) {
  nlohmann::json& metadata = stored["metadata"];
  const nlohmann::json& want = desired.at("metadata");
  const nlohmann::json labels = want.value("labels", nlohmann::json::object());
  for (const auto& [key, value] : labels.items()) {
    metadata["labels"][key] = value;
  }
  if (want.contains("ownerReferences")) {
    metadata["ownerReferences"] = want.at("ownerReferences");
  }
  for (const char* part : {"spec", "status", "data"}) {
    if (desired.contains(part)) {
      stored[part] = desired.at(part);
    }
  }
  return stored;
}

}  // namespace

std::string ActionPath(const Action& action, bool status) {
  const std::string subresource = status ? "status" : "";
  // TargetKind names every action kind (-Wswitch holds it to that); each kind has its path.
  const std::string_view kind = TargetKind(action.kind);
  if (kind == api::kGpuClassKind) return kGpuClasses.Path("", action.name, subresource);
  if (kind == api::kGpuDeviceKind) {
    return kGpuDevices.Path(action.namespaceName, action.name, subresource);
  }
  if (kind == api::kWorkloadMonitorKind) {
    return kWorkloadMonitors.Path(action.namespaceName, action.name);
  }
  if (kind == api::kWorkloadKind) return kWorkloads.Path(action.namespaceName, action.name);
  if (kind == "ConfigMap") return kConfigMaps.Path(action.namespaceName, action.name);
  throw std::logic_error("ActionPath: no path for the kind " + std::string(kind));
}

Applier::Applier(kube::Client& client, const kube::Leadership& leadership,
                 kube::BackoffPolicy retry)
    : client_(client), leadership_(leadership), deadline_(leadership.Deadline()), backoff_(retry) {}

ApplyCounts Applier::Apply(const std::vector<Action>& actions,
                           std::chrono::steady_clock::time_point now) {
  ApplyCounts counts;
  for (auto it = memo_.begin(); it != memo_.end();) {
    it = now - it->second.at > kMemoLife ? memo_.erase(it) : std::next(it);
  }
  backoff_.Prune(now);
  for (const Action& action : actions) {
    const std::string key = action.Key();
    const std::string kind(TargetKind(action.kind));
    auto memo = memo_.find(key);
    if (memo != memo_.end() && memo->second.resourceVersion == action.resourceVersion) {
      ++counts.writes[{kind, "skipped"}];  // written from this version already; awaiting the watch
      continue;
    }
    if (backoff_.HeldOff(key, now, action.resourceVersion)) {
      ++counts.heldOff;
      ++counts.writes[{kind, "backoff"}];  // failed lately: tried again once its delay is over
      continue;
    }
    if (!leadership_.Leading()) {
      ++counts.failed;
      continue;  // stepped down mid-pass: the new leader plans afresh
    }
    std::string result = "ok";
    try {
      ApplyOne(action);
      backoff_.Succeeded(key);
      memo_[key] = Memo{action.resourceVersion, now};
      runtime::LogInfo("reconciled", LogFields{{"action", std::string(ToString(action.kind))},
                                               {"object", key},
                                               {"reason", action.reason}});
    } catch (const kube::ApiError& error) {
      ++counts.failed;
      switch (error.kind()) {
        case kube::ErrorKind::kConflict:
          // Stale read, or someone else wrote first: the next pass reads again.
          // Held off while the plan reads this version; a newer one in the cache goes at once.
          result = "conflict";
          ++counts.conflicts;
          backoff_.Failed(key, now, action.resourceVersion);
          break;
        case kube::ErrorKind::kNotFound:
          result = "gone";  // deleted since the cache saw it: nothing left to do
          backoff_.Succeeded(key);
          memo_[key] = Memo{action.resourceVersion, now};
          break;
        case kube::ErrorKind::kForbidden:
          result = "forbidden";  // e.g. a namespace being terminated refuses creates
          backoff_.Succeeded(key);
          memo_[key] = Memo{action.resourceVersion, now};
          break;
        default:
          result = "error";  // this object waits its backoff; the rest of the pass goes on
          backoff_.Failed(key, now);
          break;
      }
      auto level = result == "error" ? runtime::LogLevel::kWarning : runtime::LogLevel::kDebug;
      LogFields fields{{"action", std::string(ToString(action.kind))},
                       {"object", key},
                       {"result", result},
                       {"error", error.what()}};
      if (const int failures = backoff_.Failures(key); failures > 0) {
        fields.emplace_back("failuresInARow", std::to_string(failures));
      }
      runtime::Logger::Get().Write(level, "reconcile write failed", std::move(fields));
    }
    ++counts.writes[{kind, result}];
  }
  counts.retryAt = backoff_.NextRetry(now);
  counts.backingOff = backoff_.HeldCount(now);
  return counts;
}

void Applier::ApplyOne(const Action& action) {
  const kube::WriteOptions options{false, kFieldManager, {deadline_}};
  switch (action.kind) {
    case ActionKind::kAddClassFinalizer:
    case ActionKind::kRemoveClassFinalizer:
    case ActionKind::kAddDeviceFinalizer:
    case ActionKind::kRemoveDeviceFinalizer:
      client_.MergePatchAt(ActionPath(action), action.body, action.resourceVersion, options);
      return;
    case ActionKind::kStampAttachment:
    case ActionKind::kMatchAttachment:
    case ActionKind::kClearAttachment:
    case ActionKind::kReleaseDevice:
      client_.MergePatchAt(ActionPath(action, true), action.body, action.resourceVersion, options);
      return;
    case ActionKind::kDeleteTemplateDevice:
    case ActionKind::kDeleteRecord:
    case ActionKind::kDeleteMonitor: {
      kube::DeleteOptions remove;
      remove.request.deadline = deadline_;
      remove.preconditionUid = action.uid;
      remove.preconditionResourceVersion = action.resourceVersion;
      client_.Delete(ActionPath(action), remove);
      return;
    }
    case ActionKind::kApplyMonitor:
    case ActionKind::kApplyRecord:
    case ActionKind::kApplySettings: {
      if (!action.stored) {
        const std::string path = ActionPath(action);
        client_.Create(path.substr(0, path.rfind('/')), action.body, options);
      } else {
        client_.Update(ActionPath(action), Overlay(*action.stored, action.body), options);
      }
      return;
    }
  }
}

}  // namespace cozy::controller
