// Where the status goes (the API server's GPUNode, in `run`), as a source of the daemon: it
// writes on a thread of its own, so an API server that answers after 9 s holds that thread and
// never the loop, and its input is the object on the server: a resync re-reads it and repairs
// an outside edit of the agent's own fields (drift).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "agent/sources/source.h"
#include "kube/backoff.h"
#include "kube/client.h"
#include "runtime/worker.h"

namespace cozy::agent {

struct PublishAttempt {
  enum class Outcome {
    kWritten,    // a write changed the object
    kUnchanged,  // the object already said it: nothing written
    kFailed,     // try again after retryIn
  };
  Outcome outcome = Outcome::kUnchanged;
  std::chrono::milliseconds retryIn{0};
  int writes = 0;
};

// The writer the source drives. Publish and Invalidate run on the source's thread only;
// ReadyIn on the loop thread.
class StatusPublisher {
 public:
  virtual ~StatusPublisher() = default;
  // Brings the agent-owned status fields in line with `status`. May block (bounded by the
  // client's timeouts).
  virtual PublishAttempt Publish(const nlohmann::json& status) = 0;
  // nullopt when Publish may write now; else how long to wait first (a client-side rate limit
  // that would otherwise sleep inside the request). Waiting is not a failure.
  virtual std::optional<std::chrono::milliseconds> ReadyIn() { return std::nullopt; }
  // Forget what the server holds: the next Publish reads the object again.
  virtual void Invalidate() {}
};

// What the API publishers (the GPUNode's, the ResourceSlice's), which share the daemon's client,
// have in common. While `client`'s rate limit (client-go's 5 qps, burst 10) has no token: how
// long until it has one (StatusPublisher::ReadyIn).
std::optional<std::chrono::milliseconds> ClientReadyIn(kube::Client& client);
// How long to wait after `error`: the backoff's next step, or the server's Retry-After when longer.
kube::Duration RetryWait(kube::Backoff& backoff, const std::exception& error);

struct PublishCounters {
  int64_t written = 0;    // attempts that changed the object
  int64_t unchanged = 0;  // attempts that found nothing to write
  int64_t failed = 0;
  int64_t waits = 0;  // postponed by the client-side rate limit
};

class PublishSource : public Source {
 public:
  // `name`: the source's and its writer thread's (at most 15 bytes).
  explicit PublishSource(std::unique_ptr<StatusPublisher> publisher,
                         std::string name = "publisher");
  ~PublishSource() override;
  std::string_view Name() const override { return name_; }
  void Start(runtime::Loop& loop, Changed changed) override;
  // Re-read the object and repair what differs from the last status offered.
  void Refresh(bool force) override;

  // Loop thread: the status to publish. Statuses offered while a write is under way are
  // coalesced: the next write carries the latest.
  void Offer(nlohmann::json status);
  const PublishCounters& counters() const { return counters_; }

 private:
  void Kick();
  void OnDone(nlohmann::json status, PublishAttempt attempt);

  std::unique_ptr<StatusPublisher> publisher_;
  std::string name_;
  runtime::Loop* loop_ = nullptr;
  runtime::Timer timer_;  // the rate limit's wait, or the retry after a failure
  std::optional<nlohmann::json> desired_;
  std::optional<nlohmann::json> confirmed_;
  bool inFlight_ = false;
  bool forced_ = false;  // a resync: write (or check) even when nothing changed here
  PublishCounters counters_;
  std::unique_ptr<runtime::Worker> worker_;  // last: stopped first
};

}  // namespace cozy::agent
