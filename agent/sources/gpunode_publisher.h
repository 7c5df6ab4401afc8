// Publishes this node's GPUNode (DESIGN §4.5): creates the object if it is missing, then
// merge-patches /status with the agent-owned fields only, and only what changed since the
// last successful write. Failures never escape: they come back as a time to try again, so
// the caller's event loop keeps discovery, health and D-Bus running meanwhile.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "agent/sources/publish.h"
#include "kube/backoff.h"
#include "kube/client.h"

namespace cozy::agent {

struct PublisherOptions {
  // Between failed attempts: 1 s growing to a minute, stretched at random so a fleet of
  // agents does not return in step after an API outage.
  kube::BackoffPolicy backoff{std::chrono::seconds(1), std::chrono::seconds(60), 2.0, 1.0};
  kube::RandomSource random;  // empty: seeded generator
};

enum class PublishOutcome {
  kPublished,  // a patch (and maybe a create) went through
  kUnchanged,  // the object already says what the agent knows: nothing sent
  kWaiting,    // called before retryAt after a failure: nothing sent
  kFailed,     // a request failed; try again at retryAt
};

struct PublishResult {
  PublishOutcome outcome = PublishOutcome::kUnchanged;
  // When to call Publish again at the latest; TimePoint::max() when nothing is pending.
  kube::TimePoint retryAt = kube::TimePoint::max();
  int writes = 0;     // creates and patches this call sent
  std::string error;  // what failed, for the log; empty unless kFailed
};

class Publisher {
 public:
  // `client` should have maxRetries = 0: the publisher schedules its own retries, and a call
  // that sleeps inside would stall the caller's loop.
  Publisher(kube::Client& client, std::string nodeName, PublisherOptions options = {});

  // Brings the GPUNode in line with `desiredStatus` (keys other than the agent-owned ones are
  // ignored). Sends nothing while the last write still holds.
  PublishResult Publish(const nlohmann::json& desiredStatus, kube::TimePoint now);

  // Forgets what the server holds, so the next Publish reads the object again (a slow resync,
  // or after something else may have changed it).
  void Invalidate() { written_.reset(); }

  // The agent-owned status last known to be on the server, if known.
  const std::optional<nlohmann::json>& LastWritten() const { return written_; }
  const std::string& nodeName() const { return nodeName_; }

 private:
  void EnsureObject(PublishResult& result);

  kube::Client& client_;
  std::string nodeName_;
  std::string objectPath_;
  std::string statusPath_;
  kube::Backoff backoff_;
  std::optional<nlohmann::json> written_;
  kube::TimePoint retryAt_{};
};

// The agent-owned part of a status: resourceNames, devices and unplaced, when present.
nlohmann::json AgentOwnedStatus(const nlohmann::json& status);

// The RFC 7386 merge patch over the agent-owned keys that turns `last` into `desired`: a key
// that differs carries its new value (arrays whole, objects by their differences), a key the
// agent no longer has is null, and no other key (conditions!) ever appears. Empty when equal.
nlohmann::json AgentStatusPatch(const nlohmann::json& last, const nlohmann::json& desired);

// The Publisher as the daemon's StatusPublisher: runs on the publish source's thread, logs one
// line per kind of failure, and maps results to attempts.
class ApiStatusPublisher : public StatusPublisher {
 public:
  ApiStatusPublisher(kube::Client& client, const std::string& nodeName);
  PublishAttempt Publish(const nlohmann::json& status) override;
  // While the client's rate limit (client-go's 5 qps, burst 10) has no token: how long until it
  // has one.
  std::optional<std::chrono::milliseconds> ReadyIn() override;
  void Invalidate() override { publisher_.Invalidate(); }

 private:
  kube::Client& client_;
  Publisher publisher_;
  std::string lastError_;
};

}  // namespace cozy::agent
