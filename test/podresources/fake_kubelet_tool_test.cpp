// The fake_kubelet tool as the README demo and out-of-process tests use it: a scenario file
// served on a socket, changed answers picked up from the file, misbehaviour switched by file.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "podresources/client.h"
#include "test/fakes/fake_kubelet.h"

namespace cozy::fakes {
namespace {

using podresources::Client;
using podresources::ClientOptions;
using podresources::FetchResult;
using podresources::FetchState;
using std::chrono::milliseconds;

TEST(ParseScenario, FullFormat) {
  const Scenario scenario = ParseScenario(R"({
    "allocatable": [
      {"resource": "nvidia.com/GRID_T4-1Q", "ids": ["a", "b"], "numaNodes": [0]},
      {"resource": "devices.kubevirt.io/kvm", "ids": ["kvm0"]}
    ],
    "pods": [
      {"namespace": "ns", "name": "p", "containers": [
        {"name": "compute", "devices": [{"resource": "nvidia.com/GRID_T4-1Q", "ids": ["a"]}]}
      ]}
    ],
    "behaviour": {"getAllocatableResources": "unimplemented", "list": "hang", "delayMs": 5}
  })");
  ASSERT_EQ(scenario.allocatable.size(), 2u);
  EXPECT_EQ(scenario.allocatable[0].numaNodes, std::vector<int64_t>{0});
  EXPECT_FALSE(scenario.allocatable[1].numaNodes);
  ASSERT_EQ(scenario.pods.size(), 1u);
  EXPECT_EQ(scenario.pods[0].containers[0].devices[0].ids, std::vector<std::string>{"a"});
  EXPECT_EQ(scenario.getAllocatableResources, Behaviour::kUnimplemented);
  EXPECT_EQ(scenario.list, Behaviour::kHang);
  EXPECT_EQ(scenario.get, Behaviour::kOk);
  EXPECT_EQ(scenario.delay, milliseconds(5));
}

TEST(ParseScenario, ErrorsNameTheKey) {
  auto message = [](const char* json) {
    try {
      ParseScenario(json);
    } catch (const std::runtime_error& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("{").find("not JSON"), std::string::npos);
  EXPECT_NE(
      message(R"({"allocatable": [{"ids": []}]})").find("allocatable[0]: missing \"resource\""),
      std::string::npos);
  EXPECT_NE(message(R"({"pods": [{"namespace": "n", "name": "p", "containers": [{}]}]})")
                .find("pods[0].containers[0]: missing \"name\""),
            std::string::npos);
  EXPECT_NE(message(R"({"behaviour": {"list": "explode"}})").find("behaviour.list"),
            std::string::npos);
}

class FakeKubeletTool : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/cozy-fakek-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
    socket_ = (dir_ / "kubelet.sock").string();
    scenario_ = (dir_ / "scenario.json").string();
  }
  void TearDown() override {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (output_ >= 0) {
      ::close(output_);
    }
    std::filesystem::remove_all(dir_);
  }

  void WriteScenario(const std::string& json) {
    // Write then rename, so the tool never reads half a file.
    const std::string temporary = scenario_ + ".tmp";
    std::ofstream(temporary) << json;
    std::filesystem::rename(temporary, scenario_);
  }

  // Starts the tool and waits for its first stdout line, which it prints once it listens:
  // the socket file alone appears at bind(), a moment before listen().
  void Launch(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {FAKE_KUBELET_PATH, "--socket", socket_, "--poll-ms", "20"};
    args.insert(args.end(), extra.begin(), extra.end());
    int out[2];
    ASSERT_EQ(::pipe(out), 0);
    pid_ = ::fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      ::close(out[0]);
      ::close(out[1]);
      std::vector<char*> argv;
      for (auto& arg : args) {
        argv.push_back(arg.data());
      }
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(out[1]);
    std::string line;
    pollfd ready{out[0], POLLIN, 0};
    while (line.find('\n') == std::string::npos && ::poll(&ready, 1, 5000) == 1) {
      char buffer[256];
      const ssize_t got = ::read(out[0], buffer, sizeof(buffer));
      if (got <= 0) {
        break;
      }
      line.append(buffer, static_cast<size_t>(got));
    }
    output_ = out[0];  // kept open to the end: the tool's later lines must not meet EPIPE
    ASSERT_NE(line.find("fake_kubelet: "), std::string::npos)
        << "fake_kubelet printed no ready line: \"" << line << '"';
  }

  // Fetches until `done` holds or ~5 s pass: the tool notices file changes by polling.
  template <typename Predicate>
  FetchResult FetchUntil(Client& client, Predicate done) {
    FetchResult result;
    for (int i = 0; i < 100; ++i) {
      result = client.Fetch();
      if (done(result)) {
        break;
      }
      std::this_thread::sleep_for(milliseconds(50));
    }
    return result;
  }

  std::filesystem::path dir_;
  std::string socket_;
  std::string scenario_;
  pid_t pid_ = -1;
  int output_ = -1;
};

TEST_F(FakeKubeletTool, ServesTheFileAndFollowsItsChanges) {
  WriteScenario(R"({"allocatable": [{"resource": "r", "ids": ["42"], "numaNodes": [0]}]})");
  Launch({"--scenario", scenario_});
  ClientOptions options;
  options.endpoint = "unix://" + socket_;
  options.callTimeout = milliseconds(1000);  // generous: CI machines are loaded
  Client client(options);
  FetchResult result = client.Fetch();
  ASSERT_EQ(result.state, FetchState::kOk) << result.message;
  EXPECT_EQ(result.allocation->allocatable.at("r").size(), 1u);

  WriteScenario(R"({"allocatable": [{"resource": "r", "ids": ["42", "43"]}],
                    "pods": [{"namespace": "n", "name": "p", "containers": []}]})");
  // Both answers of the new file: one fetch is two calls (allocatable, then the pods), and a
  // change of the file may land between them, so a fetch can pair the old allocatable with the
  // new pods, as a real kubelet's two answers can disagree for a moment.
  result = FetchUntil(client, [](const FetchResult& r) {
    return r.state == FetchState::kOk && r.allocation->pods.size() == 1 &&
           r.allocation->allocatable.count("r") == 1 &&
           r.allocation->allocatable.at("r").size() == 2;
  });
  ASSERT_EQ(result.state, FetchState::kOk) << result.message;
  EXPECT_EQ(result.allocation->allocatable.at("r").size(), 2u);

  // Misbehaviour by file: a kubelet that starts hanging.
  WriteScenario(R"({"behaviour": {"getAllocatableResources": "hang"}})");
  result = FetchUntil(
      client, [](const FetchResult& r) { return r.state == FetchState::kDeadlineExceeded; });
  EXPECT_EQ(result.state, FetchState::kDeadlineExceeded);

  // A broken file keeps the previous answers rather than killing the server.
  WriteScenario("{ not json");
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(client.Fetch().state, FetchState::kDeadlineExceeded);

  ASSERT_EQ(::kill(pid_, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid_, &status, 0), pid_);
  pid_ = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_FALSE(std::filesystem::exists(socket_));
}

TEST_F(FakeKubeletTool, SighupRereadsTheFile) {
  WriteScenario(R"({"allocatable": []})");
  Launch({"--scenario", scenario_, "--poll-ms", "60000"});  // no polling: only SIGHUP
  ClientOptions options;
  options.endpoint = "unix://" + socket_;
  Client client(options);
  ASSERT_EQ(client.Fetch().state, FetchState::kOk);
  WriteScenario(R"({"behaviour": {"list": "unimplemented"}})");
  ASSERT_EQ(::kill(pid_, SIGHUP), 0);
  const FetchResult result = FetchUntil(
      client, [](const FetchResult& r) { return r.state == FetchState::kUnimplemented; });
  EXPECT_EQ(result.state, FetchState::kUnimplemented) << result.message;
}

TEST_F(FakeKubeletTool, RefuseMode) {
  Launch({"--refuse"});
  ClientOptions options;
  options.endpoint = "unix://" + socket_;
  Client client(options);
  EXPECT_EQ(client.Fetch().state, FetchState::kUnavailable);
}

}  // namespace
}  // namespace cozy::fakes
