// The fixture of the controller's end-to-end tests: an API server with the chart's and
// KubeVirt's CRDs, `gpu-controller run` replicas as real processes, kubectl as the client, and
// the objects the scenarios are made of. controller_e2e_test.cpp (the daemon, the reconciler,
// the binder) and admission_e2e_test.cpp (the webhooks) stand on it.
//
// Two backends (docs/testing.md, "Which suites run where"): the fake API server in this process
// (fault injection, its request log), or, when COZY_E2E_CLUSTER names a directory of
// `scripts/cluster.sh up`, that real control plane: each replica a user of its own (a client
// certificate of the cluster's CA, its identity the user name, as the fake tells replicas apart
// by bearer token), the API server's audit log as the request log, each test in a tenant
// namespace of its own and the cluster-scoped objects removed before and after it. A step that
// needs the fake's faults (Fake()) fails a test run on the real backend: such tests are listed
// in test/e2e/CMakeLists.txt and run on the fake only.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "api/keys.h"
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

// The tenant namespace of the running test: tenant-a on the fake; on a real cluster one of its
// own per test (the last test's may still be terminating).
inline std::string& Tenant() {
  static std::string tenant = "tenant-a";
  return tenant;
}

class ControllerEndToEnd : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* cluster = std::getenv("COZY_E2E_CLUSTER"); cluster && *cluster) {
      cluster_ = cluster;
      std::filesystem::copy_file(cluster_ / "kubeconfig", Path("kubeconfig"));
      Tenant() = "tenant-" + std::to_string(getpid());
      ASSERT_NO_FATAL_FAILURE(CleanCluster());
      for (const auto& crds : {testing::ChartCrdDir(), testing::TestCrdDir()}) {
        Kubectl("apply --server-side --force-conflicts -f " + ShellQuote(crds.string()));
      }
      Kubectl("wait --for condition=Established --timeout=60s crd --all");
      std::error_code ignored;
      auditFrom_ = std::filesystem::file_size(AuditLog(), ignored);
      // cluster.sh gives the API server a webhook client certificate of a CA of its own.
      webhookClientCa_ = cluster_ / "pki" / "webhook-client-ca.crt";
    } else {
      Tenant() = "tenant-a";
      fake::FakeApiServerOptions options;
      options.crdPaths = {testing::ChartCrdDir(), testing::TestCrdDir()};
      // The fake presents a webhook client certificate as a configured kube-apiserver does.
      const auto made = testing::MakeOnce(
          "openssl req -x509 -newkey rsa:2048 -nodes -keyout webhook-client-ca.key"
          " -out webhook-client-ca.crt -days 1 -subj /CN=webhook-client-ca 2>/dev/null"
          " && printf 'extendedKeyUsage=clientAuth\\n' > client.ext"
          " && openssl req -newkey rsa:2048 -nodes -keyout webhook-client.key"
          " -out webhook-client.csr -subj /CN=kube-apiserver-webhook-client 2>/dev/null"
          " && openssl x509 -req -in webhook-client.csr -CA webhook-client-ca.crt"
          " -CAkey webhook-client-ca.key -CAcreateserial -out webhook-client.crt -days 1"
          " -extfile client.ext 2>/dev/null",
          directory_.path());
      ASSERT_EQ(made.exitCode, 0) << made.err;
      options.webhookClientCertificate = Path("webhook-client.crt");
      options.webhookClientKey = Path("webhook-client.key");
      webhookClientCa_ = Path("webhook-client-ca.crt");
      server_ = std::make_unique<fake::FakeApiServer>(options);
      server_->Start();
      std::ofstream(Path("kubeconfig")) << server_->Kubeconfig("hoster");
    }
    for (const std::string& ns : {std::string("cozy-system"), Tenant()}) {
      json object = {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}};
      // A tenant namespace carries the label the hoster sets on every one (docs/install.md,
      // "Tenant namespaces"), which the chart's raw-name and usage-monitor bindings select.
      if (ns == Tenant()) {
        object["metadata"]["labels"] = {{"cozy-gpu-e2e", "tenant"},
                                        {std::string(api::kTenantNamespaceLabel), "true"}};
      }
      Apply(object);
    }
  }

  void TearDown() override {
    for (auto& [name, pid] : replicas_) {
      if (pid > 0) testing::Finish(pid, SIGKILL);
    }
    if (server_) {
      server_->Stop();
    } else if (!cluster_.empty()) {
      // The CRDs go too: the next real-cluster test may install the chart, whose CRDs helm
      // must create itself.
      CleanCluster();
      Kubectl("delete --ignore-not-found --timeout=60s -f " +
                  ShellQuote(testing::ChartCrdDir().string()) + " -f " +
                  ShellQuote(testing::TestCrdDir().string()),
              true);
    }
  }

  bool Real() const { return !cluster_.empty(); }
  // The fake API server, for a step that injects its faults or reads what only it has; on the
  // real backend the test fails here (it belongs in CMakeLists.txt's fake-only list).
  fake::FakeApiServer& Fake() {
    if (!server_) {
      throw std::logic_error(
          "this step needs the fake API server (faults, its stand-ins): list the test as "
          "fake-only in test/e2e/CMakeLists.txt");
    }
    return *server_;
  }

  // What the real cluster's tests leave behind, removed: the GPU objects (finalizers stripped:
  // the controller that would remove them is stopped), the nodes, the webhook configurations,
  // the controller's Lease and settings, KubeVirt's configuration, the DRA objects, and the tenant
  // namespaces, which the namespace controller empties in the background (each test has a new one).
  void CleanCluster() {
    for (const std::string kind : {"gpudevices", "gpuclasses", "gpunodes"}) {
      const json list = Get(kind + " -A");
      if (!list.is_object()) continue;  // the CRDs are not there yet
      for (const json& item : list["items"]) {
        const json& metadata = item["metadata"];
        if (metadata.value("finalizers", json::array()).empty()) continue;
        const std::string ns = metadata.value("namespace", "");
        Kubectl((ns.empty() ? "" : "-n " + ns + " ") + "patch " + kind + " " +
                    metadata["name"].get<std::string>() +
                    " --type=merge -p '{\"metadata\":{\"finalizers\":null}}'",
                true);
      }
      Kubectl("delete " + kind + " -A --all --ignore-not-found --wait=false", true);
    }
    Kubectl("delete nodes,validatingwebhookconfigurations,mutatingwebhookconfigurations --all",
            true);
    Kubectl("delete kubevirts -A --all --ignore-not-found", true);
    // The DRA objects the dra tests make (DraNode's slices) or the leader makes for them (the
    // DeviceClasses; the claims go with the tenant namespaces).
    Kubectl("delete resourceslices,deviceclasses --all --ignore-not-found --wait=false", true);
    Kubectl(
        "-n cozy-system delete lease/gpu-controller configmap/cozy-gpu-settings "
        "configmap/unrelated --ignore-not-found",
        true);
    // Pods bound to a node go only once a kubelet confirms: with none here they would stay
    // Terminating, holding their GPUs in every later test. Forced, they go at once.
    const json tenants = Get("namespaces -l cozy-gpu-e2e=tenant");
    if (tenants.is_object()) {
      for (const json& item : tenants["items"]) {
        Kubectl("-n " + item["metadata"]["name"].get<std::string>() +
                    " delete pods --all --force --grace-period=0 --wait=false",
                true);
      }
    }
    Kubectl("delete namespace -l cozy-gpu-e2e=tenant --wait=false", true);
    Kubectl("delete namespace tenant-root --ignore-not-found --timeout=60s", true);
  }

  std::filesystem::path AuditLog() const { return cluster_ / "logs" / "audit.log"; }

  // Every request the API server answered since the test's start, oldest first: the fake's own
  // log, or the real server's audit log read as the same records (the user as bearerToken, the
  // patch or object written as body, the time it was received on this process's steady clock).
  std::vector<fake::LoggedRequest> Requests() {
    if (server_) return server_->Requests();
    std::this_thread::sleep_for(200ms);  // an answer is logged just after it is sent
    std::vector<fake::LoggedRequest> requests;
    std::ifstream in(AuditLog());
    in.seekg(static_cast<std::streamoff>(auditFrom_));
    const auto systemNow = std::chrono::system_clock::now();
    const auto steadyNow = std::chrono::steady_clock::now();
    static const std::map<std::string, std::string> methods = {
        {"get", "GET"},       {"list", "GET"},
        {"watch", "GET"},     {"create", "POST"},
        {"update", "PUT"},    {"patch", "PATCH"},
        {"delete", "DELETE"}, {"deletecollection", "DELETE"}};
    std::set<std::string> seen;
    for (std::string line; std::getline(in, line);) {
      const json event = json::parse(line, nullptr, false);
      if (!event.is_object() || !seen.insert(event.value("auditID", "")).second) continue;
      fake::LoggedRequest request;
      const auto method = methods.find(event.value("verb", ""));
      request.method = method == methods.end() ? event.value("verb", "") : method->second;
      const std::string uri = event.value("requestURI", "");
      request.path = uri.substr(0, uri.find('?'));
      if (uri.find('?') != std::string::npos) request.query = uri.substr(uri.find('?') + 1);
      if (event.contains("requestObject")) request.body = event["requestObject"].dump();
      request.bearerToken = event["user"].value("username", "");
      request.status = event.value("responseStatus", json::object()).value("code", 0);
      std::istringstream when(event.value("requestReceivedTimestamp", ""));
      std::tm parts{};
      double seconds = 0;
      when >> std::get_time(&parts, "%Y-%m-%dT%H:%M:") >> seconds;
      const auto received = std::chrono::system_clock::from_time_t(timegm(&parts)) +
                            std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
      request.received =
          steadyNow -
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(systemNow - received);
      requests.push_back(std::move(request));
    }
    return requests;
  }

  // A kubeconfig for `identity`: the fake's bearer token, or a user of the real cluster by that
  // name (system:masters); `viaPort` puts a proxy on 127.0.0.1 between it and the API server.
  std::string KubeconfigFor(const std::string& identity, int viaPort = 0) {
    const std::filesystem::path file = Path("kubeconfig-" + identity);
    std::string kubeconfig;
    std::string url;
    if (server_) {
      kubeconfig = server_->Kubeconfig(identity);
      url = server_->url();
    } else {
      const auto made = testing::RunCommand(
          ShellQuote((testing::SourceDir() / "scripts/cluster.sh").string()) + " user " +
          ShellQuote(cluster_.string()) + " " + ShellQuote(file.string()) + " " +
          ShellQuote(identity) + " system:masters");
      EXPECT_EQ(made.exitCode, 0) << made.err;
      std::ifstream in(file);
      kubeconfig.assign(std::istreambuf_iterator<char>(in), {});
      std::smatch server;
      std::regex_search(kubeconfig, server, std::regex("https://127\\.0\\.0\\.1:[0-9]+"));
      url = server.str();
    }
    if (viaPort != 0) {
      const std::string proxied = url.substr(0, url.rfind(':') + 1) + std::to_string(viaPort);
      kubeconfig.replace(kubeconfig.find(url), url.size(), proxied);
    }
    std::ofstream(file) << kubeconfig;
    return file.string();
  }
  // The API server's port on 127.0.0.1.
  int ApiPort() {
    if (server_) return server_->port();
    std::ifstream in(cluster_ / "env");
    for (std::string line; std::getline(in, line);) {
      if (line.starts_with("APISERVER_PORT=")) return std::stoi(line.substr(15));
    }
    ADD_FAILURE() << "no APISERVER_PORT in " << (cluster_ / "env");
    return 0;
  }

  std::filesystem::path Path(const std::string& name) const { return directory_.path() / name; }

  // Starts a replica named `identity` (its user is the identity, so the request log tells the
  // replicas apart) with the flags given; returns its health port. `viaPort`: the port of a
  // proxy in front of the API server.
  int StartReplica(const std::string& identity, std::vector<std::string> flags = {},
                   int viaPort = 0) {
    const std::string kubeconfig = KubeconfigFor(identity, viaPort);
    const int port = testing::FreePort();
    std::vector<std::string> arguments = {GPU_CONTROLLER,
                                          "run",
                                          "--kubeconfig",
                                          kubeconfig,
                                          "--identity",
                                          identity,
                                          "--health-addr",
                                          "127.0.0.1:" + std::to_string(port),
                                          "--discovery-interval",
                                          "500ms",
                                          "-v"};
    if (std::find(flags.begin(), flags.end(), "--resync") == flags.end()) {
      arguments.insert(arguments.end(), {"--resync", "1s"});  // unless the scenario sets its own
    }
    const bool gpu = std::find(flags.begin(), flags.end(), "--enable-gpu") != flags.end();
    if (gpu && std::find(flags.begin(), flags.end(), "--webhook-cert-dir") == flags.end()) {
      // The webhooks come with GPUs; a scenario that does not call them serves them anyway.
      arguments.insert(arguments.end(), {"--webhook-addr", "127.0.0.1:0", "--webhook-cert-dir",
                                         WebhookCertificates()});
    }
    const auto given = [&flags](const char* flag) {
      return std::find(flags.begin(), flags.end(), flag) != flags.end();
    };
    if (gpu && !given("--webhook-client-ca") && !given("--webhook-allow-unauthenticated-callers")) {
      // Only the API server's webhook client certificate gets in (H9).
      arguments.insert(arguments.end(), {"--webhook-client-ca", webhookClientCa_.string()});
    }
    arguments.insert(arguments.end(), flags.begin(), flags.end());
    replicas_[identity] = testing::Spawn(arguments, Path(identity + ".log"));
    ports_[identity] = port;
    return port;
  }

  // The webhooks' serving pair for the Service gpu-controller-webhook.cozy-system.svc, made by
  // the openssl CLI once per test program (MakeOnce) and copied into each test's certs/
  // (tls.crt, tls.key, as a mounted Secret); its CA is ca.crt, and caBundle_ the CA as a webhook
  // configuration's caBundle (base64).
  std::string WebhookCertificates() {
    if (caBundle_.empty()) {
      const auto made = testing::MakeOnce(
          "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 "
          "-subj /CN=webhook-ca 2>/dev/null"
          " && printf 'subjectAltName=DNS:gpu-controller-webhook.cozy-system.svc,IP:127.0.0.1\\n'"
          " > san.ext"
          " && openssl req -newkey rsa:2048 -nodes -keyout tls.key -out tls.csr -subj /CN=webhook "
          "2>/dev/null"
          " && openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
          "-out tls.crt -days 1 -extfile san.ext 2>/dev/null"
          " && mkdir -p certs && cp tls.crt tls.key certs/ && base64 -w0 ca.crt",
          directory_.path());
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
    Kubectl("-n " + Tenant() + " patch gpudevice " + name +
            " --subresource=status --type=merge -p " + ShellQuote(json{{"status", status}}.dump()));
  }
  // What the VMI webhook writes to ask the binder for a device's GPUs: a bind request `id` in its
  // status (B2).
  void AskToBind(const std::string& name, const std::string& id,
                 const std::string& requestedAt = "2026-12-01T00:00:00Z") {
    PatchStatus(name, {{"bindRequest", {{"id", id}, {"requestedAt", requestedAt}}}});
  }
  // Whether the device's bindResponse answers request `id`.
  bool Answered(const std::string& name, const std::string& id) {
    return Get("gpudevice " + name, Tenant())["status"]
               .value("bindResponse", json::object())
               .value("id", "") == id;
  }

  std::string Holder() {
    const json lease = Get("lease gpu-controller", "cozy-system");
    return lease.is_object() ? lease["spec"].value("holderIdentity", "") : "";
  }
  // Whether the replica's /readyz answers 200 within `limit`.
  bool ReadyWithin(const std::string& identity, std::chrono::seconds limit) {
    return WaitFor(
        [&] {
          return testing::RunCommand(
                     "curl -sf http://127.0.0.1:" + std::to_string(ports_[identity]) + "/readyz")
                     .exitCode == 0;
        },
        limit);
  }
  std::string Metrics(const std::string& identity) {
    return testing::RunCommand("curl -s http://127.0.0.1:" + std::to_string(ports_[identity]) +
                               "/metrics")
        .out;
  }
  // One sample's value (`name` with its labels, as the exposition writes it); -1 when absent.
  double Metric(const std::string& identity, const std::string& sample) {
    const std::string metrics = Metrics(identity);
    const size_t at = metrics.find("\n" + sample + " ");
    if (at == std::string::npos) return -1;
    return std::stod(metrics.substr(at + sample.size() + 2));
  }
  // The part of the replica's /metrics its registry renders from the loop's figures: the
  // process_* samples, read from the kernel at each request, left out.
  std::string LoopMetrics(const std::string& identity) {
    const std::string metrics = Metrics(identity);
    return metrics.substr(0, metrics.find("# HELP process_"));
  }

  // Waits until `identity` has run `passes` whole passes of each of `loops` ("binder": its full
  // passes, which place, move and write conditions; "reconciler"; "binder+reconciler": both,
  // waited for together) that began after this call: the evidence a "nothing happened"
  // assertion stands on, where a sleep would only guess that a pass had run. The counts are read
  // from the page served now, which the controller renders at each scrape from its loop
  // thread's counts; the first pass counted after it may have been under way before the call,
  // and a loop's passes run one at a time, so each further one began after it.
  // Fails after `limit`: the loop is not running (a standby, unsynced caches) or not asked to (a
  // long --resync and nothing changed).
  ::testing::AssertionResult WaitForPasses(const std::string& identity, const std::string& loops,
                                           int passes = 1, std::chrono::seconds limit = 30s) {
    std::vector<std::string> samples;
    if (loops == "binder" || loops == "binder+reconciler") {
      samples.push_back("gpu_controller_binder_passes_total{kind=\"full\"}");
    }
    if (loops == "reconciler" || loops == "binder+reconciler") {
      samples.push_back("gpu_controller_reconcile_passes_total");
    }
    if (samples.empty()) return ::testing::AssertionFailure() << "no loop named " << loops;
    const auto valueIn = [](const std::string& page, const std::string& sample) {
      const size_t at = page.find("\n" + sample + " ");
      return at == std::string::npos ? -1.0 : std::stod(page.substr(at + sample.size() + 2));
    };
    // The page is rendered at each scrape: its counts are those of every pass ended so far.
    const std::string rebuilt = LoopMetrics(identity);
    std::vector<double> from;
    for (const std::string& sample : samples) {
      from.push_back(valueIn(rebuilt, sample));
      if (from.back() < 0) {
        return ::testing::AssertionFailure() << identity << " has no " << sample << "\n" << rebuilt;
      }
    }
    std::string page;
    const bool ran = WaitFor(
        [&] {
          page = LoopMetrics(identity);
          for (size_t i = 0; i < samples.size(); ++i) {
            if (valueIn(page, samples[i]) < from[i] + passes + 1) return false;
          }
          return true;
        },
        limit, 100ms);
    if (!ran) {
      ::testing::AssertionResult failure = ::testing::AssertionFailure();
      failure << identity << " did not run the " << passes + 1 << " passes of each loop, in "
              << limit.count() << " s, that make " << passes << " begun after the wait:";
      for (size_t i = 0; i < samples.size(); ++i) {
        failure << " " << samples[i] << " ran " << valueIn(page, samples[i]) - from[i] << ";";
      }
      return failure << "\n" << page;
    }
    return ::testing::AssertionSuccess();
  }

  static json Class(const std::string& name) { return testing::GpuClassObject(name); }
  static json Device(const std::string& name, json labels = json::object()) {
    return {{"apiVersion", "gpu.cozystack.io/v1alpha1"},
            {"kind", "GPUDevice"},
            {"metadata", {{"name", name}, {"namespace", Tenant()}, {"labels", labels}}},
            {"spec", {{"className", "a100"}, {"count", 1}}}};
  }
  static json Vmi(const std::string& name) {
    return {{"apiVersion", "kubevirt.io/v1"},
            {"kind", "VirtualMachineInstance"},
            {"metadata", {{"name", name}, {"namespace", Tenant()}}},
            {"spec", {{"domain", {{"devices", json::object()}}}}}};
  }
  std::string VmiUid(const std::string& name) {
    return Get("vmi " + name, Tenant())["metadata"].value("uid", "");
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
          return HasFinalizer(Get("gpudevice " + device, Tenant()),
                              "gpu.cozystack.io/device-protection");
        },
        15s))
        << Logs();
  }

  // A Ready node and its GPUNode serving `units` of nvidia.com/GA100 on one function.
  // A Ready node whose one A100 (10de:20b5, 0000:3b:00.0) no device plugin advertises and
  // gpu-agent publishes in its ResourceSlice: one unit of a dra class of that ID (C19).
  void DraNode(const std::string& node) {
    Apply(testing::ReadyNode(node));
    Apply({{"apiVersion", "gpu.cozystack.io/v1alpha1"},
           {"kind", "GPUNode"},
           {"metadata", {{"name", node}}}});
    json status = testing::GpuNodeStatus(0);
    status["resourceNames"] = json::array();
    status["devices"][0]["resources"] = json::array();
    status["devices"][0]["health"] = "Unadvertised";
    Kubectl("patch gpunode " + node + " --subresource=status --type=merge -p " +
            ShellQuote(json{{"status", status}}.dump()));
    Apply({{"apiVersion", "resource.k8s.io/v1"},
           {"kind", "ResourceSlice"},
           {"metadata", {{"name", node + "-gpu.cozystack.io"}}},
           {"spec",
            {{"driver", "gpu.cozystack.io"},
             {"nodeName", node},
             {"pool", {{"name", node}, {"generation", 1}, {"resourceSliceCount", 1}}},
             {"devices",
              {{{"name", "pci-0000-3b-00-0"},
                {"attributes",
                 {{"resource.kubernetes.io/pciBusID", {{"string", "0000:3b:00.0"}}},
                  {"vendorID", {{"string", "10de"}}},
                  {"deviceID", {{"string", "20b5"}}}}}}}}}}});
  }
  // A passthrough A100 class of that ID selling through DRA.
  static json DraClass(const std::string& name) {
    json dra = Class(name);
    dra["spec"]["source"] = {{"dra", {{"pciVendorSelector", "10DE:20B5"}}}};
    return dra;
  }
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
    const json object = Get("gpudevice " + device, Tenant());
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
    Fake().AddFault(stall);
    Fake().DropWatches();
    // Kept a sleep: the replicas' re-watches, which the stall holds, count nowhere; 300 ms is
    // ample for a client to see its stream end and ask again.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  std::string Phase(const std::string& device) {
    const json object = Get("gpudevice " + device, Tenant());
    if (!object.is_object() || !object.contains("status") || !object["status"].is_object()) {
      return "";
    }
    return object["status"].value("phase", "");
  }
  // Placement writes in the request log: status patches that set a phase; those that applied,
  // or with `attempts` every one the server was sent, refused or not (who tried to write).
  std::vector<fake::LoggedRequest> PlacementWrites(bool attempts = false) {
    std::vector<fake::LoggedRequest> writes;
    for (const auto& request : Requests()) {
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
  std::filesystem::path cluster_;  // the real backend's cluster.sh directory, or empty
  uintmax_t auditFrom_ = 0;        // its audit log's size when the test began
  // The CA of the API server's webhook client certificate, which the replicas trust.
  std::filesystem::path webhookClientCa_;
  std::unique_ptr<fake::FakeApiServer> server_;
  std::map<std::string, pid_t> replicas_;
  std::map<std::string, int> ports_;
  std::string caBundle_;
};

}  // namespace cozy::e2e
