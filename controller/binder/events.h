// Events for tenants and hosters (docs/controller.md, "Events"), shaped like client-go's
// recorder: an object, a type, a reason, an action and a note make one events.k8s.io/v1 Event,
// named as client-go names them ("<object>.<unix nanoseconds in hex>") and written by a sender
// thread of its own, so no pass waits on the API server for an Event. Held back: the same
// (uid, reason, note) within kRepeat, more than kPerPass in one pass, and more than the queue
// limit waiting for the sender (dropped, counted). Written with the writer's options (a leader's
// Events end with its Lease, as its other writes do).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "kube/client.h"
#include "runtime/worker.h"

namespace cozy::controller {

class EventRecorder {
 public:
  static constexpr std::chrono::minutes kRepeat{10};
  static constexpr int kPerPass = 100;
  static constexpr int64_t kQueue = 1000;
  // Where an Event about a cluster-scoped object goes.
  inline static const std::string kClusterNamespace = "default";

  // An Event made, not yet handed to the sender.
  struct Pending {
    std::string key;  // (uid, reason, note): the rate limit's key
    std::string eventNamespace;
    std::string what;  // the object, for the log
    nlohmann::json body;
    bool written = false;
    std::string error;
  };

  // `identity` is the reporting instance (this replica); `client` and `write` outlive this.
  EventRecorder(kube::Client& client, const kube::WriteOptions& write, std::string identity);
  EventRecorder(const EventRecorder&) = delete;
  EventRecorder& operator=(const EventRecorder&) = delete;

  // A pass begins: its own kPerPass.
  void BeginPass() { thisPass_ = 0; }
  // The Event for `regarding` (apiVersion, kind, namespace, name, uid), or none when the rate
  // limit holds it back (`suppressed` counts it). Its place in this pass is taken now, so Events
  // made together stay within the limit.
  std::optional<Pending> Make(const nlohmann::json& regarding, const std::string& eventNamespace,
                              const std::string& uid, const std::string& action,
                              const std::string& reason, const std::string& type, std::string note,
                              std::chrono::system_clock::time_point now, int64_t& suppressed);
  // Hands it to the sender (`queued` counts it), or drops it when the queue is full.
  void Post(Pending event, std::chrono::system_clock::time_point now, int64_t& queued);
  // Make, then Post.
  void Record(const nlohmann::json& regarding, const std::string& eventNamespace,
              const std::string& uid, const std::string& action, const std::string& reason,
              const std::string& type, std::string note, std::chrono::system_clock::time_point now,
              int64_t& queued, int64_t& suppressed);

  void SetQueueLimit(int64_t limit) { queueLimit_ = limit; }
  // Waits until every Event handed over is sent (or failed), at most `limit`; whether they are.
  bool WaitForQueued(std::chrono::milliseconds limit);
  // Any thread.
  int64_t Written() const { return written_.load(); }
  int64_t Failed() const { return failed_.load(); }
  int64_t Dropped() const { return dropped_.load(); }

 private:
  void Send(Pending& event);  // the sender's thread

  kube::Client& client_;
  const kube::WriteOptions& write_;
  std::string identity_;
  std::map<std::string, std::chrono::system_clock::time_point> sent_;  // key -> when
  int thisPass_ = 0;
  int64_t queueLimit_ = kQueue;
  std::atomic<int64_t> queued_{0};
  std::atomic<int64_t> written_{0};
  std::atomic<int64_t> failed_{0};
  std::atomic<int64_t> dropped_{0};
  std::mutex mutex_;
  std::condition_variable drained_;
  runtime::Worker sender_{"events"};  // declared last: stopped before the rest goes
};

}  // namespace cozy::controller
