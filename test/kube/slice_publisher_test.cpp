// The agent's ResourceSlice publisher against the fake API server over real HTTP (docs/dra.md,
// "The agent's ResourceSlice"): one create owned by the Node, nothing in steady state, one PUT
// with the pool's next generation per change, a slice deleted or changed behind its back put
// back, and no device offered by a server that would drop the catalog's taint (A10, A11).
#include "agent/sources/slice_publisher.h"

#include <gtest/gtest.h>

#include "agent/status/resource_slice.h"
#include "test/fakes/fake_apiserver_logic.h"
#include "test/kube/kube_test_support.h"
#include "test/support/fixture_host.h"

namespace cozy::agent {
namespace {
using nlohmann::json;
using namespace std::chrono_literals;

const std::string kSlices = "/apis/resource.k8s.io/v1/resourceslices";
const std::string kSlice = kSlices + "/n1-gpu.cozystack.io";

// The a100-vfio host's two devices, the second of them only when `both`.
json Devices(bool both = true) {
  static const json all = SliceDevices(testing::FixtureHost("a100-vfio").Scan(), "n1");
  json devices = all;
  if (!both) devices.erase(1);
  return devices;
}

// Stored writes (a dry run is not stored).
std::vector<fake::LoggedRequest> StoredWrites(const fake::FakeApiServer& server) {
  std::vector<fake::LoggedRequest> writes;
  for (const auto& request : testing::Writes(server)) {
    if (request.query.find("dryRun") == std::string::npos) writes.push_back(request);
  }
  return writes;
}

class SlicePublisherTest : public ::testing::Test {
 protected:
  void SetUp() override { Start({}); }
  void Start(fake::FakeApiServerOptions options) {
    server_ = std::make_unique<fake::FakeApiServer>(options);
    server_->Start();
    server_->Seed(testing::NodeObject("n1"));
    client_ = std::make_unique<kube::Client>(testing::ConfigFor(*server_),
                                             testing::TestClientOptions(time_));
    publisher_ = std::make_unique<SlicePublisher>(*client_, "n1");
  }
  json Stored() const {
    return server_->Object("resource.k8s.io/v1", "resourceslices", "", "n1-gpu.cozystack.io");
  }
  PublishAttempt::Outcome Publish(const json& devices) {
    return publisher_->Publish(devices).outcome;
  }

  kube::FakeTimeSource time_;
  std::unique_ptr<fake::FakeApiServer> server_;
  std::unique_ptr<kube::Client> client_;
  std::unique_ptr<SlicePublisher> publisher_;
};

TEST_F(SlicePublisherTest, A10_TheFirstPublishIsOneCreateOwnedByTheNodeThenNothingIsSent) {
  ASSERT_EQ(Publish(Devices()), PublishAttempt::Outcome::kWritten);
  auto writes = StoredWrites(*server_);
  ASSERT_EQ(writes.size(), 1U);
  EXPECT_EQ(writes[0].method, "POST");
  EXPECT_EQ(writes[0].path, kSlices);
  const json stored = Stored();
  EXPECT_EQ(stored["metadata"]["ownerReferences"][0]["uid"],
            server_->Object("v1", "nodes", "", "n1")["metadata"]["uid"]);
  EXPECT_EQ(stored["spec"]["pool"]["generation"], 1);
  EXPECT_EQ(ComparableDevices(stored["spec"]["devices"]), Devices());
  // The server stamped each taint's timeAdded; that is no difference to write again.
  EXPECT_TRUE(stored["spec"]["devices"][0]["taints"][0].contains("timeAdded"));
  EXPECT_TRUE(publisher_->IsWhatWasWritten(stored));

  server_->ClearRequests();
  for (int i = 0; i < 5; ++i) EXPECT_EQ(Publish(Devices()), PublishAttempt::Outcome::kUnchanged);
  EXPECT_TRUE(server_->Requests().empty());  // A11: steady state sends nothing at all
}

TEST_F(SlicePublisherTest, A10_AChangeIsOnePutWithThePoolsNextGeneration) {
  ASSERT_EQ(Publish(Devices()), PublishAttempt::Outcome::kWritten);
  server_->ClearRequests();
  ASSERT_EQ(Publish(Devices(false)), PublishAttempt::Outcome::kWritten);
  auto writes = StoredWrites(*server_);
  ASSERT_EQ(writes.size(), 1U);
  EXPECT_EQ(writes[0].method, "PUT");
  EXPECT_EQ(writes[0].path, kSlice);
  EXPECT_EQ(Stored()["spec"]["pool"]["generation"], 2);
  EXPECT_EQ(Stored()["spec"]["devices"].size(), 1U);
  EXPECT_EQ(publisher_->generation(), 2);
}

TEST_F(SlicePublisherTest, A11_ASliceDeletedOrChangedBehindItsBackIsPutBack) {
  ASSERT_EQ(Publish(Devices()), PublishAttempt::Outcome::kWritten);
  // Deleted (kubelet at its start): a change finds it gone and creates it again.
  client_->Delete(kSlice);
  ASSERT_EQ(Publish(Devices(false)), PublishAttempt::Outcome::kWritten);
  EXPECT_EQ(Stored()["spec"]["devices"].size(), 1U);
  EXPECT_EQ(Stored()["spec"]["pool"]["generation"], 2) << "a recreated pool never goes back";

  // Changed by someone else: not what was written; the repair (Invalidate, as the watch asks)
  // reads it and writes the agent's devices over it, at a newer generation.
  json edited = Stored();
  edited["spec"]["devices"] = json::array();
  edited = client_->Update(kSlice, edited);
  EXPECT_FALSE(publisher_->IsWhatWasWritten(edited));
  publisher_->Invalidate();
  ASSERT_EQ(Publish(Devices(false)), PublishAttempt::Outcome::kWritten);
  EXPECT_EQ(ComparableDevices(Stored()["spec"]["devices"]), Devices(false));
  EXPECT_EQ(Stored()["spec"]["pool"]["generation"], 3);
}

TEST_F(SlicePublisherTest, A11_ARestartedAgentFindsItsSliceAndWritesNothing) {
  ASSERT_EQ(Publish(Devices()), PublishAttempt::Outcome::kWritten);
  server_->ClearRequests();
  SlicePublisher restarted(*client_, "n1");
  EXPECT_EQ(restarted.Publish(Devices()).outcome, PublishAttempt::Outcome::kUnchanged);
  EXPECT_TRUE(testing::Writes(*server_).empty());
  EXPECT_EQ(server_->Requests().size(), 1U);  // one GET to learn what is there
  EXPECT_EQ(restarted.generation(), 1);
}

TEST_F(SlicePublisherTest, A10_AServerThatDropsDeviceTaintsIsOfferedNoDevice) {
  fake::FakeApiServerOptions options;
  options.draDeviceTaints = false;  // the feature gate DRADeviceTaints off
  Start(options);
  ASSERT_EQ(Publish(Devices()), PublishAttempt::Outcome::kWritten);
  // Only the dry run carried devices; what was stored offers none, then or later.
  for (const auto& write : StoredWrites(*server_)) {
    EXPECT_EQ(json::parse(write.body)["spec"]["devices"], json::array()) << write.body;
  }
  EXPECT_EQ(Stored()["spec"]["devices"], json::array());
  EXPECT_EQ(Publish(Devices(false)), PublishAttempt::Outcome::kUnchanged);
  EXPECT_EQ(Stored()["spec"]["devices"], json::array());
}

TEST_F(SlicePublisherTest, ServerErrorsAndAMissingNodeAreRetriedLater) {
  server_->AddFault(fake::Fault::Answer(503, 1, "POST"));
  PublishAttempt failed = publisher_->Publish(Devices());
  EXPECT_EQ(failed.outcome, PublishAttempt::Outcome::kFailed);
  EXPECT_GE(failed.retryIn, 10ms);
  EXPECT_EQ(Publish(Devices()), PublishAttempt::Outcome::kWritten);

  SlicePublisher orphan(*client_, "ghost");
  EXPECT_EQ(orphan.Publish(Devices()).outcome, PublishAttempt::Outcome::kFailed);
  EXPECT_TRUE(server_->Object("resource.k8s.io/v1", "resourceslices", "", "ghost-gpu.cozystack.io")
                  .is_null());
}

}  // namespace
}  // namespace cozy::agent
