// The agent's GPUNode publisher against the fake API server over real HTTP (DESIGN §4.5):
// one create and one status patch at first, nothing in steady state, only differences,
// only agent-owned keys, only its own node, and every API failure ridden out.
#include "agent/sources/gpunode_publisher.h"

#include "agent/sources/pod_watch.h"

#include <fstream>

#include <gtest/gtest.h>

#include "test/fakes/fake_apiserver_logic.h"
#include "test/kube/kube_test_support.h"

namespace cozy::agent {
namespace {
using nlohmann::json;
using namespace std::chrono_literals;
using testing::ConfigFor;
using testing::NodeObject;
using testing::RequestsTo;
using testing::StartFakeApiServer;
using testing::TestClientOptions;
using testing::Writes;

const std::string kGpuNodes = "/apis/gpu.cozystack.io/v1alpha1/gpunodes";

json SampleStatus(int allocated = 0) {
  return {
      {"resourceNames", {"nvidia.com/GA100_A100_PCIE_80GB"}},
      {"devices",
       {{{"pciAddress", "0000:3b:00.0"},
         {"vendorID", "10de"},
         {"deviceID", "20b5"},
         {"classCode", "030200"},
         {"vendor", "NVIDIA Corporation"},
         {"model", "GA100 [A100 PCIe 80GB]"},
         {"driver", "vfio-pci"},
         {"iommuGroup", 42},
         {"iommuGroupViable", true},
         {"numaNode", 0},
         {"resources",
          {{{"name", "nvidia.com/GA100_A100_PCIE_80GB"},
            {"allocatable", 1},
            {"allocated", allocated}}}},
         {"allocatable", 1},
         {"allocated", allocated},
         {"health", "Healthy"}}}},
      {"unplaced", {{{"resourceName", "nvidia.com/gpu"}, {"allocatable", 8}, {"allocated", 2}}}}};
}

PublisherOptions FastBackoff() {
  PublisherOptions options;
  options.backoff = {1s, 8s, 2.0, 0.0};
  options.random = [] { return 0.0; };
  return options;
}

class PublisherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = StartFakeApiServer();
    server_->Seed(NodeObject("n1"));
    client_ = std::make_unique<kube::Client>(ConfigFor(*server_), TestClientOptions(time_));
    publisher_ = std::make_unique<Publisher>(*client_, "n1", FastBackoff());
  }

  json StoredGpuNode(const std::string& name) {
    return server_->Object("gpu.cozystack.io/v1alpha1", "gpunodes", "", name);
  }

  kube::FakeTimeSource time_;
  std::unique_ptr<fake::FakeApiServer> server_;
  std::unique_ptr<kube::Client> client_;
  std::unique_ptr<Publisher> publisher_;
};

TEST_F(PublisherTest, FirstPublishIsOneCreateAndOneMergePatchWithoutConditions) {  // A8
  PublishResult result = publisher_->Publish(SampleStatus(), time_.Now());
  ASSERT_EQ(result.outcome, PublishOutcome::kPublished) << result.error;
  EXPECT_EQ(result.writes, 2);

  auto writes = Writes(*server_);
  ASSERT_EQ(writes.size(), 2u);
  EXPECT_EQ(writes[0].method, "POST");
  EXPECT_EQ(writes[0].path, kGpuNodes);
  json created = json::parse(writes[0].body);
  EXPECT_FALSE(created.contains("status"));
  json node = server_->Object("v1", "nodes", "", "n1");
  ASSERT_EQ(created["metadata"]["ownerReferences"].size(), 1u);
  EXPECT_EQ(created["metadata"]["ownerReferences"][0]["kind"], "Node");
  EXPECT_EQ(created["metadata"]["ownerReferences"][0]["uid"], node["metadata"]["uid"]);

  EXPECT_EQ(writes[1].method, "PATCH");
  EXPECT_EQ(writes[1].path, kGpuNodes + "/n1/status");
  EXPECT_EQ(writes[1].contentType, "application/merge-patch+json");
  json patch = json::parse(writes[1].body);
  ASSERT_EQ(patch.size(), 1u) << patch;
  EXPECT_FALSE(patch["status"].contains("conditions"));
  EXPECT_EQ(patch["status"], SampleStatus());

  EXPECT_EQ(StoredGpuNode("n1")["status"], SampleStatus());
}

TEST_F(PublisherTest, SteadyStateSendsNoRequestAtAll) {
  ASSERT_EQ(publisher_->Publish(SampleStatus(), time_.Now()).outcome, PublishOutcome::kPublished);
  server_->ClearRequests();
  for (int i = 0; i < 20; ++i) {
    time_.Advance(30s);
    PublishResult result = publisher_->Publish(SampleStatus(), time_.Now());
    EXPECT_EQ(result.outcome, PublishOutcome::kUnchanged);
    EXPECT_EQ(result.retryAt, kube::TimePoint::max());
  }
  EXPECT_TRUE(server_->Requests().empty());
}

TEST_F(PublisherTest, AChangedFieldIsOnePatchWithOnlyTheChangedKey) {
  ASSERT_EQ(publisher_->Publish(SampleStatus(0), time_.Now()).outcome, PublishOutcome::kPublished);
  server_->ClearRequests();
  PublishResult result = publisher_->Publish(SampleStatus(1), time_.Now());
  ASSERT_EQ(result.outcome, PublishOutcome::kPublished) << result.error;
  auto writes = Writes(*server_);
  ASSERT_EQ(writes.size(), 1u);
  json patch = json::parse(writes[0].body);
  // devices is an array: RFC 7386 replaces it whole; the untouched keys are not sent.
  EXPECT_EQ(patch, json({{"status", {{"devices", SampleStatus(1)["devices"]}}}}));
  EXPECT_EQ(StoredGpuNode("n1")["status"], SampleStatus(1));
}

TEST_F(PublisherTest, AKeyTheAgentNoLongerHasIsRemovedWithNull) {
  ASSERT_EQ(publisher_->Publish(SampleStatus(), time_.Now()).outcome, PublishOutcome::kPublished);
  server_->ClearRequests();
  json withoutUnplaced = SampleStatus();
  withoutUnplaced.erase("unplaced");
  ASSERT_EQ(publisher_->Publish(withoutUnplaced, time_.Now()).outcome, PublishOutcome::kPublished);
  auto writes = Writes(*server_);
  ASSERT_EQ(writes.size(), 1u);
  EXPECT_EQ(json::parse(writes[0].body), json({{"status", {{"unplaced", nullptr}}}}));
  EXPECT_FALSE(StoredGpuNode("n1")["status"].contains("unplaced"));
}

TEST_F(PublisherTest, BinderConditionsSurviveAgentPatches) {  // A8
  ASSERT_EQ(publisher_->Publish(SampleStatus(0), time_.Now()).outcome, PublishOutcome::kPublished);
  json conditions = {{{"type", "Bound"}, {"status", "True"}, {"reason", "BinderPass"}}};
  client_->MergePatch(kGpuNodes + "/n1/status", {{"status", {{"conditions", conditions}}}});
  json desired = SampleStatus(1);
  desired["conditions"] = json::array();  // a key the agent does not own is never sent
  ASSERT_EQ(publisher_->Publish(desired, time_.Now()).outcome, PublishOutcome::kPublished);
  for (const auto& write : RequestsTo(*server_, "PATCH", kGpuNodes)) {
    if (write.bearerToken.empty() && json::parse(write.body)["status"].contains("conditions") &&
        json::parse(write.body)["status"]["conditions"] == conditions) {
      continue;  // the binder's own patch above
    }
    EXPECT_FALSE(json::parse(write.body)["status"].contains("conditions")) << write.body;
  }
  EXPECT_EQ(StoredGpuNode("n1")["status"]["conditions"], conditions);
  EXPECT_EQ(StoredGpuNode("n1")["status"]["devices"], SampleStatus(1)["devices"]);
}

TEST_F(PublisherTest, OtherNodesObjectsAreNeverRead_OrWritten) {  // A9
  server_->Seed(NodeObject("n2"));
  json other = server_->Seed({{"apiVersion", "gpu.cozystack.io/v1alpha1"},
                              {"kind", "GPUNode"},
                              {"metadata", {{"name", "n2"}}},
                              {"status", SampleStatus(1)}});
  for (int allocated : {0, 1, 0}) {
    ASSERT_EQ(publisher_->Publish(SampleStatus(allocated), time_.Now()).outcome,
              PublishOutcome::kPublished);
  }
  for (const auto& request : server_->Requests()) {
    EXPECT_EQ(request.path.find("n2"), std::string::npos) << request.method << " " << request.path;
  }
  EXPECT_EQ(StoredGpuNode("n2"), other);
}

TEST_F(PublisherTest, ServerErrorsBackOffThenPublishExactlyOnce) {
  server_->AddFault(fake::Fault::Answer(503, 3, "PATCH"));
  kube::TimePoint start = time_.Now();
  PublishResult first = publisher_->Publish(SampleStatus(), start);
  EXPECT_EQ(first.outcome, PublishOutcome::kFailed);
  EXPECT_NE(first.error.find("503"), std::string::npos) << first.error;
  EXPECT_EQ(first.retryAt, start + 1s);

  // Before the retry time nothing is sent.
  size_t before = server_->Requests().size();
  EXPECT_EQ(publisher_->Publish(SampleStatus(), start + 500ms).outcome, PublishOutcome::kWaiting);
  EXPECT_EQ(server_->Requests().size(), before);

  // Exponential: 1 s, 2 s, 4 s; then the fault is spent and the patch goes through once.
  kube::TimePoint now = first.retryAt;
  std::vector<kube::Duration> waits;
  PublishResult result;
  for (int i = 0; i < 10; ++i) {
    result = publisher_->Publish(SampleStatus(), now);
    if (result.outcome != PublishOutcome::kFailed) break;
    waits.push_back(result.retryAt - now);
    now = result.retryAt;
  }
  ASSERT_EQ(result.outcome, PublishOutcome::kPublished) << result.error;
  EXPECT_EQ(waits, (std::vector<kube::Duration>{2s, 4s}));
  int accepted = 0;
  for (const auto& patch : RequestsTo(*server_, "PATCH", kGpuNodes))
    accepted += patch.status == 200;
  EXPECT_EQ(accepted, 1);
  EXPECT_EQ(RequestsTo(*server_, "POST", kGpuNodes).size(), 1u);
  EXPECT_EQ(publisher_->Publish(SampleStatus(), now + 1h).outcome, PublishOutcome::kUnchanged);
}

TEST_F(PublisherTest, ThrottlingHonoursRetryAfter) {
  server_->AddFault(fake::Fault::Answer(429, 1, "", 7));
  kube::TimePoint start = time_.Now();
  PublishResult result = publisher_->Publish(SampleStatus(), start);
  ASSERT_EQ(result.outcome, PublishOutcome::kFailed);
  EXPECT_EQ(result.retryAt, start + 7s);  // longer than the 1 s backoff: the server's word wins
  EXPECT_EQ(publisher_->Publish(SampleStatus(), result.retryAt).outcome,
            PublishOutcome::kPublished);
}

TEST_F(PublisherTest, DroppedConnectionsAreRetried) {
  server_->AddFault(fake::Fault::Drop(1, "PATCH"));
  PublishResult result = publisher_->Publish(SampleStatus(), time_.Now());
  ASSERT_EQ(result.outcome, PublishOutcome::kFailed);
  EXPECT_EQ(publisher_->Publish(SampleStatus(), result.retryAt).outcome,
            PublishOutcome::kPublished);
  EXPECT_EQ(StoredGpuNode("n1")["status"], SampleStatus());
}

TEST_F(PublisherTest, AnObjectDeletedBehindItsBackIsCreatedAgain) {
  ASSERT_EQ(publisher_->Publish(SampleStatus(0), time_.Now()).outcome, PublishOutcome::kPublished);
  client_->Delete(kGpuNodes + "/n1");
  PublishResult result = publisher_->Publish(SampleStatus(1), time_.Now());
  ASSERT_EQ(result.outcome, PublishOutcome::kPublished) << result.error;
  EXPECT_EQ(StoredGpuNode("n1")["status"], SampleStatus(1));
}

TEST_F(PublisherTest, WithoutItsNodeItCreatesNothingAndWaits) {
  Publisher orphan(*client_, "ghost", FastBackoff());
  PublishResult result = orphan.Publish(SampleStatus(), time_.Now());
  EXPECT_EQ(result.outcome, PublishOutcome::kFailed);
  EXPECT_NE(result.error.find("nodes/ghost"), std::string::npos) << result.error;
  EXPECT_TRUE(RequestsTo(*server_, "POST", kGpuNodes).empty());
}

TEST_F(PublisherTest, ARestartedAgentWritesNothingWhenTheObjectIsAlreadyRight) {
  ASSERT_EQ(publisher_->Publish(SampleStatus(), time_.Now()).outcome, PublishOutcome::kPublished);
  server_->ClearRequests();
  Publisher restarted(*client_, "n1", FastBackoff());
  EXPECT_EQ(restarted.Publish(SampleStatus(), time_.Now()).outcome, PublishOutcome::kUnchanged);
  EXPECT_TRUE(Writes(*server_).empty());
  EXPECT_EQ(server_->Requests().size(), 1u);  // one GET to learn what is there
}

TEST(PublisherCrd, MissingCrdIsTransientAndPublishesOnceTheCrdIsAdded) {
  auto server = StartFakeApiServer(/*withCrds=*/false);
  server->Seed(NodeObject("n1"));
  kube::FakeTimeSource time;
  kube::Client client(ConfigFor(*server), TestClientOptions(time));
  Publisher publisher(client, "n1", FastBackoff());
  PublishResult result = publisher.Publish(SampleStatus(), time.Now());
  ASSERT_EQ(result.outcome, PublishOutcome::kFailed);
  EXPECT_NE(result.error.find("ResourceNotServed"), std::string::npos) << result.error;
  time.Advance(1h);
  result = publisher.Publish(SampleStatus(), time.Now());
  EXPECT_EQ(result.outcome, PublishOutcome::kFailed);  // still no CRD

  for (const auto& crd : fake::YamlFileToJson(testing::GpuNodeCrdFile())) server->LoadCrd(crd);
  time.Advance(1h);
  result = publisher.Publish(SampleStatus(), time.Now());
  ASSERT_EQ(result.outcome, PublishOutcome::kPublished) << result.error;
  EXPECT_EQ(server->Object("gpu.cozystack.io/v1alpha1", "gpunodes", "", "n1")["status"],
            SampleStatus());
}

TEST(PublisherConnection, RefusedConnectionsFailWithoutThrowing) {
  kube::FakeTimeSource time;
  kube::ClientConfig config;
  {
    auto server = StartFakeApiServer();
    config.server = server->url();
  }  // stopped: nothing listens on that port now
  kube::Client client(config, TestClientOptions(time));
  Publisher publisher(client, "n1", FastBackoff());
  PublishResult result;
  EXPECT_NO_THROW(result = publisher.Publish(SampleStatus(), time.Now()));
  EXPECT_EQ(result.outcome, PublishOutcome::kFailed);
  EXPECT_NE(result.error.find("Transport"), std::string::npos) << result.error;
}

TEST(PublisherToken, ARotatedTokenFileIsPickedUp) {
  auto server = StartFakeApiServer();
  server->Seed(NodeObject("n1"));
  auto tokenFile =
      std::filesystem::temp_directory_path() / ("cozy-token-" + std::to_string(::getpid()));
  std::ofstream(tokenFile) << "token-one\n";
  server->SetAcceptedTokens({"token-one"});
  kube::FakeTimeSource time;
  kube::ClientConfig config = ConfigFor(*server);
  config.tokenFile = tokenFile.string();
  kube::Client client(config, TestClientOptions(time));
  Publisher publisher(client, "n1", FastBackoff());
  ASSERT_EQ(publisher.Publish(SampleStatus(0), time.Now()).outcome, PublishOutcome::kPublished);

  // kubelet rotates the projected token; the API server stops taking the old one.
  std::ofstream(tokenFile) << "token-two\n";
  server->SetAcceptedTokens({"token-two"});
  time.Advance(5s);  // the cached copy is still young: the first try gets a 401
  PublishResult result = publisher.Publish(SampleStatus(1), time.Now());
  EXPECT_EQ(result.outcome, PublishOutcome::kFailed);
  EXPECT_NE(result.error.find("401"), std::string::npos) << result.error;
  result = publisher.Publish(SampleStatus(1), result.retryAt);
  ASSERT_EQ(result.outcome, PublishOutcome::kPublished) << result.error;
  auto patches = RequestsTo(*server, "PATCH", kGpuNodes);
  ASSERT_FALSE(patches.empty());
  EXPECT_EQ(patches.back().bearerToken, "token-two");
  std::filesystem::remove(tokenFile);
}

TEST(AgentStatusPatch, OnlyAgentOwnedKeysAndNullForRemovedOnes) {
  json last = {{"resourceNames", {"a"}},
               {"devices", json::array()},
               {"unplaced", json::array()},
               {"conditions", {{{"type", "X"}}}}};
  json desired = {{"resourceNames", {"a", "b"}},
                  {"devices", json::array()},
                  {"conditions", json::array()},
                  {"somethingElse", 1}};
  EXPECT_EQ(AgentStatusPatch(last, desired),
            json({{"resourceNames", {"a", "b"}}, {"unplaced", nullptr}}));
  EXPECT_TRUE(AgentStatusPatch(desired, desired).empty());
}

// The loop's publisher asks the client's rate limiter before writing, so a write never sleeps
// inside the event loop: with the bucket empty it names the wait and sends nothing.
TEST(ApiStatusPublisher, WaitsForTheRateLimitInsteadOfSleepingInTheLoop) {
  auto server = StartFakeApiServer();
  server->Seed(NodeObject("n1"));
  kube::FakeTimeSource time;
  kube::ClientOptions options = TestClientOptions(time);
  options.qps = 2.0;
  options.burst = 2;
  kube::Client client(ConfigFor(*server), options);
  ApiStatusPublisher publisher(client, "n1");
  EXPECT_EQ(publisher.ReadyIn(), std::nullopt);
  // The first publish creates the object and patches its status: both tokens.
  EXPECT_EQ(publisher.Publish(SampleStatus()).outcome, PublishAttempt::Outcome::kWritten);
  const size_t requests = server->Requests().size();
  const auto wait = publisher.ReadyIn();
  ASSERT_TRUE(wait.has_value());
  EXPECT_GT(*wait, 0ms);
  EXPECT_LE(*wait, 500ms);  // one token at 2 qps
  EXPECT_EQ(server->Requests().size(), requests);
  time.Advance(*wait);
  EXPECT_EQ(publisher.ReadyIn(), std::nullopt);
}

}  // namespace
}  // namespace cozy::agent
