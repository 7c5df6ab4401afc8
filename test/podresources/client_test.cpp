// The pod-resources client against a fake kubelet over real gRPC on a real unix socket: every
// kubelet failure is a state, never a crash, and a hung kubelet costs one deadline.
#include "podresources/client.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <thread>

#include "agent/status/units.h"
#include "test/fakes/fake_kubelet.h"
#include "test/support/hosts.h"

namespace cozy::podresources {
namespace {

using fakes::Behaviour;
using fakes::FakeKubelet;
using fakes::Scenario;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr const char* kA100 = "nvidia.com/GA100_A100_PCIE_80GB";

class PodResourcesClient : public ::testing::Test {
 protected:
  void SetUp() override {
    // Unix socket paths are limited to 108 bytes: keep the directory short.
    char pattern[] = "/tmp/cozy-kubelet-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
    socket_ = (dir_ / "kubelet.sock").string();
  }
  void TearDown() override {
    kubelet_.Stop();
    std::filesystem::remove_all(dir_);
  }

  ClientOptions Options(milliseconds timeout = milliseconds(2000)) const {
    ClientOptions options;
    options.endpoint = "unix://" + socket_;
    options.callTimeout = timeout;
    return options;
  }

  static Scenario TwoGpusOnePod() {
    Scenario scenario;
    scenario.allocatable = {{kA100, {"42"}, std::vector<int64_t>{0}},
                            {kA100, {"43"}, std::vector<int64_t>{1}},
                            {"devices.kubevirt.io/kvm", {"kvm0", "kvm1"}, std::nullopt}};
    scenario.pods = {{"tenant-a",
                      "virt-launcher-vm1-x7k2p",
                      {{"compute", {{kA100, {"43"}, std::vector<int64_t>{1}}}}, {"sidecar", {}}}}};
    return scenario;
  }

  std::filesystem::path dir_;
  std::string socket_;
  FakeKubelet kubelet_;
};

TEST_F(PodResourcesClient, A1_ReadsAllocatableAndPods) {
  kubelet_.Start(socket_, TwoGpusOnePod());
  Client client(Options());
  const FetchResult result = client.Fetch();
  ASSERT_EQ(result.state, FetchState::kOk) << result.message;
  ASSERT_TRUE(result.allocation);
  const Allocation& allocation = *result.allocation;
  EXPECT_EQ(allocation.allocatable.at(kA100),
            (std::vector<AllocatableDevice>{{"42", std::vector<int64_t>{0}},
                                            {"43", std::vector<int64_t>{1}}}));
  EXPECT_EQ(allocation.allocatable.at("devices.kubevirt.io/kvm"),
            (std::vector<AllocatableDevice>{{"kvm0", std::nullopt}, {"kvm1", std::nullopt}}));
  ASSERT_EQ(allocation.pods.size(), 1u);
  EXPECT_EQ(allocation.pods[0].podNamespace, "tenant-a");
  EXPECT_EQ(allocation.pods[0].name, "virt-launcher-vm1-x7k2p");
  ASSERT_EQ(allocation.pods[0].containers.size(), 2u);
  EXPECT_EQ(allocation.pods[0].containers[0].devices.at(kA100), std::vector<std::string>{"43"});
  EXPECT_TRUE(allocation.pods[0].containers[1].devices.empty());
  EXPECT_TRUE(result.message.empty());
}

// proto3 leaves NUMANode.ID 0 off the wire: node 0 must still read as "has topology".
TEST_F(PodResourcesClient, NumaNodeZeroIsTopologyNotAbsence) {
  Scenario scenario;
  scenario.allocatable = {{"r", {"on-node-0"}, std::vector<int64_t>{0}},
                          {"r", {"no-topology"}, std::nullopt},
                          {"r", {"empty-node-list"}, std::vector<int64_t>{}},
                          {"r", {"two-nodes"}, std::vector<int64_t>{0, 1}}};
  kubelet_.Start(socket_, scenario);
  Client client(Options());
  const FetchResult result = client.Fetch();
  ASSERT_EQ(result.state, FetchState::kOk) << result.message;
  EXPECT_EQ(result.allocation->allocatable.at("r"),
            (std::vector<AllocatableDevice>{{"on-node-0", std::vector<int64_t>{0}},
                                            {"no-topology", std::nullopt},
                                            // "no NUMA preference" in the plugin contract
                                            {"empty-node-list", std::nullopt},
                                            {"two-nodes", std::vector<int64_t>{0, 1}}}));
}

// kubelet lists a device on two NUMA nodes once per node; units count it once.
TEST_F(PodResourcesClient, DeviceOnTwoNumaNodesListedTwiceCountsOnce) {
  Scenario scenario;
  scenario.allocatable = {{kA100, {"0000:3b:00.0"}, std::vector<int64_t>{0}},
                          {kA100, {"0000:3b:00.0"}, std::vector<int64_t>{1}}};
  kubelet_.Start(socket_, scenario);
  Client client(Options());
  const FetchResult result = client.Fetch();
  ASSERT_EQ(result.state, FetchState::kOk) << result.message;
  EXPECT_EQ(result.allocation->allocatable.at(kA100).size(), 2u);  // as kubelet sent it

  testing::HostBuilder builder;
  builder.Add(
      {"0000:3b:00.0", testing::kNvidia, 0x20b5, testing::kClass3d, "vfio-pci", 42u, true, {}});
  const agent::UnitReport report =
      agent::CountUnits(builder.Build(), *result.allocation, {}, {}, {});
  ASSERT_EQ(report.functions.size(), 1u);
  EXPECT_EQ(report.functions[0].allocatable, 1);
}

TEST_F(PodResourcesClient, SocketAbsentNamesThePath) {
  Client client(Options());
  const auto start = Clock::now();
  const FetchResult result = client.Fetch();
  EXPECT_EQ(result.state, FetchState::kSocketAbsent);
  EXPECT_FALSE(result.allocation);
  EXPECT_NE(result.message.find(socket_), std::string::npos) << result.message;
  EXPECT_NE(result.message.find("No such file"), std::string::npos) << result.message;
  EXPECT_LT(Clock::now() - start, milliseconds(500));
}

// A kubelet that died without removing its socket: the file is there, nobody accepts.
TEST_F(PodResourcesClient, RefusedConnectionIsUnavailableAndFast) {
  fakes::RefusingSocket refusing(socket_);
  Client client(Options(milliseconds(3000)));
  const auto start = Clock::now();
  const FetchResult result = client.Fetch();
  EXPECT_EQ(result.state, FetchState::kUnavailable) << result.message;
  EXPECT_NE(result.message.find("GetAllocatableResources on unix://" + socket_), std::string::npos)
      << result.message;
  // Not waiting out the deadline for a connection that will not come.
  EXPECT_LT(Clock::now() - start, milliseconds(2000));
}

TEST_F(PodResourcesClient, HungGetAllocatableReturnsWithinTheDeadline) {
  Scenario scenario = TwoGpusOnePod();
  scenario.getAllocatableResources = Behaviour::kHang;
  kubelet_.Start(socket_, scenario);
  Client client(Options(milliseconds(300)));
  const auto start = Clock::now();
  const FetchResult result = client.Fetch();
  const auto elapsed = Clock::now() - start;
  EXPECT_EQ(result.state, FetchState::kDeadlineExceeded);
  EXPECT_EQ(result.message,
            "GetAllocatableResources on unix://" + socket_ + ": deadline of 300 ms exceeded");
  EXPECT_GE(elapsed, milliseconds(250));
  EXPECT_LT(elapsed, milliseconds(1500));
  EXPECT_EQ(kubelet_.Calls().list, 0);  // no second call after the first failed
}

TEST_F(PodResourcesClient, HungListReturnsWithinTwoDeadlines) {
  Scenario scenario = TwoGpusOnePod();
  scenario.list = Behaviour::kHang;
  kubelet_.Start(socket_, scenario);
  Client client(Options(milliseconds(300)));
  const auto start = Clock::now();
  const FetchResult result = client.Fetch();
  EXPECT_EQ(result.state, FetchState::kDeadlineExceeded);
  EXPECT_NE(result.message.find("List on"), std::string::npos) << result.message;
  EXPECT_LT(Clock::now() - start, milliseconds(1500));
}

TEST_F(PodResourcesClient, UnimplementedGetAllocatableMeansUnitsUnknown) {
  Scenario scenario = TwoGpusOnePod();
  scenario.getAllocatableResources = Behaviour::kUnimplemented;
  kubelet_.Start(socket_, scenario);
  Client client(Options());
  const FetchResult result = client.Fetch();
  EXPECT_EQ(result.state, FetchState::kUnimplemented);
  EXPECT_FALSE(result.allocation);
  EXPECT_NE(result.message.find("GetAllocatableResources"), std::string::npos);
}

// kubelets < 1.28 with the KubeletPodResourcesGetAllocatable gate off answer a Go error.
TEST_F(PodResourcesClient, DisabledGetAllocatableGateMeansUnitsUnknown) {
  Scenario scenario = TwoGpusOnePod();
  scenario.getAllocatableResources = Behaviour::kDisabled;
  kubelet_.Start(socket_, scenario);
  Client client(Options());
  EXPECT_EQ(client.Fetch().state, FetchState::kUnimplemented);
}

TEST_F(PodResourcesClient, RateLimitIsResourceExhausted) {
  Scenario scenario = TwoGpusOnePod();
  scenario.list = Behaviour::kResourceExhausted;
  kubelet_.Start(socket_, scenario);
  Client client(Options());
  const FetchResult result = client.Fetch();
  EXPECT_EQ(result.state, FetchState::kResourceExhausted);
  EXPECT_NE(result.message.find("rejected by rate limit"), std::string::npos) << result.message;
}

TEST_F(PodResourcesClient, OversizedAnswerIsNotMistakenForTheRateLimit) {
  Scenario scenario;
  std::vector<std::string> ids;
  for (int i = 0; i < 200; ++i) {
    ids.push_back("a1b2c3d4-0000-4000-8000-" + std::to_string(100000000000 + i));
  }
  scenario.allocatable = {{"nvidia.com/GRID_T4-1Q", ids, std::nullopt}};
  kubelet_.Start(socket_, scenario);
  ClientOptions options = Options();
  options.maxReceiveBytes = 1024;
  Client client(options);
  const FetchResult result = client.Fetch();
  EXPECT_EQ(result.state, FetchState::kMessageTooLarge) << result.message;
  EXPECT_NE(result.message.find("1024 bytes"), std::string::npos) << result.message;
}

TEST_F(PodResourcesClient, OtherErrorsAreOther) {
  Scenario scenario = TwoGpusOnePod();
  scenario.list = Behaviour::kError;
  kubelet_.Start(socket_, scenario);
  Client client(Options());
  const FetchResult result = client.Fetch();
  EXPECT_EQ(result.state, FetchState::kOther);
  EXPECT_NE(result.message.find("fake kubelet: internal error"), std::string::npos);
}

TEST_F(PodResourcesClient, AnswersChangeWhileRunning) {
  kubelet_.Start(socket_, TwoGpusOnePod());
  Client client(Options(milliseconds(300)));
  ASSERT_EQ(client.Fetch().allocation->pods.size(), 1u);

  Scenario next = TwoGpusOnePod();
  next.pods.clear();
  next.allocatable.erase(next.allocatable.begin());  // group 42 went unhealthy
  kubelet_.SetScenario(next);
  FetchResult result = client.Fetch();
  ASSERT_EQ(result.state, FetchState::kOk) << result.message;
  EXPECT_TRUE(result.allocation->pods.empty());
  EXPECT_EQ(result.allocation->allocatable.at(kA100).size(), 1u);

  next.getAllocatableResources = Behaviour::kHang;
  kubelet_.SetScenario(next);
  EXPECT_EQ(client.Fetch().state, FetchState::kDeadlineExceeded);
  next.getAllocatableResources = Behaviour::kOk;
  kubelet_.SetScenario(next);
  result = client.Fetch();
  EXPECT_EQ(result.state, FetchState::kOk) << result.message;  // the channel survived
}

// kubelet restarts: its socket goes away, then a new one appears at the same path.
TEST_F(PodResourcesClient, KubeletRestartIsPickedUpOnTheNextFetch) {
  kubelet_.Start(socket_, TwoGpusOnePod());
  Client client(Options(milliseconds(1000)));
  ASSERT_EQ(client.Fetch().state, FetchState::kOk);

  kubelet_.Stop();
  EXPECT_EQ(client.Fetch().state, FetchState::kSocketAbsent);
  {
    fakes::RefusingSocket refusing(socket_);
    EXPECT_EQ(client.Fetch().state, FetchState::kUnavailable);
  }
  Scenario next = TwoGpusOnePod();
  next.pods.clear();
  kubelet_.Start(socket_, next);
  const FetchResult result = client.Fetch();
  ASSERT_EQ(result.state, FetchState::kOk) << result.message;
  EXPECT_TRUE(result.allocation->pods.empty());
}

// Something that is not kubelet listens on the path and answers junk, then hangs up.
TEST_F(PodResourcesClient, NonGrpcPeerIsAStateNotACrash) {
  const int listener = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, socket_.c_str(), socket_.size() + 1);
  ASSERT_EQ(::bind(listener, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(listener, 8), 0);
  std::atomic<bool> stop{false};
  std::thread peer([&] {
    while (!stop) {
      pollfd ready{listener, POLLIN, 0};
      if (::poll(&ready, 1, 20) != 1) {
        continue;
      }
      const int connection = ::accept(listener, nullptr, nullptr);
      if (connection >= 0) {
        constexpr std::string_view kJunk = "HTTP/1.1 400 Bad Request\r\n\r\n";
        (void)!::write(connection, kJunk.data(), kJunk.size());
        ::close(connection);
      }
    }
  });
  Client client(Options(milliseconds(1000)));
  const auto start = Clock::now();
  const FetchResult result = client.Fetch();
  stop = true;
  peer.join();
  ::close(listener);
  EXPECT_TRUE(result.state == FetchState::kUnavailable || result.state == FetchState::kOther)
      << ToString(result.state) << ": " << result.message;
  EXPECT_FALSE(result.allocation);
  EXPECT_LT(Clock::now() - start, milliseconds(1500));
}

TEST(UnixSocketPath, AbsoluteRelativeAndOtherSchemes) {
  EXPECT_EQ(UnixSocketPath(kDefaultEndpoint), "/var/lib/kubelet/pod-resources/kubelet.sock");
  EXPECT_EQ(UnixSocketPath("unix:kubelet.sock"), "kubelet.sock");
  EXPECT_FALSE(UnixSocketPath("dns:///localhost:10250"));
}

TEST(FetchStateNames, AreStable) {
  EXPECT_EQ(ToString(FetchState::kOk), "ok");
  EXPECT_EQ(ToString(FetchState::kSocketAbsent), "socketAbsent");
  EXPECT_EQ(ToString(FetchState::kDeadlineExceeded), "deadlineExceeded");
  EXPECT_EQ(ToString(FetchState::kUnimplemented), "unimplemented");
  EXPECT_EQ(ToString(FetchState::kResourceExhausted), "resourceExhausted");
}

}  // namespace
}  // namespace cozy::podresources
