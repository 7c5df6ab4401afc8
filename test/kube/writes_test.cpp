// Writes with preconditions: PUT and merge patch conditional on resourceVersion, client-go's
// RetryOnConflict, DeleteOptions (preconditions, propagationPolicy), dryRun and fieldManager,
// against the fake API server. Where the fake does not act on an option (dryRun, delete
// preconditions) the test checks that the client sends it; the request log has query and body.
#include <cmath>

#include <gtest/gtest.h>

#include "kube/client.h"
#include "kube/retry.h"
#include "test/kube/kube_test_support.h"

namespace cozy::kube {
namespace {
using nlohmann::json;
using namespace std::chrono_literals;

const std::string kPods = "/api/v1/namespaces/tenant/pods";

json Pod(const std::string& name) {
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", "tenant"}}},
          {"spec", {{"nodeName", "n1"}, {"containers", {{{"name", "c"}}}}}}};
}

ErrorKind KindOf(const std::function<void()>& call) {
  try {
    call();
  } catch (const ApiError& error) {
    return error.kind();
  }
  return ErrorKind::kOther;
}

class WritesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = testing::StartFakeApiServer(false);
    client_ =
        std::make_unique<Client>(testing::ConfigFor(*server_), testing::TestClientOptions(time_));
    client_->Create("/api/v1/namespaces", {{"metadata", {{"name", "tenant"}}}});
    client_->Create(kPods, Pod("p1"));
    server_->ClearRequests();
  }
  fake::LoggedRequest Last() const { return server_->Requests().back(); }

  FakeTimeSource time_;
  std::unique_ptr<fake::FakeApiServer> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(WritesTest, DryRunAndFieldManagerAreOnEveryWrite) {
  const WriteOptions options{.dryRun = true, .fieldManager = "gpu-controller"};
  client_->Create(kPods, Pod("p2"), options);
  EXPECT_EQ(Last().method, "POST");
  EXPECT_EQ(Last().query, "dryRun=All&fieldManager=gpu-controller");
  json pod = client_->Get(kPods + "/p1");
  client_->Update(kPods + "/p1", pod, options);
  EXPECT_EQ(Last().method, "PUT");
  EXPECT_EQ(Last().query, "dryRun=All&fieldManager=gpu-controller");
  client_->MergePatch(kPods + "/p1", {{"metadata", {{"labels", {{"a", "1"}}}}}}, options);
  EXPECT_EQ(Last().query, "dryRun=All&fieldManager=gpu-controller");
  client_->JsonPatch(
      kPods + "/p1",
      // (The dry-run patches above stored nothing: labels do not exist yet.)
      json::array({{{"op", "add"}, {"path", "/metadata/labels"}, {"value", {{"b", "2"}}}}}),
      {.dryRun = false, .fieldManager = "binder"});
  EXPECT_EQ(Last().query, "fieldManager=binder");
  client_->MergePatch(kPods + "/p1", {{"metadata", {{"labels", {{"c", "3"}}}}}});
  EXPECT_EQ(Last().query, "");  // nothing asked, nothing sent
  DeleteOptions dryDelete;
  dryDelete.dryRun = true;
  client_->Delete(kPods + "/p1", dryDelete);
  EXPECT_EQ(Last().method, "DELETE");
  EXPECT_EQ(Last().query, "dryRun=All");
  EXPECT_EQ(json::parse(Last().body)["dryRun"], json::array({"All"}));
}

TEST_F(WritesTest, DeleteSendsPreconditionsAndPropagationPolicyAsDeleteOptions) {
  json pod = client_->Get(kPods + "/p1");
  const std::string uid = pod["metadata"]["uid"];
  const std::string version = pod["metadata"]["resourceVersion"];
  DeleteOptions options;
  options.preconditionUid = uid;
  options.preconditionResourceVersion = version;
  options.propagationPolicy = "Foreground";
  options.gracePeriodSeconds = 0;
  client_->Delete(kPods + "/p1", options);
  const fake::LoggedRequest request = Last();
  EXPECT_EQ(request.method, "DELETE");
  EXPECT_EQ(request.contentType, "application/json");
  EXPECT_EQ(request.query, "");
  EXPECT_EQ(json::parse(request.body),
            json({{"kind", "DeleteOptions"},
                  {"apiVersion", "v1"},
                  {"preconditions", {{"uid", uid}, {"resourceVersion", version}}},
                  {"propagationPolicy", "Foreground"},
                  {"gracePeriodSeconds", 0}}));
  EXPECT_TRUE(server_->Object("v1", "pods", "tenant", "p1").is_null());
  // No options: no body, as before.
  client_->Create(kPods, Pod("p3"));
  client_->Delete(kPods + "/p3");
  EXPECT_EQ(Last().body, "");
  EXPECT_TRUE(DeleteOptionsBody({}).is_null());
}

TEST_F(WritesTest, UpdateAndMergePatchAreConditionalOnTheResourceVersion) {
  json pod = client_->Get(kPods + "/p1");
  const std::string version = pod["metadata"]["resourceVersion"];
  client_->MergePatch(kPods + "/p1", {{"metadata", {{"labels", {{"moved", "on"}}}}}});
  // Both writes carry the version read before the change: both lose.
  pod["metadata"]["labels"]["mine"] = "x";
  EXPECT_EQ(KindOf([&] { client_->Update(kPods + "/p1", pod); }), ErrorKind::kConflict);
  EXPECT_EQ(KindOf([&] {
              client_->MergePatchAt(kPods + "/p1", {{"metadata", {{"labels", {{"mine", "x"}}}}}},
                                    version);
            }),
            ErrorKind::kConflict);
  EXPECT_EQ(json::parse(Last().body)["metadata"]["resourceVersion"], version);
  // At the current version the patch applies.
  const std::string current = client_->Get(kPods + "/p1")["metadata"]["resourceVersion"];
  json patched =
      client_->MergePatchAt(kPods + "/p1", {{"metadata", {{"labels", {{"mine", "x"}}}}}}, current);
  EXPECT_EQ(patched["metadata"]["labels"]["mine"], "x");
  EXPECT_EQ(patched["metadata"]["labels"]["moved"], "on");
}

TEST_F(WritesTest, RetryOnConflictRereadsReappliesAndSucceeds) {
  int attempts = 0;
  json stored = UpdateWithRetry(
      *client_, kPods + "/p1",
      [&](json& pod) {
        ++attempts;
        if (attempts == 1) {
          // Another writer gets in between our read and our write.
          client_->MergePatch(kPods + "/p1", {{"metadata", {{"labels", {{"other", "1"}}}}}});
        }
        pod["metadata"]["labels"]["mine"] = "1";
      },
      {.dryRun = false, .fieldManager = "binder"});
  EXPECT_EQ(attempts, 2);
  EXPECT_EQ(stored["metadata"]["labels"]["mine"], "1");
  EXPECT_EQ(stored["metadata"]["labels"]["other"], "1");  // the re-read kept theirs
  ASSERT_EQ(time_.Sleeps().size(), 1u);                   // client-go's 10 ms, jitter 0.1
  EXPECT_GE(time_.Sleeps()[0], 10ms);
  EXPECT_LE(time_.Sleeps()[0], 11ms);
  const auto puts = testing::RequestsTo(*server_, "PUT", kPods + "/p1");
  ASSERT_EQ(puts.size(), 2u);
  EXPECT_EQ(puts[0].status, 409);
  EXPECT_EQ(puts[1].status, 200);
  EXPECT_EQ(puts[1].query, "fieldManager=binder");
}

TEST_F(WritesTest, RetryOnConflictGivesUpAfterItsStepsAndPassesOtherErrorsAtOnce) {
  int attempts = 0;
  EXPECT_EQ(KindOf([&] {
              UpdateWithRetry(*client_, kPods + "/p1", [&](json& pod) {
                ++attempts;
                client_->MergePatch(
                    kPods + "/p1", {{"metadata", {{"labels", {{"n", std::to_string(attempts)}}}}}});
                pod["metadata"]["labels"]["mine"] = "1";
              });
            }),
            ErrorKind::kConflict);
  EXPECT_EQ(attempts, 5);  // client-go's DefaultRetry: 5 steps
  EXPECT_EQ(time_.Sleeps().size(), 4u);

  attempts = 0;
  EXPECT_EQ(KindOf([&] {
              RetryOnConflict(time_, [&] {
                ++attempts;
                return client_->Get(kPods + "/gone");
              });
            }),
            ErrorKind::kNotFound);
  EXPECT_EQ(attempts, 1);
}

// A daemon's --qps and --burst.
TEST(RateLimitFlags, SetTheTokenBucketAndRefuseWhatIsNotOne) {
  ClientOptions options;
  EXPECT_EQ(options.qps, 5.0);  // client-go's defaults
  EXPECT_EQ(options.burst, 10);
  SetRateLimit(options, 50, 100);
  EXPECT_EQ(options.qps, 50.0);
  EXPECT_EQ(options.burst, 100);
  SetRateLimit(options, 0, 1);  // no limit
  EXPECT_EQ(options.qps, 0.0);
  EXPECT_THROW(SetRateLimit(options, -1, 10), std::invalid_argument);
  EXPECT_THROW(SetRateLimit(options, std::nan(""), 10), std::invalid_argument);
  EXPECT_THROW(SetRateLimit(options, 5, 0), std::invalid_argument);
}

}  // namespace
}  // namespace cozy::kube
