#include "agent/sources/gpunode_publisher.h"

#include "runtime/log.h"

#include "api/gpunode.h"

namespace cozy::agent {
using nlohmann::json;

namespace {

// RFC 7386 difference of two values: what a merge patch must say to turn `from` into `to`.
json MergeDiff(const json& from, const json& to) {
  if (!from.is_object() || !to.is_object()) return to;
  json patch = json::object();
  for (const auto& [key, value] : from.items()) {
    if (!to.contains(key)) patch[key] = nullptr;
  }
  for (const auto& [key, value] : to.items()) {
    auto old = from.find(key);
    if (old == from.end()) {
      patch[key] = value;
    } else if (*old != value) {
      patch[key] = old->is_object() && value.is_object() ? MergeDiff(*old, value) : value;
    }
  }
  return patch;
}

}  // namespace

json AgentOwnedStatus(const json& status) {
  json owned = json::object();
  if (!status.is_object()) return owned;
  for (std::string_view field : api::kAgentOwnedStatusFields) {
    auto it = status.find(std::string(field));
    if (it != status.end() && !it->is_null()) owned[std::string(field)] = *it;
  }
  return owned;
}

json AgentStatusPatch(const json& last, const json& desired) {
  return MergeDiff(AgentOwnedStatus(last), AgentOwnedStatus(desired));
}

Publisher::Publisher(kube::Client& client, std::string nodeName, PublisherOptions options)
    : client_(client),
      nodeName_(std::move(nodeName)),
      objectPath_(
          kube::ResourcePath(api::kGroup, api::kVersion, api::kGpuNodePlural, "", nodeName_)),
      statusPath_(kube::ResourcePath(api::kGroup, api::kVersion, api::kGpuNodePlural, "", nodeName_,
                                     "status")),
      backoff_(options.backoff, options.random ? options.random : kube::DefaultRandomSource()) {}

void Publisher::EnsureObject(PublishResult& result) {
  try {
    json object = client_.Get(objectPath_);
    written_ = AgentOwnedStatus(object.value("status", json::object()));
    return;
  } catch (const kube::ApiError& error) {
    if (error.kind() != kube::ErrorKind::kNotFound) throw;
  }
  // Missing: create it owned by the Node, so it goes when the node goes. Without the Node
  // there is nothing to own it; an unowned GPUNode would outlive a mistyped or removed node
  // and offer its GPUs to the binder forever, so wait (as a transient failure) instead.
  json node = client_.Get(kube::ResourcePath("", "v1", "nodes", "", nodeName_));
  std::string uid = node.value("metadata", json::object()).value("uid", "");
  json object = {
      {"apiVersion", api::kApiVersion},
      {"kind", api::kGpuNodeKind},
      {"metadata",
       {{"name", nodeName_},
        {"ownerReferences",
         json::array(
             {{{"apiVersion", "v1"}, {"kind", "Node"}, {"name", nodeName_}, {"uid", uid}}})}}},
      {"spec", json::object()}};
  try {
    json created =
        client_.Create(kube::ResourcePath(api::kGroup, api::kVersion, api::kGpuNodePlural), object);
    ++result.writes;
    written_ = AgentOwnedStatus(created.value("status", json::object()));
  } catch (const kube::ApiError& error) {
    if (error.kind() != kube::ErrorKind::kAlreadyExists) throw;
    // Someone (an earlier attempt whose answer was lost) created it meanwhile.
    json existing = client_.Get(objectPath_);
    written_ = AgentOwnedStatus(existing.value("status", json::object()));
  }
}

PublishResult Publisher::Publish(const json& desiredStatus, kube::TimePoint now) {
  PublishResult result;
  if (now < retryAt_) {
    result.outcome = PublishOutcome::kWaiting;
    result.retryAt = retryAt_;
    return result;
  }
  const json desired = AgentOwnedStatus(desiredStatus);
  try {
    // Twice at most: a patch that finds the object deleted recreates it once.
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (!written_) EnsureObject(result);
      json patch = AgentStatusPatch(*written_, desired);
      if (patch.empty()) break;
      try {
        client_.MergePatch(statusPath_, {{"status", patch}});
      } catch (const kube::ApiError& error) {
        if (error.kind() != kube::ErrorKind::kNotFound || attempt > 0) throw;
        written_.reset();
        continue;
      }
      ++result.writes;
      written_ = desired;
      break;
    }
  } catch (const std::exception& error) {
    // Also when the answer to a patch was lost: written_ still holds the older state, so
    // the next attempt sends the same (idempotent) difference again.
    retryAt_ = now + RetryWait(backoff_, error);
    result.outcome = PublishOutcome::kFailed;
    result.retryAt = retryAt_;
    result.error = "publishing GPUNode " + nodeName_ + ": " + error.what();
    return result;
  }
  backoff_.Reset();
  retryAt_ = {};
  result.outcome = result.writes > 0 ? PublishOutcome::kPublished : PublishOutcome::kUnchanged;
  return result;
}

ApiStatusPublisher::ApiStatusPublisher(kube::Client& client, const std::string& nodeName)
    : client_(client), publisher_(client, nodeName) {}

std::optional<std::chrono::milliseconds> ApiStatusPublisher::ReadyIn() {
  return ClientReadyIn(client_);
}

PublishAttempt ApiStatusPublisher::Publish(const json& status) {
  const auto now = kube::Clock::now();
  const PublishResult result = publisher_.Publish(status, now);
  PublishAttempt attempt;
  attempt.writes = result.writes;
  switch (result.outcome) {
    case PublishOutcome::kPublished:
      runtime::LogInfo("published GPUNode", {{"node", publisher_.nodeName()},
                                             {"writes", std::to_string(result.writes)}});
      lastError_.clear();
      attempt.outcome = PublishAttempt::Outcome::kWritten;
      return attempt;
    case PublishOutcome::kUnchanged:
      lastError_.clear();
      attempt.outcome = PublishAttempt::Outcome::kUnchanged;
      return attempt;
    case PublishOutcome::kWaiting:
    case PublishOutcome::kFailed:
      break;
  }
  if (result.outcome == PublishOutcome::kFailed && result.error != lastError_) {
    // One line per kind of failure, not one per retry.
    runtime::LogWarning("cannot publish GPUNode; retrying with backoff",
                        {{"node", publisher_.nodeName()}, {"reason", result.error}});
    lastError_ = result.error;
  }
  attempt.outcome = PublishAttempt::Outcome::kFailed;
  attempt.retryIn =
      std::max(std::chrono::duration_cast<std::chrono::milliseconds>(result.retryAt - now),
               std::chrono::milliseconds(10));
  return attempt;
}

}  // namespace cozy::agent
