// Leader election on a Lease against the fake API server, on real time with short periods
// (lease 3 s, renew deadline 2 s, retry 0.5 s): one leader, a release that hands over in
// about a retry period (G8), a leader cut off from the API server that steps down within its
// renew deadline, and renewals that a 9 s LIST elsewhere in the process does not hold up.
#include "kube/leader_election.h"

#include <atomic>
#include <regex>
#include <thread>

#include <gtest/gtest.h>

#include <functional>

#include "kube/informer.h"
#include "test/kube/kube_test_support.h"
#include "test/support/process.h"

namespace cozy::kube {
namespace {
using nlohmann::json;
using namespace std::chrono_literals;

constexpr Duration kLease = 3s;
constexpr Duration kRenew = 2s;
constexpr Duration kRetry = 500ms;
const std::string kLeasePath = "/apis/coordination.k8s.io/v1/namespaces/cozy-system/leases/ctl";

// The fake serves Lease (coordination.k8s.io/v1) as a built-in kind; the Lease's namespace
// must exist before the first candidate creates it there, as on a real cluster.
std::unique_ptr<fake::FakeApiServer> StartWithLeases() {
  fake::FakeApiServerOptions options;
  options.bookmarkInterval = 100ms;
  auto server = std::make_unique<fake::FakeApiServer>(options);
  server->Seed(
      {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "cozy-system"}}}});
  server->Start();
  return server;
}

// One candidate with its callbacks recorded.
class Candidate {
 public:
  Candidate(Client& client, const std::string& identity,
            const std::function<void(LeaderElectionOptions&)>& adjust = {}) {
    LeaderElectionOptions options;
    options.leaseNamespace = "cozy-system";
    options.leaseName = "ctl";
    options.identity = identity;
    options.leaseDuration = kLease;
    options.renewDeadline = kRenew;
    options.retryPeriod = kRetry;
    options.onStartedLeading = [this] {
      std::lock_guard lock(mutex_);
      startedAt_.push_back(Clock::now());
    };
    options.onStoppedLeading = [this](const std::string& why) {
      std::lock_guard lock(mutex_);
      stoppedAt_.push_back(Clock::now());
      stopWhy_.push_back(why);
    };
    options.onNewLeader = [this](const std::string& leader) {
      std::lock_guard lock(mutex_);
      leaders_.push_back(leader);
    };
    if (adjust) adjust(options);
    elector_ = std::make_unique<LeaderElector>(client, options);
  }
  LeaderElector& elector() { return *elector_; }
  std::vector<Clock::time_point> StartedAt() const {
    std::lock_guard lock(mutex_);
    return startedAt_;
  }
  std::vector<Clock::time_point> StoppedAt() const {
    std::lock_guard lock(mutex_);
    return stoppedAt_;
  }
  std::vector<std::string> StopWhy() const {
    std::lock_guard lock(mutex_);
    return stopWhy_;
  }
  std::vector<std::string> Leaders() const {
    std::lock_guard lock(mutex_);
    return leaders_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<Clock::time_point> startedAt_;
  std::vector<Clock::time_point> stoppedAt_;
  std::vector<std::string> stopWhy_;
  std::vector<std::string> leaders_;
  std::unique_ptr<LeaderElector> elector_;
};

ClientOptions RealTimeOptions() {
  return testing::TestClientOptions(DefaultTimeSource(), /*maxRetries=*/0);
}

json LeaseSpec(const fake::FakeApiServer& server) {
  json lease = server.Object("coordination.k8s.io/v1", "leases", "cozy-system", "ctl");
  return lease.is_null() ? json() : lease["spec"];
}

TEST(LeaderElection, OptionsClientGoWouldRefuseAreRefused) {
  auto server = StartWithLeases();
  Client client(testing::ConfigFor(*server), RealTimeOptions());
  LeaderElectionOptions options;
  options.leaseNamespace = "ns";
  options.leaseName = "l";
  EXPECT_THROW(LeaderElector(client, options), std::invalid_argument);  // no identity
  options.identity = "a";
  LeaderElectionOptions defaults = options;
  EXPECT_EQ(defaults.leaseDuration, 15s);  // client-go's defaults
  EXPECT_EQ(defaults.renewDeadline, 10s);
  EXPECT_EQ(defaults.retryPeriod, 2s);
  EXPECT_TRUE(defaults.releaseOnCancel);
  EXPECT_NO_THROW(LeaderElector(client, defaults));
  options.renewDeadline = 15s;  // not below the lease duration
  EXPECT_THROW(LeaderElector(client, options), std::invalid_argument);
  options.renewDeadline = 2s;
  options.retryPeriod = 2s;  // 2 s * 1.2 jitter is past the renew deadline
  EXPECT_THROW(LeaderElector(client, options), std::invalid_argument);
}

TEST(LeaderElection, MicroTimeHasSixFractionalDigitsInUtc) {
  const auto time = std::chrono::system_clock::time_point(
      std::chrono::microseconds(int64_t{1700000000} * 1000000 + 42));
  EXPECT_EQ(FormatMicroTime(time), "2023-11-14T22:13:20.000042Z");
}

// G8: the leader releases its lease on shutdown, so the standby leads well before a lease
// duration; the first election writes the record client-go writes.
TEST(LeaderElection, G8_OneLeadsAndItsReleaseOnStopHandsOverWithinAboutARetryPeriod) {
  auto server = StartWithLeases();
  Client client(testing::ConfigFor(*server), RealTimeOptions());
  Candidate a(client, "a");
  Candidate b(client, "b");
  a.elector().Start();
  ASSERT_TRUE(testing::WaitFor([&] { return a.elector().IsLeader(); }, 5s));
  b.elector().Start();
  // Two lease durations with a standby: the leader renews, the standby never leads.
  const auto end = Clock::now() + 2 * kLease;
  while (Clock::now() < end) {
    ASSERT_TRUE(a.elector().IsLeader());
    ASSERT_FALSE(b.elector().IsLeader());
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(b.elector().Leader(), "a");
  EXPECT_EQ(b.Leaders(), std::vector<std::string>{"a"});
  json spec = LeaseSpec(*server);
  EXPECT_EQ(spec["holderIdentity"], "a");
  EXPECT_EQ(spec["leaseDurationSeconds"], 3);
  EXPECT_EQ(spec["leaseTransitions"], 0);
  const std::regex microTime(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z)");
  EXPECT_TRUE(std::regex_match(spec["acquireTime"].get<std::string>(), microTime)) << spec;
  EXPECT_TRUE(std::regex_match(spec["renewTime"].get<std::string>(), microTime)) << spec;
  EXPECT_GT(spec["renewTime"].get<std::string>(), spec["acquireTime"].get<std::string>());
  const std::string firstAcquire = spec["acquireTime"];

  const auto stop = Clock::now();
  a.elector().Stop();
  EXPECT_TRUE(a.elector().Released());
  EXPECT_FALSE(a.elector().IsLeader());
  ASSERT_EQ(a.StopWhy(), std::vector<std::string>{"stopped"});
  // The release as client-go's ReleaseOnCancel writes it.
  auto puts = testing::RequestsTo(*server, "PUT", kLeasePath);
  ASSERT_FALSE(puts.empty());
  json released = json::parse(puts.back().body)["spec"];
  EXPECT_EQ(released["holderIdentity"], "");
  EXPECT_EQ(released["leaseDurationSeconds"], 1);
  EXPECT_EQ(released["leaseTransitions"], 0);

  ASSERT_TRUE(testing::WaitFor([&] { return b.elector().IsLeader(); }, kLease));
  const auto handover = Clock::now() - stop;
  // The standby's wait is a retry period stretched by up to 1.2 (client-go's jitter), plus
  // its request: about two retry periods, half the lease duration it would wait unreleased.
  EXPECT_LT(handover, 2 * kRetry * 1.2 + 600ms)
      << "handover took " << std::chrono::duration<double>(handover).count();
  spec = LeaseSpec(*server);
  EXPECT_EQ(spec["holderIdentity"], "b");
  EXPECT_EQ(spec["leaseTransitions"], 1);
  EXPECT_NE(spec["acquireTime"], firstAcquire);
  b.elector().Stop();
  EXPECT_EQ(LeaseSpec(*server)["holderIdentity"], "");
}

TEST(LeaderElection, TwoCandidatesStartingTogetherNeverBothLead) {
  auto server = StartWithLeases();
  Client client(testing::ConfigFor(*server), RealTimeOptions());
  Candidate a(client, "a");
  Candidate b(client, "b");
  a.elector().Start();
  b.elector().Start();
  ASSERT_TRUE(
      testing::WaitFor([&] { return a.elector().IsLeader() || b.elector().IsLeader(); }, 5s));
  const auto end = Clock::now() + kLease;
  while (Clock::now() < end) {
    ASSERT_FALSE(a.elector().IsLeader() && b.elector().IsLeader());
    ASSERT_TRUE(a.elector().IsLeader() || b.elector().IsLeader());
    std::this_thread::sleep_for(20ms);
  }
  const std::string leader = a.elector().IsLeader() ? "a" : "b";
  EXPECT_EQ(LeaseSpec(*server)["holderIdentity"], leader);
  EXPECT_EQ(a.elector().Leader(), leader);
  EXPECT_EQ(b.elector().Leader(), leader);
}

struct CutCase {
  const char* name;
  fake::Fault fault;
};

void PrintTo(const CutCase& cut, std::ostream* out) { *out << cut.name; }

class LeaderCutOff : public ::testing::TestWithParam<CutCase> {};

// A leader whose lease requests fail steps down within its renew deadline (and says so); the
// standby, which still reaches the API server, takes over only after that, once the lease has
// stood still for a lease duration.
TEST_P(LeaderCutOff, StepsDownWithinTheRenewDeadlineAndTheOtherLeads) {
  auto server = StartWithLeases();
  Client clientA(testing::ConfigFor(*server, "a"), RealTimeOptions());
  Client clientB(testing::ConfigFor(*server, "b"), RealTimeOptions());
  Candidate a(clientA, "a");
  Candidate b(clientB, "b");
  a.elector().Start();
  ASSERT_TRUE(testing::WaitFor([&] { return a.elector().IsLeader(); }, 5s));
  b.elector().Start();
  ASSERT_TRUE(testing::WaitFor([&] { return b.elector().Leader() == "a"; }, 5s));

  fake::Fault fault = GetParam().fault;
  fault.pathPrefix = kLeasePath;
  fault.bearerToken = "a";  // only the leader is cut off
  server->AddFault(fault);
  const auto cut = Clock::now();
  ASSERT_TRUE(testing::WaitFor([&] { return !a.StoppedAt().empty(); }, 2 * kLease));
  const auto steppedDown = a.StoppedAt().front() - cut;
  EXPECT_LE(steppedDown, kRenew + 200ms)
      << "stepped down after " << std::chrono::duration<double>(steppedDown).count() << " s";
  EXPECT_FALSE(a.elector().IsLeader());
  EXPECT_NE(a.StopWhy().front().find("renew deadline"), std::string::npos) << a.StopWhy().front();
  EXPECT_FALSE(a.elector().LastError().empty());

  ASSERT_TRUE(testing::WaitFor([&] { return b.elector().IsLeader(); }, 2 * kLease));
  server->ClearFaults();
  ASSERT_FALSE(b.StartedAt().empty());
  EXPECT_GT(b.StartedAt().front(), a.StoppedAt().front());  // never two leaders
  EXPECT_FALSE(a.elector().IsLeader());
  const json spec = LeaseSpec(*server);
  EXPECT_EQ(spec["holderIdentity"], "b");
  EXPECT_EQ(spec["leaseTransitions"], 1);
  ASSERT_TRUE(testing::WaitFor([&] { return a.elector().Leader() == "b"; }, 3s));
  EXPECT_EQ(a.StartedAt().size(), 1u);
}

// An API server away for longer than the renew deadline, for every candidate: the leader steps
// down, and when the server is back it finds the Lease still naming it and leads again at its
// next retry, before the standby's wait for the record to stand still has ended (its lease
// duration is long here, so the order cannot be chance). Waiting that lease duration itself
// left the cluster without a leader after every such outage.
TEST(LeaderElection, AfterAnOutageOfTheApiServerTheHolderNamedInTheLeaseLeadsAgainAtOnce) {
  auto server = StartWithLeases();
  Client clientA(testing::ConfigFor(*server, "a"), RealTimeOptions());
  Client clientB(testing::ConfigFor(*server, "b"), RealTimeOptions());
  Candidate a(clientA, "a", [](LeaderElectionOptions& options) { options.leaseDuration = 8s; });
  Candidate b(clientB, "b");
  a.elector().Start();
  ASSERT_TRUE(testing::WaitFor([&] { return a.elector().IsLeader(); }, 5s));
  b.elector().Start();
  ASSERT_TRUE(testing::WaitFor([&] { return b.elector().Leader() == "a"; }, 5s));

  fake::Fault outage = fake::Fault::Drop(-1);
  outage.pathPrefix = kLeasePath;
  server->AddFault(outage);
  ASSERT_TRUE(testing::WaitFor([&] { return !a.StoppedAt().empty(); }, 2 * kRenew));
  EXPECT_FALSE(a.elector().IsLeader());
  server->ClearFaults();
  const auto back = Clock::now();
  ASSERT_TRUE(testing::WaitFor([&] { return a.elector().IsLeader(); }, 4s))
      << "b leads: " << b.elector().IsLeader();
  EXPECT_LE(a.StartedAt().back() - back, 3 * kRetry) << "not within a retry period";
  EXPECT_EQ(a.StartedAt().size(), 2u);
  EXPECT_TRUE(b.StartedAt().empty()) << "the standby led";
  const json spec = LeaseSpec(*server);
  EXPECT_EQ(spec["holderIdentity"], "a");
  EXPECT_EQ(spec["leaseTransitions"], 0) << "the same holder: no transition";
}

INSTANTIATE_TEST_SUITE_P(
    Faults, LeaderCutOff,
    ::testing::Values(CutCase{"DroppedConnections", fake::Fault::Drop(-1)},
                      CutCase{"ServiceUnavailableOnRenew", fake::Fault::Answer(503, -1, "PUT")}),
    [](const ::testing::TestParamInfo<CutCase>& param) { return std::string(param.param.name); });

// The elector's requests are on a thread and a client of its own: a LIST that takes 9 s on
// the caller's client (a relist of a big collection) does not delay a single renewal.
TEST(LeaderElection, ANineSecondListElsewhereDoesNotStopRenewal) {
  auto server = StartWithLeases();
  ClientOptions options = RealTimeOptions();
  options.requestTimeout = 30s;  // long enough for the slow LIST
  Client client(testing::ConfigFor(*server), options);
  Candidate a(client, "a");
  Candidate b(client, "b");
  a.elector().Start();
  ASSERT_TRUE(testing::WaitFor([&] { return a.elector().IsLeader(); }, 5s));
  b.elector().Start();

  fake::Fault slow;
  slow.method = "GET";
  slow.pathPrefix = "/api/v1/pods";
  slow.latencyMs = 9000;
  slow.count = 1;
  server->AddFault(slow);
  server->ClearRequests();
  Informer pods(client, "/api/v1/pods", {}, [](const WatchEvent&) {});
  const auto start = Clock::now();
  pods.RunFor(12s, [&] { return pods.Stats().lists > 0; });
  const auto listed = Clock::now() - start;
  ASSERT_GE(listed, 9s);
  EXPECT_EQ(pods.Stats().lists, 1);

  EXPECT_TRUE(a.elector().IsLeader());
  EXPECT_TRUE(a.StoppedAt().empty());
  EXPECT_TRUE(b.StartedAt().empty());
  // A renewal every retry period all along.
  const auto puts = testing::RequestsTo(*server, "PUT", kLeasePath);
  EXPECT_GE(puts.size(), 9s / kRetry - 3) << puts.size() << " renewals";
  for (size_t i = 1; i < puts.size(); ++i) {
    EXPECT_LT(puts[i].received - puts[i - 1].received, kRetry + 400ms) << "renewal " << i;
  }
  EXPECT_EQ(LeaseSpec(*server)["holderIdentity"], "a");
}

// docs/security.md, "Hardening done": a candidate starts the lease duration's wait when its read of
// the Lease has returned (client-go sets observedTime after the get), not when it sent the read: a
// slow read must not shorten the wait, or a candidate could take a Lease renewed while its read was
// on the way.
TEST(LeaderElection, ACandidatesWaitStartsWhenItsReadOfTheLeaseHasReturned) {
  auto server = StartWithLeases();
  // Held by a replica that is gone: the record never changes again.
  server->Seed({{"apiVersion", "coordination.k8s.io/v1"},
                {"kind", "Lease"},
                {"metadata", {{"name", "ctl"}, {"namespace", "cozy-system"}}},
                {"spec",
                 {{"holderIdentity", "gone"},
                  {"leaseDurationSeconds", 3},
                  {"renewTime", FormatMicroTime(std::chrono::system_clock::now())},
                  {"leaseTransitions", 0}}}});
  fake::Fault slow;  // the candidate's first read of the Lease takes 1.5 s
  slow.method = "GET";
  slow.pathPrefix = kLeasePath;
  slow.latencyMs = 1500;
  slow.count = 1;
  server->AddFault(slow);
  Client client(testing::ConfigFor(*server), RealTimeOptions());
  Candidate b(client, "b", [](LeaderElectionOptions& options) {
    options.random = [] { return 0.0; };  // a retry period between reads, no jitter
  });
  const auto start = Clock::now();
  b.elector().Start();
  ASSERT_TRUE(testing::WaitFor([&] { return b.elector().IsLeader(); }, 2 * kLease + 2s));
  const auto waited = b.StartedAt().front() - start;
  // A lease duration from when the read returned, not from when it was sent (3 s after start).
  EXPECT_GE(waited, 1500ms + kLease) << std::chrono::duration<double>(waited).count() << " s";
  EXPECT_LT(waited, 1500ms + kLease + 2 * kRetry + 500ms)
      << std::chrono::duration<double>(waited).count() << " s";
  const json spec = LeaseSpec(*server);
  EXPECT_EQ(spec["holderIdentity"], "b");
  EXPECT_EQ(spec["leaseTransitions"], 1);
}

// docs/security.md, "Hardening done": while leading, LeadingUntil is the start of the last
// successful renewal plus the renew deadline; a write gated by it (LeaderDeadline) makes no attempt
// past that instant, however often the server asks to be tried again, and its attempts' timeouts
// end there. The leader itself steps down by then.
TEST(LeaderElection, AGatedWriteMakesNoAttemptPastTheInstantTheLeaseLeadsUntil) {
  auto server = StartWithLeases();
  Client client(testing::ConfigFor(*server), RealTimeOptions());
  Candidate a(client, "a");
  EXPECT_EQ(a.elector().LeadingUntil(), std::nullopt);
  a.elector().Start();
  ASSERT_TRUE(testing::WaitFor([&] { return a.elector().IsLeader(); }, 5s));
  const std::optional<TimePoint> first = a.elector().LeadingUntil();
  ASSERT_TRUE(first);
  EXPECT_GT(*first, Clock::now());
  EXPECT_LE(*first, Clock::now() + kRenew);
  // It moves on with each renewal.
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        const auto until = a.elector().LeadingUntil();
        return until && *until > *first;
      },
      2 * kRetry + 500ms));

  // The writer retries a 429 as often as it may (Retry-After 1 s); the leader's renewals fail
  // from now on, so the instant it leads until stops moving.
  const std::string configMaps = "/api/v1/namespaces/cozy-system/configmaps";
  fake::Fault busy = fake::Fault::Answer(429, -1, "POST", 1);
  busy.pathPrefix = configMaps;
  server->AddFault(busy);
  fake::Fault cut = fake::Fault::Answer(503, -1, "PUT");
  cut.pathPrefix = kLeasePath;
  server->AddFault(cut);
  std::this_thread::sleep_for(100ms);  // a renewal already sent lands
  const std::optional<TimePoint> until = a.elector().LeadingUntil();
  ASSERT_TRUE(until);
  ASSERT_GT(*until, Clock::now() + 500ms) << "the lease ran out before the write began";
  Client writer(testing::ConfigFor(*server), testing::TestClientOptions(DefaultTimeSource(), 100));
  std::atomic<bool> leading{true};
  WriteOptions gated;
  gated.request.deadline = LeaderDeadline(leading, [&] { return a.elector().LeadingUntil(); });
  const json configMap = {{"apiVersion", "v1"},
                          {"kind", "ConfigMap"},
                          {"metadata", {{"name", "gated"}, {"namespace", "cozy-system"}}}};
  server->ClearRequests();
  try {
    writer.Create(configMaps, configMap, gated);
    ADD_FAILURE() << "the write went through a 429 on every attempt";
  } catch (const ApiError& error) {
    // The last 429: the retry that would have reached the instant was not made.
    EXPECT_EQ(error.kind(), ErrorKind::kTooManyRequests) << error.what();
  }
  EXPECT_LE(Clock::now(), *until + 50ms);
  const auto posts = testing::RequestsTo(*server, "POST", configMaps);
  EXPECT_GE(posts.size(), 1u);
  for (const auto& post : posts) EXPECT_LT(post.received, *until);

  // The leader steps down by the same instant; from then on no gated attempt starts at all.
  ASSERT_TRUE(testing::WaitFor([&] { return !a.StoppedAt().empty(); }, kRenew + 500ms));
  EXPECT_LE(a.StoppedAt().front(), *until + 200ms);
  EXPECT_EQ(a.elector().LeadingUntil(), std::nullopt);
  server->ClearFaults();
  server->ClearRequests();
  try {
    writer.Create(configMaps, configMap, gated);
    ADD_FAILURE() << "a write was sent after the leader stepped down";
  } catch (const ApiError& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kDeadlineExceeded) << error.what();
  }
  EXPECT_TRUE(testing::RequestsTo(*server, "POST", configMaps).empty());

  // An attempt's timeout ends at the instant too: a write the server holds for 3 s is given
  // up at a deadline 500 ms ahead, not at the client's 5 s timeout.
  fake::Fault slow;
  slow.method = "POST";
  slow.pathPrefix = configMaps;
  slow.latencyMs = 3000;
  server->AddFault(slow);
  const TimePoint soon = Clock::now() + 500ms;
  WriteOptions bounded;
  bounded.request.deadline = [soon]() -> std::optional<TimePoint> { return soon; };
  EXPECT_THROW(writer.Create(configMaps, configMap, bounded), ApiError);
  EXPECT_LT(Clock::now(), soon + 300ms);
}

}  // namespace
}  // namespace cozy::kube
