// Leader election on a coordination.k8s.io/v1 Lease, with client-go's semantics
// (tools/leaderelection): a candidate reads the Lease every retry period and takes it when it
// is free (no holder) or when the record has not changed for a lease duration as seen on its
// own clock; the leader renews it every retry period and steps down when it could not renew
// for the renew deadline; on Stop() a leader releases the Lease (ReleaseOnCancel: holder
// emptied, leaseDurationSeconds 1) so a standby takes over in about a retry period instead of
// a lease duration (G8).
//
// The elector runs on a thread of its own with a Client of its own (the caller's config and
// options, no in-call retries, requests bounded by the renew deadline), so a long LIST or a
// busy rate limit elsewhere in the process never delays a renewal.
//
// How long a leader may write (LeadingUntil): until the start of its last successful acquire
// or renew plus the renew deadline. That start is before the write that put the record in the
// Lease; a candidate starts its clock only once its read of that record has returned (as
// client-go sets observedTime after the get), so it cannot take the Lease before that start
// plus the lease duration. The renew deadline is the instant the leader steps down by anyway
// (client-go's renewDeadline), and the lease duration's margin past it (5 s by default) is
// for a write sent just before the instant to reach the server, and for the two clocks' rates.
// Leader-gated writes pass LeaderDeadline as their RequestOptions::deadline, so no attempt of
// theirs, first or retry, starts or runs past it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "kube/client.h"
#include "kube/clock.h"

namespace cozy::kube {

struct LeaderElectionOptions {
  std::string leaseNamespace;
  std::string leaseName;
  std::string identity;  // this candidate's holderIdentity; must not be empty
  // client-go's defaults. leaseDuration > renewDeadline > retryPeriod * jitter, as client-go
  // checks (its JitterFactor is 1.2).
  Duration leaseDuration = std::chrono::seconds(15);
  Duration renewDeadline = std::chrono::seconds(10);
  Duration retryPeriod = std::chrono::seconds(2);
  double jitter = 1.2;  // a candidate's wait is retryPeriod stretched by up to this fraction
  bool releaseOnCancel = true;
  // Callbacks, on the elector's thread; they must return quickly (hand work elsewhere).
  std::function<void()> onStartedLeading;
  // After leading: on Stop() (after the release) or when a renewal failed for the renew
  // deadline; `why` says which.
  std::function<void(const std::string& why)> onStoppedLeading;
  // The holder seen in the Lease changed ("" when released); also for this candidate.
  std::function<void(const std::string& identity)> onNewLeader;
  // What the elector has to say (failed requests, transitions), one line each; may be empty.
  std::function<void(const std::string& message)> log;
  RandomSource random;  // empty: seeded generator
};

// The spec of a Lease as client-go's LeaderElectionRecord reads it.
struct LeaderElectionRecord {
  std::string holderIdentity;
  int64_t leaseDurationSeconds = 0;
  std::string acquireTime;  // MicroTime, e.g. "2026-01-02T03:04:05.678901Z"
  std::string renewTime;
  int64_t leaseTransitions = 0;
  static LeaderElectionRecord FromLease(const nlohmann::json& lease);
  nlohmann::json ToSpec() const;
  bool operator==(const LeaderElectionRecord&) const = default;
};

// metav1.MicroTime's text form: RFC 3339 in UTC with exactly six fractional digits.
std::string FormatMicroTime(std::chrono::system_clock::time_point time);

class LeaderElector {
 public:
  // Throws std::invalid_argument for options client-go would refuse (an empty identity or
  // name, leaseDuration <= renewDeadline, renewDeadline <= jitter * retryPeriod).
  LeaderElector(Client& client, LeaderElectionOptions options);
  ~LeaderElector();  // Stop()
  LeaderElector(const LeaderElector&) = delete;
  LeaderElector& operator=(const LeaderElector&) = delete;

  // Starts campaigning on the elector's thread. Once only.
  void Start();
  // Ends the campaign: a leader releases the Lease (releaseOnCancel) and calls
  // onStoppedLeading before this returns. Waits at most about the renew deadline (a request
  // in flight). Safe to call more than once and from any thread but a callback's.
  void Stop();

  bool IsLeader() const { return leading_.load(); }
  // While leading: the start of the last successful acquire or renew plus the renew deadline
  // (see above), on the steady clock; std::nullopt when not leading, and from the moment a
  // release begins. Any thread.
  std::optional<TimePoint> LeadingUntil() const;
  std::string Leader() const;  // the holder last seen in the Lease, "" if none
  std::string LastError() const;
  // Whether the last release (on Stop) was written.
  bool Released() const { return released_.load(); }
  // The Lease's leaseTransitions as last read or written: how often leadership changed hands.
  int64_t Transitions() const { return transitions_.load(); }

 private:
  void Run();
  bool TryAcquireOrRenew();
  void Release();
  void ReportLeader(const std::string& holder);
  void StepDown(const std::string& why);
  void SetLeadingUntil(std::optional<TimePoint> until);
  bool WaitFor(Duration duration);  // false when stopping
  void Log(const std::string& message);
  std::string LeasePath() const;

  LeaderElectionOptions options_;
  std::unique_ptr<Client> client_;
  Duration requestTimeout_{};  // the longest any one request of the elector's may take
  std::thread thread_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::atomic<bool> leading_{false};
  // LeadingUntil's instant (steady clock ticks) while leading_; Clock::rep's minimum when not.
  std::atomic<Clock::rep> leadingUntil_{std::numeric_limits<Clock::rep>::min()};
  std::atomic<bool> released_{false};
  std::atomic<int64_t> transitions_{0};
  std::string reportedLeader_;  // guarded by mutex_
  std::string lastError_;       // guarded by mutex_
  bool reported_ = false;

  // The elector thread's own state.
  std::optional<LeaderElectionRecord> observed_;
  nlohmann::json observedLease_;  // the Lease as last read or written
  std::string lostTo_;            // set when a renewal found another holder
  // When the read (or write) that showed observed_ returned, and when the last successful
  // acquire or renew began.
  TimePoint observedTime_{};
  TimePoint lastRenew_{};
};

// The deadline of a leader-gated call (RequestOptions::deadline): none while `leading` is false
// (the replica stepped down, or is stopping), else `leadingUntil()` (LeaderElector::LeadingUntil;
// an empty one: no limit in time). Both are read before every attempt; `leading` must outlive
// the calls.
DeadlineSource LeaderDeadline(const std::atomic<bool>& leading, DeadlineSource leadingUntil);

// A replica's leadership, one handle for every part that works as the leader (the reconciler,
// the binder, their writes): whether it leads now, read before each pass and each write, and the
// deadline of its writes (LeaderDeadline over the elector's LeadingUntil). The daemon sets it
// from the elector's callbacks; a test makes one that leads with no limit in time.
class Leadership {
 public:
  explicit Leadership(bool leading = false, DeadlineSource until = {})
      : leading_(leading), until_(std::move(until)) {}
  Leadership(const Leadership&) = delete;
  Leadership& operator=(const Leadership&) = delete;

  bool Leading() const { return leading_.load(); }
  void Set(bool leading) { leading_.store(leading); }
  // Where the deadline comes from (LeaderElector::LeadingUntil; empty: no limit in time). Only
  // before any write reads Deadline: the elector is made after the parts that hold this.
  void SetUntil(DeadlineSource until) { until_ = std::move(until); }
  // The deadline of a leader-gated call (RequestOptions::deadline), read before every attempt:
  // none once this stops leading, else the instant the Lease lets it lead until.
  DeadlineSource Deadline() const {
    return LeaderDeadline(leading_, [this]() -> std::optional<TimePoint> {
      return until_ ? until_() : TimePoint::max();
    });
  }

 private:
  std::atomic<bool> leading_;
  DeadlineSource until_;
};

}  // namespace cozy::kube
