// What the agent's end-to-end suites share (agent_e2e_test, agent_faults_test): the fake API
// server with the chart's CRDs and the Node n1, the fake kubelet serving the a100-kubevirt-pci
// scenario on a socket, the a100-vfio sysfs fixture, and `gpu-agent run` for n1 against them
// (pod-resources read every 200 ms, no udev).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test/fakes/fake_apiserver.h"
#include "test/fakes/fake_kubelet.h"
#include "test/support/agent_process.h"
#include "test/support/fixture_host.h"
#include "test/support/process.h"

namespace cozy {

class AgentOnFakeCluster : public ::testing::Test {
 protected:
  void SetUp() override {
    fake::FakeApiServerOptions options;
    options.crdPaths = {testing::SourceDir() / "charts/gpu/templates/crds"};
    server_ = std::make_unique<fake::FakeApiServer>(options);
    server_->Start();
    SeedNode("n1", "11111111-1111-1111-1111-111111111111");
    std::ofstream(directory_.path() / "kubeconfig") << server_->Kubeconfig("agent-token");
    StartKubelet();
  }

  void TearDown() override {
    StopAgent();
    kubelet_.Stop();
    server_->Stop();
  }

  void SeedNode(const std::string& name, const std::string& uid) {
    server_->Seed(
        {{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", name}, {"uid", uid}}}});
  }

  void StartKubelet() {
    kubelet_.Start(
        (directory_.path() / "kubelet.sock").string(),
        fakes::LoadScenario(
            (testing::SourceDir() / "fixtures/kubelet/a100-kubevirt-pci.json").string()));
  }

  // `gpu-agent run` for n1, its health server on healthAddress_, with `extra` flags after.
  void StartAgent(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> arguments = {"run",
                                          "--node-name",
                                          "n1",
                                          "--kubeconfig",
                                          (directory_.path() / "kubeconfig").string(),
                                          "--sysfs-root",
                                          host_.root().string(),
                                          "--pci-ids",
                                          testing::FixturePciIds().string(),
                                          "--pod-resources",
                                          "unix://" + (directory_.path() / "kubelet.sock").string(),
                                          "--pod-resources-interval",
                                          "200ms",
                                          "--udev-source",
                                          "off",
                                          "--health-addr",
                                          healthAddress_,
                                          "-v",
                                          "1"};
    arguments.insert(arguments.end(), extra.begin(), extra.end());
    agent_.Start(arguments, directory_.path() / "agent.log");
  }

  // SIGTERM and wait; its wait status in exitStatus_.
  void StopAgent() {
    if (agent_.pid() > 0) exitStatus_ = agent_.Stop();
  }

  nlohmann::json GpuNode(const std::string& name = "n1") const {
    return server_->Object("gpu.cozystack.io/v1alpha1", "gpunodes", "", name);
  }
  // n1's GPUNode has a status with its devices.
  bool Published() const {
    const nlohmann::json node = GpuNode();
    return node.is_object() && node.contains("status") && node["status"].contains("devices");
  }
  // The device of `node`'s status at `address`; null when it lists none there.
  static nlohmann::json Device(const nlohmann::json& node, const std::string& address) {
    for (const auto& device : node["status"]["devices"]) {
      if (device["pciAddress"] == address) return device;
    }
    return {};
  }

  // Rebinds a GPU of the fixture (0000:3b:00.0 or 0000:af:00.0) to `driver` (the agent sees it
  // at its next scan: SIGHUP it).
  void Rebind(const std::string& address, const std::string& driver) {
    const std::string parent =
        address.substr(5, 2) == "3b" ? "pci0000:3a/0000:3a:00.0" : "pci0000:ae/0000:ae:00.0";
    const auto device = host_.root() / "sys/devices" / parent / address;
    std::filesystem::remove(device / "driver");
    std::filesystem::create_directories(host_.root() / "sys/bus/pci/drivers" / driver);
    std::filesystem::create_symlink("../../../../bus/pci/drivers/" + driver, device / "driver");
  }

  testing::FixtureHost host_{"a100-vfio"};
  testing::TempDir directory_;
  std::unique_ptr<fake::FakeApiServer> server_;
  fakes::FakeKubelet kubelet_;
  testing::AgentProcess agent_;
  std::string healthAddress_ = "127.0.0.1:0";
  int exitStatus_ = -1;
};

}  // namespace cozy
