#include "controller/reconciler/apply.h"

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
    const std::string kind(action.target.kind);
    // Each action counted once, under its object's kind and its reconciler, by its result.
    auto count = [&](const std::string& result) {
      ++counts.writes[{kind, result}];
      ++counts.byReconciler[{action.reconciler, result}];
    };
    auto memo = memo_.find(key);
    if (memo != memo_.end() && memo->second.resourceVersion == action.resourceVersion) {
      count("skipped");  // written from this version already; awaiting the watch
      continue;
    }
    if (backoff_.HeldOff(key, now, action.resourceVersion)) {
      ++counts.heldOff;
      count("backoff");  // failed lately: tried again once its delay is over
      continue;
    }
    if (!leadership_.Leading()) {
      ++counts.failed;
      ++counts.byReconciler[{action.reconciler, "not-leading"}];
      continue;  // stepped down mid-pass: the new leader plans afresh
    }
    std::string result = "ok";
    try {
      ApplyOne(action);
      backoff_.Succeeded(key);
      memo_[key] = Memo{action.resourceVersion, now};
      runtime::LogInfo(
          "reconciled",
          LogFields{{"action", action.what}, {"object", key}, {"reason", action.reason}});
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
      LogFields fields{
          {"action", action.what}, {"object", key}, {"result", result}, {"error", error.what()}};
      if (const int failures = backoff_.Failures(key); failures > 0) {
        fields.emplace_back("failuresInARow", std::to_string(failures));
      }
      runtime::Logger::Get().Write(level, "reconcile write failed", std::move(fields));
    }
    count(result);
  }
  counts.retryAt = backoff_.NextRetry(now);
  counts.backingOff = backoff_.HeldCount(now);
  return counts;
}

void Applier::ApplyOne(const Action& action) {
  const kube::WriteOptions options{false, kFieldManager, {deadline_}};
  switch (action.verb) {
    case Verb::kMergePatch:
      client_.MergePatchAt(action.target.Path(), action.body, action.resourceVersion, options);
      return;
    case Verb::kDelete: {
      kube::DeleteOptions remove;
      remove.request.deadline = deadline_;
      remove.preconditionUid = action.uid;
      remove.preconditionResourceVersion = action.resourceVersion;
      client_.Delete(action.target.Path(), remove);
      return;
    }
    case Verb::kApply:
      if (!action.stored) {
        client_.Create(action.target.CollectionPath(), action.body, options);
      } else {
        client_.Update(action.target.Path(), Overlay(*action.stored, action.body), options);
      }
      return;
  }
}

}  // namespace cozy::controller
