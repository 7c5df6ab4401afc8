// `gpu-agent scan` with kubelet's pod-resources: a fixture host, the fake kubelet serving the
// real plugins' ID shapes over gRPC on a real unix socket, and the agent as users run it.
// A1-A7: resolution by shape, units per function, health, final pods, NVML UUIDs.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <tuple>

#include "test/fakes/fake_apiserver.h"
#include "test/fakes/fake_kubelet.h"
#include "test/support/fixture_host.h"

namespace cozy {
namespace {

using testing::FixtureHost;
using testing::RunCommand;
using testing::ShellQuote;

std::filesystem::path Scenario(const std::string& name) {
  return testing::SourceDir() / "fixtures/kubelet" / (name + ".json");
}

class ScanWithKubelet : public ::testing::Test {
 protected:
  void Serve(const std::string& scenario) {
    kubelet_.Start((socketDir_.path() / "kubelet.sock").string(),
                   fakes::LoadScenario(Scenario(scenario).string()));
  }
  testing::CommandResult Scan(const FixtureHost& host, const std::string& extra = "") {
    return RunCommand(ShellQuote(testing::GpuAgentBinary().string()) + " scan --sysfs-root " +
                      ShellQuote(host.root().string()) + " --pci-ids " +
                      ShellQuote(testing::FixturePciIds().string()) + " --pod-resources " +
                      ShellQuote("unix://" + (socketDir_.path() / "kubelet.sock").string()) + " " +
                      extra);
  }
  static nlohmann::json Device(const nlohmann::json& object, const std::string& address) {
    for (const auto& device : object["status"]["devices"]) {
      if (device["pciAddress"] == address) {
        return device;
      }
    }
    ADD_FAILURE() << "no device " << address;
    return {};
  }

  testing::TempDir socketDir_;
  fakes::FakeKubelet kubelet_;
};

TEST_F(ScanWithKubelet, A2_A100PassthroughThroughKubeVirtGroupIds) {
  const FixtureHost host("a100-vfio");
  Serve("a100-kubevirt-pci");
  const auto result = Scan(host);
  ASSERT_EQ(result.exitCode, 0) << result.err;
  EXPECT_EQ(result.err, "");
  const auto object = nlohmann::json::parse(result.out);
  EXPECT_EQ(object["status"]["resourceNames"],
            nlohmann::json::array({"nvidia.com/GA100_A100_PCIE_40GB"}));  // kvm is not a GPU
  EXPECT_EQ(object["status"]["unplaced"], nlohmann::json::array());
  const auto held = Device(object, "0000:3b:00.0");
  EXPECT_EQ(
      held["resources"],
      (nlohmann::json::array(
          {{{"name", "nvidia.com/GA100_A100_PCIE_40GB"}, {"allocatable", 1}, {"allocated", 1}}})));
  EXPECT_EQ(held["allocatable"], 1);
  EXPECT_EQ(held["allocated"], 1);
  EXPECT_EQ(held["health"], "Healthy");
  const auto free = Device(object, "0000:af:00.0");
  EXPECT_EQ(free["allocatable"], 1);
  EXPECT_EQ(free["allocated"], 0);
  EXPECT_EQ(free["health"], "Healthy");
}

TEST_F(ScanWithKubelet, A6_A7_T4FourMdevsTwoHeldByARunningPodOneByASucceededPod) {
  const FixtureHost host("t4-vgpu-4");
  Serve("t4-vgpu-4");
  const auto phases = testing::SourceDir() / "fixtures/kubelet/t4-vgpu-4.phases.json";
  const auto result = Scan(host, "--pod-phases " + ShellQuote(phases.string()));
  ASSERT_EQ(result.exitCode, 0) << result.err;
  const auto t4 = Device(nlohmann::json::parse(result.out), "0000:5e:00.0");
  EXPECT_EQ(t4["allocatable"], 4);  // per function: an mdev parent serves several
  EXPECT_EQ(t4["allocated"], 2);    // the Succeeded pod holds nothing
  EXPECT_EQ(t4["health"], "Healthy");
  // Without phases every listed pod counts as active.
  const auto unknownPhases = Device(nlohmann::json::parse(Scan(host).out), "0000:5e:00.0");
  EXPECT_EQ(unknownPhases["allocated"], 3);
}

TEST_F(ScanWithKubelet, A7_KubeconfigListsTheNodesPodsOnceForTheirPhases) {
  const FixtureHost host("t4-vgpu-4");
  Serve("t4-vgpu-4");
  fake::FakeApiServer api;
  api.Start();
  for (const auto& [ns, name, phase] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"tenant-a", "virt-launcher-running", "Running"},
           {"tenant-b", "virt-launcher-finished", "Succeeded"}}) {
    api.Seed({{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata", {{"name", name}, {"namespace", ns}}},
              {"spec", {{"nodeName", "gpu-node-1"}}},
              {"status", {{"phase", phase}}}});
  }
  const auto kubeconfig = socketDir_.path() / "kubeconfig";
  std::ofstream(kubeconfig) << api.Kubeconfig("t");
  const auto result =
      Scan(host, "--node-name gpu-node-1 --kubeconfig " + ShellQuote(kubeconfig.string()));
  ASSERT_EQ(result.exitCode, 0) << result.err;
  EXPECT_EQ(Device(nlohmann::json::parse(result.out), "0000:5e:00.0")["allocated"], 2);
  bool listed = false;
  for (const auto& request : api.Requests()) {
    listed = listed ||
             (request.path == "/api/v1/pods" &&
              request.query.find("fieldSelector=spec.nodeName=gpu-node-1") != std::string::npos);
    EXPECT_EQ(request.method, "GET");  // scan writes nothing
  }
  EXPECT_TRUE(listed);
  api.Stop();
}

TEST_F(ScanWithKubelet, A5_UnhealthyDeviceStillHeldByAPod) {
  const FixtureHost host("a100-vfio");
  auto scenario = fakes::LoadScenario(Scenario("a100-kubevirt-pci").string());
  // kubelet lists only healthy devices as allocatable: group 40 turned unhealthy.
  scenario.allocatable.erase(scenario.allocatable.begin());
  kubelet_.Start((socketDir_.path() / "kubelet.sock").string(), scenario);
  const auto object = nlohmann::json::parse(Scan(host).out);
  const auto held = Device(object, "0000:3b:00.0");
  EXPECT_EQ(held["allocatable"], 0);
  EXPECT_EQ(held["allocated"], 1);
  EXPECT_EQ(held["health"], "Unhealthy");
  EXPECT_EQ(Device(object, "0000:af:00.0")["health"], "Healthy");
}

TEST_F(ScanWithKubelet, L40sVendorSpecificVfAdvertisedByPciAddress) {
  const FixtureHost host("l40s-vendor-vfio");
  Serve("l40s-vendor-vfio");
  const auto object = nlohmann::json::parse(Scan(host).out);
  const auto vf = Device(object, "0000:41:00.5");
  EXPECT_EQ(vf["vgpu"]["currentType"], "1150");
  EXPECT_EQ(vf["allocatable"], 1);
  EXPECT_EQ(vf["allocated"], 1);
  EXPECT_EQ(vf["health"], "Healthy");
  EXPECT_EQ(Device(object, "0000:41:00.4")["health"], "Unadvertised");
  EXPECT_EQ(Device(object, "0000:41:00.0")["health"], "Unadvertised");
  EXPECT_EQ(object["status"]["resourceNames"],
            nlohmann::json::array({"nvidia.com/NVIDIA_L40S-4Q"}));
}

TEST_F(ScanWithKubelet, A4_HgxContainerPluginUuidsAreUnplacedWithoutProcfs) {
  const FixtureHost host("hgx-h100");
  std::filesystem::remove_all(host.root() / "proc");  // no NVIDIA driver procfs
  Serve("hgx-h100-container-plugin");
  const auto object = nlohmann::json::parse(Scan(host).out);
  EXPECT_EQ(object["status"]["resourceNames"], nlohmann::json::array({"nvidia.com/gpu"}));
  EXPECT_EQ(object["status"]["unplaced"],
            (nlohmann::json::array(
                {{{"resourceName", "nvidia.com/gpu"}, {"allocatable", 8}, {"allocated", 2}}})));
  for (const auto& device : object["status"]["devices"]) {
    EXPECT_EQ(device["health"], "Unadvertised") << device["pciAddress"];
    EXPECT_EQ(device["allocatable"], 0);
  }
}

TEST_F(ScanWithKubelet, HgxContainerPluginUuidsArePlacedThroughNvidiaProcfs) {
  const FixtureHost host("hgx-h100");
  Serve("hgx-h100-container-plugin");
  const auto object = nlohmann::json::parse(Scan(host).out);
  EXPECT_EQ(object["status"]["unplaced"], nlohmann::json::array());
  EXPECT_EQ(object["status"]["resourceNames"], nlohmann::json::array({"nvidia.com/gpu"}));
  EXPECT_EQ(Device(object, "0000:19:00.0")["allocated"], 1);
  EXPECT_EQ(Device(object, "0000:29:00.0")["allocated"], 1);
  EXPECT_EQ(Device(object, "0000:39:00.0")["allocated"], 0);
  for (const auto& device : object["status"]["devices"]) {
    EXPECT_EQ(device["allocatable"], 1) << device["pciAddress"];
    EXPECT_EQ(device["health"], "Healthy");
  }
}

TEST_F(ScanWithKubelet, HungKubeletScanFinishesWithinTheDeadlineAndSaysUnitsAreUnknown) {
  const FixtureHost host("a100-vfio");
  auto scenario = fakes::LoadScenario(Scenario("a100-kubevirt-pci").string());
  scenario.getAllocatableResources = fakes::Behaviour::kHang;
  kubelet_.Start((socketDir_.path() / "kubelet.sock").string(), scenario);
  const auto start = std::chrono::steady_clock::now();
  const auto result = Scan(host, "--pod-resources-timeout 300ms");
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(result.exitCode, 0) << result.err;
  // Bounded by the deadline, not by kubelet: a generous ceiling, not a timing assertion.
  EXPECT_LT(elapsed, std::chrono::seconds(20));
  EXPECT_NE(result.err.find("pod-resources deadlineExceeded"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("units unknown"), std::string::npos);
  const auto object = nlohmann::json::parse(result.out);
  EXPECT_FALSE(object["status"].contains("resourceNames"));
  EXPECT_FALSE(Device(object, "0000:3b:00.0").contains("allocatable"));
}

TEST_F(ScanWithKubelet, AbsentKubeletMeansUnknownNotZero) {
  const FixtureHost host("t4-vgpu-4");
  const auto result = Scan(host);  // nothing listens on the socket path
  ASSERT_EQ(result.exitCode, 0) << result.err;
  EXPECT_NE(result.err.find("pod-resources socketAbsent"), std::string::npos) << result.err;
  const auto t4 = Device(nlohmann::json::parse(result.out), "0000:5e:00.0");
  EXPECT_FALSE(t4.contains("allocatable"));
  EXPECT_FALSE(t4.contains("health"));
}

TEST_F(ScanWithKubelet, UnimplementedGetAllocatableMeansUnitsUnknown) {
  const FixtureHost host("a100-vfio");
  auto scenario = fakes::LoadScenario(Scenario("a100-kubevirt-pci").string());
  scenario.getAllocatableResources = fakes::Behaviour::kUnimplemented;
  kubelet_.Start((socketDir_.path() / "kubelet.sock").string(), scenario);
  const auto result = Scan(host);
  EXPECT_NE(result.err.find("pod-resources unimplemented"), std::string::npos) << result.err;
  EXPECT_FALSE(nlohmann::json::parse(result.out)["status"].contains("resourceNames"));
}

TEST(ScanCliPodResources, BadEndpointAndTimeoutAreExitTwo) {
  const FixtureHost host("a100-vfio");
  const std::string base = ShellQuote(testing::GpuAgentBinary().string()) + " scan --sysfs-root " +
                           ShellQuote(host.root().string());
  EXPECT_EQ(RunCommand(base + " --pod-resources-timeout soon").exitCode, 2);
  EXPECT_EQ(RunCommand(base + " --pod-resources http://kubelet:10250").exitCode, 2);
  EXPECT_EQ(RunCommand(base + " --pod-phases /nonexistent.json").exitCode, 2);
}

}  // namespace
}  // namespace cozy
