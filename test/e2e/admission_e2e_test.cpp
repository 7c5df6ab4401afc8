// End to end, the admission webhooks: `gpu-controller run --enable-gpu` replicas
// serving HTTPS with a certificate the openssl CLI makes per run, the webhook configurations
// rendered from the chart, and the fake API server calling them as a real one does (rules,
// selectors, caBundle, failurePolicy, reinvocation after a stand-in for virt-api's own VMI
// mutator), or kube-apiserver itself (controller_fixture.h). kubectl is the tenant's client: what
// it prints is what a tenant reads. Each scenario is named by the catalog items it covers (E1-E13,
// G2-G4, H2, H3).
#include <atomic>
#include <cstdlib>
#include <future>
#include <random>
#include <thread>

#include "kube/leader_election.h"
#include "test/chart/chart_render.h"
#include "test/e2e/controller_fixture.h"
#include "test/support/node_fit.h"

namespace cozy::e2e {
namespace {

const std::string kService = "gpu-controller-webhook";
const std::string kServiceNamespace = "cozy-system";

class AdmissionEndToEnd : public ControllerEndToEnd {
 protected:
  void SetUp() override {
    ControllerEndToEnd::SetUp();
    WebhookCertificates();
    ApplyWebhookConfigurations();
    Apply(Class("a100"));
    GpuNode("n1", 2);
    GpuNode("n2", 2);
  }

  // The chart's webhook configurations with GPUs on, as the hoster installs them, with this
  // run's CA as their caBundle (cert-manager's injector writes it in a cluster).
  void ApplyWebhookConfigurations() {
    YAML::Node values =
        YAML::Load("gpu: {enabled: true, webhook: {networkPolicy: {podCIDRs: [10.244.0.0/16]}}}");
    // H9: the authenticated setup, with the CA of the API server's webhook client certificate.
    std::ifstream ca(webhookClientCa_);
    values["gpu"]["webhook"]["clientCA"] =
        std::string(std::istreambuf_iterator<char>(ca), std::istreambuf_iterator<char>());
    chart::Release release;
    release.ns = kServiceNamespace;
    int applied = 0;
    for (const auto& document :
         chart::RenderChart(testing::SourceDir() / "charts/gpu", values, release)) {
      YAML::Node node = YAML::Load(document.text);
      const std::string kind = node["kind"] ? node["kind"].as<std::string>() : "";
      if (kind != "MutatingWebhookConfiguration" && kind != "ValidatingWebhookConfiguration") {
        continue;
      }
      std::ofstream(Path("webhooks.yaml")) << document.text;
      json object = json::parse(Kubectl("create --dry-run=client -o json -f " +
                                        ShellQuote(Path("webhooks.yaml").string())));
      for (json& webhook : object["webhooks"]) {
        webhook["clientConfig"]["caBundle"] = caBundle_;
      }
      object["metadata"].erase("annotations");  // cert-manager's inject-ca-from
      webhookConfigurations_.push_back(object);
      Apply(object);
      ++applied;
    }
    ASSERT_EQ(applied, 2) << "the chart renders one validating and one mutating configuration";
    if (Real()) ServeWebhooksAt(testing::FreePort());  // nothing serves yet: they fail closed
  }

  // Sends the API server's webhook calls to 127.0.0.1:port: the fake's Service gets that
  // endpoint; on a real cluster, which cannot reach a Service here, the configurations are
  // applied again with the URL form the chart's gpu.webhook.url renders.
  void ServeWebhooksAt(int port) {
    if (!Real()) {
      Fake().SetServiceEndpoint(kServiceNamespace, kService, port);
      return;
    }
    for (json object : webhookConfigurations_) {
      for (json& webhook : object["webhooks"]) {
        json& client = webhook["clientConfig"];
        client["url"] =
            "https://127.0.0.1:" + std::to_string(port) + client["service"].value("path", "");
        client.erase("service");
      }
      Apply(object);
    }
  }

  // A replica with its webhooks on a port of its own; the Service sends the API server there
  // when `serve` (the last one so started wins, as one endpoint of the Service).
  int StartWebhookReplica(const std::string& identity, std::vector<std::string> flags = {},
                          bool serve = true) {
    const int port = testing::FreePort();
    std::vector<std::string> all = {"--enable-gpu", "--webhook-addr",
                                    "127.0.0.1:" + std::to_string(port), "--webhook-cert-dir",
                                    WebhookCertificates()};
    if (std::find(flags.begin(), flags.end(), "--bind-wait") == flags.end()) {
      all.insert(all.end(), {"--bind-wait", "4s"});
    }
    all.insert(all.end(), flags.begin(), flags.end());
    StartReplica(identity, all);
    webhookPorts_[identity] = port;
    if (serve) ServeWebhooksAt(port);
    return port;
  }

  bool Ready(const std::string& identity) {
    return testing::RunCommand("curl -sf http://127.0.0.1:" + std::to_string(ports_[identity]) +
                               "/readyz")
               .exitCode == 0;
  }
  void WaitReady(const std::string& identity) {
    ASSERT_TRUE(WaitFor([&] { return Ready(identity); }, 20s)) << Logs();
  }
  void WaitLeader(const std::string& identity) {
    ASSERT_TRUE(WaitFor([&] { return Holder() == identity; }, 20s)) << Logs();
  }

  // kubectl create; returns (exit code, stdout + stderr).
  // `kubeconfig`: whose request it is; empty: the hoster's.
  std::pair<int, std::string> Create(const json& object, const std::string& extra = "",
                                     const std::string& kubeconfig = "") {
    // Steps create at once from several threads: each takes a file of its own.
    const std::string file = Path("create-" + std::to_string(++files_) + ".json").string();
    std::ofstream(file) << object.dump();
    const auto result = testing::RunCommand(
        "kubectl --kubeconfig " +
        ShellQuote(kubeconfig.empty() ? Path("kubeconfig").string() : kubeconfig) + " create " +
        extra + " -o json -f " + ShellQuote(file));
    return {result.exitCode, result.out + result.err};
  }

  // E14: KubeVirt's controller as the API server names it (the chart's default
  // policies.kubevirtControllerUser and the controller's --kubevirt-controller-user): a token
  // user of the fake; on kube-apiserver a client certificate with that name (cluster.sh user).
  static constexpr const char* kKubevirtController =
      "system:serviceaccount:cozy-kubevirt:kubevirt-controller";
  std::string KubevirtController() {
    if (kubevirtKubeconfig_.empty()) {
      if (!Real()) {
        Fake().SetUser("kubevirt-controller",
                       {kKubevirtController,
                        "",
                        {"system:serviceaccounts", "system:serviceaccounts:cozy-kubevirt"},
                        {}});
        kubevirtKubeconfig_ = KubeconfigFor("kubevirt-controller");
      } else {
        kubevirtKubeconfig_ = KubeconfigFor(kKubevirtController);
      }
    }
    return kubevirtKubeconfig_;
  }
  // The launcher as virt-controller creates it, by KubeVirt's controller. kubectl sends no
  // bearer token over plain HTTP, so on the fake the request goes through the kube client with
  // the token; on kube-apiserver kubectl presents the certificate. (exit code, stdout + stderr)
  std::pair<int, std::string> CreateLauncher(const json& pod) {
    if (Real()) return Create(pod, "", KubevirtController());
    kube::Client client(kube::LoadKubeconfig(KubevirtController()));
    try {
      return {
          0,
          client
              .Create("/api/v1/namespaces/" + pod["metadata"].value("namespace", "") + "/pods", pod)
              .dump()};
    } catch (const kube::ApiError& error) {
      return {1, error.what()};
    }
  }

  static json Order(const std::string& name, const std::string& className, int count) {
    json device = Device(name);
    device["spec"] = {{"className", className}, {"count", count}};
    return device;
  }
  // A VMI referencing held devices and templates, labelled and annotated as the vm-instance
  // chart renders a VM's template.
  static json VmWithGpus(const std::string& name, const std::vector<std::string>& devices,
                         const json& templates = json::array()) {
    json vmi = Vmi(name);
    json references = json::object();
    if (!devices.empty()) references["devices"] = devices;
    if (!templates.empty()) references["templates"] = templates;
    vmi["metadata"]["labels"] = {{"gpu.cozystack.io/device-references", "true"}};
    vmi["metadata"]["annotations"] = {{"gpu.cozystack.io/device-references", references.dump()}};
    return vmi;
  }
  static json Template(const std::string& name, const std::string& className, int count) {
    return {{"name", name}, {"className", className}, {"count", count}};
  }
  // The launcher pod virt-controller creates for a VMI.
  json Launcher(const std::string& vmi) {
    return {{"apiVersion", "v1"},
            {"kind", "Pod"},
            {"metadata",
             {{"name", "virt-launcher-" + vmi + "-abcde"},
              {"namespace", Tenant()},
              {"labels",
               {{"gpu.cozystack.io/device-references", "true"},
                {"kubevirt.io", "virt-launcher"},
                {"vm.kubevirt.io/name", vmi}}},
              {"ownerReferences",
               {{{"apiVersion", "kubevirt.io/v1"},
                 {"kind", "VirtualMachineInstance"},
                 {"name", vmi},
                 {"uid", VmiUid(vmi)},
                 {"controller", true}}}}}},
            {"spec", {{"containers", {{{"name", "compute"}, {"image", "virt-launcher"}}}}}}};
  }

  // Someone else holds the Lease for an hour: a replica serves the webhooks and never binds.
  void GhostHoldsTheLease() {
    Apply({{"apiVersion", "coordination.k8s.io/v1"},
           {"kind", "Lease"},
           {"metadata", {{"name", "gpu-controller"}, {"namespace", "cozy-system"}}},
           {"spec",
            {{"holderIdentity", "ghost"},
             {"leaseDurationSeconds", 3600},
             {"renewTime", kube::FormatMicroTime(std::chrono::system_clock::now())}}}});
  }

  // The status PATCHes that attached devices (the webhook's bind requests).
  int AttachWrites() {
    int writes = 0;
    for (const auto& request : Requests()) {
      if (request.method == "PATCH" && request.status < 300 && request.path.ends_with("/status") &&
          request.body.find("\"bindRequest\"") != std::string::npos &&
          request.body.find("\"attachment\"") != std::string::npos) {
        ++writes;
      }
    }
    return writes;
  }

  std::string kubevirtKubeconfig_;
  std::vector<json> webhookConfigurations_;
  std::map<std::string, int> webhookPorts_;
  std::atomic<int> files_ = 0;
};

TEST_F(AdmissionEndToEnd, E1_E2_E3_E4_AnOrderThatCannotBeMetIsRefusedAtApplyWithItsReason) {
  StartWebhookReplica("replica-a");
  WaitReady("replica-a");
  // E1: a class nobody offers.
  auto [code, out] = Create(Order("unknown", "h100", 1));
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("h100"), std::string::npos) << out;
  EXPECT_NE(out.find("denied the request"), std::string::npos) << out;
  // E1: over the class's maxCount.
  json limited = Class("a100-one");
  limited["spec"]["maxCount"] = 1;
  Apply(limited);
  std::tie(code, out) = Create(Order("two-of-one", "a100-one", 2));
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("a100-one"), std::string::npos) << out;
  // E2: 2 + 2 free on two nodes: 3 cannot go on one node.
  std::tie(code, out) = Create(Order("three", "a100", 3));
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("3"), std::string::npos) << out;
  std::tie(code, out) = Create(Order("two", "a100", 2));
  EXPECT_EQ(code, 0) << out;
  // E3: the parent tenant's budget is full although the child's has room.
  Kubectl("label namespace " + Tenant() + " tenant.cozystack.io/tenant-root=");
  Apply({{"apiVersion", "v1"},
         {"kind", "Namespace"},
         {"metadata",
          {{"name", "tenant-root"}, {"labels", {{"tenant.cozystack.io/tenant-root", ""}}}}}});
  Apply({{"apiVersion", "v1"},
         {"kind", "ResourceQuota"},
         {"metadata", {{"name", "gpu"}, {"namespace", "tenant-root"}}},
         {"spec", {{"hard", {{"requests.gpu.cozystack.io/a100", "2"}}}}}});
  Apply({{"apiVersion", "v1"},
         {"kind", "ResourceQuota"},
         {"metadata", {{"name", "gpu"}, {"namespace", Tenant()}}},
         {"spec", {{"hard", {{"requests.gpu.cozystack.io/a100", "8"}}}}}});
  // The webhook reads the quotas from its cache: the first tries may come before it has them.
  int attempt = 0;
  EXPECT_TRUE(WaitFor(
      [&] {
        std::tie(code, out) = Create(Order("over-parent-" + std::to_string(++attempt), "a100", 1));
        return code != 0;
      },
      10s))
      << "the parent's budget (2, both used) did not refuse a third GPU";
  EXPECT_NE(out.find("tenant-root"), std::string::npos) << out;
  // E4: a vGPU class without the entitlement, then with it.
  json vgpu = Class("a100-vgpu");
  vgpu["spec"]["mode"] = "vgpu";
  vgpu["spec"]["profile"] = "A100-4C";
  vgpu["spec"]["source"]["devicePlugin"]["resourceName"] = "nvidia.com/GA100";
  Apply(vgpu);
  Kubectl("delete resourcequota gpu -n tenant-root");
  std::tie(code, out) = Create(Order("vgpu", "a100-vgpu", 1));
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("entitle"), std::string::npos) << out;
  Kubectl("label namespace tenant-root gpu.cozystack.io/vgpu-entitled=true");
  EXPECT_TRUE(WaitFor([&] { return Create(Order("vgpu", "a100-vgpu", 1)).first == 0; }, 10s))
      << Logs();
}

TEST_F(AdmissionEndToEnd, E5_ADryRunAndARefusedStartLeaveNoTrace) {
  StartWebhookReplica("replica-a");
  WaitReady("replica-a");
  WaitLeader("replica-a");
  ASSERT_EQ(Create(Order("held", "a100", 1)).first, 0);
  // A dry run is admitted with its patch and writes nothing.
  auto [code, out] =
      Create(VmWithGpus("vm-dry", {"held"}, json::array({Template("scratch", "a100", 1)})),
             "--dry-run=server");
  ASSERT_EQ(code, 0) << out << Logs();
  const json shown = json::parse(out);
  EXPECT_EQ(shown["spec"]["domain"]["devices"]["gpus"].size(), 2u) << shown.dump();
  EXPECT_TRUE(Get("gpudevice vm-dry-scratch", Tenant()).is_null());
  EXPECT_FALSE(Get("gpudevice held", Tenant())["status"].contains("attachment"));
  // A refused start (a template of a class nobody offers) writes nothing either.
  std::tie(code, out) =
      Create(VmWithGpus("vm-refused", {"held"}, json::array({Template("scratch", "h100", 1)})));
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("h100"), std::string::npos) << out;
  EXPECT_TRUE(Get("gpudevice vm-refused-scratch", Tenant()).is_null());
  EXPECT_FALSE(Get("gpudevice held", Tenant())["status"].contains("attachment"));
  EXPECT_TRUE(Get("vmi vm-refused", Tenant()).is_null());
  EXPECT_EQ(AttachWrites(), 0);
}

TEST_F(AdmissionEndToEnd, E6_E8_E9_E10_E13_AVmGetsItsGpusOnOneNodeAndItsLauncherIsPinned) {
  StartWebhookReplica("replica-a");
  WaitReady("replica-a");
  WaitLeader("replica-a");
  // The fake stands in for virt-api's own VMI mutator, which calls the webhook again (E9); a
  // real cluster here has no virt-api.
  if (!Real()) Fake().EnableVirtApiMutator();
  ASSERT_EQ(Create(Order("held", "a100", 1)).first, 0);
  auto [code, out] =
      Create(VmWithGpus("vm1", {"held"}, json::array({Template("scratch", "a100", 1)})));
  ASSERT_EQ(code, 0) << out << Logs();
  const json vmi = Get("vmi vm1", Tenant());
  // E10: one gpus entry per GPU, no resources key as well.
  const json& gpus = vmi["spec"]["domain"]["devices"]["gpus"];
  ASSERT_EQ(gpus.size(), 2u) << vmi.dump();
  for (const json& entry : gpus) EXPECT_EQ(entry["deviceName"], "nvidia.com/GA100");
  EXPECT_FALSE(vmi["spec"]["domain"].contains("resources")) << vmi.dump();
  EXPECT_EQ(AttachWrites(), 2) << "one attachment per device, none from a reinvocation";
  if (!Real()) {
    // virt-api's stand-in ran after the webhook, which was called again (E9) and wrote nothing.
    EXPECT_EQ(vmi["spec"]["domain"]["machine"]["type"], "q35") << vmi.dump();
    EXPECT_TRUE(WaitFor(
        [&] {
          return Metrics("replica-a").find("gpu_controller_admission_reinvocations_total 1") !=
                 std::string::npos;
        },
        5s))
        << Metrics("replica-a");
  }
  // E6: the template device exists, marked; both are on one node, attached to vm1.
  const json scratch = Get("gpudevice vm1-scratch", Tenant());
  ASSERT_TRUE(scratch.is_object());
  EXPECT_EQ(scratch["metadata"]["labels"]["gpu.cozystack.io/template-device"], "true");
  const json held = Get("gpudevice held", Tenant());
  EXPECT_EQ(held["status"]["phase"], "Bound");
  EXPECT_EQ(scratch["status"]["phase"], "Bound");
  const std::string node = held["status"]["nodeName"];
  EXPECT_EQ(scratch["status"]["nodeName"], node);
  EXPECT_EQ(held["status"]["attachment"]["vmiName"], "vm1");
  // E13: the launcher pod gets a required node affinity to that node.
  std::tie(code, out) = CreateLauncher(Launcher("vm1"));
  ASSERT_EQ(code, 0) << out << Logs();
  const json pod = json::parse(out);
  const json& terms = pod["spec"]["affinity"]["nodeAffinity"]
                         ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
  ASSERT_FALSE(terms.empty()) << pod.dump();
  // By the Node's name (E13), tolerating its cordon (D10).
  EXPECT_EQ(terms[0]["matchFields"],
            json::array({{{"key", "metadata.name"}, {"operator", "In"}, {"values", {node}}}}))
      << pod.dump();
  EXPECT_EQ(testing::WhyNotOn(pod, testing::WithoutLifecycleTaints(Get("node " + node))), "")
      << pod.dump();
}

// E15, D21: a VM on a dra class's GPU gets KubeVirt's DRA form (a spec.resourceClaims entry naming
// the device's claim, a gpus entry naming its request), its device Bound on the node whose slice
// has the GPU, the claim written by the leader, and its launcher pinned there as any (E13).
TEST_F(AdmissionEndToEnd, E15_D21_AVmOfADraClassGetsItsClaimInKubeVirtsDraForm) {
  DraNode("n3");
  Apply(DraClass("a100-dra"));
  StartWebhookReplica("replica-a");
  WaitReady("replica-a");
  WaitLeader("replica-a");
  // The replica's ResourceSlice cache follows discovery and readiness does not wait for it (as
  // for KubeVirt's kinds, G3): the order is admitted once the slice is read.
  ASSERT_TRUE(WaitFor([&] { return Create(Order("held", "a100-dra", 1)).first == 0; }, 10s))
      << Logs();
  auto [code, out] = Create(VmWithGpus("vm1", {"held"}, json::array()));
  ASSERT_EQ(code, 0) << out << Logs();
  const json vmi = Get("vmi vm1", Tenant());
  EXPECT_EQ(vmi["spec"]["resourceClaims"],
            (json{{{"name", "cozy-gpu-held"}, {"resourceClaimName", "held"}}}))
      << vmi.dump();
  EXPECT_EQ(vmi["spec"]["domain"]["devices"]["gpus"], (json{{{"name", "cozy-gpu-held-0"},
                                                             {"claimName", "cozy-gpu-held"},
                                                             {"requestName", "gpu-0"}}}))
      << vmi.dump();
  EXPECT_EQ(Get("gpudevice held", Tenant()).value("status", json::object()).value("nodeName", ""),
            "n3");
  ASSERT_TRUE(WaitFor([&] { return Get("resourceclaim held", Tenant()).is_object(); })) << Logs();
  EXPECT_EQ(Get("resourceclaim held", Tenant())["spec"]["devices"]["requests"][0]["name"], "gpu-0");
  std::tie(code, out) = CreateLauncher(Launcher("vm1"));
  ASSERT_EQ(code, 0) << out << Logs();
  const json pod = json::parse(out);
  EXPECT_EQ(
      pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
         ["nodeSelectorTerms"][0]["matchFields"][0]["values"],
      json::array({"n3"}))
      << pod.dump();
}

// C18: one namespace's pods cannot take the GPU catalog from everyone. A pod asking for "10E"
// GPUs (the API server accepts it) made the model throw, and every tenant's order, every VM
// start and every binder pass failed. Now: a pod of 10E bound to n1 in one namespace, with a
// raw-name quota and a budget of 10E beside it, and another of 10E, unscheduled, in a
// namespace outside every tenant. Another tenant's order is bound (on n2, the one node with
// room) and its VM starts; the first namespace's own order is refused at apply with a reason
// that names its pod; the leader counts the inputs it read out of range.
TEST_F(AdmissionEndToEnd, C18_APodOf10EGpusHoldsBackOnlyItsOwnNodeAndNamespace) {
  StartWebhookReplica("replica-a");
  WaitReady("replica-a");
  WaitLeader("replica-a");
  const std::string noisy = Tenant() + "-noisy";
  const std::string stranger = Tenant() + "-stranger";
  for (const std::string& ns : {noisy, stranger}) {
    Apply({{"apiVersion", "v1"},
           {"kind", "Namespace"},
           {"metadata", {{"name", ns}, {"labels", {{"cozy-gpu-e2e", "tenant"}}}}}});
  }
  auto hog = [](const std::string& ns, const std::string& name, const std::string& node) {
    const json units = {{"nvidia.com/GA100", "10E"}};
    json pod = {{"apiVersion", "v1"},
                {"kind", "Pod"},
                {"metadata", {{"name", name}, {"namespace", ns}}},
                {"spec",
                 {{"containers",
                   {{{"name", "main"},
                     {"image", "busybox"},
                     {"resources", {{"requests", units}, {"limits", units}}}}}}}}};
    if (!node.empty()) pod["spec"]["nodeName"] = node;
    return pod;
  };
  Apply(hog(noisy, "squatter", "n1"));
  Apply(hog(stranger, "stranger", ""));
  Apply({{"apiVersion", "v1"},
         {"kind", "ResourceQuota"},
         {"metadata", {{"name", "gpu"}, {"namespace", noisy}}},
         {"spec",
          {{"hard",
            {{"requests.nvidia.com/GA100", "4"}, {"requests.gpu.cozystack.io/total", "10E"}}}}}});
  if (!Real()) Fake().EnableVirtApiMutator();

  // Another tenant: bound on n2 and its VM starts.
  auto [code, out] = Create(Order("held", "a100", 1));
  ASSERT_EQ(code, 0) << out << Logs();
  ASSERT_TRUE(WaitFor([&] { return Phase("held") == "Bound"; })) << Logs();
  EXPECT_EQ(NodeOf("held"), "n2");
  std::tie(code, out) = Create(VmWithGpus("vm1", {"held"}));
  ASSERT_EQ(code, 0) << out << Logs();
  EXPECT_EQ(Get("gpudevice held", Tenant())["status"]["attachment"]["vmiName"], "vm1");

  // The squatter's own namespace: refused at apply, naming the pod.
  json order = Order("mine", "a100", 1);
  order["metadata"]["namespace"] = noisy;
  std::tie(code, out) = Create(order);
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("Pod " + noisy + "/squatter"), std::string::npos) << out;
  EXPECT_TRUE(WaitFor([&] {
    return Metric("replica-a", "gpu_controller_model_input_problems{kind=\"Pod\"}") == 2 &&
           Metric("replica-a", "gpu_controller_model_input_problems{kind=\"ResourceQuota\"}") == 1;
  })) << Metrics("replica-a");
}

// E14: any pod labelled as its own running VMI's launcher (the labels and a VMI owner reference it
// wrote itself) was pinned to the GPU node and given the cordon and the class's tolerations. Only
// the pods KubeVirt's controller creates are launchers to the pod webhook now: the same pod from
// anyone else is refused, naming who may create it, and changes nothing.
TEST_F(AdmissionEndToEnd, E14_APodPosingAsAVmsLauncherIsRefusedUnlessKubeVirtCreatesIt) {
  StartWebhookReplica("replica-a");
  WaitReady("replica-a");
  WaitLeader("replica-a");
  if (!Real()) Fake().EnableVirtApiMutator();
  ASSERT_EQ(Create(Order("held", "a100", 1)).first, 0);
  auto [code, out] = Create(VmWithGpus("vm1", {"held"}));
  ASSERT_EQ(code, 0) << out << Logs();
  json posing = Launcher("vm1");
  posing["metadata"]["name"] = "posing-as-vm1";
  std::tie(code, out) = Create(posing);  // the hoster's own user, let alone a tenant
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find(std::string("only KubeVirt's controller (") + kKubevirtController + ")"),
            std::string::npos)
      << out;
  EXPECT_TRUE(Get("pod posing-as-vm1", Tenant()).is_null());
  // The same pod from KubeVirt's controller is the launcher, pinned.
  std::tie(code, out) = CreateLauncher(Launcher("vm1"));
  ASSERT_EQ(code, 0) << out << Logs();
  EXPECT_FALSE(json::parse(out)["spec"]["affinity"].is_null()) << out;
  // Without a VMI owner, KubeVirt's controller's pod names no VMI by its labels alone.
  json unowned = Launcher("vm1");
  unowned["metadata"]["name"] = "unowned";
  unowned["metadata"].erase("ownerReferences");
  std::tie(code, out) = CreateLauncher(unowned);
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("names no VirtualMachineInstance"), std::string::npos) << out;
}

// E13 with D10: the launcher's pin must be schedulable. The node the GPUs sit
// on has a kubernetes.io/hostname label other than its name (as cloud and bare-metal installers
// set it), the other node's hostname label is that node's name, and the node is cordoned with no
// room elsewhere, so the binder answers the VM's start Succeeded in place (D10). The launcher
// pod the API server stores must fit that Node as kube-scheduler filters it (node affinity by
// the Node's name, the cordon tolerated) and fit no other.
TEST_F(AdmissionEndToEnd, E13_D10_TheLauncherPinFitsACordonedNodeWithAnotherHostname) {
  StartWebhookReplica("replica-a");
  WaitReady("replica-a");
  WaitLeader("replica-a");
  ASSERT_EQ(Create(Order("held", "a100", 1)).first, 0);
  ASSERT_TRUE(WaitFor([&] { return Phase("held") == "Bound"; }, 10s)) << Logs();
  const std::string node = NodeOf("held");
  const std::string other = node == "n1" ? "n2" : "n1";
  Kubectl("label node " + node + " --overwrite kubernetes.io/hostname=gpu-host-17.example");
  Kubectl("label node " + other + " --overwrite kubernetes.io/hostname=" + node);
  // The other node first, so that the set has nowhere to move when its own is cordoned.
  Kubectl("cordon " + other);
  Kubectl("cordon " + node);
  auto [code, out] = Create(VmWithGpus("vm1", {"held"}));
  ASSERT_EQ(code, 0) << out << Logs();
  EXPECT_EQ(NodeOf("held"), node) << "D10: answered Succeeded in place";
  std::tie(code, out) = CreateLauncher(Launcher("vm1"));
  ASSERT_EQ(code, 0) << out << Logs();
  const json pod = json::parse(out);
  const json pinned = Get("node " + node);
  ASSERT_TRUE(pinned.value("spec", json::object()).value("unschedulable", false)) << pinned;
  EXPECT_NE(pinned["metadata"]["labels"].value("kubernetes.io/hostname", ""), node);
  EXPECT_EQ(testing::WhyNotOn(pod, testing::WithoutLifecycleTaints(pinned)), "")
      << pod["spec"].dump();
  json elsewhere = Get("node " + other);
  EXPECT_NE(testing::WhyNotOn(pod, testing::WithoutLifecycleTaints(elsewhere)), "")
      << pod["spec"].dump();
  elsewhere["spec"].erase("unschedulable");  // uncordoned: still not there, the pin decides
  elsewhere["spec"].erase("taints");
  EXPECT_NE(testing::WhyNotOn(pod, testing::WithoutLifecycleTaints(elsewhere)), "")
      << pod["spec"].dump();
}

// C7, E13: GPU nodes behind a NoSchedule taint, as hosters run them. A class that does
// not tolerate the pool's taint is refused at apply with the taint named; once the hoster gives
// the class the toleration, a tenant's order binds there and stays Bound across passes (its VM
// off), a VM start with a held device and a template is admitted, and its launcher pod, as the
// API server stores it, fits the tainted node as kube-scheduler filters it, and no other.
TEST_F(AdmissionEndToEnd, C7_E13_ATaintedPoolTakesOrdersAndStartsVmsOnceItsClassTolerates) {
  StartWebhookReplica("replica-a");
  WaitReady("replica-a");
  WaitLeader("replica-a");
  for (const char* node : {"n1", "n2"}) {
    Kubectl(std::string("taint node ") + node + " nvidia.com/gpu=present:NoSchedule");
  }
  std::pair<int, std::string> created;
  ASSERT_TRUE(WaitFor(
      [&] {
        created = Create(Order("early", "a100", 1));
        return created.first != 0;
      },
      10s))
      << created.second;
  EXPECT_NE(created.second.find("taint nvidia.com/gpu=present:NoSchedule not tolerated"),
            std::string::npos)
      << created.second;

  json tolerating = Class("a100");
  tolerating["spec"]["tolerations"] = {
      {{"key", "nvidia.com/gpu"}, {"operator", "Exists"}, {"effect", "NoSchedule"}}};
  Apply(tolerating);
  ASSERT_TRUE(WaitFor(
      [&] {
        created = Create(Order("held", "a100", 1));
        return created.first == 0;
      },
      10s))
      << created.second << Logs();
  ASSERT_TRUE(WaitFor([&] { return Phase("held") == "Bound"; }, 10s)) << Logs();
  const std::string node = NodeOf("held");
  // Passes go on (a resync, the next order's): the held order is never sent Lost for the taint.
  ASSERT_EQ(Create(Order("second", "a100", 1)).first, 0);
  ASSERT_TRUE(WaitFor([&] { return Phase("second") == "Bound"; }, 10s)) << Logs();
  EXPECT_EQ(Phase("held"), "Bound");
  EXPECT_EQ(NodeOf("held"), node);

  auto [code, out] =
      Create(VmWithGpus("vm1", {"held"}, json::array({Template("scratch", "a100", 1)})));
  ASSERT_EQ(code, 0) << out << Logs();
  // Both on one node of the pool (the set moves off a node the second order filled).
  const std::string placed = NodeOf("held");
  EXPECT_EQ(NodeOf("vm1-scratch"), placed);
  std::tie(code, out) = CreateLauncher(Launcher("vm1"));
  ASSERT_EQ(code, 0) << out << Logs();
  const json pod = json::parse(out);
  const json pool = testing::WithoutLifecycleTaints(Get("node " + placed));
  ASSERT_FALSE(pool["spec"]["taints"].empty()) << pool.dump();
  EXPECT_EQ(testing::WhyNotOn(pod, pool), "") << pod["spec"].dump();
  const std::string other = placed == "n1" ? "n2" : "n1";
  EXPECT_NE(testing::WhyNotOn(pod, testing::WithoutLifecycleTaints(Get("node " + other))), "")
      << pod["spec"].dump();
  // Without the class's toleration the same pod fits neither node: the taint decides.
  json bare = pod;
  bare["spec"]["tolerations"] = json::array();
  EXPECT_NE(testing::WhyNotOn(bare, pool), "");
}

// C7, E5: a VM whose own tolerations let it onto a tainted pool its class
// does not tolerate is refused at once, and nothing is written. The binder
// answers a start before the VMI exists, so only the classes' tolerations can place its GPUs;
// the webhook used to admit it on the VMI's, create the template device (which the GPUDevice
// webhook then refused) and attach, and the binder refused after those writes.
TEST_F(AdmissionEndToEnd, E5_AVmToleratingThePoolItselfIsRefusedBeforeAnyWrite) {
  StartWebhookReplica("replica-a");
  WaitReady("replica-a");
  WaitLeader("replica-a");
  ASSERT_EQ(Create(Order("held", "a100", 1)).first, 0);
  ASSERT_TRUE(WaitFor([&] { return Phase("held") == "Bound"; }, 10s)) << Logs();
  for (const char* node : {"n1", "n2"}) {
    Kubectl(std::string("taint node ") + node + " gpu=present:NoSchedule");
  }
  // The taint reaches the replica's cache within a moment: an order is refused from then on.
  ASSERT_TRUE(WaitFor([&] { return Create(Order("probe", "a100", 1)).first != 0; }, 10s));
  const int attachesBefore = AttachWrites();
  json vmi = VmWithGpus("vm1", {"held"}, json::array({Template("scratch", "a100", 1)}));
  vmi["spec"]["tolerations"] = {{{"key", "gpu"}, {"operator", "Exists"}}};
  const auto [code, out] = Create(vmi);
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("vm1 cannot start: its GPUs cannot be placed on one node now"),
            std::string::npos)
      << out;
  EXPECT_FALSE(Get("gpudevice vm1-scratch", Tenant()).is_object()) << "no template device";
  EXPECT_EQ(AttachWrites(), attachesBefore) << "no attachment";
  EXPECT_FALSE(Get("gpudevice held", Tenant())["status"].contains("attachment"));
}

// E9 across replicas: the first call of a VM start reaches replica A, which
// attaches the held device and gets the binder's answer; the reinvocation after virt-api's
// mutator reaches replica B, whose device cache does not show A's writes yet (its device watch
// stalled). B reads the API server before writing and finds the answered request its own: it
// attaches nothing and asks nothing again.
TEST_F(AdmissionEndToEnd, E9_AReinvocationOnAReplicaWhoseCacheLagsWritesNothing) {
  const int portA = StartWebhookReplica("replica-a");
  WaitReady("replica-a");
  WaitLeader("replica-a");
  const int portB = StartWebhookReplica("replica-b", {}, /*serve=*/false);
  WaitReady("replica-b");
  Fake().EnableVirtApiMutator();
  ASSERT_EQ(Create(Order("held", "a100", 1)).first, 0);
  ASSERT_TRUE(WaitFor([&] { return Phase("held") == "Bound"; }, 10s)) << Logs();
  // Replica B's cache shows the order Bound. Kept a sleep: a cache counts its objects, not the
  // versions it has seen, and B, the standby, runs no pass that could say so.
  std::this_thread::sleep_for(500ms);
  fake::Fault stall;
  stall.pathPrefix = "/apis/gpu.cozystack.io/v1alpha1/gpudevices";
  stall.watchOnly = true;
  stall.latencyMs = 15000;
  stall.bearerToken = "replica-b";
  Fake().AddFault(stall);
  Fake().DropWatches();
  // Kept a sleep: B's re-watch, which the stall holds, counts nowhere (StallDeviceWatches).
  std::this_thread::sleep_for(300ms);
  // The first call to A, the reinvocation to B.
  Fake().SetServiceEndpoints(kServiceNamespace, kService, {portA, portB});
  const auto [code, out] = Create(VmWithGpus("vm1", {"held"}));
  ASSERT_EQ(code, 0) << out << Logs();
  const json vmi = Get("vmi vm1", Tenant());
  EXPECT_EQ(vmi["spec"]["domain"]["devices"]["gpus"].size(), 1u) << vmi.dump();
  EXPECT_EQ(vmi["spec"]["domain"]["machine"]["type"], "q35") << "virt-api's stand-in ran";
  EXPECT_EQ(AttachWrites(), 1) << "B attached and asked again";
  EXPECT_TRUE(WaitFor(
      [&] {
        return Metrics("replica-b")
                   .find("gpu_controller_admission_reinvocations_read_live_total 1") !=
               std::string::npos;
      },
      5s))
      << Metrics("replica-b");
  Fake().ClearFaults();
}

// C3, D6 across real replicas: two gpu-controller processes, random steps (orders, VM
// starts with a held order and a template, two of them at once, deletions, and the leader
// stopped and started again so the lead changes hands and the webhooks move between replicas),
// and after every step the binder's invariants as the API server holds them: the tenant's
// budget (requests.gpu.cozystack.io/a100: 3) never below what its Bound and Lost devices order,
// and no node holding more Bound GPUs than it serves. The seed is drawn per run and printed with
// any failure (COZY_PROPERTY_SEED replays one); the model's own property test
// (PassPropertiesC3D6) covers far more clusters per second.
TEST_F(AdmissionEndToEnd, C3_D6_TwoReplicasAndLeaderChangesNeverOverrunABudgetOrANode) {
  uint32_t seed = std::random_device{}();
  if (const char* replay = std::getenv("COZY_PROPERTY_SEED")) {
    seed = static_cast<uint32_t>(std::stoul(replay));
  }
  SCOPED_TRACE("seed " + std::to_string(seed) + " (COZY_PROPERTY_SEED replays it)");
  std::mt19937 random(seed);
  auto pick = [&random](int low, int high) {
    return std::uniform_int_distribution<int>(low, high)(random);
  };
  Apply({{"apiVersion", "v1"},
         {"kind", "ResourceQuota"},
         {"metadata", {{"name", "gpu"}, {"namespace", Tenant()}}},
         {"spec", {{"hard", {{"requests.gpu.cozystack.io/a100", "3"}}}}}});
  std::map<std::string, int64_t> units = {{"n1", 2}, {"n2", 2}};
  StartWebhookReplica("replica-a");
  WaitReady("replica-a");
  WaitLeader("replica-a");
  StartWebhookReplica("replica-b");
  WaitReady("replica-b");

  std::string leader = "replica-a";  // the Lease's holder, whose passes check waits for
  auto check = [&](const std::string& step) {
    // A binder pass of the leader's begun after the step has run (the passes a step queues).
    ASSERT_TRUE(WaitForPasses(leader, "binder")) << step << "\n" << Logs();
    const json list = Get("gpudevices", Tenant());
    ASSERT_TRUE(list.is_object()) << step;
    int64_t held = 0;
    std::map<std::string, int64_t> onNode;
    for (const json& device : list["items"]) {
      const json status = device.value("status", json::object());
      const std::string phase = status.value("phase", "");
      const int64_t count = device["spec"].value("count", 1);
      if (phase == "Bound" || phase == "Lost") held += count;
      if (phase == "Bound") onNode[status.value("nodeName", "")] += count;
    }
    EXPECT_LE(held, 3) << "after " << step << ": the budget is overrun\n" << list.dump();
    for (const auto& [node, count] : onNode) {
      EXPECT_LE(count, units[node]) << "after " << step << ": node " << node << " is overrun";
    }
  };

  // Names and choices are drawn on this thread, before a step runs anything at once: the seed
  // replays the same run, and the steps' threads share nothing.
  int made = 0;
  std::vector<std::string> orders;
  auto drawOrder = [&] { return std::make_pair("o" + std::to_string(++made), pick(1, 2)); };
  auto drawVm = [&] {
    std::vector<std::string> held;
    if (!orders.empty() && pick(0, 1) == 1) {
      held.push_back(orders[static_cast<size_t>(pick(0, static_cast<int>(orders.size()) - 1))]);
    }
    return std::make_pair("vm" + std::to_string(++made), held);
  };
  auto order = [&](const std::pair<std::string, int>& drawn) {
    return Create(Order(drawn.first, "a100", drawn.second)).first == 0;
  };
  auto vm = [&](const std::pair<std::string, std::vector<std::string>>& drawn) {
    Create(VmWithGpus(drawn.first, drawn.second, json::array({Template("t", "a100", 1)})));
  };
  for (int step = 0; step < 10; ++step) {
    std::string what;
    switch (pick(0, 4)) {
      case 0: {
        what = "an order";
        const auto drawn = drawOrder();
        if (order(drawn)) orders.push_back(drawn.first);
        break;
      }
      case 1:
        what = "a VM start";
        vm(drawVm());
        break;
      case 2: {
        what = "a VM start and an order at once";
        const auto drawnVm = drawVm();
        const auto drawnOrder = drawOrder();
        auto other = std::async(std::launch::async, [&] { return order(drawnOrder); });
        vm(drawnVm);
        if (other.get()) orders.push_back(drawnOrder.first);
        break;
      }
      case 3:
        what = "a deletion";
        if (!orders.empty()) {
          const size_t at = static_cast<size_t>(pick(0, static_cast<int>(orders.size()) - 1));
          Kubectl("-n " + Tenant() + " delete gpudevice " + orders[at] + " --wait=false", true);
          orders.erase(orders.begin() + static_cast<std::ptrdiff_t>(at));
        }
        break;
      default: {
        what = "a leader change";
        StopReplica(leader);
        const std::string other = leader == "replica-a" ? "replica-b" : "replica-a";
        ASSERT_TRUE(WaitFor([&] { return Holder() == other; }, 30s)) << Logs();
        StartWebhookReplica(leader);  // back as the standby, serving the webhooks
        WaitReady(leader);
        leader = other;
        break;
      }
    }
    check("step " + std::to_string(step) + ", " + what);
    if (HasFatalFailure() || HasNonfatalFailure()) break;
  }
}

TEST_F(AdmissionEndToEnd, E7_TwoVmsRaceForOneHeldDeviceAndOneGetsIt) {
  StartWebhookReplica("replica-a");
  WaitReady("replica-a");
  WaitLeader("replica-a");
  ASSERT_EQ(Create(Order("held", "a100", 1)).first, 0);
  auto a = std::async(std::launch::async, [&] { return Create(VmWithGpus("vm-a", {"held"})); });
  auto b = std::async(std::launch::async, [&] { return Create(VmWithGpus("vm-b", {"held"})); });
  const auto [codeA, outA] = a.get();
  const auto [codeB, outB] = b.get();
  EXPECT_NE(codeA == 0, codeB == 0) << outA << "\n" << outB << Logs();
  const std::string winner = codeA == 0 ? "vm-a" : "vm-b";
  EXPECT_EQ(Get("gpudevice held", Tenant())["status"]["attachment"]["vmiName"], winner);
  // The loser is refused for the winner's hold, in the words of the step that saw it (a loaded
  // machine gives any order): the plan ("attached to VMI <winner>"), the attachment write that
  // lost the race ("attached to VirtualMachineInstance <winner>"), or, once the winner's VMI is
  // in the cache, "in use by the running VirtualMachineInstance <winner>".
  const std::string& lost = codeA == 0 ? outB : outA;
  EXPECT_TRUE(lost.find("attached to VMI " + winner) != std::string::npos ||
              lost.find("attached to VirtualMachineInstance " + winner) != std::string::npos ||
              lost.find("in use by the running VirtualMachineInstance " + winner) !=
                  std::string::npos)
      << lost;
}

TEST_F(AdmissionEndToEnd, E7_AnOrderAndAVmRaceForTheLastUnitAndOneGetsIt) {
  StartWebhookReplica("replica-a");
  WaitReady("replica-a");
  WaitLeader("replica-a");
  // Three of the four units are held: one is left.
  ASSERT_EQ(Create(Order("two", "a100", 2)).first, 0);
  ASSERT_EQ(Create(Order("one", "a100", 1)).first, 0);
  ASSERT_TRUE(WaitFor([&] { return Phase("two") == "Bound" && Phase("one") == "Bound"; }, 10s));
  auto order = std::async(std::launch::async, [&] { return Create(Order("last", "a100", 1)); });
  auto vm = std::async(std::launch::async, [&] {
    return Create(VmWithGpus("vm1", {}, json::array({Template("scratch", "a100", 1)})));
  });
  const auto [orderCode, orderOut] = order.get();
  const auto [vmCode, vmOut] = vm.get();
  // The VM either started on the last unit or was refused; the order either holds it or waits
  // refused: never both bound, nor by a pass that runs after both were admitted.
  ASSERT_TRUE(WaitForPasses("replica-a", "binder")) << Logs();
  const bool vmBound = vmCode == 0 && Phase("vm1-scratch") == "Bound";
  const bool orderBound = orderCode == 0 && Phase("last") == "Bound";
  EXPECT_FALSE(vmBound && orderBound) << vmOut << orderOut;
  EXPECT_TRUE(vmBound || orderBound) << vmOut << orderOut << Logs();
  if (vmCode == 0) {
    EXPECT_TRUE(vmBound) << "a started VM holds its GPU";
  }
}

TEST_F(AdmissionEndToEnd, E8_WithTheBinderStoppedAStartIsRefusedWithinTheBoundAndLeavesNothing) {
  GhostHoldsTheLease();
  StartWebhookReplica("replica-a", {"--bind-wait", "2s"});
  WaitReady("replica-a");
  ASSERT_EQ(Create(Order("held", "a100", 1)).first, 0);
  const auto started = std::chrono::steady_clock::now();
  auto [code, out] =
      Create(VmWithGpus("vm1", {"held"}, json::array({Template("scratch", "a100", 1)})));
  const auto took = std::chrono::steady_clock::now() - started;
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("did not place"), std::string::npos) << out;
  EXPECT_LT(took, 10s) << "the API server's timeout, not the webhook's bound, ended the call";
  // Rolled back: no attachment, no template device.
  EXPECT_FALSE(Get("gpudevice held", Tenant())["status"].contains("attachment"));
  EXPECT_TRUE(WaitFor([&] { return Get("gpudevice vm1-scratch", Tenant()).is_null(); }, 10s));
}

// E5, D4: the binder may answer a bind request between the undo's read of the device and its
// patch; the undo's conditional patch then meets a conflict, reads again and still clears the
// attachment (the binder is not leading here, so nothing else would clear it: D18 waits for the
// attachment grace).
TEST_F(AdmissionEndToEnd, E5_AnUndoThatMeetsAConflictReadsAgainAndStillDetaches) {
  GhostHoldsTheLease();
  StartWebhookReplica("replica-a", {"--bind-wait", "1s"});
  WaitReady("replica-a");
  ASSERT_EQ(Create(Order("held", "a100", 1)).first, 0);
  // The attach's patch goes through; the undo's first patch is answered 409.
  fake::Fault conflict = fake::Fault::Answer(409, 1, "PATCH");
  conflict.pathPrefix =
      "/apis/gpu.cozystack.io/v1alpha1/namespaces/" + Tenant() + "/gpudevices/held/status";
  conflict.skip = 1;
  Fake().AddFault(conflict);
  auto [code, out] = Create(VmWithGpus("vm1", {"held"}));
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("did not place"), std::string::npos) << out;
  int conflicts = 0;
  for (const auto& request : Fake().Requests()) {
    if (request.method == "PATCH" && request.fault == "status") ++conflicts;
  }
  EXPECT_EQ(conflicts, 1) << "the undo's patch was not the one faulted";
  // Detached when the refusal came, not later by someone else.
  EXPECT_FALSE(Get("gpudevice held", Tenant())["status"].contains("attachment"))
      << Get("gpudevice held", Tenant()).dump(2) << Logs();
  EXPECT_FALSE(Get("gpudevice held", Tenant())["status"].contains("bindRequest"));
}

// docs/security.md, "Hardening done": the VMI webhook writes nothing after the API server stopped
// waiting for it. With a 3 s webhook timeout and every attachment write taking 1.5 s, a start of
// three devices cannot be attached in time: the webhook stops at the deadline instead of writing on
// (and then answering Allow to nobody), rolls back what it wrote, and nothing stays attached.
TEST_F(AdmissionEndToEnd, E8_NoWriteIsStartedAfterTheApiServersTimeoutAndWhatWasWrittenGoes) {
  GpuNode("n3", 4);
  StartWebhookReplica("replica-a");
  WaitReady("replica-a");
  WaitLeader("replica-a");
  ASSERT_EQ(Create(Order("held-a", "a100", 1)).first, 0);
  ASSERT_EQ(Create(Order("held-b", "a100", 1)).first, 0);
  ASSERT_TRUE(WaitFor([&] { return Phase("held-a") == "Bound" && Phase("held-b") == "Bound"; }));
  for (json configuration : webhookConfigurations_) {
    if (configuration["kind"] != "MutatingWebhookConfiguration") continue;
    for (json& webhook : configuration["webhooks"]) webhook["timeoutSeconds"] = 3;
    Apply(configuration);
  }
  fake::Fault slow;
  slow.method = "PATCH";
  slow.pathPrefix = "/apis/gpu.cozystack.io/v1alpha1/namespaces/" + Tenant() + "/gpudevices/";
  slow.latencyMs = 1500;
  Fake().AddFault(slow);
  auto [code, out] = Create(
      VmWithGpus("vm1", {"held-a", "held-b"}, json::array({Template("scratch", "a100", 1)})));
  EXPECT_NE(code, 0) << out << Logs();
  EXPECT_LT(AttachWrites(), 3) << "attachments were still written after the deadline";
  Fake().ClearFaults();
  EXPECT_TRUE(WaitFor(
      [&] {
        return !Get("gpudevice held-a", Tenant())["status"].contains("attachment") &&
               !Get("gpudevice held-b", Tenant())["status"].contains("attachment") &&
               Get("gpudevice vm1-scratch", Tenant()).is_null();
      },
      10s))
      << Get("gpudevices", Tenant()).dump(2) << Logs();
}

TEST_F(AdmissionEndToEnd, H2_H3_WithTheControllerDownOnlyGpuObjectsAreRefused) {
  // No replica runs: the configurations fail closed, but select only what they must.
  for (const json& configuration : webhookConfigurations_) {
    for (const json& webhook : configuration["webhooks"]) {
      EXPECT_EQ(webhook.value("failurePolicy", ""), "Fail") << webhook.dump();  // H2
    }
  }
  ServeWebhooksAt(testing::FreePort());
  auto [code, out] = Create(Vmi("plain"));
  EXPECT_EQ(code, 0) << "an unlabelled VMI starts: " << out;
  std::tie(code, out) = Create(VmWithGpus("vm1", {"held"}));
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("failed calling webhook"), std::string::npos) << out;
  std::tie(code, out) = Create(Order("held", "a100", 1));
  EXPECT_NE(code, 0) << "every order goes through the webhook";
  json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata", {{"name", "plain"}, {"namespace", Tenant()}}},
              {"spec", {{"containers", {{{"name", "c"}, {"image", "busybox"}}}}}}};
  EXPECT_EQ(Create(pod).first, 0) << "an unlabelled pod starts";
  pod["metadata"]["name"] = "labelled-not-launcher";
  pod["metadata"]["labels"] = {{"gpu.cozystack.io/device-references", "true"}};
  EXPECT_EQ(Create(pod).first, 0) << "the pod webhook also needs the virt-launcher label";
  pod["metadata"]["name"] = "launcher";
  pod["metadata"]["labels"]["kubevirt.io"] = "virt-launcher";
  EXPECT_NE(Create(pod).first, 0);
}

// H9: a review forged by anyone who can reach the webhook port (any pod) without
// the API server's client certificate is refused in the TLS handshake: nothing is attached,
// created or listed. The same body with the API server's certificate is answered, so it is the
// certificate that decides; and a forged attachment of a VMI that never appears costs the tenant
// nothing lasting: after the attachment grace the device is detached and the template order goes.
TEST_F(AdmissionEndToEnd, AForgedReviewWithoutTheApiServersCertificateChangesNothing) {
  const int port = StartWebhookReplica("replica-a", {"--attachment-grace", "4s"});
  WaitReady("replica-a");
  WaitLeader("replica-a");
  ASSERT_EQ(Create(Order("held", "a100", 1)).first, 0);
  ASSERT_TRUE(WaitFor([&] { return Phase("held") == "Bound"; })) << Logs();
  const json forged = {
      {"apiVersion", "admission.k8s.io/v1"},
      {"kind", "AdmissionReview"},
      {"request",
       {{"uid", "0b5e3a43-forged"},
        {"kind", {{"group", "kubevirt.io"}, {"version", "v1"}, {"kind", "VirtualMachineInstance"}}},
        {"resource",
         {{"group", "kubevirt.io"}, {"version", "v1"}, {"resource", "virtualmachineinstances"}}},
        {"name", "vm-forged"},
        {"namespace", Tenant()},
        {"operation", "CREATE"},
        {"userInfo", {{"username", "system:serviceaccount:kubevirt:kubevirt-controller"}}},
        {"object",
         VmWithGpus("vm-forged", {"held"}, json::array({Template("scratch", "a100", 1)}))},
        {"dryRun", false}}}};
  std::ofstream(Path("forged.json")) << forged.dump();
  const auto made = testing::RunCommand(
      "cd " + ShellQuote(directory_.path().string()) +
      " && openssl req -x509 -newkey rsa:2048 -nodes -keyout mallory.key -out mallory.crt -days 1"
      " -subj /CN=kube-apiserver-webhook-client 2>/dev/null");
  ASSERT_EQ(made.exitCode, 0) << made.err;
  auto post = [&](const std::string& credentials) {
    return testing::RunCommand("cd " + ShellQuote(directory_.path().string()) +
                               " && curl -sS --max-time 10 --cacert ca.crt " + credentials +
                               " -o answer.json -w '%{http_code}' -H 'Content-Type: "
                               "application/json' --data-binary @forged.json https://127.0.0.1:" +
                               std::to_string(port) + "/mutate/virtualmachineinstances");
  };
  // No certificate, and a self-made one with the API server's name: refused in the handshake.
  const std::string refusals =
      "gpu_controller_webhook_connections_total{outcome=\"handshake_failed\"}";
  const double refusedBefore = Metric("replica-a", refusals);
  for (const std::string credentials : {"", "--cert mallory.crt --key mallory.key"}) {
    const auto refused = post(credentials);
    EXPECT_NE(refused.exitCode, 0) << credentials << ": " << refused.out;
    EXPECT_EQ(refused.out, "000") << credentials;
  }
  // The server has refused both: it is done with them.
  ASSERT_TRUE(WaitFor([&] { return Metric("replica-a", refusals) >= refusedBefore + 2; }))
      << Metrics("replica-a");
  EXPECT_FALSE(Get("gpudevice held", Tenant())["status"].contains("attachment"));
  EXPECT_TRUE(Get("gpudevice vm-forged-scratch", Tenant()).is_null());
  // The same body with the API server's webhook client certificate is answered.
  const std::string apiserver =
      Real() ? "--cert " + ShellQuote((cluster_ / "pki/webhook-client.crt").string()) + " --key " +
                   ShellQuote((cluster_ / "pki/webhook-client.key").string())
             : "--cert webhook-client.crt --key webhook-client.key";
  const auto answered = post(apiserver);
  EXPECT_EQ(answered.out, "200") << answered.err << Logs();
  std::ifstream in(Path("answer.json"));
  const json answer = json::parse(in, nullptr, false);
  ASSERT_TRUE(answer.is_object()) << answered.out;
  EXPECT_EQ(answer["response"]["uid"], "0b5e3a43-forged");
  if (answer["response"].value("allowed", false)) {
    // What the API server's own call would have caused, for a VMI that never appears: after
    // the attachment grace nothing of it is left.
    EXPECT_TRUE(WaitFor(
        [&] { return !Get("gpudevice held", Tenant())["status"].contains("attachment"); }, 20s))
        << Get("gpudevice held", Tenant()).dump(2) << Logs();
    EXPECT_TRUE(
        WaitFor([&] { return Get("gpudevice vm-forged-scratch", Tenant()).is_null(); }, 20s))
        << Get("gpudevices", Tenant()).dump(2);
    EXPECT_EQ(Phase("held"), "Bound") << "the tenant's order keeps its unit";
  }
}

// On SIGTERM a replica drains its webhooks before it stops (docs/controller.md, "How a replica
// starts and stops"): unready at once, so that the Service's endpoints drop it, yet it answers
// the reviews still sent to it for --shutdown-delay; then it refuses new connections, releases
// the Lease and exits 0. Before, it closed every connection at the SIGTERM, and a review in
// flight got EOF (an order refused for want of a webhook in the upgrade test).
TEST_F(AdmissionEndToEnd, AStoppingReplicaDrainsItsWebhooksBeforeItStops) {
  const int port = StartWebhookReplica("replica-a", {"--shutdown-delay", "3s"});
  WaitReady("replica-a");
  WaitLeader("replica-a");
  ASSERT_EQ(Create(Order("before", "a100", 1), "--dry-run=server").first, 0) << Logs();
  const auto signalled = std::chrono::steady_clock::now();
  const auto since = [&signalled] { return std::chrono::steady_clock::now() - signalled; };
  int status = -1;
  std::thread stopper([&] { status = StopReplica("replica-a"); });
  EXPECT_TRUE(WaitFor([&] { return !Ready("replica-a"); }, 1s)) << "still ready after SIGTERM";
  const auto [code, out] = Create(Order("draining", "a100", 1), "--dry-run=server");
  EXPECT_EQ(code, 0) << "a review sent while the replica drains was not answered: " << out;
  EXPECT_LT(since(), 3s) << "the order was answered only after the drain";
  // Then a connect is refused (curl's 7; a connection without the API server's certificate
  // fails its handshake while the webhooks still serve), so the Service's next try goes to
  // another replica, and the API server's own call fails closed.
  const auto refused = [port] {
    return testing::RunCommand("curl -sk --max-time 2 -o /dev/null https://127.0.0.1:" +
                               std::to_string(port) + "/validate/gpudevices -d {}")
               .exitCode == 7;
  };
  EXPECT_TRUE(WaitFor(refused, 10s, 50ms));
  EXPECT_GE(since(), 3s) << "new connections were refused before --shutdown-delay ran out";
  stopper.join();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << Log("replica-a");
  const std::string log = Log("replica-a");
  const size_t draining = log.find("the webhooks' connections closing after each answer");
  const size_t closing = log.find("no new webhook connections; answering the reviews begun");
  const size_t releasing = log.find("then releasing the Lease");
  ASSERT_NE(draining, std::string::npos) << log;
  ASSERT_NE(closing, std::string::npos) << log;
  ASSERT_NE(releasing, std::string::npos) << log;
  EXPECT_LT(draining, closing);
  EXPECT_LT(closing, releasing) << "the leadership ended before the webhooks were done";
  EXPECT_NE(Create(Order("after", "a100", 1), "--dry-run=server").first, 0)
      << "a review was answered with no replica serving";
}

// H9: secure by default. With GPUs on and no --webhook-client-ca the controller refuses to start,
// naming the flag and its opt-out, so a default install never serves its writing webhooks to
// any caller on the network. With the opt-out it starts and says so where a hoster looks: a
// warning at start, gpu_controller_webhook_callers_authenticated 0, and the settings ConfigMap
// (which `kubectl gpu` warns of). A replica given the CA says 1.
TEST_F(AdmissionEndToEnd, H9_WithoutAClientCaTheControllerRefusesToStartUnlessToldTo) {
  const auto refused = testing::RunCommand(
      std::string(GPU_CONTROLLER) + " run --kubeconfig " + ShellQuote(Path("kubeconfig").string()) +
      " --enable-gpu --health-addr off --webhook-addr 127.0.0.1:0 --webhook-cert-dir " +
      ShellQuote(WebhookCertificates()));
  EXPECT_EQ(refused.exitCode, 2) << refused.err;
  EXPECT_NE(refused.err.find("--webhook-client-ca"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("--webhook-allow-unauthenticated-callers"), std::string::npos)
      << refused.err;

  StartWebhookReplica("replica-a", {"--webhook-allow-unauthenticated-callers"});
  WaitReady("replica-a");
  WaitLeader("replica-a");
  EXPECT_NE(Log("replica-a").find("admission webhooks accept any TLS client"), std::string::npos)
      << Log("replica-a");
  EXPECT_EQ(Metric("replica-a", "gpu_controller_webhook_callers_authenticated"), 0)
      << Metrics("replica-a");
  EXPECT_TRUE(WaitFor([&] {
    const json settings = Get("configmap cozy-gpu-settings", "cozy-system");
    return settings.is_object() &&
           settings["data"].value("webhookCallers", "") == "unauthenticated";
  })) << Get("configmap cozy-gpu-settings", "cozy-system").dump(2);
  StartWebhookReplica("replica-b", {}, false);
  WaitReady("replica-b");
  EXPECT_EQ(Metric("replica-b", "gpu_controller_webhook_callers_authenticated"), 1)
      << Metrics("replica-b");
}

TEST_F(AdmissionEndToEnd, G2_WithoutGpusThereIsNoWebhookServerAndNoCertificateIsNeeded) {
  const int webhookPort = testing::FreePort();
  StartReplica("replica-a", {"--webhook-addr", "127.0.0.1:" + std::to_string(webhookPort),
                             "--webhook-cert-dir", Path("nowhere").string()});
  WaitReady("replica-a");
  EXPECT_NE(testing::RunCommand("curl -sk https://127.0.0.1:" + std::to_string(webhookPort) +
                                "/validate/gpudevices -d {}")
                .exitCode,
            0)
      << "nothing listens on the webhook port";
  // With GPUs on, a missing certificate stops the start with a message naming the file.
  const auto result = testing::RunCommand(
      std::string(GPU_CONTROLLER) + " run --kubeconfig " + ShellQuote(Path("kubeconfig").string()) +
      " --enable-gpu --health-addr off --webhook-addr 127.0.0.1:0 --webhook-cert-dir " +
      ShellQuote(Path("nowhere").string()) + " --webhook-client-ca " +
      ShellQuote(webhookClientCa_.string()));
  EXPECT_EQ(result.exitCode, 1);
  EXPECT_NE(result.err.find("nowhere/tls.crt"), std::string::npos) << result.err;
}

TEST_F(AdmissionEndToEnd, G3_G4_ANonLeaderAnswersWarmAndReadinessNeverWaitsForKubeVirt) {
  // KubeVirt is not installed: its CRDs are gone before any replica starts.
  Fake().DeleteCrd("virtualmachineinstances.kubevirt.io");
  Fake().DeleteCrd("kubevirts.kubevirt.io");
  StartWebhookReplica("replica-a", {}, false);
  WaitLeader("replica-a");
  StartWebhookReplica("replica-b");  // the Service's endpoint: a replica that does not lead
  WaitReady("replica-b");            // G4: ready without KubeVirt
  EXPECT_EQ(Holder(), "replica-a");
  // G3: its first admission is answered from warm caches: the order is checked against the
  // class and the nodes it has already read.
  auto [code, out] = Create(Order("three", "a100", 3));
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("a100"), std::string::npos) << out;
  EXPECT_EQ(Create(Order("two", "a100", 2)).first, 0);
  EXPECT_NE(Metrics("replica-b").find("gpu_controller_admission_total"), std::string::npos);
}

// G12: the webhooks' KubeVirt and VMI informers start once their kinds are served, with no
// restart. KubeVirt is installed after the replica is ready; vm1 then starts on a held device,
// and a second VM asking for it is refused for vm1 running: the check that says so reads the
// webhook's own VMI cache, and the attachment's VMI UID it matches is stamped from the same
// cache. A replica that read VMIs only if they were served at its start never says either.
TEST_F(AdmissionEndToEnd, G12_KubeVirtInstalledAfterStartIsReadWithoutARestart) {
  Fake().DeleteCrd("virtualmachineinstances.kubevirt.io");
  Fake().DeleteCrd("kubevirts.kubevirt.io");
  StartWebhookReplica("replica-a");
  WaitReady("replica-a");
  WaitLeader("replica-a");
  ASSERT_EQ(Create(Order("held", "a100", 1)).first, 0);
  for (const char* file :
       {"kubevirt.io_virtualmachineinstances.yaml", "kubevirt.io_kubevirts.yaml"}) {
    Kubectl("apply -f " + ShellQuote(testing::TestCrdFile(file).string()));
  }
  ASSERT_TRUE(WaitFor(
      [&] {
        const std::string log = Log("replica-a");
        return log.find("VirtualMachineInstance cache state=started") != std::string::npos &&
               log.find("KubeVirt cache state=started") != std::string::npos;
      },
      15s))
      << Log("replica-a");
  auto [code, out] = Create(VmWithGpus("vm1", {"held"}));
  ASSERT_EQ(code, 0) << out << Logs();
  const std::string uid = VmiUid("vm1");
  ASSERT_FALSE(uid.empty());
  ASSERT_TRUE(WaitFor(
      [&] {
        const json held = Get("gpudevice held", Tenant());
        return held["status"]["attachment"].value("vmiUID", "") == uid;
      },
      15s))
      << Get("gpudevice held", Tenant()).dump() << Logs();
  std::tie(code, out) = Create(VmWithGpus("vm2", {"held"}));
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("GPUDevice held is in use by the running VirtualMachineInstance vm1"),
            std::string::npos)
      << out;
}

}  // namespace
}  // namespace cozy::e2e
