// The agent under faults (docs/gpu-agent.md, "Under faults"), end to end: `gpu-agent run` as a
// process against the fake API server and the fake kubelet, each fault injected there. Nothing
// crashes, nothing is lost, the log says what happened, and the published status tells stale counts
// from fresh.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "test/e2e/agent_fixture.h"
#include "test/fakes/fake_apiserver.h"
#include "test/fakes/fake_kubelet.h"
#include "test/support/agent_process.h"
#include "test/support/fixture_host.h"
#include "test/support/process.h"

namespace cozy {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using testing::WaitFor;

const std::string kGpuNodes = "/apis/gpu.cozystack.io/v1alpha1/gpunodes";

class AgentFaults : public AgentOnFakeCluster {
 protected:
  void SetUp() override {
    AgentOnFakeCluster::SetUp();
    healthPort_ = testing::FreePort();
    healthAddress_ = "127.0.0.1:" + std::to_string(healthPort_);
  }

  // Lines of the agent's log that contain `text`.
  size_t LogCount(const std::string& text) const {
    const std::string log = agent_.Log();
    size_t count = 0;
    for (size_t at = log.find(text); at != std::string::npos; at = log.find(text, at + 1)) {
      ++count;
    }
    return count;
  }
  // GET on the agent's health server with a one-second deadline; the HTTP code, or "000".
  std::string Probe(const std::string& path) const {
    return testing::RunCommand("curl -s -o /dev/null -m 1 -w '%{http_code}' http://127.0.0.1:" +
                               std::to_string(healthPort_) + path)
        .out;
  }
  int healthPort_ = 0;
};

// Every request answered after 9 s: the loop keeps turning (passes run on every trigger within
// a second), /healthz and /metrics answer at once, and once the server recovers the last status
// is published.
TEST_F(AgentFaults, BrownoutNeverHoldsTheLoop) {
  StartAgent();
  ASSERT_TRUE(WaitFor([&] { return Published(); })) << agent_.Log();
  server_->SetRequestDelay(9s);  // every request: lists, watches, gets and patches
  const std::string drivers[] = {"nvidia", "vfio-pci", "nvidia"};
  for (const std::string& driver : drivers) {
    const size_t before = LogCount("inventory changed");
    Rebind("0000:af:00.0", driver);
    agent_.Signal(SIGHUP);
    // Today's main wrote the first change inside the loop: 9 s and more before the next pass.
    EXPECT_TRUE(WaitFor([&] { return LogCount("inventory changed") > before; }, 2s))
        << "no pass within 2 s of SIGHUP during the brownout\n"
        << agent_.Log();
    EXPECT_EQ(Probe("/healthz"), "200");
    EXPECT_EQ(Probe("/metrics"), "200");
  }
  server_->ClearFaults();
  ASSERT_TRUE(WaitFor([&] { return Device(GpuNode(), "0000:af:00.0")["driver"] == "nvidia"; }, 40s))
      << agent_.Log();
  EXPECT_TRUE(agent_.Alive());
}

// An outside edit of the agent's own fields is repaired at the next resync; the binder's
// conditions are left as they are.
TEST_F(AgentFaults, DriftIsRepairedAtTheNextResync) {
  StartAgent({"--resync-interval", "2s"});
  ASSERT_TRUE(WaitFor([&] { return Published(); })) << agent_.Log();
  const json published = GpuNode()["status"];
  const auto edited = testing::RunCommand(
      "curl -s -o /dev/null -w '%{http_code}' -X PATCH -H "
      "'Content-Type: application/merge-patch+json' -d '" +
      json{{"status",
            {{"devices", json::array()},
             {"summary", {{"gpus", 0}}},
             {"conditions", {{{"type", "Schedulable"}, {"status", "True"}}}}}}}
          .dump() +
      "' " + server_->url() + kGpuNodes + "/n1/status");
  ASSERT_EQ(edited.out, "200");
  ASSERT_EQ(GpuNode()["status"]["devices"], json::array());
  ASSERT_TRUE(WaitFor([&] { return GpuNode()["status"]["devices"] == published["devices"]; }, 8s))
      << GpuNode().dump(2) << agent_.Log();
  EXPECT_EQ(GpuNode()["status"]["summary"], published["summary"]);
  EXPECT_EQ(GpuNode()["status"]["conditions"][0]["type"], "Schedulable");
}

// kubelet gone for longer than --stale-after: the status keeps the last counts and says since
// when they are; kubelet back, the mark goes.
TEST_F(AgentFaults, StaleCountsSaySinceWhen) {
  StartAgent({"--stale-after", "1s"});
  ASSERT_TRUE(WaitFor([&] { return Published(); })) << agent_.Log();
  EXPECT_FALSE(GpuNode()["status"].contains("staleUnits"));
  kubelet_.Stop();
  ASSERT_TRUE(WaitFor([&] { return GpuNode()["status"].contains("staleUnits"); }, 10s))
      << GpuNode().dump(2) << agent_.Log();
  const json stale = GpuNode()["status"]["staleUnits"];
  EXPECT_EQ(stale["kubelet"], "socketAbsent");
  ASSERT_TRUE(stale["since"].is_string());
  EXPECT_TRUE(std::regex_match(stale["since"].get<std::string>(),
                               std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")))
      << stale;
  // The last counts stay: zeros would tell the cluster its GPUs are gone.
  EXPECT_EQ(GpuNode()["status"]["summary"]["allocatable"], 2);
  // kubelet back; SIGHUP reads it at once instead of at the end of the backoff.
  StartKubelet();
  agent_.Signal(SIGHUP);
  ASSERT_TRUE(WaitFor([&] { return !GpuNode()["status"].contains("staleUnits"); }, 10s))
      << GpuNode().dump(2) << agent_.Log();
}

// Answers that parse but carry the wrong types, in the pod list and in its watch: before, the
// first one threw out of the loop and terminated the agent, and the relist after the restart did
// it again. Now each fails that list or watch, is logged, backed off and relisted; the agent
// publishes and stays up, and the pod watch recovers.
TEST_F(AgentFaults, WrongTypesInThePodListAndWatchNeverStopTheAgent) {
  server_->Seed({{"apiVersion", "v1"},
                 {"kind", "Pod"},
                 {"metadata", {{"name", "virt-launcher-vm1-x7k2p"}, {"namespace", "tenant-a"}}},
                 {"spec", {{"nodeName", "n1"}}},
                 {"status", {{"phase", "Succeeded"}}}});
  const std::string pods = "/api/v1/pods";
  server_->AddFault(fake::Fault::Mode(fake::FaultMode::kListItemsNotArray, 1, pods));
  server_->AddFault(fake::Fault::Mode(fake::FaultMode::kListResourceVersionNumber, 1, pods));
  server_->AddFault(fake::Fault::Mode(fake::FaultMode::kListWithoutMetadata, 1, pods));
  server_->AddFault(fake::Fault::Mode(fake::FaultMode::kWatchResourceVersionNumber, 1, pods));
  server_->AddFault(fake::Fault::Mode(fake::FaultMode::kWatchObjectNotObject, 1, pods));
  StartAgent();
  ASSERT_TRUE(WaitFor([&] { return Published(); }, 20s)) << agent_.Log();
  EXPECT_NE(agent_.Log().find("pod watch failed"), std::string::npos) << agent_.Log();
  EXPECT_NE(agent_.Log().find("items"), std::string::npos) << agent_.Log();
  // Once the faults are spent the watch syncs: the Succeeded pod holds no unit (A7).
  ASSERT_TRUE(WaitFor([&] { return Device(GpuNode(), "0000:3b:00.0")["allocated"] == 0; }, 30s))
      << GpuNode().dump(2) << agent_.Log();
  EXPECT_TRUE(agent_.Alive());
  EXPECT_EQ(agent_.Log().find("terminate"), std::string::npos);
}

// A GPUNode read that never ends (a 200 MiB body, an endless string) fails that request only:
// the agent publishes once the server answers properly, and its memory stays small.
TEST_F(AgentFaults, AnEndlessBodyFailsOneRequestOnly) {
  server_->AddFault(fake::Fault::Mode(fake::FaultMode::kEndlessBody, 1, kGpuNodes + "/n1"));
  server_->AddFault(fake::Fault::Mode(fake::FaultMode::kEndlessString, 1, kGpuNodes + "/n1"));
  StartAgent();
  ASSERT_TRUE(WaitFor([&] { return Published(); }, 30s)) << agent_.Log();
  EXPECT_NE(agent_.Log().find("cannot publish GPUNode"), std::string::npos) << agent_.Log();
  EXPECT_TRUE(agent_.Alive());
#if !defined(__SANITIZE_ADDRESS__)
  // Today's main read the 200 MiB body whole. (Under AddressSanitizer its shadow memory and
  // quarantine are most of the RSS, so the bound means nothing there.)
  EXPECT_LT(agent_.PeakRssKiB(), 64 * 1024) << "peak RSS " << agent_.PeakRssKiB() << " KiB";
#endif
}

// A pod watch that the server closes at once with no events is re-opened with backoff, not in a
// hot loop.
TEST_F(AgentFaults, AWatchThatClosesAtOnceIsBackedOff) {
  server_->AddFault(fake::Fault::Mode(fake::FaultMode::kWatchCloseAtOnce, -1, "/api/v1/pods"));
  StartAgent();
  ASSERT_TRUE(WaitFor([&] { return Published(); })) << agent_.Log();
  server_->ClearRequests();
  // Kept a sleep: what is asserted is a rate, the watches opened in a window of 3 s.
  std::this_thread::sleep_for(3s);
  size_t watches = 0;
  for (const auto& request : server_->Requests()) {
    watches += request.path == "/api/v1/pods" && request.query.find("watch=1") != std::string::npos
                   ? 1U
                   : 0U;
  }
  EXPECT_LE(watches, 4U) << "pod watches in 3 s";
  EXPECT_TRUE(agent_.Alive());
}

// The unit ships NODE_NAME= and passes --node-name ${NODE_NAME}: an empty name is refused with a
// reason, never replaced by the hostname.
TEST_F(AgentFaults, AnEmptyNodeNameIsRefused) {
  const std::string agent = testing::ShellQuote(testing::GpuAgentBinary().string());
  const std::string common = " --sysfs-root " + testing::ShellQuote(host_.root().string()) +
                             " --udev-source off --health-addr off";
  const auto emptyFlag = testing::RunCommand(agent + " run --node-name ''" + common);
  EXPECT_EQ(emptyFlag.exitCode, 2);
  EXPECT_NE(emptyFlag.err.find("--node-name is empty"), std::string::npos) << emptyFlag.err;
  const auto emptyEnvironment = testing::RunCommand("env NODE_NAME= " + agent + " run" + common);
  EXPECT_EQ(emptyEnvironment.exitCode, 2);
  EXPECT_NE(emptyEnvironment.err.find("NODE_NAME is set but empty"), std::string::npos)
      << emptyEnvironment.err;
  const auto badName = testing::RunCommand(agent + " run --node-name 'Node_1'" + common);
  EXPECT_EQ(badName.exitCode, 2);
  EXPECT_NE(badName.err.find("is not a Kubernetes node name"), std::string::npos) << badName.err;
}

}  // namespace
}  // namespace cozy
