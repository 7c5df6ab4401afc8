// The fixture of the controller's end-to-end tests: the fake API server with the chart's and
// KubeVirt's CRDs, `gpu-controller run` replicas as real processes, kubectl as the client, and
// the objects the scenarios are made of. controller_e2e_test.cpp (the daemon, the reconciler,
// the binder) and admission_e2e_test.cpp (the webhooks) stand on it.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "api/time.h"
#include "controller/model/readers.h"
#include "controller/snapshot_json.h"
#include "kube/cache.h"
#include "kube/config.h"
#include "test/fakes/fake_apiserver.h"
#include "test/kube/kube_test_support.h"
#include "test/support/fixture_host.h"
#include "test/support/gpu_objects.h"
#include "test/support/process.h"
#include "test/support/tcp_proxy.h"

namespace cozy::e2e {

using namespace std::chrono_literals;
using nlohmann::json;
using testing::ShellQuote;
using testing::WaitFor;

inline const std::string kTenant = "tenant-a";

class ControllerEndToEnd : public ::testing::Test {
 protected:
  void SetUp() override {
    fake::FakeApiServerOptions options;
    options.crdPaths = {testing::ChartCrdDir(), testing::TestCrdDir()};
    server_ = std::make_unique<fake::FakeApiServer>(options);
    server_->Start();
    std::ofstream(Path("kubeconfig")) << server_->Kubeconfig("hoster");
    for (const std::string& ns : {std::string("cozy-system"), kTenant}) {
      Apply({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}});
    }
  }

  void TearDown() override {
    for (auto& [name, pid] : replicas_) {
      if (pid > 0) testing::Finish(pid, SIGKILL);
    }
    server_->Stop();
  }

  std::filesystem::path Path(const std::string& name) const { return directory_.path() / name; }

  // Starts a replica named `identity` (its bearer token is the identity, so the request log
  // tells the replicas apart) with the flags given; returns its health port.
  // `server` replaces the API server's URL (a proxy in front of it).
  int StartReplica(const std::string& identity, std::vector<std::string> flags = {},
                   const std::string& server = "") {
    std::string kubeconfig = server_->Kubeconfig(identity);
    if (!server.empty()) {
      kubeconfig.replace(kubeconfig.find(server_->url()), server_->url().size(), server);
    }
    std::ofstream(Path("kubeconfig-" + identity)) << kubeconfig;
    const int port = testing::FreePort();
    std::vector<std::string> arguments = {GPU_CONTROLLER,
                                          "run",
                                          "--kubeconfig",
                                          Path("kubeconfig-" + identity).string(),
                                          "--identity",
                                          identity,
                                          "--health-addr",
                                          "127.0.0.1:" + std::to_string(port),
                                          "--discovery-interval",
                                          "500ms",
                                          "--resync",
                                          "1s",
                                          "-v"};
    const bool gpu = std::find(flags.begin(), flags.end(), "--enable-gpu") != flags.end();
    if (gpu && std::find(flags.begin(), flags.end(), "--webhook-cert-dir") == flags.end()) {
      // The webhooks come with GPUs; a scenario that does not call them serves them anyway.
      arguments.insert(arguments.end(), {"--webhook-addr", "127.0.0.1:0", "--webhook-cert-dir",
                                         WebhookCertificates()});
    }
    arguments.insert(arguments.end(), flags.begin(), flags.end());
    replicas_[identity] = testing::Spawn(arguments, Path(identity + ".log"));
    ports_[identity] = port;
    return port;
  }

  // The webhooks' serving pair for the Service gpu-controller-webhook.cozy-system.svc, made once
  // per test by the openssl CLI into certs/ (tls.crt, tls.key, as a mounted Secret); its CA is
  // ca.crt, and caBundle_ the CA as a webhook configuration's caBundle (base64).
  std::string WebhookCertificates() {
    if (caBundle_.empty()) {
      const auto made = testing::RunCommand(
          "cd " + ShellQuote(directory_.path().string()) +
          " && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 "
          "-subj /CN=webhook-ca 2>/dev/null"
          " && printf 'subjectAltName=DNS:gpu-controller-webhook.cozy-system.svc\\n' > san.ext"
          " && openssl req -newkey rsa:2048 -nodes -keyout tls.key -out tls.csr -subj /CN=webhook "
          "2>/dev/null"
          " && openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
          "-out tls.crt -days 1 -extfile san.ext 2>/dev/null"
          " && mkdir -p certs && cp tls.crt tls.key certs/ && base64 -w0 ca.crt");
      EXPECT_EQ(made.exitCode, 0) << made.err;
      caBundle_ = made.out;
    }
    return Path("certs").string();
  }

  int StopReplica(const std::string& identity, int signal = SIGTERM) {
    return testing::Finish(replicas_[identity], signal);
  }

  std::string Log(const std::string& identity) const {
    std::ifstream in(Path(identity + ".log"));
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  std::string Logs() const {
    std::string all;
    for (const auto& [name, pid] : replicas_) all += "--- " + name + "\n" + Log(name);
    return all;
  }

  // kubectl against the fake server; fails the test when kubectl fails, unless `mayFail`.
  std::string Kubectl(const std::string& arguments, bool mayFail = false) {
    const auto result = testing::RunCommand(
        "kubectl --kubeconfig " + ShellQuote(Path("kubeconfig").string()) + " " + arguments);
    if (!mayFail) {
      EXPECT_EQ(result.exitCode, 0) << "kubectl " << arguments << ": " << result.err;
    }
    return result.out;
  }
  void Apply(const json& object) {
    const std::filesystem::path file = Path("apply.json");
    std::ofstream(file) << object.dump();
    Kubectl("apply -f " + ShellQuote(file.string()));
  }
  // The object as kubectl reads it, or null when it does not exist.
  json Get(const std::string& what, const std::string& ns = "") {
    const auto result =
        testing::RunCommand("kubectl --kubeconfig " + ShellQuote(Path("kubeconfig").string()) +
                            (ns.empty() ? "" : " -n " + ns) + " get " + what + " -o json");
    if (result.exitCode != 0) return nullptr;
    return json::parse(result.out);
  }
  // Status written the way the binder and the webhook write it: merge patches on /status.
  void PatchStatus(const std::string& name, const json& status) {
    Kubectl("-n " + kTenant + " patch gpudevice " + name +
            " --subresource=status --type=merge -p " + ShellQuote(json{{"status", status}}.dump()));
  }

  std::string Holder() {
    const json lease = Get("lease gpu-controller", "cozy-system");
    return lease.is_object() ? lease["spec"].value("holderIdentity", "") : "";
  }
  std::string Metrics(const std::string& identity) {
    return testing::RunCommand("curl -s http://127.0.0.1:" + std::to_string(ports_[identity]) +
                               "/metrics")
        .out;
  }

  static json Class(const std::string& name) { return testing::GpuClassObject(name); }
  static json Device(const std::string& name, json labels = json::object()) {
    return {{"apiVersion", "gpu.cozystack.io/v1alpha1"},
            {"kind", "GPUDevice"},
            {"metadata", {{"name", name}, {"namespace", kTenant}, {"labels", labels}}},
            {"spec", {{"className", "a100"}, {"count", 1}}}};
  }
  static json Vmi(const std::string& name) {
    return {{"apiVersion", "kubevirt.io/v1"},
            {"kind", "VirtualMachineInstance"},
            {"metadata", {{"name", name}, {"namespace", kTenant}}},
            {"spec", {{"domain", {{"devices", json::object()}}}}}};
  }
  std::string VmiUid(const std::string& name) {
    return Get("vmi " + name, kTenant)["metadata"].value("uid", "");
  }
  bool HasFinalizer(const json& object, const std::string& finalizer) {
    if (!object.is_object()) return false;
    for (const auto& item : object["metadata"].value("finalizers", json::array())) {
      if (item == finalizer) return true;
    }
    return false;
  }
  // Waits for the device's protection finalizer: the reconciler has seen the device.
  void WaitProtected(const std::string& device) {
    ASSERT_TRUE(WaitFor(
        [&] {
          return HasFinalizer(Get("gpudevice " + device, kTenant),
                              "gpu.cozystack.io/device-protection");
        },
        15s))
        << Logs();
  }

  // A Ready node and its GPUNode serving `units` of nvidia.com/GA100 on one function.
  void GpuNode(const std::string& node, int units) {
    Apply(testing::ReadyNode(node));
    Apply({{"apiVersion", "gpu.cozystack.io/v1alpha1"},
           {"kind", "GPUNode"},
           {"metadata", {{"name", node}}}});
    const json status = testing::GpuNodeStatus(units);
    Kubectl("patch gpunode " + node + " --subresource=status --type=merge -p " +
            ShellQuote(json{{"status", status}}.dump()));
  }
  std::string NodeOf(const std::string& device) {
    const json object = Get("gpudevice " + device, kTenant);
    if (!object.is_object() || !object.contains("status") || !object["status"].is_object()) {
      return "";
    }
    return object["status"].value("nodeName", "");
  }
  // Every GPUDevice watch stalls: open streams end and a re-watch is answered only after
  // `latency`, so every replica's device cache is frozen meanwhile (other watches are not).
  void StallDeviceWatches(std::chrono::milliseconds latency) {
    fake::Fault stall;
    stall.pathPrefix = "/apis/gpu.cozystack.io/v1alpha1/gpudevices";
    stall.watchOnly = true;
    stall.latencyMs = static_cast<int>(latency.count());
    server_->AddFault(stall);
    server_->DropWatches();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  std::string Phase(const std::string& device) {
    const json object = Get("gpudevice " + device, kTenant);
    if (!object.is_object() || !object.contains("status") || !object["status"].is_object()) {
      return "";
    }
    return object["status"].value("phase", "");
  }
  // Placement writes in the request log: status patches that set a phase; those that applied,
  // or with `attempts` every one the server was sent, refused or not (who tried to write).
  std::vector<fake::LoggedRequest> PlacementWrites(bool attempts = false) {
    std::vector<fake::LoggedRequest> writes;
    for (const auto& request : server_->Requests()) {
      if (request.method == "PATCH" && (attempts || request.status < 300) &&
          request.path.find("/gpudevices/") != std::string::npos &&
          request.path.ends_with("/status") &&
          request.body.find("\"phase\"") != std::string::npos) {
        writes.push_back(request);
      }
    }
    return writes;
  }

  testing::TempDir directory_;
  std::unique_ptr<fake::FakeApiServer> server_;
  std::map<std::string, pid_t> replicas_;
  std::map<std::string, int> ports_;
  std::string caBundle_;
};

}  // namespace cozy::e2e
