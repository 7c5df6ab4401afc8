// The Kubernetes client: config, errors, retries, tokens, rate limit, and every verb against
// the fake API server over real HTTP, on injected time so no test waits for real.
#include "kube/client.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

#include "kube/informer.h"
#include "kube/json_stream.h"
#include "test/kube/kube_test_support.h"
#include "test/support/fixture_host.h"

namespace cozy::kube {
namespace {
using nlohmann::json;
using namespace std::chrono_literals;
using testing::ConfigFor;
using testing::NodeObject;
using testing::RequestsTo;
using testing::StartFakeApiServer;
using testing::TestClientOptions;

void WriteFile(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path) << text;
}

json Pod(const std::string& name, const std::string& node, const std::string& app = "vm") {
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", "tenant"}, {"labels", {{"app", app}}}}},
          {"spec", {{"nodeName", node}, {"containers", {{{"name", "c"}}}}}}};
}

TEST(Kubeconfig, ReadsTheCurrentContextWithFilesRelativeToIt) {
  testing::TempDir dir;
  WriteFile(dir.path() / "config", R"(apiVersion: v1
kind: Config
current-context: prod
clusters:
- name: prod-cluster
  cluster:
    server: https://10.0.0.1:6443
    certificate-authority: pki/ca.crt
- name: lab
  cluster: {server: "https://lab:6443", insecure-skip-tls-verify: true}
users:
- name: agent
  user:
    client-certificate: pki/agent.crt
    client-key-data: a2V5LXBlbQ==
    tokenFile: token
contexts:
- name: prod
  context: {cluster: prod-cluster, user: agent, namespace: cozy-gpu}
- name: lab
  context: {cluster: lab, user: agent}
)");
  ClientConfig config = LoadKubeconfig(dir.path() / "config");
  EXPECT_EQ(config.server, "https://10.0.0.1:6443");
  EXPECT_EQ(config.caFile, (dir.path() / "pki/ca.crt").string());
  EXPECT_EQ(config.clientCertFile, (dir.path() / "pki/agent.crt").string());
  EXPECT_EQ(config.clientKeyData, "key-pem");
  EXPECT_EQ(config.tokenFile, (dir.path() / "token").string());
  EXPECT_EQ(config.namespace_, "cozy-gpu");
  EXPECT_FALSE(config.insecureSkipTlsVerify);

  ClientConfig lab = LoadKubeconfig(dir.path() / "config", "lab");
  EXPECT_TRUE(lab.insecureSkipTlsVerify);
  EXPECT_EQ(lab.server, "https://lab:6443");
}

TEST(Kubeconfig, ErrorsNameTheFileAndTheMissingEntry) {
  testing::TempDir dir;
  WriteFile(dir.path() / "config",
            "current-context: gone\ncontexts: []\nclusters: []\nusers: []\n");
  try {
    LoadKubeconfig(dir.path() / "config");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("config"), std::string::npos);
    EXPECT_NE(std::string(error.what()).find("context \"gone\" not found"), std::string::npos)
        << error.what();
  }
}

TEST(InClusterConfig, ServiceEnvTokenCaAndNamespace) {
  testing::TempDir dir;
  InClusterPaths paths{dir.path() / "token", dir.path() / "ca.crt", dir.path() / "namespace"};
  WriteFile(paths.tokenFile, "  tok\n");
  WriteFile(paths.caFile, "pem");
  WriteFile(paths.namespaceFile, "cozy-gpu\n");
  ::unsetenv("POD_NAMESPACE");
  ::setenv("KUBERNETES_SERVICE_HOST", "fd00::1", 1);
  ::setenv("KUBERNETES_SERVICE_PORT", "443", 1);
  ClientConfig config = LoadInClusterConfig(paths);
  EXPECT_EQ(config.server, "https://[fd00::1]:443");  // IPv6 in brackets
  EXPECT_EQ(config.tokenFile, paths.tokenFile.string());
  EXPECT_EQ(config.caFile, paths.caFile.string());
  EXPECT_EQ(config.namespace_, "cozy-gpu");
  ::unsetenv("KUBERNETES_SERVICE_HOST");
  EXPECT_THROW(LoadInClusterConfig(paths), ConfigError);
  ::unsetenv("KUBERNETES_SERVICE_PORT");
}

TEST(Errors, PlainNotFoundIsAnUnservedKindAndStatusNotFoundIsAMissingObject) {
  ApiError plain = ErrorFromResponse(404, "text/plain; charset=utf-8", "404 page not found\n", "",
                                     "GET", "/apis/x/v1/things/a");
  EXPECT_EQ(plain.kind(), ErrorKind::kResourceNotServed);
  json status = {{"kind", "Status"},
                 {"code", 404},
                 {"reason", "NotFound"},
                 {"details", {{"name", "a"}, {"kind", "things"}}}};
  ApiError missing = ErrorFromResponse(404, "application/json", status.dump(), "", "GET", "/p");
  EXPECT_EQ(missing.kind(), ErrorKind::kNotFound);
  EXPECT_FALSE(missing.IsTransient());
  EXPECT_TRUE(plain.IsTransient());
  EXPECT_NE(std::string(plain.what()).find("GET /apis/x/v1/things/a"), std::string::npos);
}

TEST(Errors, ReasonsCodesAndRetryAfter) {
  auto status = [](int code, const char* reason) {
    return json({{"kind", "Status"}, {"code", code}, {"reason", reason}}).dump();
  };
  EXPECT_EQ(ErrorFromResponse(409, "application/json", status(409, "Conflict"), "", "", "").kind(),
            ErrorKind::kConflict);
  EXPECT_EQ(
      ErrorFromResponse(409, "application/json", status(409, "AlreadyExists"), "", "", "").kind(),
      ErrorKind::kAlreadyExists);
  EXPECT_EQ(ErrorFromResponse(422, "application/json", status(422, "Invalid"), "", "", "").kind(),
            ErrorKind::kInvalid);
  ApiError throttled = ErrorFromResponse(429, "text/plain", "Too many requests", "3\r\n", "", "");
  EXPECT_EQ(throttled.kind(), ErrorKind::kTooManyRequests);
  EXPECT_EQ(throttled.retryAfter(), std::chrono::seconds(3));
  json unavailable = {{"kind", "Status"},
                      {"code", 503},
                      {"reason", "ServiceUnavailable"},
                      {"details", {{"retryAfterSeconds", 5}}}};
  ApiError down = ErrorFromResponse(503, "application/json", unavailable.dump(), "", "", "");
  EXPECT_EQ(down.kind(), ErrorKind::kServerError);
  EXPECT_EQ(down.retryAfter(), std::chrono::seconds(5));
}

TEST(Errors, RetryAfterInSecondsOrAsAnHttpDateClampedToFiveMinutes) {
  // 2015-10-21 07:28:00 UTC.
  const auto now = std::chrono::system_clock::from_time_t(1445412480);
  EXPECT_EQ(ParseRetryAfter("120", now), 120s);
  EXPECT_EQ(ParseRetryAfter(" 0\r\n", now), 0s);
  // RFC 9110's three date forms, two minutes ahead.
  EXPECT_EQ(ParseRetryAfter("Wed, 21 Oct 2015 07:30:00 GMT", now), 120s);
  EXPECT_EQ(ParseRetryAfter("Wednesday, 21-Oct-15 07:30:00 GMT", now), 120s);
  EXPECT_EQ(ParseRetryAfter("Wed Oct 21 07:30:00 2015", now), 120s);
  // Longer waits, in either form and however long the number, are five minutes.
  EXPECT_EQ(ParseRetryAfter("86400", now), kMaxRetryAfter);
  EXPECT_EQ(ParseRetryAfter("999999999999999999999999999", now), kMaxRetryAfter);
  EXPECT_EQ(ParseRetryAfter("Thu, 22 Oct 2015 07:28:00 GMT", now), kMaxRetryAfter);
  EXPECT_EQ(kMaxRetryAfter, 300s);
  // Ignored: negative, fractional, a date already past, words, a broken date.
  for (const char* ignored : {"-5", "1.5", "+3", "Wed, 21 Oct 2015 07:27:00 GMT", "soon",
                              "Wed, 99 Foo 2015 07:30:00 GMT", "", "12 seconds"}) {
    EXPECT_EQ(ParseRetryAfter(ignored, now), std::nullopt) << ignored;
  }
  // The header of an error answer, and a Status' retryAfterSeconds, both clamped.
  EXPECT_EQ(ErrorFromResponse(429, "text/plain", "", "100000", "GET", "/p").retryAfter(),
            kMaxRetryAfter);
  json huge = {{"kind", "Status"}, {"code", 503}, {"details", {{"retryAfterSeconds", 1u << 31}}}};
  EXPECT_EQ(ErrorFromResponse(503, "application/json", huge.dump(), "", "", "").retryAfter(),
            kMaxRetryAfter);
  json negative = {{"kind", "Status"}, {"code", 503}, {"details", {{"retryAfterSeconds", -4}}}};
  EXPECT_EQ(ErrorFromResponse(503, "application/json", negative.dump(), "", "", "").retryAfter(),
            std::nullopt);
}

TEST(Backoff, ExponentialCappedAndJittered) {
  Backoff plain({800ms, 5s, 2.0, 1.0}, [] { return 0.0; });
  EXPECT_EQ(plain.Next(), 800ms);
  EXPECT_EQ(plain.Next(), 1600ms);
  EXPECT_EQ(plain.Next(), 3200ms);
  EXPECT_EQ(plain.Next(), 5s);
  EXPECT_EQ(plain.Next(), 5s);
  plain.Reset();
  EXPECT_EQ(plain.Next(), 800ms);
  Backoff jittered({1s, 30s, 2.0, 1.0}, [] { return 0.5; });
  EXPECT_EQ(jittered.Next(), 1500ms);  // stretched into [d, 2d)
}

// docs/controller.md, "The reconciler: what each finalizer waits for": one object's failures back
// off that object alone, growing while they last.
TEST(KeyedBackoff, EachKeyWaitsItsOwnGrowingDelayAndASuccessStartsItOver) {
  KeyedBackoff backoff({1s, 4s, 2.0, 0.0});
  const TimePoint t0{std::chrono::hours(1)};
  EXPECT_FALSE(backoff.HeldOff("a", t0));
  EXPECT_EQ(backoff.NextRetry(t0), std::nullopt);
  EXPECT_EQ(backoff.Failed("a", t0), t0 + 1s);
  EXPECT_TRUE(backoff.HeldOff("a", t0 + 999ms));
  EXPECT_FALSE(backoff.HeldOff("b", t0 + 999ms)) << "another key is not held back";
  EXPECT_FALSE(backoff.HeldOff("a", t0 + 1s));
  EXPECT_EQ(backoff.Failed("a", t0 + 1s), t0 + 3s);
  EXPECT_EQ(backoff.Failed("a", t0 + 3s), t0 + 7s);
  EXPECT_EQ(backoff.Failed("a", t0 + 7s), t0 + 11s) << "capped at 4 s";
  EXPECT_EQ(backoff.Failures("a"), 4);
  EXPECT_EQ(backoff.Failed("b", t0 + 7s), t0 + 8s) << "b starts at the initial delay";
  EXPECT_EQ(backoff.NextRetry(t0 + 7s), t0 + 8s);
  EXPECT_EQ(backoff.HeldCount(t0 + 7s), 2u);
  EXPECT_EQ(backoff.HeldCount(t0 + 9s), 1u);
  backoff.Succeeded("a");
  EXPECT_FALSE(backoff.HeldOff("a", t0 + 8s));
  EXPECT_EQ(backoff.Failures("a"), 0);
  EXPECT_EQ(backoff.Failed("a", t0 + 8s), t0 + 9s) << "a success starts it over";
}

TEST(KeyedBackoff, AFailureFromAVersionHoldsOnlyThatVersion) {
  KeyedBackoff backoff({1s, 4s, 2.0, 0.0});
  const TimePoint t0{std::chrono::hours(1)};
  backoff.Failed("a", t0, "41");  // a 409: planned from a stale read
  EXPECT_TRUE(backoff.HeldOff("a", t0 + 500ms, "41"));
  EXPECT_FALSE(backoff.HeldOff("a", t0 + 500ms, "42")) << "the cache moved on: write at once";
  backoff.Failed("a", t0, "");  // any other failure holds every version
  EXPECT_TRUE(backoff.HeldOff("a", t0 + 500ms, "42"));
}

TEST(KeyedBackoff, PruneForgetsKeysQuietForACapPastTheirRetry) {
  KeyedBackoff backoff({1s, 4s, 2.0, 0.0});
  const TimePoint t0{std::chrono::hours(1)};
  backoff.Failed("gone", t0);          // retry at t0+1s; forgotten after t0+5s
  backoff.Failed("failing", t0 + 4s);  // retry at t0+5s
  backoff.Prune(t0 + 5s);
  EXPECT_EQ(backoff.Size(), 2u) << "a cap past its retry is not yet over";
  backoff.Prune(t0 + 5s + 1ms);
  EXPECT_EQ(backoff.Size(), 1u);
  EXPECT_EQ(backoff.Failures("gone"), 0);
  EXPECT_EQ(backoff.Failures("failing"), 1);
}

TEST(RateLimiter, BurstThenQps) {
  FakeTimeSource time;
  RateLimiter limiter(2.0, 3, time);
  for (int i = 0; i < 3; ++i) limiter.Acquire();
  EXPECT_TRUE(time.Sleeps().empty());
  limiter.Acquire();
  ASSERT_EQ(time.Sleeps().size(), 1u);
  EXPECT_EQ(std::chrono::duration_cast<std::chrono::milliseconds>(time.Sleeps()[0]), 500ms);
}

TEST(TokenSource, RereadWhenOldOrAfterInvalidateKeepingTheLastGoodToken) {
  testing::TempDir dir;
  auto file = dir.path() / "token";
  WriteFile(file, "one\n");
  FakeTimeSource time;
  TokenSource tokens("", file.string(), time);
  EXPECT_EQ(tokens.Token(), "one");
  WriteFile(file, "two");
  time.Advance(30s);
  EXPECT_EQ(tokens.Token(), "one");  // young enough
  time.Advance(21s);
  EXPECT_EQ(tokens.Token(), "two");  // older than 50 s: re-read
  WriteFile(file, "three");
  tokens.Invalidate();  // after a 401
  EXPECT_EQ(tokens.Token(), "three");
  WriteFile(file, "");
  tokens.Invalidate();
  EXPECT_EQ(tokens.Token(), "three");  // an empty file keeps the last good token
  EXPECT_NE(tokens.LastError().find("empty"), std::string::npos);
}

TEST(JsonStreamSplitter, AValueLongerThanTheCapFailsTheStreamAndFreesItsBuffer) {
  JsonStreamSplitter splitter(64);
  splitter.Feed(R"({"type":"ADDED","object":{}} {"type":"ADDED","object":{"name":")");
  ASSERT_TRUE(splitter.Next());
  EXPECT_FALSE(splitter.Next());
  EXPECT_FALSE(splitter.Failed());
  // An endless string: fed far past the cap, never more than the cap is held.
  const std::string chunk(1000, 'a');
  for (int i = 0; i < 100 && !splitter.Failed(); ++i) {
    splitter.Feed(chunk);
    EXPECT_FALSE(splitter.Next());
    EXPECT_LE(splitter.Pending(), 64u + chunk.size());
  }
  ASSERT_TRUE(splitter.Failed());
  EXPECT_NE(splitter.Error().find("starting at byte 29"), std::string::npos) << splitter.Error();
  EXPECT_NE(splitter.Error().find("longer than 64 bytes"), std::string::npos) << splitter.Error();
  splitter.Feed(chunk);
  EXPECT_EQ(splitter.Pending(), 0u);
  EXPECT_FALSE(splitter.Next());
}

TEST(JsonStreamSplitter, AValueNestedTooDeepFailsTheStream) {
  JsonStreamSplitter splitter;
  splitter.Feed(std::string(kMaxJsonDepth, '['));
  EXPECT_FALSE(splitter.Next());
  EXPECT_FALSE(splitter.Failed());
  splitter.Feed("[");
  EXPECT_FALSE(splitter.Next());
  EXPECT_TRUE(splitter.Failed());
  EXPECT_NE(splitter.Error().find("deeper than 1000"), std::string::npos) << splitter.Error();
}

TEST(ParseNetworkJson, RefusesTextNestedTooDeepOrNotJsonWithoutThrowing) {
  std::string error;
  EXPECT_EQ(ParseNetworkJson(R"({"a":[1,"]]]"]})", error)["a"][1], "]]]");
  EXPECT_EQ(error, "");
  std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_TRUE(ParseNetworkJson(deep, error).is_null());
  EXPECT_EQ(error, "nests deeper than 1000 levels");
  EXPECT_TRUE(ParseNetworkJson("{\"a\":", error).is_null());
  EXPECT_EQ(error, "is not JSON");
}

// docs/controller.md, "Who wakes for a change": a watch event skimmed without a document. The keys
// inside the object are offered with their path from the object ("[]" for an array's element); a
// wanted key, an event of another type, an object without a string name or resourceVersion, or a
// text that is not JSON or nests too deep are left to the whole parse (nullopt).
TEST(SkimEvent, StubsWhatNoKeyIsWantedForAndLeavesTheRestWhole) {
  std::vector<std::string> offered;
  const SkimWants wants = [&offered](const std::vector<std::string>& path, const std::string& key) {
    std::string joined;
    for (const std::string& part : path) joined += part + ".";
    offered.push_back(joined + key);
    return key == "wanted";
  };
  const std::string plain =
      R"({"type":"MODIFIED","object":{"metadata":{"name":"p","namespace":"t","resourceVersion":"7",)"
      R"("labels":{"name":"not-this-one"}},"spec":{"containers":[{"name":"c","resources":)"
      R"({"requests":{"cpu":"1"}}}]}}})";
  const auto stub = SkimEvent(plain, wants);
  ASSERT_TRUE(stub.has_value());
  EXPECT_EQ(stub->type, "MODIFIED");
  EXPECT_EQ(stub->stub,
            (nlohmann::json{
                {"metadata", {{"name", "p"}, {"namespace", "t"}, {"resourceVersion", "7"}}}}));
  EXPECT_EQ(offered, (std::vector<std::string>{
                         "metadata", "metadata.name", "metadata.namespace",
                         "metadata.resourceVersion", "metadata.labels", "metadata.labels.name",
                         "spec", "spec.containers", "spec.containers.[].name",
                         "spec.containers.[].resources", "spec.containers.[].resources.requests",
                         "spec.containers.[].resources.requests.cpu"}));
  const auto cluster = SkimEvent(
      R"({"type":"ADDED","object":{"metadata":{"name":"n","resourceVersion":"1"}}})", wants);
  ASSERT_TRUE(cluster.has_value());
  EXPECT_EQ(cluster->stub,
            (nlohmann::json{{"metadata", {{"name", "n"}, {"resourceVersion", "1"}}}}));
  for (
      const std::string& text : std::vector<std::string>{
          R"({"type":"ADDED","object":{"metadata":{"name":"p","resourceVersion":"1"},"wanted":1}})",
          R"({"type":"BOOKMARK","object":{"metadata":{"name":"p","resourceVersion":"1"}}})",
          R"({"type":"ERROR","object":{"kind":"Status","code":410}})",
          R"({"type":"ADDED","object":{"metadata":{"name":"p"}}})",
          R"({"type":"ADDED","object":{"metadata":{"name":"p","resourceVersion":1}}})",
          // A key read again keeps its last value, as the whole parse does.
          R"({"type":"ADDED","object":{"metadata":{"name":"p","resourceVersion":"1"}},"object":5})",
          R"({"type":"ADDED","type":5,"object":{"metadata":{"name":"p","resourceVersion":"1"}}})",
          R"({"type":"ADDED","object":{"metadata":{"name":"p","resourceVersion":"1","name":1}}})",
          R"({"type":"ADDED","object":{"metadata":{"name":"p","resourceVersion":"1"},"metadata":[]}})",
          R"({"type":"ADDED","object":{"metadata":[{"name":1,"resourceVersion":"1"},"p"]}})",
          R"({"type":"ADDED","object":{"metadata":{"name":"p","resourceVersion":"1"})",
          std::string(
              R"({"type":"ADDED","object":{"metadata":{"name":"p","resourceVersion":"1"},"x":)") +
              std::string(2000, '[') + std::string(2000, ']') + "}}",
      }) {
    EXPECT_FALSE(SkimEvent(text, wants).has_value()) << text.substr(0, 120);
  }
}

TEST(JsonStreamSplitter, ValuesSplitAcrossReadsAndSeveralInOne) {
  JsonStreamSplitter splitter;
  splitter.Feed(R"({"type":"ADDED","object":{"s":"a}\"{"}})"
                "\n"
                R"({"type":"MOD)");
  auto first = splitter.Next();
  ASSERT_TRUE(first);
  EXPECT_EQ(json::parse(*first)["object"]["s"], "a}\"{");
  EXPECT_FALSE(splitter.Next());
  splitter.Feed(R"(IFIED","object":{}}{"type":"DELETED","object":{}})");
  EXPECT_EQ(json::parse(*splitter.Next())["type"], "MODIFIED");
  EXPECT_EQ(json::parse(*splitter.Next())["type"], "DELETED");
  EXPECT_FALSE(splitter.Next());
  EXPECT_EQ(splitter.Pending(), 0u);
}

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = StartFakeApiServer();
    client_ = std::make_unique<Client>(ConfigFor(*server_, "t0"), TestClientOptions(time_, 3));
  }
  FakeTimeSource time_;
  std::unique_ptr<fake::FakeApiServer> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(ClientTest, MissingObjectAndUnservedKindAreDifferentErrors) {
  try {
    client_->Get("/apis/gpu.cozystack.io/v1alpha1/gpunodes/nope");
    FAIL();
  } catch (const ApiError& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kNotFound) << error.what();
  }
  try {
    client_->Get("/apis/gpu.cozystack.io/v1alpha1/gpuclasses/x");
    FAIL();
  } catch (const ApiError& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kResourceNotServed) << error.what();
  }
  EXPECT_TRUE(time_.Sleeps().empty());  // neither is retried
}

TEST_F(ClientTest, ServerErrorsAreRetriedWithBackoffAndRetryAfterWins) {
  server_->Seed(NodeObject("n1"));
  server_->AddFault(fake::Fault::Answer(503, 2));
  EXPECT_EQ(client_->Get("/api/v1/nodes/n1")["metadata"]["name"], "n1");
  EXPECT_EQ(time_.Sleeps(), (std::vector<Duration>{200ms, 400ms}));
  server_->AddFault(fake::Fault::Answer(429, 1, "", 3));
  client_->Get("/api/v1/nodes/n1");
  EXPECT_EQ(time_.Sleeps().back(), 3s);
  server_->AddFault(fake::Fault::Answer(500, -1));
  EXPECT_THROW(client_->Get("/api/v1/nodes/n1"), ApiError);
  EXPECT_EQ(time_.Sleeps().size(), 2u + 1u + 3u);  // three retries, then the error
}

TEST_F(ClientTest, ConflictsAndInvalidWritesAreNotRetried) {
  json node = client_->Create("/api/v1/nodes", NodeObject("n1"));
  client_->MergePatch("/api/v1/nodes/n1", {{"metadata", {{"labels", {{"a", "b"}}}}}});
  try {
    client_->Update("/api/v1/nodes/n1", node);  // stale resourceVersion
    FAIL();
  } catch (const ApiError& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConflict) << error.what();
  }
  try {
    client_->JsonPatch("/api/v1/nodes/n1",
                       {{{"op", "test"}, {"path", "/metadata/name"}, {"value", "other"}}});
    FAIL();
  } catch (const ApiError& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kInvalid) << error.what();
  }
  EXPECT_TRUE(time_.Sleeps().empty());
  auto patches = RequestsTo(*server_, "PATCH", "/api/v1/nodes/n1");
  ASSERT_EQ(patches.size(), 2u);
  EXPECT_EQ(patches[0].contentType, "application/merge-patch+json");
  EXPECT_EQ(patches[1].contentType, "application/json-patch+json");
  EXPECT_EQ(patches[0].bearerToken, "t0");
}

TEST_F(ClientTest, ListsWithFieldAndLabelSelectorsAndPages) {
  server_->Seed(Pod("a", "n1"));
  server_->Seed(Pod("b", "n2"));
  server_->Seed(Pod("c", "n1", "db"));
  auto names = [](const json& list) {
    std::vector<std::string> result;
    for (const auto& item : list["items"]) result.push_back(item["metadata"]["name"]);
    return result;
  };
  EXPECT_EQ(names(client_->List("/api/v1/pods", {"", "spec.nodeName=n1", "", 0, {}})),
            (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(names(client_->List("/api/v1/namespaces/tenant/pods",
                                {"app in (vm),app!=db", "spec.nodeName=n1", "", 0, {}})),
            (std::vector<std::string>{"a"}));
  EXPECT_EQ(names(client_->List("/api/v1/pods", {"", "", "", 1, {}})),
            (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(RequestsTo(*server_, "GET", "/api/v1/pods").size(), 1u + 3u);
  try {
    client_->List("/api/v1/pods", {"", "spec.hostname=x", "", 0, {}});
    FAIL();
  } catch (const ApiError& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kBadRequest);
    EXPECT_NE(error.message().find("field label not supported"), std::string::npos);
  }
}

TEST_F(ClientTest, WatchStreamDeliversEventsAndBookmarks) {
  server_->Seed(Pod("a", "n1"));
  json list = client_->List("/api/v1/pods");
  auto watch = client_->Watch(
      "/api/v1/pods", {"", "spec.nodeName=n1", list["metadata"]["resourceVersion"], true, 5});
  server_->Seed(Pod("b", "n2"));
  server_->Seed(Pod("c", "n1"));
  std::vector<WatchEvent> events;
  auto deadline = std::chrono::steady_clock::now() + 5s;
  bool sawBookmark = false;
  while (std::chrono::steady_clock::now() < deadline && !(sawBookmark && !events.empty())) {
    watch->Poll(100ms);
    for (auto& event : watch->TakeEvents()) {
      if (event.type == "BOOKMARK") {
        sawBookmark = true;
      } else {
        events.push_back(event);
      }
    }
  }
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, "ADDED");
  EXPECT_EQ(events[0].object["metadata"]["name"], "c");
  EXPECT_TRUE(sawBookmark);
  EXPECT_FALSE(watch->Done());
  auto logged = RequestsTo(*server_, "GET", "/api/v1/pods");
  EXPECT_NE(logged.back().query.find("allowWatchBookmarks=true"), std::string::npos);
}

TEST_F(ClientTest, WatchFromACompactedVersionGetsAnExpiredEvent) {
  server_->Seed(Pod("a", "n1"));
  std::string old = server_->CurrentResourceVersion();
  server_->Seed(Pod("b", "n1"));
  server_->Compact();
  auto watch = client_->Watch("/api/v1/pods", {"", "", old, false, 5});
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!watch->Done() && std::chrono::steady_clock::now() < deadline) watch->Poll(100ms);
  auto events = watch->TakeEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, "ERROR");
  EXPECT_EQ(events[0].object["code"], 410);
  EXPECT_EQ(events[0].object["reason"], "Expired");
}

TEST(Informer, ListsWatchesResumesAfterADropAndRelistsAfterExpiry) {
  auto server = StartFakeApiServer();
  Client client(ConfigFor(*server), TestClientOptions(DefaultTimeSource()));
  server->Seed(Pod("a", "n1"));
  server->Seed(Pod("x", "n2"));
  std::vector<std::string> seen;
  InformerOptions options;
  options.fieldSelector = "spec.nodeName=n1";
  options.watchTimeoutSeconds = 30;
  options.backoff = {10ms, 100ms, 2.0, 0.0};
  Informer informer(client, "/api/v1/pods", options, [&seen](const WatchEvent& event) {
    seen.push_back(event.type + " " + event.object["metadata"]["name"].get<std::string>());
  });
  auto runUntil = [&informer](const std::function<bool()>& done) {
    informer.RunFor(5s, done);
    return done();
  };
  ASSERT_TRUE(runUntil([&] { return informer.Synced(); }));
  EXPECT_EQ(seen, (std::vector<std::string>{"ADDED a"}));

  server->Seed(Pod("b", "n1"));
  ASSERT_TRUE(runUntil([&] { return seen.size() == 2; }));
  EXPECT_EQ(seen.back(), "ADDED b");

  // A dropped stream is re-opened from the last resourceVersion, without a relist.
  server->DropWatches();
  ASSERT_TRUE(runUntil([&] { return informer.Stats().watches == 2; }));
  EXPECT_EQ(informer.Stats().failures, 0) << informer.LastError();  // re-opened at once
  // Grace 0, as its kubelet deletes a pod bound to a node (one DELETE alone leaves it
  // Terminating, MODIFIED).
  DeleteOptions now;
  now.gracePeriodSeconds = 0;
  client.Delete("/api/v1/namespaces/tenant/pods/a", now);
  ASSERT_TRUE(runUntil([&] { return seen.size() == 3; }));
  EXPECT_EQ(seen.back(), "DELETED a");
  EXPECT_EQ(informer.Stats().lists, 1);

  // 410 Expired: relist, and what changed meanwhile arrives as plain events.
  server->ExpireWatches();
  server->Seed(Pod("c", "n1"));
  ASSERT_TRUE(runUntil([&] { return informer.Stats().lists == 2 && seen.size() == 4; }))
      << "lists " << informer.Stats().lists << " expired " << informer.Stats().expired
      << " watches " << informer.Stats().watches << " seen " << seen.size() << " last "
      << ::testing::PrintToString(seen) << " error " << informer.LastError();
  EXPECT_EQ(seen.back(), "ADDED c");
  EXPECT_EQ(informer.Stats().expired, 1);
  EXPECT_EQ(informer.Cache().size(), 2u);
  EXPECT_TRUE(informer.Cache().count("tenant/b"));
  EXPECT_TRUE(informer.Cache().count("tenant/c"));
}

// docs/security.md, "Hardening done": a consumer that keeps what it needs from the events
// (kube::Cache) must not pay for a second, raw copy of every object. With keepObjects off the
// informer holds each object's resourceVersion alone, hands over whole objects, and still tells a
// relist's changes apart from what stayed.
TEST(Informer, WithoutKeptObjectsItHoldsVersionsAndStillDiffsARelist) {
  auto server = StartFakeApiServer();
  Client client(ConfigFor(*server), TestClientOptions(DefaultTimeSource()));
  server->Seed(Pod("a", "n1"));
  server->Seed(Pod("b", "n1"));
  std::vector<std::string> seen;
  InformerOptions options;
  options.keepObjects = false;
  options.watchTimeoutSeconds = 30;
  options.backoff = {10ms, 100ms, 2.0, 0.0};
  Informer informer(client, "/api/v1/pods", options, [&seen](const WatchEvent& event) {
    // The events carry the whole object; a deletion a relist finds, a stub of what was kept
    // (name, namespace and the last resourceVersion seen).
    if (event.type == "DELETED") {
      EXPECT_EQ(event.object["metadata"]["namespace"], "tenant") << event.object.dump();
      EXPECT_FALSE(event.object["metadata"].value("resourceVersion", "").empty());
    } else {
      EXPECT_EQ(event.object["spec"]["nodeName"], "n1") << event.object.dump();
    }
    seen.push_back(event.type + " " + event.object["metadata"]["name"].get<std::string>());
  });
  informer.RunFor(5s, [&] { return informer.Synced() && informer.Stats().watches == 1; });
  ASSERT_EQ(informer.Stats().watches, 1) << informer.LastError();
  // Of each object only its resourceVersion, the server's.
  EXPECT_TRUE(informer.Cache().empty());
  ASSERT_EQ(informer.Versions().size(), 2u);
  EXPECT_EQ(informer.Versions().at("tenant/a"),
            server->Object("v1", "pods", "tenant", "a")["metadata"]["resourceVersion"]);
  // The watch is open once an event came through it.
  // Gone during the relist below, with w: their deletions come in key order, whatever order
  // the informer keeps its versions in (a hash).
  const std::vector<std::string> alsoGone = {"g1", "g2", "g3", "g4", "g5"};
  for (const std::string& name : alsoGone) server->Seed(Pod(name, "n1"));
  server->Seed(Pod("w", "n1"));
  informer.RunFor(5s, [&] { return informer.Versions().count("tenant/w") > 0; });
  ASSERT_EQ(seen.back(), "ADDED w");
  // A relist after expiry: b changed, a did not, c is new, w and the g's went.
  server->ExpireWatches();
  client.MergePatch("/api/v1/namespaces/tenant/pods/b", {{"metadata", {{"labels", {{"x", "1"}}}}}});
  server->Seed(Pod("c", "n1"));
  DeleteOptions now;
  now.gracePeriodSeconds = 0;
  client.Delete("/api/v1/namespaces/tenant/pods/w", now);
  for (const std::string& name : alsoGone) {
    client.Delete("/api/v1/namespaces/tenant/pods/" + name, now);
  }
  seen.clear();
  informer.RunFor(5s, [&] { return informer.Stats().lists == 2; });
  ASSERT_EQ(informer.Stats().lists, 2) << informer.LastError();
  std::vector<std::string> deleted;
  std::copy_if(seen.begin(), seen.end(), std::back_inserter(deleted),
               [](const std::string& event) { return event.rfind("DELETED", 0) == 0; });
  EXPECT_EQ(deleted, (std::vector<std::string>{"DELETED g1", "DELETED g2", "DELETED g3",
                                               "DELETED g4", "DELETED g5", "DELETED w"}));
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<std::string>{"ADDED c", "DELETED g1", "DELETED g2", "DELETED g3",
                                            "DELETED g4", "DELETED g5", "DELETED w", "MODIFIED b"}))
      << informer.LastError();
  EXPECT_EQ(informer.Versions().count("tenant/w"), 0u);
  EXPECT_EQ(informer.Versions().at("tenant/b"),
            server->Object("v1", "pods", "tenant", "b")["metadata"]["resourceVersion"]);
  EXPECT_TRUE(informer.Cache().empty());
}

TEST(Informer, BacksOffWhileTheServerFailsAndRecovers) {
  auto server = StartFakeApiServer();
  Client client(ConfigFor(*server), TestClientOptions(DefaultTimeSource()));
  server->Seed(Pod("a", "n1"));
  server->AddFault(fake::Fault::Answer(503, 3, "GET"));
  int events = 0;
  InformerOptions options;
  options.backoff = {10ms, 40ms, 2.0, 0.0};
  Informer informer(client, "/api/v1/pods", options, [&events](const WatchEvent&) { ++events; });
  informer.RunFor(5s, [&] { return informer.Synced(); });
  EXPECT_TRUE(informer.Synced());
  EXPECT_EQ(informer.Stats().failures, 3);
  EXPECT_EQ(events, 1);
}

}  // namespace
}  // namespace cozy::kube
