// The Kubernetes client against a misbehaving API server (docs/kubernetes.md, "Fault modes"): the
// real Client, WatchStream and Informer over real HTTP to the fake's fault modes. Whatever the
// server sends, nothing throws out of Step(), the failure names what and where, the informer backs
// off instead of hammering, its cache survives, and it recovers once the fault is gone.
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "kube/client.h"
#include "kube/informer.h"
#include "test/kube/kube_test_support.h"
#include "test/support/process.h"

namespace cozy::kube {
namespace {
using nlohmann::json;
using namespace std::chrono_literals;
using testing::ConfigFor;
using testing::RequestsTo;
using testing::StartFakeApiServer;
using testing::TestClientOptions;

const std::string kPods = "/api/v1/pods";

json Pod(const std::string& name) {
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", "tenant"}}},
          {"spec", {{"nodeName", "n1"}, {"containers", {{{"name", "c"}}}}}}};
}

// AddressSanitizer's allocator and shadow memory make RSS say little about what the code
// under test holds; there the bytes the fake got out before the client hung up are the check.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kRssMeaningful = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kRssMeaningful = false;
#else
constexpr bool kRssMeaningful = true;
#endif
#else
constexpr bool kRssMeaningful = true;
#endif

// Resident memory of this process, in KiB (/proc/self/status VmRSS).
long ResidentKiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

ClientOptions SmallCaps(size_t bytes) {
  ClientOptions options = TestClientOptions(DefaultTimeSource());
  options.maxResponseBytes = bytes;
  options.maxWatchEventBytes = bytes;
  return options;
}

uint64_t BytesSent(const fake::FakeApiServer& server, const std::string& fault) {
  uint64_t bytes = 0;
  for (const auto& request : server.Requests()) {
    if (request.fault == fault) bytes += request.bytesSent;
  }
  return bytes;
}

// --- Lists of the wrong shape, straight through Client::List.

struct ListCase {
  fake::FaultMode mode;
  std::string problem;
};

void PrintTo(const ListCase& test, std::ostream* out) { *out << fake::FaultModeName(test.mode); }

class MalformedList : public ::testing::TestWithParam<ListCase> {};

TEST_P(MalformedList, FailsThatListWithTheFieldNamedAndNothingElse) {
  auto server = StartFakeApiServer(false);
  server->Seed(Pod("a"));
  Client client(ConfigFor(*server), TestClientOptions(DefaultTimeSource()));
  server->AddFault(fake::Fault::Mode(GetParam().mode, 1, kPods));
  try {
    client.List(kPods, {"", "spec.nodeName=n1", "", 0, {}});
    FAIL() << "a list of the wrong shape was taken";
  } catch (const ApiError& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kBadResponse) << error.what();
    EXPECT_NE(std::string(error.what()).find("GET /api/v1/pods?fieldSelector="), std::string::npos)
        << error.what();
    EXPECT_NE(error.message().find(GetParam().problem), std::string::npos) << error.what();
  }
  // The fault was spent on that one list; the next is good again.
  EXPECT_EQ(client.List(kPods)["items"].size(), 1u);
}

// A fault scoped to one caller's bearer token (one controller replica of two) hits only that
// caller's requests: the other's go through as if there were none (E9's test across replicas).
TEST(FaultScope, AFaultWithABearerTokenHitsOnlyThatCaller) {
  auto server = StartFakeApiServer(false);
  server->Seed(Pod("a"));
  Client a(ConfigFor(*server, "replica-a"), TestClientOptions(DefaultTimeSource()));
  Client b(ConfigFor(*server, "replica-b"), TestClientOptions(DefaultTimeSource()));
  fake::Fault fault = fake::Fault::Answer(503, -1);
  fault.bearerToken = "replica-b";
  server->AddFault(fault);
  EXPECT_EQ(a.List(kPods)["items"].size(), 1u);
  EXPECT_THROW(b.List(kPods), ApiError);
  EXPECT_EQ(a.List(kPods)["items"].size(), 1u);
  EXPECT_EQ(fake::Fault::FromJson(fault.ToJson()).bearerToken, "replica-b");
}

INSTANTIATE_TEST_SUITE_P(
    Modes, MalformedList,
    ::testing::Values(
        ListCase{fake::FaultMode::kListResourceVersionNumber,
                 "list: metadata.resourceVersion is a number, not a string"},
        ListCase{fake::FaultMode::kListItemsNotArray, "list: items is an object, not an array"},
        ListCase{fake::FaultMode::kListWithoutMetadata, "list: the list has no metadata"}),
    [](const auto& test) { return std::string(fake::FaultModeName(test.param.mode)); });

// --- The informer under every fault: list, watch, endless bodies.

struct InformerCase {
  std::string name;
  fake::Fault fault;
  bool onList;          // the fault hits the relist (else the re-watch)
  std::string problem;  // in LastError()
};

void PrintTo(const InformerCase& test, std::ostream* out) { *out << test.name; }

class InformerUnderFault : public ::testing::TestWithParam<InformerCase> {};

TEST_P(InformerUnderFault, NeverThrowsBacksOffKeepsItsCacheAndRecovers) {
  const InformerCase& param = GetParam();
  auto server = StartFakeApiServer(false);
  server->Seed(Pod("a"));
  server->Seed(Pod("b"));
  Client client(ConfigFor(*server), SmallCaps(256 * 1024));
  std::vector<std::string> seen;
  InformerOptions options;
  options.watchTimeoutSeconds = 30;
  options.backoff = {100ms, 800ms, 2.0, 0.0};
  Informer informer(client, kPods, options, [&seen](const WatchEvent& event) {
    seen.push_back(event.type + " " + event.object["metadata"]["name"].get<std::string>());
  });
  informer.RunFor(5s, [&] { return informer.Synced(); });
  ASSERT_TRUE(informer.Synced()) << informer.LastError();
  informer.RunFor(300ms);  // a bookmark or two: the open watch is a healthy one
  const std::string version = informer.ResourceVersion();
  ASSERT_EQ(informer.Stats().failures, 0) << informer.LastError();

  server->AddFault(param.fault);
  server->ClearRequests();
  if (param.onList) {
    server->ExpireWatches();  // 410: the informer relists, into the fault
  } else {
    server->DropWatches();  // a clean end after events: it re-watches at once, into the fault
  }
  informer.RunFor(1500ms);  // would throw out of here, or spin, without the fixes

  EXPECT_GE(informer.Stats().failures, 1);
  EXPECT_NE(informer.LastError().find(param.problem), std::string::npos) << informer.LastError();
  EXPECT_NE(informer.LastError().find(kPods), std::string::npos) << informer.LastError();
  // Backed off (100, 200, 400, 800 ms): a few tries in 1.5 s, not a hot loop.
  const size_t requests = RequestsTo(*server, "GET", kPods).size();
  EXPECT_GE(requests, 2u);
  EXPECT_LE(requests, 14u);
  // Nothing lost, nothing made up.
  EXPECT_EQ(informer.ResourceVersion(), version);
  EXPECT_EQ(informer.Cache().size(), 2u);
  EXPECT_TRUE(informer.Cache().count("tenant/a"));
  EXPECT_TRUE(informer.Cache().count("tenant/b"));
  EXPECT_EQ(seen, (std::vector<std::string>{"ADDED a", "ADDED b"}));

  server->ClearFaults();
  server->Seed(Pod("c"));
  informer.RunFor(5s, [&] { return informer.Cache().count("tenant/c") > 0; });
  EXPECT_EQ(informer.Cache().size(), 3u) << informer.LastError();
  EXPECT_EQ(seen.back(), "ADDED c");
  // And it watches again: a change reaches it as a watch event, without a relist.
  const int lists = informer.Stats().lists;
  server->Seed(Pod("d"));
  informer.RunFor(5s, [&] { return informer.Cache().count("tenant/d") > 0; });
  EXPECT_TRUE(informer.Cache().count("tenant/d"));
  EXPECT_EQ(informer.Stats().lists, lists);
}

fake::Fault WatchOnly(fake::Fault fault) {
  fault.watchOnly = true;
  return fault;
}

INSTANTIATE_TEST_SUITE_P(
    Faults, InformerUnderFault,
    ::testing::Values(
        InformerCase{"ListResourceVersionNumber",
                     fake::Fault::Mode(fake::FaultMode::kListResourceVersionNumber), true,
                     "metadata.resourceVersion is a number, not a string"},
        InformerCase{"ListItemsNotArray", fake::Fault::Mode(fake::FaultMode::kListItemsNotArray),
                     true, "items is an object, not an array"},
        InformerCase{"ListWithoutMetadata",
                     fake::Fault::Mode(fake::FaultMode::kListWithoutMetadata), true,
                     "the list has no metadata"},
        InformerCase{"ListEndlessBody", fake::Fault::Mode(fake::FaultMode::kEndlessBody), true,
                     "response body is longer than 262144 bytes"},
        InformerCase{"ListEndlessString", fake::Fault::Mode(fake::FaultMode::kEndlessString), true,
                     "response body is longer than 262144 bytes"},
        InformerCase{"WatchResourceVersionNumber",
                     fake::Fault::Mode(fake::FaultMode::kWatchResourceVersionNumber), false,
                     "event 1 (ADDED): metadata.resourceVersion is a number, not a string"},
        InformerCase{"WatchMetadataMissing",
                     fake::Fault::Mode(fake::FaultMode::kWatchMetadataMissing), false,
                     "event 1 (MODIFIED): metadata is missing"},
        InformerCase{"WatchObjectNotObject",
                     fake::Fault::Mode(fake::FaultMode::kWatchObjectNotObject), false,
                     "event 1 (ADDED): object is a string, not an object"},
        InformerCase{"WatchUnknownType", fake::Fault::Mode(fake::FaultMode::kWatchUnknownType),
                     false, "event 1: unknown type \"RENAMED\""},
        InformerCase{"WatchNotJson", fake::Fault::Mode(fake::FaultMode::kWatchNotJson), false,
                     "event 1 is not JSON"},
        InformerCase{"WatchErrorWrongTypes",
                     fake::Fault::Mode(fake::FaultMode::kWatchErrorWrongTypes), false,
                     "ERROR event"},
        InformerCase{"WatchEndlessString",
                     WatchOnly(fake::Fault::Mode(fake::FaultMode::kEndlessString)), false,
                     "event 1: the value starting at byte 0 of the stream is longer than 262144 "
                     "bytes"},
        InformerCase{"WatchCloseAtOnce", fake::Fault::Mode(fake::FaultMode::kWatchCloseAtOnce),
                     false, "without a single event"}),
    [](const auto& test) { return test.param.name; });

TEST(InformerFaults, AHandlerThatThrowsIsBackedOffAndGetsTheEventAgain) {
  auto server = StartFakeApiServer(false);
  server->Seed(Pod("a"));
  Client client(ConfigFor(*server), TestClientOptions(DefaultTimeSource()));
  int throws = 1;
  std::vector<std::string> seen;
  InformerOptions options;
  options.backoff = {50ms, 200ms, 2.0, 0.0};
  Informer informer(client, kPods, options, [&](const WatchEvent& event) {
    const std::string name = event.object["metadata"]["name"].get<std::string>();
    if (name == "b" && throws-- > 0) throw std::runtime_error("the handler broke on b");
    seen.push_back(event.type + " " + name);
  });
  informer.RunFor(5s, [&] { return informer.Synced(); });
  server->Seed(Pod("b"));
  informer.RunFor(5s, [&] { return informer.Stats().failures > 0; });
  EXPECT_EQ(informer.Stats().failures, 1);
  EXPECT_NE(informer.LastError().find("the handler broke on b"), std::string::npos)
      << informer.LastError();
  EXPECT_FALSE(informer.Cache().count("tenant/b"));  // not applied while unhandled
  informer.RunFor(5s, [&] { return informer.Cache().count("tenant/b") > 0; });
  EXPECT_EQ(seen, (std::vector<std::string>{"ADDED a", "ADDED b"}));
  EXPECT_EQ(informer.Stats().lists, 2);  // the event came again through a relist
}

// --- Caps: an endless or huge answer fails that request early and cheaply.

TEST(ResponseCap, AnAnnouncedHugeBodyIsRefusedBeforeItIsRead) {
  auto server = StartFakeApiServer(false);
  Client client(ConfigFor(*server), SmallCaps(1 << 20));
  server->AddFault(fake::Fault::Mode(fake::FaultMode::kEndlessBody, 1));
  const long before = ResidentKiB();
  const auto start = std::chrono::steady_clock::now();
  try {
    client.List(kPods);
    FAIL() << "a 200 MiB body was taken";
  } catch (const ApiError& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kBadResponse);
    EXPECT_EQ(error.httpStatus(), 200);
    EXPECT_NE(error.message().find("longer than 1048576 bytes"), std::string::npos) << error.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  if (kRssMeaningful) {
    EXPECT_LT(ResidentKiB() - before, 5 * 1024);
  }
  // Content-Length: 200 MiB; what the fake got out before the client hung up is at most
  // what the sockets buffer.
  testing::WaitFor([&] { return BytesSent(*server, "endlessBody") > 0; }, 2s);
  EXPECT_LT(BytesSent(*server, "endlessBody"), uint64_t{32} << 20);
  // The client is fine afterwards.
  EXPECT_TRUE(client.List(kPods)["items"].empty());
}

TEST(ResponseCap, AnEndlessStringFailsAtTheDefault16MiB) {
  auto server = StartFakeApiServer(false);
  Client client(ConfigFor(*server), TestClientOptions(DefaultTimeSource()));
  ASSERT_EQ(client.options().maxResponseBytes, size_t{16} << 20);
  server->AddFault(fake::Fault::Mode(fake::FaultMode::kEndlessString, 1));
  const auto start = std::chrono::steady_clock::now();
  try {
    client.Get(kPods);
    FAIL() << "an endless body was taken";
  } catch (const ApiError& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kBadResponse);
    EXPECT_NE(error.message().find("longer than 16777216 bytes"), std::string::npos)
        << error.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 4s);  // not the 5 s request timeout
  testing::WaitFor([&] { return BytesSent(*server, "endlessString") >= (uint64_t{16} << 20); }, 2s);
  const uint64_t sent = BytesSent(*server, "endlessString");
  EXPECT_GE(sent, uint64_t{16} << 20);
  EXPECT_LT(sent, uint64_t{48} << 20);
}

// G13: pages of 500 were over the 16 MiB cap once pods weighed tens of KB (managed fields,
// last-applied annotations, many env vars): 76 pods of 240 KB kept the controller unready with
// only "response body is longer than ..." in its log. Here, at a 1 MiB cap, 60 pods of 30 KB
// (1.8 MB in one page of 500): the page is asked for again with 250, 125, 62, then 31 pods,
// from the same place; the smaller size holds for the rest of the list and for the informer's
// next relist; every pod is listed once.
TEST(ResponseCap, G13_AListPageOverTheCapIsHalvedUntilItFits) {
  auto server = StartFakeApiServer(false);
  const std::string padding(30 * 1024, 'x');
  for (int i = 0; i < 60; ++i) {
    json pod = Pod("p" + std::to_string(i));
    pod["metadata"]["annotations"] = {{"example.com/padding", padding}};
    server->Seed(pod);
  }
  Client client(ConfigFor(*server), SmallCaps(1024 * 1024));
  std::vector<std::pair<int, int>> halved;
  ListOptions options{"", "", "", 500, {}};
  options.onPageHalved = [&halved](int from, int to) { halved.emplace_back(from, to); };
  size_t items = 0;
  client.ListPages(kPods, options, [&items](json& page) { items += page["items"].size(); });
  EXPECT_EQ(items, 60u);
  EXPECT_EQ(halved,
            (std::vector<std::pair<int, int>>{{500, 250}, {250, 125}, {125, 62}, {62, 31}}));
  std::vector<std::string> limits;
  for (const auto& request : RequestsTo(*server, "GET", kPods)) {
    const size_t at = request.query.find("limit=");
    limits.push_back(at == std::string::npos
                         ? "none"
                         : request.query.substr(at + 6, request.query.find('&', at) - at - 6));
  }
  EXPECT_EQ(limits, (std::vector<std::string>{"500", "250", "125", "62", "31", "31"}));

  // The informer: synced, the halving counted, and its next relist asks for 31 at once.
  server->ClearRequests();
  InformerOptions informerOptions;
  informerOptions.watchTimeoutSeconds = 30;
  size_t added = 0;
  Informer informer(client, kPods, informerOptions, [&added](const WatchEvent& event) {
    if (event.type == "ADDED") ++added;
  });
  informer.RunFor(10s, [&] { return informer.Synced(); });
  ASSERT_TRUE(informer.Synced()) << informer.LastError();
  EXPECT_EQ(added, 60u);
  EXPECT_EQ(informer.Stats().pagesHalved, 4);
  EXPECT_EQ(informer.Stats().pageSize, 31);
  informer.RunFor(300ms);  // its watch opens
  server->ClearRequests();
  server->ExpireWatches();  // 410: a relist
  informer.RunFor(3s, [&] { return informer.Stats().lists >= 2; });
  ASSERT_GE(informer.Stats().lists, 2);
  const auto relist = RequestsTo(*server, "GET", kPods);
  ASSERT_FALSE(relist.empty());
  EXPECT_NE(relist.front().query.find("limit=31"), std::string::npos) << relist.front().query;
  EXPECT_EQ(informer.Stats().pagesHalved, 4);
  // A single object over the cap is no list a smaller page can fix: the error stands.
  Client tiny(ConfigFor(*server), SmallCaps(16 * 1024));
  try {
    tiny.ListPages(kPods, {"", "", "", 500, {}}, [](json&) {});
    FAIL() << "a page of one over the cap was taken";
  } catch (const ApiError& error) {
    EXPECT_TRUE(error.responseTooLarge()) << error.what();
  }
}

TEST(WatchEventCap, AnEndlessEventEndsThatWatchOnlyAndCostsLittle) {
  auto server = StartFakeApiServer(false);
  server->Seed(Pod("a"));
  Client client(ConfigFor(*server), SmallCaps(512 * 1024));
  fake::Fault endless = fake::Fault::Mode(fake::FaultMode::kEndlessString, 1);
  endless.watchOnly = true;
  server->AddFault(endless);
  const long before = ResidentKiB();
  auto watch = client.Watch(kPods, {"", "", "", false, 30});
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!watch->Done() && std::chrono::steady_clock::now() < deadline) watch->Poll(100ms);
  ASSERT_TRUE(watch->Done());
  ASSERT_TRUE(watch->Error());
  EXPECT_EQ(watch->Error()->kind(), ErrorKind::kBadResponse);
  EXPECT_NE(std::string(watch->Error()->what()).find("GET /api/v1/pods?watch=1"), std::string::npos)
      << watch->Error()->what();
  EXPECT_NE(watch->Error()->message().find(
                "event 1: the value starting at byte 0 of the stream is longer than 524288 bytes"),
            std::string::npos)
      << watch->Error()->what();
  EXPECT_TRUE(watch->TakeEvents().empty());
  if (kRssMeaningful) {
    EXPECT_LT(ResidentKiB() - before, 5 * 1024);
  }
  watch.reset();
  testing::WaitFor([&] { return BytesSent(*server, "endlessString") > 0; }, 2s);
  EXPECT_LT(BytesSent(*server, "endlessString"), uint64_t{32} << 20);
  // The next watch is a good one.
  auto next = client.Watch(kPods, {"", "", "", false, 30});
  std::vector<WatchEvent> events;
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (events.empty() && std::chrono::steady_clock::now() < until) {
    next->Poll(100ms);
    events = next->TakeEvents();
  }
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].object["metadata"]["name"], "a");
}

// --- Retry-After: HTTP-dates read, huge values clamped, through the informer's schedule.

TEST(RetryAfter, TheInformerWaitsAnHttpDateAndAtMostFiveMinutes) {
  auto server = StartFakeApiServer(false);
  Client client(ConfigFor(*server), TestClientOptions(DefaultTimeSource()));
  InformerOptions options;
  options.backoff = {100ms, 800ms, 2.0, 0.0};
  Informer informer(client, kPods, options, [](const WatchEvent&) {});
  auto waitAfterFailure = [&](const fake::Fault& fault) {
    server->AddFault(fault);
    const TimePoint now = Clock::now();
    const int failures = informer.Stats().failures;
    const TimePoint next = informer.Step(now);
    EXPECT_EQ(informer.Stats().failures, failures + 1) << informer.LastError();
    return std::chrono::duration_cast<std::chrono::milliseconds>(next - now);
  };
  // A date two minutes ahead, as a proxy may send it.
  fake::Fault dated = fake::Fault::Answer(503, 1, "GET");
  dated.retryAfterSeconds = 120;
  dated.retryAfterHttpDate = true;
  const auto datedWait = waitAfterFailure(dated);
  EXPECT_GE(datedWait, 118s);
  EXPECT_LE(datedWait, 120s);
  // A day, as seconds: five minutes. (Step at a later `now` to get past the wait.)
  server->AddFault(fake::Fault::Answer(429, 1, "GET", 86400));
  const TimePoint later = Clock::now() + 10min;
  const int failures = informer.Stats().failures;
  EXPECT_EQ(informer.Step(later) - later, kMaxRetryAfter);
  EXPECT_EQ(informer.Stats().failures, failures + 1);
  // Garbage is ignored: the informer's own backoff.
  fake::Fault garbage = fake::Fault::Answer(503, 1, "GET");
  garbage.retryAfterRaw = "-5";
  const TimePoint evenLater = later + 10min;
  server->AddFault(garbage);
  const auto wait = informer.Step(evenLater) - evenLater;
  EXPECT_LE(wait, 800ms);
  EXPECT_NE(informer.LastError().find("ServerError"), std::string::npos) << informer.LastError();
}

TEST(RetryAfter, AWatchAnsweredWithAnHttpDateWaitsForIt) {
  auto server = StartFakeApiServer(false);
  Client client(ConfigFor(*server), TestClientOptions(DefaultTimeSource()));
  InformerOptions options;
  options.backoff = {100ms, 800ms, 2.0, 0.0};
  Informer informer(client, kPods, options, [](const WatchEvent&) {});
  fake::Fault dated = fake::Fault::Answer(429, 1);
  dated.watchOnly = true;
  dated.retryAfterSeconds = 60;
  dated.retryAfterHttpDate = true;
  server->AddFault(dated);
  TimePoint next{};
  const auto deadline = Clock::now() + 5s;
  while (informer.Stats().failures == 0 && Clock::now() < deadline) {
    next = informer.Step(Clock::now());
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(informer.Stats().failures, 1) << informer.LastError();
  EXPECT_TRUE(informer.Synced());
  const auto wait = next - Clock::now();
  EXPECT_GE(wait, 55s);
  EXPECT_LE(wait, 60s);
  EXPECT_NE(informer.LastError().find("TooManyRequests"), std::string::npos)
      << informer.LastError();
}

// --- A brownout: every answer late, lists and watches included.

TEST(Brownout, EveryRequestIsAnsweredLateUntilItEnds) {
  auto server = StartFakeApiServer(false);
  server->Seed(Pod("a"));
  Client client(ConfigFor(*server), TestClientOptions(DefaultTimeSource()));
  server->SetRequestDelay(400ms);
  auto timed = [](const std::function<void()>& call) {
    const auto start = std::chrono::steady_clock::now();
    call();
    return std::chrono::steady_clock::now() - start;
  };
  EXPECT_GE(timed([&] { client.Get("/api/v1/namespaces/tenant/pods/a"); }), 400ms);
  EXPECT_GE(timed([&] { EXPECT_EQ(client.List(kPods)["items"].size(), 1u); }), 400ms);
  EXPECT_GE(timed([&] {
              auto watch = client.Watch(kPods, {"", "", "", false, 30});
              const auto deadline = std::chrono::steady_clock::now() + 5s;
              while (watch->TakeEvents().empty() && std::chrono::steady_clock::now() < deadline) {
                watch->Poll(50ms);
              }
            }),
            400ms);
  server->SetRequestDelay(0ms);
  EXPECT_LT(timed([&] { client.List(kPods); }), 300ms);
}

TEST(Brownout, AnInformerWhoseListTimesOutKeepsItsCacheAndRecovers) {
  auto server = StartFakeApiServer(false);
  server->Seed(Pod("a"));
  ClientOptions clientOptions = TestClientOptions(DefaultTimeSource());
  clientOptions.requestTimeout = 300ms;
  Client client(ConfigFor(*server), clientOptions);
  InformerOptions options;
  options.backoff = {100ms, 400ms, 2.0, 0.0};
  Informer informer(client, kPods, options, [](const WatchEvent&) {});
  informer.RunFor(5s, [&] { return informer.Synced(); });
  ASSERT_TRUE(informer.Synced());
  informer.RunFor(300ms);  // the watch is open before the brownout starts
  server->SetRequestDelay(1s);
  server->ExpireWatches();
  informer.RunFor(5s, [&] { return informer.Stats().failures > 0; });
  EXPECT_NE(informer.LastError().find("GET /api/v1/pods"), std::string::npos)
      << informer.LastError();
  EXPECT_NE(informer.LastError().find("Transport"), std::string::npos) << informer.LastError();
  EXPECT_EQ(informer.Cache().size(), 1u);
  server->SetRequestDelay(0ms);
  server->Seed(Pod("b"));
  informer.RunFor(5s, [&] { return informer.Cache().size() == 2; });
  EXPECT_EQ(informer.Cache().size(), 2u);
}

}  // namespace
}  // namespace cozy::kube
