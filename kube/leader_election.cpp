#include "kube/leader_election.h"

#include "runtime/thread_name.h"

#include <algorithm>
#include <ctime>
#include <stdexcept>

namespace cozy::kube {
using nlohmann::json;

namespace {

std::string StringAt(const json& object, const char* key) {
  if (!object.is_object()) return "";
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

int64_t IntegerAt(const json& object, const char* key) {
  if (!object.is_object()) return 0;
  const auto it = object.find(key);
  return it != object.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

std::string Seconds(Duration duration) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(duration).count();
  return std::to_string(ms / 1000) + "." + std::to_string(ms % 1000 / 100) + " s";
}

}  // namespace

std::string FormatMicroTime(std::chrono::system_clock::time_point time) {
  const auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(time.time_since_epoch()).count();
  const std::time_t seconds = static_cast<std::time_t>(micros / 1000000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[40];
  const size_t length = std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &utc);
  char fraction[16];
  std::snprintf(fraction, sizeof fraction, ".%06lldZ", static_cast<long long>(micros % 1000000));
  return std::string(text, length) + fraction;
}

LeaderElectionRecord LeaderElectionRecord::FromLease(const json& lease) {
  LeaderElectionRecord record;
  const json spec = lease.is_object() ? lease.value("spec", json::object()) : json::object();
  record.holderIdentity = StringAt(spec, "holderIdentity");
  record.leaseDurationSeconds = IntegerAt(spec, "leaseDurationSeconds");
  record.acquireTime = StringAt(spec, "acquireTime");
  record.renewTime = StringAt(spec, "renewTime");
  record.leaseTransitions = IntegerAt(spec, "leaseTransitions");
  return record;
}

json LeaderElectionRecord::ToSpec() const {
  // client-go writes every field; an empty holder is written as "" when released.
  json spec = {{"holderIdentity", holderIdentity},
               {"leaseDurationSeconds", leaseDurationSeconds},
               {"leaseTransitions", leaseTransitions}};
  if (!acquireTime.empty()) spec["acquireTime"] = acquireTime;
  if (!renewTime.empty()) spec["renewTime"] = renewTime;
  return spec;
}

LeaderElector::LeaderElector(Client& client, LeaderElectionOptions options)
    : options_(std::move(options)) {
  if (options_.identity.empty()) throw std::invalid_argument("leader election: empty identity");
  if (options_.leaseName.empty() || options_.leaseNamespace.empty()) {
    throw std::invalid_argument("leader election: the Lease needs a name and a namespace");
  }
  if (options_.leaseDuration <= options_.renewDeadline) {
    throw std::invalid_argument(
        "leader election: leaseDuration must be greater than renewDeadline");
  }
  const auto jittered =
      std::chrono::duration_cast<Duration>(options_.retryPeriod * std::max(1.0, options_.jitter));
  if (options_.renewDeadline <= jittered) {
    throw std::invalid_argument(
        "leader election: renewDeadline must be greater than retryPeriod * jitter");
  }
  if (options_.retryPeriod <= Duration::zero() ||
      options_.leaseDuration < std::chrono::seconds(1)) {
    throw std::invalid_argument("leader election: retryPeriod and leaseDuration must be positive");
  }
  if (!options_.random) options_.random = DefaultRandomSource();
  // A client of its own: no retries inside a call (the elector's loop is the retry), no rate
  // limit shared with the informers, real time (the elector waits on a condition variable).
  ClientOptions clientOptions = client.options();
  clientOptions.time = nullptr;
  clientOptions.maxRetries = 0;
  clientOptions.requestTimeout = std::min(clientOptions.requestTimeout, options_.renewDeadline);
  clientOptions.userAgent += " leader-election";
  requestTimeout_ = clientOptions.requestTimeout;
  client_ = std::make_unique<Client>(client.config(), clientOptions);
}

LeaderElector::~LeaderElector() { Stop(); }

std::string LeaderElector::LeasePath() const {
  return ResourcePath("coordination.k8s.io", "v1", "leases", options_.leaseNamespace,
                      options_.leaseName);
}

void LeaderElector::Start() {
  std::lock_guard lock(mutex_);
  if (thread_.joinable() || stopping_) return;
  thread_ = std::thread([this] { Run(); });
}

void LeaderElector::Stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

std::string LeaderElector::Leader() const {
  std::lock_guard lock(mutex_);
  return reportedLeader_;
}

std::optional<TimePoint> LeaderElector::LeadingUntil() const {
  const Clock::rep until = leadingUntil_.load();
  if (until == std::numeric_limits<Clock::rep>::min() || !leading_.load()) return std::nullopt;
  return TimePoint(Clock::duration(until));
}

void LeaderElector::SetLeadingUntil(std::optional<TimePoint> until) {
  leadingUntil_ =
      until ? until->time_since_epoch().count() : std::numeric_limits<Clock::rep>::min();
}

DeadlineSource LeaderDeadline(const std::atomic<bool>& leading, DeadlineSource leadingUntil) {
  return [&leading, leadingUntil = std::move(leadingUntil)]() -> std::optional<TimePoint> {
    if (!leading.load()) return std::nullopt;
    if (!leadingUntil) return TimePoint::max();
    return leadingUntil();
  };
}

std::string LeaderElector::LastError() const {
  std::lock_guard lock(mutex_);
  return lastError_;
}

bool LeaderElector::WaitFor(Duration duration) {
  std::unique_lock lock(mutex_);
  wake_.wait_for(lock, duration, [this] { return stopping_; });
  return !stopping_;
}

void LeaderElector::Log(const std::string& message) {
  if (options_.log) options_.log(message);
}

void LeaderElector::ReportLeader(const std::string& holder) {
  {
    std::lock_guard lock(mutex_);
    if (reported_ && holder == reportedLeader_) return;
    reported_ = true;
    reportedLeader_ = holder;
  }
  Log("lease " + options_.leaseNamespace + "/" + options_.leaseName + ": leader is now \"" +
      holder + "\"");
  if (options_.onNewLeader) options_.onNewLeader(holder);
}

bool LeaderElector::TryAcquireOrRenew() {
  const TimePoint now = Clock::now();
  const std::string stamp = FormatMicroTime(std::chrono::system_clock::now());
  LeaderElectionRecord desired;
  desired.holderIdentity = options_.identity;
  desired.leaseDurationSeconds =
      std::chrono::duration_cast<std::chrono::seconds>(options_.leaseDuration).count();
  desired.acquireTime = stamp;
  desired.renewTime = stamp;
  // Every request of the attempt ends by its deadline, whatever the server does: a leader's
  // by the instant it leads until; a candidate's by the attempt's start plus the renew
  // deadline, so that a successful attempt (its start is the renew time) leads for a while.
  const TimePoint deadline = (leading_ ? lastRenew_ : now) + options_.renewDeadline;
  if (deadline <= now) return false;
  const auto bound = [&] {
    const Duration left = deadline - Clock::now();
    if (left < std::chrono::milliseconds(1)) {
      throw ApiError(ErrorKind::kDeadlineExceeded, 0, "",
                     "the attempt's deadline (the renew deadline) has passed", "", LeasePath());
    }
    client_->SetRequestTimeout(std::min(requestTimeout_, left));
  };
  const std::string path = LeasePath();
  try {
    json lease;
    try {
      bound();
      lease = client_->Get(path);
    } catch (const ApiError& error) {
      if (error.kind() != ErrorKind::kNotFound) throw;
      json fresh = {
          {"apiVersion", "coordination.k8s.io/v1"},
          {"kind", "Lease"},
          {"metadata", {{"name", options_.leaseName}, {"namespace", options_.leaseNamespace}}},
          {"spec", desired.ToSpec()}};
      bound();
      observedLease_ = client_->Create(
          ResourcePath("coordination.k8s.io", "v1", "leases", options_.leaseNamespace), fresh);
      observed_ = desired;
      transitions_ = observed_->leaseTransitions;
      observedTime_ = Clock::now();  // as client-go: once the write has returned
      lastRenew_ = now;
      return true;
    }
    // client-go sets observedTime when the get has returned, not before it was sent: a slow
    // read must not start this candidate's wait before the record it shows was written.
    const TimePoint observedAt = Clock::now();
    LeaderElectionRecord record = LeaderElectionRecord::FromLease(lease);
    if (!observed_ || !(*observed_ == record)) {
      observed_ = record;
      transitions_ = observed_->leaseTransitions;
      observedTime_ = observedAt;
    }
    observedLease_ = lease;
    // A Lease that names this candidate is its own to renew, as client-go's: also after it
    // stepped down (an API server that was away longer than the renew deadline), for nobody
    // else can have taken it while it still names this one, and the update below is conditional
    // on the version read. Waiting a lease duration there left the cluster without a leader.
    const bool ours = record.holderIdentity == options_.identity;
    if (!record.holderIdentity.empty() && !ours) {
      // Held by another: free only once the record has stood still for its lease duration on
      // this clock.
      if (now < observedTime_ + std::chrono::seconds(record.leaseDurationSeconds)) {
        if (leading_) lostTo_ = record.holderIdentity;
        return false;
      }
    }
    if (ours) {
      desired.acquireTime = record.acquireTime.empty() ? stamp : record.acquireTime;
      desired.leaseTransitions = record.leaseTransitions;
    } else {
      desired.leaseTransitions = record.leaseTransitions + 1;
    }
    json updated = lease;
    updated["spec"] = desired.ToSpec();  // client-go writes the whole spec
    bound();
    observedLease_ = client_->Update(path, updated);
    observed_ = desired;
    transitions_ = observed_->leaseTransitions;
    observedTime_ = Clock::now();  // as client-go: once the write has returned
    lastRenew_ = now;              // the renew time: before the write, never after it
    return true;
  } catch (const std::exception& error) {
    const auto* apiError = dynamic_cast<const ApiError*>(&error);
    if (apiError && apiError->kind() == ErrorKind::kDeadlineExceeded) {
      return false;  // out of time, not a failure of its own: the last error stays
    }
    std::lock_guard lock(mutex_);
    lastError_ = error.what();
    return false;
  }
}

void LeaderElector::Release() {
  if (!observed_ || observed_->holderIdentity != options_.identity || observedLease_.is_null()) {
    return;
  }
  const std::string lease = options_.leaseNamespace + "/" + options_.leaseName;
  SetLeadingUntil(std::nullopt);  // no leader-gated attempt starts once the release may land
  const TimePoint deadline = Clock::now() + options_.renewDeadline;
  // As client-go: bounded by the renew deadline, and again from a fresh read after a 409
  // (a renewal of ours may have moved the resourceVersion on) while the Lease still names us.
  for (int attempt = 0; attempt < 3; ++attempt) {
    const Duration left = deadline - Clock::now();
    if (left <= Duration::zero()) break;
    client_->SetRequestTimeout(std::min(requestTimeout_, left));
    const std::string stamp = FormatMicroTime(std::chrono::system_clock::now());
    LeaderElectionRecord record;
    record.leaseDurationSeconds = 1;
    record.acquireTime = stamp;
    record.renewTime = stamp;
    record.leaseTransitions = observed_->leaseTransitions;
    json updated = observedLease_;
    updated["spec"] = record.ToSpec();
    try {
      observedLease_ = client_->Update(LeasePath(), updated);
      observed_ = record;
      transitions_ = observed_->leaseTransitions;
      released_ = true;
      Log("lease " + lease + ": released");
      return;
    } catch (const ApiError& error) {
      {
        std::lock_guard lock(mutex_);
        lastError_ = error.what();
      }
      Log("lease " + lease + ": release failed: " + error.what());
      if (error.kind() != ErrorKind::kConflict) return;
    }
    try {
      json fresh = client_->Get(LeasePath());
      LeaderElectionRecord current = LeaderElectionRecord::FromLease(fresh);
      if (current.holderIdentity != options_.identity) return;  // not ours to release
      observedLease_ = fresh;
      observed_ = current;
      transitions_ = observed_->leaseTransitions;
    } catch (const std::exception& error) {
      std::lock_guard lock(mutex_);
      lastError_ = error.what();
      return;
    }
  }
}

void LeaderElector::StepDown(const std::string& why) {
  SetLeadingUntil(std::nullopt);
  leading_ = false;
  Log("lease " + options_.leaseNamespace + "/" + options_.leaseName + ": stopped leading: " + why);
  if (options_.onStoppedLeading) options_.onStoppedLeading(why);
}

void LeaderElector::Run() {
  runtime::NameThisThread("lease");
  const std::string lease = options_.leaseNamespace + "/" + options_.leaseName;
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
    }
    if (!TryAcquireOrRenew()) {
      if (observed_) ReportLeader(observed_->holderIdentity);
      const auto wait = std::chrono::duration_cast<Duration>(
          options_.retryPeriod * (1.0 + options_.jitter * options_.random()));
      if (!WaitFor(wait)) return;
      continue;
    }
    SetLeadingUntil(lastRenew_ + options_.renewDeadline);
    leading_ = true;
    lostTo_.clear();
    Log("lease " + lease + ": acquired by \"" + options_.identity + "\"");
    ReportLeader(options_.identity);
    if (options_.onStartedLeading) options_.onStartedLeading();
    for (;;) {
      // Wakes at the renew deadline at the latest, so a leader that cannot renew steps down
      // on time, not a retry period late.
      const Duration untilDeadline =
          std::max(Duration::zero(), lastRenew_ + options_.renewDeadline - Clock::now());
      if (!WaitFor(std::min(options_.retryPeriod, untilDeadline))) {
        if (options_.releaseOnCancel) Release();
        StepDown("stopped");
        return;
      }
      if (TryAcquireOrRenew()) {
        SetLeadingUntil(lastRenew_ + options_.renewDeadline);
        continue;
      }
      if (!lostTo_.empty()) {
        ReportLeader(lostTo_);
        StepDown("the lease is held by \"" + lostTo_ + "\"");
        break;
      }
      if (Clock::now() - lastRenew_ >= options_.renewDeadline) {
        const std::string why = "failed to renew within the renew deadline (" +
                                Seconds(options_.renewDeadline) + "): " + LastError();
        if (options_.releaseOnCancel) Release();
        StepDown(why);
        break;
      }
    }
  }
}

}  // namespace cozy::kube
