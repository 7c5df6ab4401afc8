// charts/gpu rendered with its default values and with custom-values.yaml by the real `helm
// template` (chart_render.h), and the manifests checked as the API server and kubelet would
// take them: they parse, name what exists, mount the host read-only, ask for the least RBAC.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "api/keys.h"
#include "controller/watched.h"
#include "test/chart/chart_render.h"
#include "test/support/fixture_host.h"

namespace cozy::chart {
namespace {

const std::filesystem::path kChart = std::filesystem::path(COZY_SOURCE_DIR) / "charts/gpu";

std::vector<YAML::Node> Render(const YAML::Node& overrides = YAML::Node(),
                               const Release& release = {}) {
  std::vector<YAML::Node> documents;
  for (const auto& document : RenderChart(kChart, overrides, release)) {
    try {
      documents.push_back(YAML::Load(document.text));
    } catch (const YAML::Exception& error) {
      ADD_FAILURE() << document.source << " does not parse: " << error.what() << "\n"
                    << document.text;
    }
  }
  return documents;
}

YAML::Node Custom() {
  return YAML::LoadFile(std::string(COZY_SOURCE_DIR) + "/test/chart/custom-values.yaml");
}

// GPU on with cert-manager issuing the webhook's certificate, and GPU settings of a hoster.
// The CA of kube-apiserver's webhook client certificate, as a hoster gives it (PEM text; the
// chart checks only that it is PEM). Every GPU-on render here authenticates the webhooks'
// callers, as an install must unless it opts out.
const std::string kClientCaPem =
    "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUQ0EK\n-----END CERTIFICATE-----\n";

YAML::Node GpuOn() {
  YAML::Node values = YAML::Load(
      "gpu: {enabled: true, resourceNames: [nvidia.com/GA100, nvidia.com/TU104GL_Tesla_T4],"
      " rawGpuNames: forbid, attachmentGrace: 90s, notReadyGrace: 2m,"
      " webhook: {networkPolicy: {podCIDRs: [10.244.0.0/16]}}}");
  values["gpu"]["webhook"]["clientCA"] = kClientCaPem;
  return values;
}

// GPU on with the hoster's own CA bundle and serving certificate Secret instead of cert-manager.
YAML::Node HosterCertificate() {
  YAML::Node values = YAML::Load(
      "gpu: {enabled: true, webhook: {certManager: false, caBundle: Q0EgYnVuZGxlCg==,"
      " existingSecret: hoster-webhook-tls, networkPolicy: {podCIDRs: [10.244.0.0/16]}}}");
  values["gpu"]["webhook"]["clientCA"] = kClientCaPem;
  return values;
}

std::vector<YAML::Node> OfKind(const std::vector<YAML::Node>& documents, const std::string& kind) {
  std::vector<YAML::Node> found;
  for (const auto& document : documents) {
    if (document["kind"].as<std::string>("") == kind) found.push_back(document);
  }
  return found;
}

YAML::Node Only(const std::vector<YAML::Node>& documents, const std::string& kind) {
  const auto found = OfKind(documents, kind);
  EXPECT_EQ(found.size(), 1u) << kind;
  return found.empty() ? YAML::Node() : found[0];
}

// The one object of `kind` named `name`.
YAML::Node Named(const std::vector<YAML::Node>& documents, const std::string& kind,
                 const std::string& name) {
  std::vector<YAML::Node> found;
  for (const auto& document : OfKind(documents, kind)) {
    if (document["metadata"]["name"].as<std::string>("") == name) found.push_back(document);
  }
  EXPECT_EQ(found.size(), 1u) << kind << " " << name;
  return found.empty() ? YAML::Node() : found[0];
}

YAML::Node PodSpec(const std::vector<YAML::Node>& documents) {
  return Only(documents, "DaemonSet")["spec"]["template"]["spec"];
}

YAML::Node Agent(const std::vector<YAML::Node>& documents) {
  const YAML::Node containers = PodSpec(documents)["containers"];
  EXPECT_EQ(containers.size(), 1u);
  return containers[0];
}

std::vector<std::string> Strings(const YAML::Node& list) {
  std::vector<std::string> out;
  for (const auto& item : list) out.push_back(item.as<std::string>());
  return out;
}

TEST(Chart, EveryDocumentParsesWithAKnownKindAndApiVersion) {
  const std::map<std::string, std::string> apiVersions = {
      {"DaemonSet", "apps/v1"},
      {"ServiceAccount", "v1"},
      {"ClusterRole", "rbac.authorization.k8s.io/v1"},
      {"ClusterRoleBinding", "rbac.authorization.k8s.io/v1"},
      {"ValidatingAdmissionPolicy", "admissionregistration.k8s.io/v1"},
      {"ValidatingAdmissionPolicyBinding", "admissionregistration.k8s.io/v1"},
      {"CustomResourceDefinition", "apiextensions.k8s.io/v1"},
      {"Deployment", "apps/v1"},
      {"PodDisruptionBudget", "policy/v1"},
      {"Role", "rbac.authorization.k8s.io/v1"},
      {"RoleBinding", "rbac.authorization.k8s.io/v1"},
      {"Service", "v1"},
      {"NetworkPolicy", "networking.k8s.io/v1"},
      {"ConfigMap", "v1"},
      {"Issuer", "cert-manager.io/v1"},
      {"Certificate", "cert-manager.io/v1"},
      {"ValidatingWebhookConfiguration", "admissionregistration.k8s.io/v1"},
      {"MutatingWebhookConfiguration", "admissionregistration.k8s.io/v1"},
  };
  for (const auto& overrides : {YAML::Node(), Custom(), GpuOn(), HosterCertificate()}) {
    const auto documents = Render(overrides);
    ASSERT_GE(documents.size(), 4u);
    for (const auto& document : documents) {
      ASSERT_TRUE(document.IsMap());
      const std::string kind = document["kind"].as<std::string>("");
      ASSERT_TRUE(apiVersions.contains(kind)) << "unexpected kind '" << kind << "'";
      EXPECT_EQ(document["apiVersion"].as<std::string>(""), apiVersions.at(kind)) << kind;
      EXPECT_FALSE(document["metadata"]["name"].as<std::string>("").empty()) << kind;
    }
    for (const char* kind : {"DaemonSet", "Deployment", "PodDisruptionBudget", "Role"}) {
      EXPECT_EQ(OfKind(documents, kind).size(), 1u) << kind;
    }
    EXPECT_EQ(OfKind(documents, "ServiceAccount").size(), 2u);  // the agent's, the controller's
    // Two names of one kind would be one object to the API server.
    std::set<std::string> keys;
    for (const auto& document : documents) {
      const std::string key = document["kind"].as<std::string>("") + " " +
                              document["metadata"]["namespace"].as<std::string>("") + "/" +
                              document["metadata"]["name"].as<std::string>("");
      EXPECT_TRUE(keys.insert(key).second) << key << " twice";
    }
  }
}

TEST(Chart, NamespacedObjectsGoToTheReleaseNamespace) {
  const std::set<std::string> clusterScoped = {
      "ClusterRole",
      "ClusterRoleBinding",
      "CustomResourceDefinition",
      "ValidatingAdmissionPolicy",
      "ValidatingAdmissionPolicyBinding",
      "ValidatingWebhookConfiguration",
      "MutatingWebhookConfiguration",
  };
  Release release;
  release.ns = "gpu-system";
  for (const auto& overrides : {YAML::Node(), GpuOn()}) {
    for (const auto& document : Render(overrides, release)) {
      const std::string kind = document["kind"].as<std::string>("");
      if (clusterScoped.contains(kind)) {
        EXPECT_FALSE(document["metadata"]["namespace"].IsDefined()) << kind;
      } else {
        EXPECT_EQ(document["metadata"]["namespace"].as<std::string>(""), "gpu-system") << kind;
      }
    }
  }
}

TEST(Chart, DaemonSetRunsAsTheBoundServiceAccount) {
  const auto documents = Render();
  const YAML::Node account = Named(documents, "ServiceAccount", "gpu-agent");
  const std::string name = account["metadata"]["name"].as<std::string>();
  const YAML::Node daemonSet = Only(documents, "DaemonSet");
  EXPECT_EQ(PodSpec(documents)["serviceAccountName"].as<std::string>(""), name);
  const YAML::Node binding = Named(documents, "ClusterRoleBinding", "gpu-agent");
  EXPECT_EQ(binding["roleRef"]["kind"].as<std::string>(""), "ClusterRole");
  EXPECT_EQ(binding["roleRef"]["name"].as<std::string>(""),
            Named(documents, "ClusterRole", "gpu-agent")["metadata"]["name"].as<std::string>());
  // The DaemonSet's account, and the group of bare-metal agents the node-bound policy binds
  // (test/kube/cel checks the policy names the same group); nobody else.
  ASSERT_EQ(binding["subjects"].size(), 2u);
  EXPECT_EQ(binding["subjects"][0]["kind"].as<std::string>(""), "ServiceAccount");
  EXPECT_EQ(binding["subjects"][0]["name"].as<std::string>(""), name);
  EXPECT_EQ(binding["subjects"][0]["namespace"].as<std::string>(""),
            daemonSet["metadata"]["namespace"].as<std::string>());
  EXPECT_EQ(binding["subjects"][1]["kind"].as<std::string>(""), "Group");
  EXPECT_EQ(binding["subjects"][1]["apiGroup"].as<std::string>(""), "rbac.authorization.k8s.io");
  EXPECT_EQ(binding["subjects"][1]["name"].as<std::string>(""), "gpu.cozystack.io:agents");
  // The pod template carries the selector's labels (the API server refuses it otherwise).
  for (const auto& label : daemonSet["spec"]["selector"]["matchLabels"]) {
    EXPECT_EQ(
        daemonSet["spec"]["template"]["metadata"]["labels"][label.first.Scalar()].as<std::string>(
            ""),
        label.second.Scalar());
  }
}

// F1: installed into any namespace, the policy still names the agent's own account; naming
// another would leave the agent free to write every node's GPUNode.
TEST(Chart, NodeBoundPolicyNamesTheAgentsServiceAccount) {
  Release release;
  release.ns = "gpu-system";
  const auto documents = Render(YAML::Node(), release);
  const YAML::Node account = Named(documents, "ServiceAccount", "gpu-agent");
  EXPECT_EQ(account["metadata"]["namespace"].as<std::string>(""), "gpu-system");
  const std::string user =
      "system:serviceaccount:gpu-system:" + account["metadata"]["name"].as<std::string>();
  std::set<std::string> policies;
  for (const auto& policy : OfKind(documents, "ValidatingAdmissionPolicy")) {
    policies.insert(policy["metadata"]["name"].as<std::string>());
    // The other policies (docs/policies.md) are about other callers; test/kube/cel runs them.
    if (policy["metadata"]["name"].as<std::string>() != "gpu-agent-own-gpunode") continue;
    bool named = false;
    for (const auto& condition : policy["spec"]["matchConditions"]) {
      named = named || condition["expression"].as<std::string>("").find("'" + user + "'") !=
                           std::string::npos;
    }
    EXPECT_TRUE(named) << "the policy does not match " << user;
  }
  for (const auto& binding : OfKind(documents, "ValidatingAdmissionPolicyBinding")) {
    EXPECT_TRUE(policies.contains(binding["spec"]["policyName"].as<std::string>("")));
  }
}

// The env var `name` of the agent's container, from the downward API field `fieldPath`.
void ExpectFieldEnv(const YAML::Node& agent, const std::string& name,
                    const std::string& fieldPath) {
  bool found = false;
  for (const auto& entry : agent["env"]) {
    if (entry["name"].as<std::string>("") != name) continue;
    EXPECT_FALSE(found) << name << " twice";
    found = true;
    EXPECT_EQ(entry["valueFrom"]["fieldRef"]["fieldPath"].as<std::string>(""), fieldPath) << name;
  }
  EXPECT_TRUE(found) << "no env " << name;
}

// --health-addr listens on the node's own address (the downward API's status.hostIP), on the
// container's health port. The probes name that port and no host: kubelet then probes the pod
// IP, which with hostNetwork is the node's IP, the address the agent listens on.
void ExpectProbesOnTheHealthPort(const std::vector<YAML::Node>& documents, int port) {
  EXPECT_TRUE(PodSpec(documents)["hostNetwork"].as<bool>(false));
  const YAML::Node agent = Agent(documents);
  ExpectFieldEnv(agent, "HOST_IP", "status.hostIP");
  std::map<std::string, int> ports;
  for (const auto& entry : agent["ports"]) {
    ports[entry["name"].as<std::string>("")] = entry["containerPort"].as<int>();
  }
  ASSERT_TRUE(ports.contains("health"));
  EXPECT_EQ(ports["health"], port);
  const auto args = Strings(agent["args"]);
  EXPECT_EQ(args.at(0), "run");
  EXPECT_NE(std::find(args.begin(), args.end(), "--health-addr=$(HOST_IP):" + std::to_string(port)),
            args.end());
  for (const auto& arg : args) {
    EXPECT_FALSE(arg.starts_with("--health-addr=:")) << "listening on every address: " << arg;
  }
  const std::map<std::string, std::string> paths = {{"livenessProbe", "/healthz"},
                                                    {"readinessProbe", "/readyz"}};
  for (const auto& [probe, path] : paths) {
    const YAML::Node get = agent[probe]["httpGet"];
    ASSERT_TRUE(get.IsMap()) << probe;
    EXPECT_EQ(get["path"].as<std::string>(""), path);
    const std::string target = get["port"].as<std::string>("");
    const bool named = ports.contains(target);
    EXPECT_TRUE(named || target == std::to_string(port)) << probe << " port " << target;
    EXPECT_FALSE(get["host"].IsDefined()) << probe << ": the pod IP is the node's, keep it";
  }
}

TEST(Chart, ProbesAskTheHealthPortForHealthzAndReadyz) {
  ExpectProbesOnTheHealthPort(Render(), 9810);
  ExpectProbesOnTheHealthPort(Render(Custom()), 19810);
}

// Every mount names a volume; every host path is mounted read-only.
std::map<std::string, std::string> ExpectReadOnlyHostMounts(
    const std::vector<YAML::Node>& documents) {
  std::map<std::string, std::string> hostPaths;  // volume -> host path
  std::set<std::string> volumes;
  for (const auto& volume : PodSpec(documents)["volumes"]) {
    const std::string name = volume["name"].as<std::string>();
    EXPECT_TRUE(volumes.insert(name).second) << "volume " << name << " twice";
    if (volume["hostPath"]) hostPaths[name] = volume["hostPath"]["path"].as<std::string>();
  }
  std::map<std::string, std::string> mounted;  // host path -> mount path
  for (const auto& mount : Agent(documents)["volumeMounts"]) {
    const std::string name = mount["name"].as<std::string>();
    EXPECT_TRUE(volumes.contains(name)) << "mount of a missing volume " << name;
    if (hostPaths.contains(name)) {
      EXPECT_TRUE(mount["readOnly"].as<bool>(false)) << name << " is not read-only";
      mounted[hostPaths[name]] = mount["mountPath"].as<std::string>();
    }
  }
  EXPECT_EQ(mounted.size(), hostPaths.size()) << "a host path volume nobody mounts";
  return mounted;
}

TEST(Chart, HostIsMountedReadOnlyWhereTheAgentLooks) {
  const auto mounted = ExpectReadOnlyHostMounts(Render());
  const std::map<std::string, std::string> expected = {
      {"/sys/bus", "/host/sys/bus"},
      {"/sys/devices", "/host/sys/devices"},
      {"/proc/driver", "/host/proc/driver"},
      {"/var/lib/kubelet/pod-resources", "/var/lib/kubelet/pod-resources"},
      {"/run/udev", "/run/udev"},
  };
  EXPECT_EQ(mounted, expected);
  const auto args = Strings(Agent(Render())["args"]);
  for (const char* arg : {"--sysfs-root=/host", "--node-name=$(NODE_NAME)",
                          "--pod-resources=unix:///var/lib/kubelet/pod-resources/kubelet.sock"}) {
    EXPECT_NE(std::find(args.begin(), args.end(), arg), args.end()) << arg;
  }
  const auto without = ExpectReadOnlyHostMounts(Render(Custom()));
  EXPECT_FALSE(without.contains("/proc/driver"));
  EXPECT_EQ(without.size(), 4u);
}

// With agent.resourceSlices the agent is the DRA driver's kubelet plugin too (docs/dra.md): the
// only writable host mounts are its two socket directories and the CDI directory, each at the
// host's own path (kubelet dials the socket path the plugin names), and the flags name them.
TEST(Chart, TheDraPluginWritesOnlyItsSocketsAndTheCdiDirectoryAtTheHostsPaths) {
  YAML::Node values;
  values["agent"]["resourceSlices"] = true;
  values["agent"]["kubeletDir"] = "/data/kubelet";
  const auto documents = Render(values);
  std::map<std::string, std::string> hostPaths;
  for (const auto& volume : PodSpec(documents)["volumes"]) {
    if (volume["hostPath"]) {
      hostPaths[volume["name"].as<std::string>()] = volume["hostPath"]["path"].as<std::string>();
    }
  }
  std::map<std::string, std::string> writable;  // host path -> mount path
  for (const auto& mount : Agent(documents)["volumeMounts"]) {
    if (!mount["readOnly"].as<bool>(false)) {
      writable[hostPaths[mount["name"].as<std::string>()]] = mount["mountPath"].as<std::string>();
    }
  }
  const std::map<std::string, std::string> expected = {
      {"/data/kubelet/plugins_registry", "/data/kubelet/plugins_registry"},
      {"/data/kubelet/plugins/gpu.cozystack.io", "/data/kubelet/plugins/gpu.cozystack.io"},
      {"/var/run/cdi", "/var/run/cdi"},
  };
  EXPECT_EQ(writable, expected);
  const auto args = Strings(Agent(documents)["args"]);
  for (const char* arg :
       {"--resource-slices=on", "--kubelet-dir=/data/kubelet", "--cdi-dir=/var/run/cdi"}) {
    EXPECT_EQ(std::count(args.begin(), args.end(), arg), 1) << arg;
  }
}

// What the chart mounts under the agent's sysfs root (/host) holds everything the agent reads
// there: on every fixture host, `gpu-agent scan` of a root holding only those host paths, where
// the chart mounts them, says exactly what a scan of the whole tree says. A subtree missing from
// the chart (say the scanner starts reading sys/kernel) fails here.
TEST(Chart, HostMountsHoldEverythingTheScanReads) {
  std::map<std::string, std::string> underRoot;  // host path -> path in the sysfs root
  for (const auto& [host, mount] : ExpectReadOnlyHostMounts(Render())) {
    if (mount.starts_with("/host/")) underRoot[host.substr(1)] = mount.substr(6);
  }
  ASSERT_TRUE(underRoot.contains("sys/bus")) << "the chart mounts no sysfs where the scan looks";
  const auto scan = [](const std::filesystem::path& root) {
    return testing::RunCommand(testing::ShellQuote(testing::GpuAgentBinary().string()) +
                               " scan -o json --sysfs-root " + testing::ShellQuote(root.string()) +
                               " --pci-ids " +
                               testing::ShellQuote(testing::FixturePciIds().string()) +
                               " --pod-resources unix:///nonexistent/kubelet.sock");
  };
  size_t hosts = 0;
  for (const auto& spec :
       std::filesystem::directory_iterator(testing::SourceDir() / "fixtures/sysfs/specs")) {
    const std::string name = spec.path().stem().string();
    // The same layout as the others, 586 functions of it: building it costs seconds.
    if (name == "large-synthetic") continue;
    const testing::FixtureHost host(name);
    const testing::TempDir mounted;
    for (const auto& [from, to] : underRoot) {
      if (!std::filesystem::exists(host.root() / from)) continue;  // as on a host without it
      std::filesystem::create_directories((mounted.path() / to).parent_path());
      std::filesystem::copy(
          host.root() / from, mounted.path() / to,
          std::filesystem::copy_options::recursive | std::filesystem::copy_options::copy_symlinks);
    }
    const auto whole = scan(host.root());
    const auto part = scan(mounted.path());
    EXPECT_EQ(part.exitCode, whole.exitCode) << name;
    EXPECT_EQ(part.out, whole.out) << name;
    EXPECT_EQ(part.err, whole.err) << name;
    if (whole.exitCode == 0) {
      EXPECT_NE(whole.out.find("\"devices\""), std::string::npos) << name << ": " << whole.out;
    }
    ++hosts;
  }
  EXPECT_GE(hosts, 10u);
}

TEST(Chart, PodIsHostNetworkedNodeCriticalAndLockedDown) {
  const auto documents = Render();
  const YAML::Node pod = PodSpec(documents);
  EXPECT_TRUE(pod["hostNetwork"].as<bool>(false));
  EXPECT_EQ(pod["dnsPolicy"].as<std::string>(""), "ClusterFirstWithHostNet");
  EXPECT_EQ(pod["priorityClassName"].as<std::string>(""), "system-node-critical");
  const YAML::Node agent = Agent(documents);
  EXPECT_EQ(agent["env"].size(), 2u);
  ExpectFieldEnv(agent, "NODE_NAME", "spec.nodeName");
  ExpectFieldEnv(agent, "HOST_IP", "status.hostIP");
  const YAML::Node security = agent["securityContext"];
  EXPECT_TRUE(security["readOnlyRootFilesystem"].as<bool>(false));
  EXPECT_FALSE(security["allowPrivilegeEscalation"].as<bool>(true));
  EXPECT_EQ(Strings(security["capabilities"]["drop"]), std::vector<std::string>{"ALL"});
  EXPECT_FALSE(security["capabilities"]["add"].IsDefined());
  EXPECT_FALSE(security["privileged"].as<bool>(false));
  EXPECT_EQ(pod["securityContext"]["seccompProfile"]["type"].as<std::string>(""), "RuntimeDefault");
  const YAML::Node resources = agent["resources"];
  EXPECT_EQ(resources["requests"]["cpu"].as<std::string>(""), "10m");
  EXPECT_EQ(resources["requests"]["memory"].as<std::string>(""), "32Mi");
  EXPECT_EQ(resources["limits"]["cpu"].as<std::string>(""), "100m");
  EXPECT_EQ(resources["limits"]["memory"].as<std::string>(""), "64Mi");
}

TEST(Chart, ImageIsTheChartsAppVersionWhichIsTheProjects) {
  const YAML::Node chart = YAML::LoadFile((kChart / "Chart.yaml").string());
  EXPECT_EQ(chart["apiVersion"].as<std::string>(""), "v2");
  EXPECT_EQ(chart["version"].as<std::string>(""), COZY_VERSION);
  EXPECT_EQ(chart["appVersion"].as<std::string>(""), COZY_VERSION);
  EXPECT_EQ(Agent(Render())["image"].as<std::string>(""),
            "ghcr.io/cozystack/cozy-gpu/gpu-agent:" COZY_VERSION);
  EXPECT_EQ(Agent(Render(Custom()))["image"].as<std::string>(""),
            "ghcr.io/cozystack/cozy-gpu/gpu-agent:0.1.0-test");
}

TEST(Chart, ImageMayBePinnedByDigest) {
  const std::string digest =
      "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
  YAML::Node overrides = Custom();
  overrides["agent"]["image"]["digest"] = digest;
  EXPECT_EQ(Agent(Render(overrides))["image"].as<std::string>(""),
            "ghcr.io/cozystack/cozy-gpu/gpu-agent@" + digest);
}

TEST(Chart, NodeSelectorTolerationsAndArgsComeFromValues) {
  const auto defaults = Render();
  const YAML::Node selector = PodSpec(defaults)["nodeSelector"];
  ASSERT_EQ(selector.size(), 1u);
  EXPECT_EQ(selector["gpu.cozystack.io/gpu-node"].Scalar(), "true");
  EXPECT_EQ(selector["gpu.cozystack.io/gpu-node"].Tag(), "!") << "must stay a string";
  EXPECT_EQ(PodSpec(defaults)["tolerations"].size(), 1u);
  EXPECT_FALSE(PodSpec(defaults)["template"]["metadata"]["annotations"].IsDefined());

  const auto custom = Render(Custom());
  const YAML::Node customSelector = PodSpec(custom)["nodeSelector"];
  ASSERT_EQ(customSelector.size(), 1u) << "null removes the default key";
  EXPECT_EQ(customSelector["nvidia.com/gpu.present"].Scalar(), "true");
  EXPECT_EQ(customSelector["nvidia.com/gpu.present"].Tag(), "!");
  EXPECT_FALSE(PodSpec(custom)["tolerations"].IsDefined());
  const auto args = Strings(Agent(custom)["args"]);
  ASSERT_GE(args.size(), 2u);
  EXPECT_EQ(std::vector<std::string>(args.end() - 2, args.end()),
            (std::vector<std::string>{"--log-format", "json"}));
  EXPECT_EQ(Only(custom,
                 "DaemonSet")["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"]
                .as<std::string>(""),
            "true");
}

// The least the agent needs, and nothing else: no wildcard, no other resource or verb.
TEST(Chart, RbacIsExactlyTheLeastTheAgentNeeds) {
  using Rule = std::tuple<std::string, std::string, std::set<std::string>>;
  const std::set<Rule> base = {
      {"gpu.cozystack.io", "gpunodes", {"get", "create"}},
      {"gpu.cozystack.io", "gpunodes/status", {"patch"}},
      {"", "nodes", {"get"}},
      {"", "pods", {"list", "watch"}},
  };
  // agent.resourceSlices adds its node's ResourceSlice (docs/dra.md): no delete.
  YAML::Node slices;
  slices["agent"]["resourceSlices"] = true;
  std::set<Rule> withSlices = base;
  withSlices.insert(
      {"resource.k8s.io", "resourceslices", {"get", "list", "watch", "create", "update"}});
  withSlices.insert({"resource.k8s.io", "resourceclaims", {"get"}});
  // and the GPUDevice owning a claim it prepares (A13)
  withSlices.insert({"gpu.cozystack.io", "gpudevices", {"get"}});
  for (const auto& [overrides, expected] : std::vector<std::pair<YAML::Node, std::set<Rule>>>{
           {YAML::Node(), base}, {Custom(), base}, {slices, withSlices}}) {
    const auto documents = Render(overrides);
    const bool on = expected.size() > base.size();
    const auto args = Strings(Agent(documents)["args"]);
    EXPECT_EQ(std::count(args.begin(), args.end(), "--resource-slices=on"), on ? 1 : 0);
    size_t slicePolicies = 0;
    for (const auto& policy : OfKind(documents, "ValidatingAdmissionPolicy")) {
      slicePolicies +=
          policy["metadata"]["name"].as<std::string>("") == "gpu-agent-own-resourceslices";
    }
    EXPECT_EQ(slicePolicies, on ? 1U : 0U) << "the node-bound slice policy (F19)";
    std::set<Rule> rules;
    for (const auto& rule : Named(documents, "ClusterRole", "gpu-agent")["rules"]) {
      for (const char* key : {"resourceNames", "nonResourceURLs"}) {
        EXPECT_FALSE(rule[key].IsDefined()) << key;
      }
      const auto verbs = Strings(rule["verbs"]);
      for (const auto& group : Strings(rule["apiGroups"])) {
        for (const auto& resource : Strings(rule["resources"])) {
          EXPECT_NE(group, "*");
          EXPECT_NE(resource, "*");
          const auto [at, fresh] =
              rules.insert({group, resource, std::set<std::string>(verbs.begin(), verbs.end())});
          EXPECT_TRUE(fresh) << group << "/" << resource << " in two rules";
        }
      }
    }
    EXPECT_EQ(rules, expected);
    // The agent is bound to its ClusterRole and nothing else.
    for (const char* kind : {"ClusterRoleBinding", "RoleBinding"}) {
      for (const auto& binding : OfKind(documents, kind)) {
        for (const auto& subject : binding["subjects"]) {
          if (subject["name"].as<std::string>("") != "gpu-agent") continue;
          EXPECT_EQ(binding["roleRef"]["name"].as<std::string>(""), "gpu-agent") << kind;
        }
      }
    }
  }
}

TEST(Chart, CrdsParseAndTheGpuNodeHasTheStatusTheAgentPatches) {
  size_t count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kChart / "templates/crds")) {
    const YAML::Node crd = YAML::LoadFile(entry.path().string());
    ++count;
    EXPECT_EQ(crd["apiVersion"].as<std::string>(""), "apiextensions.k8s.io/v1");
    EXPECT_EQ(crd["kind"].as<std::string>(""), "CustomResourceDefinition");
    EXPECT_EQ(crd["spec"]["group"].as<std::string>(""), "gpu.cozystack.io");
    if (crd["spec"]["names"]["plural"].as<std::string>("") == "gpunodes") {
      EXPECT_EQ(crd["spec"]["scope"].as<std::string>(""), "Cluster");
      EXPECT_TRUE(crd["spec"]["versions"][0]["subresources"]["status"].IsDefined());
    }
  }
  EXPECT_GE(count, 2u);
}

// ---- gpu-controller ----

const char* const kWebhookKinds[] = {"ValidatingWebhookConfiguration",
                                     "MutatingWebhookConfiguration"};

YAML::Node Controller(const std::vector<YAML::Node>& documents) {
  const YAML::Node containers =
      Named(documents, "Deployment", "gpu-controller")["spec"]["template"]["spec"]["containers"];
  EXPECT_EQ(containers.size(), 1u);
  return containers[0];
}

bool HasArg(const std::vector<std::string>& args, const std::string& arg) {
  return std::find(args.begin(), args.end(), arg) != args.end();
}

// H1: GPU off (the default) renders the controller and nothing of GPU admission: no Service,
// no webhook configurations, no certificate, no --enable-gpu, no GPU-only RBAC.
TEST(ChartController, GpuOffRendersNoWebhookServiceCertificateOrGpuFlag) {
  const auto documents = Render();
  for (const char* kind : {"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration",
                           "Issuer", "Certificate"}) {
    EXPECT_TRUE(OfKind(documents, kind).empty()) << kind;
  }
  // Only the headless metrics Services (docs/operations.md, "Scraping"), no webhook Service.
  for (const auto& service : OfKind(documents, "Service")) {
    EXPECT_TRUE(service["metadata"]["name"].as<std::string>("").ends_with("-metrics"))
        << service["metadata"]["name"];
  }
  // The agent's, the controller's, and the two tenant roles the hoster binds (docs/install.md).
  EXPECT_EQ(OfKind(documents, "ClusterRole").size(), 4u);
  const auto args = Strings(Controller(documents)["args"]);
  for (const auto& arg : args) {
    EXPECT_FALSE(arg.starts_with("--enable-gpu") || arg.starts_with("--webhook") ||
                 arg.starts_with("--gpu-resource-names") || arg.starts_with("--raw-gpu-names") ||
                 arg.starts_with("--attachment-grace") || arg.starts_with("--not-ready-grace") ||
                 arg.starts_with("--catalog-tenant-series") || arg.starts_with("--shutdown-delay"))
        << arg;
  }
  EXPECT_FALSE(Controller(documents)["volumeMounts"].IsDefined());
  // The reconciler runs on every cluster: the Deployment, its bindings and the PDB do.
  Named(documents, "Deployment", "gpu-controller");
  Named(documents, "PodDisruptionBudget", "gpu-controller");
  Named(documents, "Role", "gpu-controller");
}

// H1: GPU on renders all of it, and the GPU flags come from values.
TEST(ChartController, GpuOnRendersWebhooksCertificateAndGpuFlags) {
  const auto documents = Render(GpuOn());
  const auto args = Strings(Controller(documents)["args"]);
  for (const char* arg :
       {"--enable-gpu", "--gpu-resource-names=nvidia.com/GA100,nvidia.com/TU104GL_Tesla_T4",
        "--raw-gpu-names=forbid", "--attachment-grace=90s", "--not-ready-grace=2m",
        "--webhook-addr=:9443", "--webhook-cert-dir=/etc/gpu-controller/webhook-tls"}) {
    EXPECT_TRUE(HasArg(args, arg)) << arg;
  }
  Named(documents, "Service", "gpu-controller-webhook");
  Named(documents, "ValidatingWebhookConfiguration", "cozy-gpu");
  Named(documents, "MutatingWebhookConfiguration", "cozy-gpu");
  Named(documents, "ClusterRole", "gpu-controller-gpu");
  EXPECT_EQ(OfKind(documents, "Certificate").size(), 2u);  // the CA, the serving certificate
  EXPECT_EQ(OfKind(documents, "Issuer").size(), 2u);       // self-signed, the CA's
  // Defaults: no resource names (the flag is left out), raw names allowed, a 2m grace.
  YAML::Node defaultValues =
      YAML::Load("gpu: {enabled: true, webhook: {networkPolicy: {podCIDRs: [10.244.0.0/16]}}}");
  defaultValues["gpu"]["webhook"]["clientCA"] = kClientCaPem;
  const auto defaults = Strings(Controller(Render(defaultValues))["args"]);
  EXPECT_TRUE(HasArg(defaults, "--raw-gpu-names=allow"));
  EXPECT_TRUE(HasArg(defaults, "--attachment-grace=2m"));
  EXPECT_TRUE(HasArg(defaults, "--not-ready-grace=5m"));  // gpu.notReadyGrace
  EXPECT_TRUE(HasArg(defaults, "--shutdown-delay=3s"));   // gpu.webhook.shutdownDelay
  // controller.catalogTenantSeries (docs/controller.md, "Catalog metrics").
  EXPECT_TRUE(HasArg(defaults, "--catalog-tenant-series=200"));
  defaultValues["controller"]["catalogTenantSeries"] = 0;
  EXPECT_TRUE(
      HasArg(Strings(Controller(Render(defaultValues))["args"]), "--catalog-tenant-series=0"));
  for (const auto& arg : defaults) EXPECT_FALSE(arg.starts_with("--gpu-resource-names")) << arg;
}

// The Service sends 443 to the webhook port and exposes the metrics (health) port for scraping.
TEST(ChartController, WebhookServiceMapsHttpsAndMetricsToTheControllersPorts) {
  const auto documents = Render(GpuOn());
  const YAML::Node service = Named(documents, "Service", "gpu-controller-webhook");
  const YAML::Node pod = Named(documents, "Deployment", "gpu-controller")["spec"]["template"];
  for (const auto& label : service["spec"]["selector"]) {
    EXPECT_EQ(pod["metadata"]["labels"][label.first.Scalar()].as<std::string>(""),
              label.second.Scalar());
  }
  std::map<std::string, int> containerPorts;
  for (const auto& port : Controller(documents)["ports"]) {
    containerPorts[port["name"].as<std::string>()] = port["containerPort"].as<int>();
  }
  EXPECT_EQ(containerPorts.at("webhook"), 9443);
  EXPECT_EQ(containerPorts.at("health"), 8080);
  std::map<std::string, std::pair<int, std::string>> ports;
  for (const auto& port : service["spec"]["ports"]) {
    ports[port["name"].as<std::string>()] = {port["port"].as<int>(),
                                             port["targetPort"].as<std::string>()};
  }
  EXPECT_EQ(ports.at("https"), (std::pair<int, std::string>{443, "webhook"}));
  EXPECT_EQ(ports.at("metrics"), (std::pair<int, std::string>{8080, "health"}));
}

struct Webhook {
  std::string configuration;
  YAML::Node node;
};

std::map<std::string, Webhook> Webhooks(const std::vector<YAML::Node>& documents) {
  std::map<std::string, Webhook> webhooks;
  for (const char* kind : kWebhookKinds) {
    for (const auto& configuration : OfKind(documents, kind)) {
      for (const auto& webhook : configuration["webhooks"]) {
        webhooks[webhook["name"].as<std::string>()] = {kind, webhook};
      }
    }
  }
  return webhooks;
}

// H2: every webhook fails closed; each speaks admission/v1 to its path on the Service.
TEST(ChartController, EveryWebhookFailsClosed) {
  for (const auto& overrides : {GpuOn(), HosterCertificate()}) {
    const auto webhooks = Webhooks(Render(overrides));
    ASSERT_EQ(webhooks.size(), 3u);
    const std::map<std::string, std::string> paths = {
        {"gpudevices.gpu.cozystack.io", "/validate/gpudevices"},
        {"virtualmachineinstances.gpu.cozystack.io", "/mutate/virtualmachineinstances"},
        {"pods.gpu.cozystack.io", "/mutate/pods"},
    };
    for (const auto& [name, webhook] : webhooks) {
      EXPECT_EQ(webhook.node["failurePolicy"].as<std::string>(""), "Fail") << name;  // H2
      EXPECT_EQ(Strings(webhook.node["admissionReviewVersions"]), std::vector<std::string>{"v1"});
      const YAML::Node service = webhook.node["clientConfig"]["service"];
      EXPECT_EQ(service["name"].as<std::string>(""), "gpu-controller-webhook") << name;
      EXPECT_EQ(service["namespace"].as<std::string>(""), "cozy-gpu") << name;
      EXPECT_EQ(service["port"].as<int>(0), 443) << name;
      ASSERT_TRUE(paths.contains(name)) << name;
      EXPECT_EQ(service["path"].as<std::string>(""), paths.at(name));
      EXPECT_FALSE(webhook.node["clientConfig"]["url"].IsDefined()) << name;
    }
    EXPECT_EQ(webhooks.at("gpudevices.gpu.cozystack.io").configuration,
              "ValidatingWebhookConfiguration");
    EXPECT_EQ(webhooks.at("virtualmachineinstances.gpu.cozystack.io").configuration,
              "MutatingWebhookConfiguration");
    EXPECT_EQ(webhooks.at("pods.gpu.cozystack.io").configuration, "MutatingWebhookConfiguration");
  }
}

using RuleView = std::tuple<std::vector<std::string>, std::vector<std::string>,
                            std::vector<std::string>, std::vector<std::string>>;

RuleView OnlyRule(const YAML::Node& webhook) {
  EXPECT_EQ(webhook["rules"].size(), 1u);
  const YAML::Node rule = webhook["rules"][0];
  return {Strings(rule["apiGroups"]), Strings(rule["apiVersions"]), Strings(rule["operations"]),
          Strings(rule["resources"])};
}

std::map<std::string, std::string> MatchLabels(const YAML::Node& webhook) {
  std::map<std::string, std::string> labels;
  for (const auto& entry : webhook["objectSelector"]["matchLabels"]) {
    if (entry.second.Scalar() == "true") {
      EXPECT_EQ(entry.second.Tag(), "!") << entry.first.Scalar() << " must be a string";
    }
    labels[entry.first.Scalar()] = entry.second.Scalar();
  }
  EXPECT_FALSE(webhook["objectSelector"]["matchExpressions"].IsDefined());
  return labels;
}

// H3: the GPUDevice webhook sees every order (CREATE, never the status subresource); the VMI
// webhook only VMIs with the device-reference label; the pod webhook only launcher pods with
// it. H7: the VMI webhook is called again after later mutators (IfNeeded), and has side effects
// only outside dry runs.
TEST(ChartController, WebhooksSelectWhatTheyMustAndNothingElse) {
  const auto webhooks = Webhooks(Render(GpuOn()));
  const std::string label(api::kDeviceReferenceLabel);
  const std::string labelValue(api::kDeviceReferenceLabelValue);

  const YAML::Node devices = webhooks.at("gpudevices.gpu.cozystack.io").node;
  EXPECT_EQ(
      OnlyRule(devices),
      (RuleView{
          {std::string(api::kGroup)}, {std::string(api::kVersion)}, {"CREATE"}, {"gpudevices"}}));
  EXPECT_FALSE(devices["objectSelector"].IsDefined()) << "every order, labelled or not";
  EXPECT_FALSE(devices["namespaceSelector"].IsDefined()) << "every namespace's orders";
  EXPECT_EQ(devices["sideEffects"].as<std::string>(""), "None");

  const YAML::Node vmis = webhooks.at("virtualmachineinstances.gpu.cozystack.io").node;
  EXPECT_EQ(OnlyRule(vmis),
            (RuleView{{"kubevirt.io"}, {"v1"}, {"CREATE"}, {"virtualmachineinstances"}}));
  EXPECT_EQ(MatchLabels(vmis), (std::map<std::string, std::string>{{label, labelValue}}));
  EXPECT_EQ(vmis["sideEffects"].as<std::string>(""), "NoneOnDryRun");
  EXPECT_EQ(vmis["reinvocationPolicy"].as<std::string>(""), "IfNeeded");
  EXPECT_EQ(vmis["timeoutSeconds"].as<int>(0), 15);

  const YAML::Node pods = webhooks.at("pods.gpu.cozystack.io").node;
  EXPECT_EQ(OnlyRule(pods), (RuleView{{""}, {"v1"}, {"CREATE"}, {"pods"}}));
  EXPECT_EQ(MatchLabels(pods), (std::map<std::string, std::string>{
                                   {label, labelValue}, {"kubevirt.io", "virt-launcher"}}));
  EXPECT_EQ(pods["sideEffects"].as<std::string>(""), "None");

  for (const auto& [name, webhook] : webhooks) {
    const RuleView rule = OnlyRule(webhook.node);
    for (const auto& resource : std::get<3>(rule)) {
      EXPECT_EQ(resource.find('/'), std::string::npos) << name << ": a subresource " << resource;
      EXPECT_NE(resource, "*") << name;
    }
    const int timeout = webhook.node["timeoutSeconds"].as<int>(0);
    EXPECT_TRUE(timeout >= 1 && timeout <= 30) << name << " " << timeout;
  }
}

// The CA: cert-manager's injector (inject-ca-from naming the serving Certificate), or the
// hoster's bundle on every webhook and the hoster's Secret mounted.
// docs/install.md, "Who may call the webhooks": a NetworkPolicy (or, where Cilium serves its API, a
// CiliumNetworkPolicy naming the kube-apiserver entity) lets only sources outside the pod
// network reach the webhook port, the health port stays open; the hoster's CA of kube-apiserver's
// webhook client certificate becomes --webhook-client-ca, mounted from a ConfigMap.
// H8: the pod network is never guessed. Without pod CIDRs (and without `from`) the chart refuses
// to render the NetworkPolicy, naming the value; IPv6 and dual-stack CIDRs each get an ipBlock
// of their own family (kube-apiserver refuses an except of another family than its cidr); an
// entry that is no CIDR is refused. With Cilium, with `from`, or with the policy off, no CIDR is
// needed.
TEST(ChartController, H8_TheWebhookNetworkPolicyNeedsThePodCidrsOfEveryFamily) {
  auto withCidrs = [](const std::string& cidrs) {
    YAML::Node values = GpuOn();
    values["gpu"]["webhook"]["networkPolicy"]["podCIDRs"] = YAML::Load(cidrs);
    return values;
  };
  for (const char* cidrs : {"[]", "null"}) {
    try {
      Render(withCidrs(cidrs));
      ADD_FAILURE() << "rendered a NetworkPolicy with podCIDRs " << cidrs;
    } catch (const RenderError& error) {
      EXPECT_NE(std::string(error.what()).find("gpu.webhook.networkPolicy.podCIDRs"),
                std::string::npos)
          << error.what();
    }
  }
  EXPECT_THROW(Render(withCidrs("[10.244.0.0]")), RenderError);
  EXPECT_THROW(Render(withCidrs("[pods]")), RenderError);
  const auto blocks = [&](const std::string& cidrs) {
    std::vector<std::pair<std::string, std::vector<std::string>>> found;
    const YAML::Node from = Named(Render(withCidrs(cidrs)), "NetworkPolicy",
                                  "gpu-controller-webhook-callers")["spec"]["ingress"][0]["from"];
    for (const auto& peer : from) {
      found.emplace_back(peer["ipBlock"]["cidr"].as<std::string>(),
                         Strings(peer["ipBlock"]["except"]));
    }
    return found;
  };
  using Blocks = std::vector<std::pair<std::string, std::vector<std::string>>>;
  EXPECT_EQ(blocks("['fd00:10:244::/56']"), (Blocks{{"::/0", {"fd00:10:244::/56"}}}));
  EXPECT_EQ(
      blocks("[10.244.0.0/16, 'fd00:10:244::/56', 10.245.0.0/16]"),
      (Blocks{{"0.0.0.0/0", {"10.244.0.0/16", "10.245.0.0/16"}}, {"::/0", {"fd00:10:244::/56"}}}));
  // No CIDR needed where no CIDR is used.
  YAML::Node peers = withCidrs("[]");
  peers["gpu"]["webhook"]["networkPolicy"]["from"] =
      YAML::Load("[{ipBlock: {cidr: 192.0.2.10/32}}]");
  EXPECT_NO_THROW(Render(peers));
  YAML::Node off = withCidrs("[]");
  off["gpu"]["webhook"]["networkPolicy"]["enabled"] = false;
  EXPECT_NO_THROW(Render(off));
  Release cilium;
  cilium.apiVersions = {"cilium.io/v2/CiliumNetworkPolicy"};
  EXPECT_NO_THROW(Render(withCidrs("[]"), cilium));
}

TEST(ChartController, OnlyTheApiServerMayReachAndCallTheWebhooks) {
  const auto documents = Render(GpuOn());
  const YAML::Node policy = Named(documents, "NetworkPolicy", "gpu-controller-webhook-callers");
  EXPECT_EQ(
      policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"].as<std::string>(),
      "gpu-controller");
  EXPECT_EQ(Strings(policy["spec"]["policyTypes"]), std::vector<std::string>{"Ingress"});
  const YAML::Node rules = policy["spec"]["ingress"];
  ASSERT_EQ(rules.size(), 2u);
  EXPECT_EQ(rules[0]["ports"][0]["port"].as<int>(), 9443);
  EXPECT_EQ(rules[0]["from"][0]["ipBlock"]["cidr"].as<std::string>(), "0.0.0.0/0");
  EXPECT_EQ(Strings(rules[0]["from"][0]["ipBlock"]["except"]),
            std::vector<std::string>{"10.244.0.0/16"});
  EXPECT_EQ(rules[1]["ports"][0]["port"].as<int>(), 8080);
  EXPECT_FALSE(rules[1]["from"].IsDefined()) << "probes and scrapes reach the health port";
  EXPECT_TRUE(OfKind(documents, "CiliumNetworkPolicy").empty());
  // The hoster's own peers replace the default.
  YAML::Node peers = GpuOn();
  peers["gpu"]["webhook"]["networkPolicy"]["from"] =
      YAML::Load("[{ipBlock: {cidr: 192.0.2.10/32}}]");
  const auto custom = Render(peers);
  EXPECT_EQ(
      Named(custom, "NetworkPolicy",
            "gpu-controller-webhook-callers")["spec"]["ingress"][0]["from"][0]["ipBlock"]["cidr"]
          .as<std::string>(),
      "192.0.2.10/32");
  // Cilium (Cozystack): the kube-apiserver entity, not CIDRs.
  Release cilium;
  cilium.apiVersions = {"cilium.io/v2/CiliumNetworkPolicy"};
  const auto withCilium = Render(GpuOn(), cilium);
  EXPECT_TRUE(OfKind(withCilium, "NetworkPolicy").empty());
  const YAML::Node ciliumPolicy = Only(withCilium, "CiliumNetworkPolicy");
  EXPECT_EQ(Strings(ciliumPolicy["spec"]["ingress"][0]["fromEntities"]),
            std::vector<std::string>{"kube-apiserver"});
  EXPECT_EQ(ciliumPolicy["spec"]["ingress"][0]["toPorts"][0]["ports"][0]["port"].as<std::string>(),
            "9443");
  // Off, and with GPUs off: no policy.
  YAML::Node off = GpuOn();
  off["gpu"]["webhook"]["networkPolicy"]["enabled"] = false;
  EXPECT_TRUE(OfKind(Render(off), "NetworkPolicy").empty());
  EXPECT_TRUE(OfKind(Render(), "NetworkPolicy").empty());

  // Secure by default: with GPUs on and no client CA the chart refuses to render, naming the
  // value and its opt-out; the opt-out renders the controller's own, which warns.
  YAML::Node withoutCa = GpuOn();
  withoutCa["gpu"]["webhook"].remove("clientCA");
  try {
    Render(withoutCa);
    ADD_FAILURE() << "rendered webhooks that answer any caller without the opt-out";
  } catch (const RenderError& error) {
    EXPECT_NE(std::string(error.what()).find("gpu.webhook.clientCA"), std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("gpu.webhook.allowUnauthenticatedCallers"),
              std::string::npos)
        << error.what();
  }
  YAML::Node optOut = withoutCa;
  optOut["gpu"]["webhook"]["allowUnauthenticatedCallers"] = true;
  const auto open = Strings(Controller(Render(optOut))["args"]);
  EXPECT_TRUE(HasArg(open, "--webhook-allow-unauthenticated-callers"));
  for (const auto& arg : open) EXPECT_FALSE(arg.starts_with("--webhook-client-ca")) << arg;
  // A PEM CA: a ConfigMap, mounted, and no opt-out.
  const std::string& pem = kClientCaPem;
  YAML::Node withCa = GpuOn();
  const auto authenticated = Render(withCa);
  EXPECT_FALSE(HasArg(Strings(Controller(authenticated)["args"]),
                      "--webhook-allow-unauthenticated-callers"));
  const YAML::Node configMap =
      Named(authenticated, "ConfigMap", "gpu-controller-webhook-client-ca");
  EXPECT_EQ(configMap["data"]["ca.crt"].as<std::string>(), pem);
  const YAML::Node controller = Controller(authenticated);
  EXPECT_TRUE(HasArg(Strings(controller["args"]),
                     "--webhook-client-ca=/etc/gpu-controller/webhook-client-ca/ca.crt"));
  bool mounted = false;
  for (const auto& mount : controller["volumeMounts"]) {
    mounted |= mount["mountPath"].as<std::string>() == "/etc/gpu-controller/webhook-client-ca";
  }
  EXPECT_TRUE(mounted);
  const YAML::Node pod =
      Named(authenticated, "Deployment", "gpu-controller")["spec"]["template"]["spec"];
  std::string volumeConfigMap;
  for (const auto& volume : pod["volumes"]) {
    if (volume["name"].as<std::string>() == "webhook-client-ca") {
      volumeConfigMap = volume["configMap"]["name"].as<std::string>();
    }
  }
  EXPECT_EQ(volumeConfigMap, "gpu-controller-webhook-client-ca");
  // An existing ConfigMap of the hoster's: mounted by name, none rendered.
  YAML::Node existing = withoutCa;
  existing["gpu"]["webhook"]["clientCAConfigMap"] = "apiserver-webhook-client-ca";
  const auto hosters = Render(existing);
  for (const auto& map : OfKind(hosters, "ConfigMap")) {  // the dashboard's alone
    EXPECT_EQ(map["metadata"]["name"].as<std::string>(""), "gpu-dashboard");
  }
  EXPECT_TRUE(HasArg(Strings(Controller(hosters)["args"]),
                     "--webhook-client-ca=/etc/gpu-controller/webhook-client-ca/ca.crt"));
  // Both, or text that is no PEM: helm refuses with the value's name.
  YAML::Node both = withCa;
  both["gpu"]["webhook"]["clientCAConfigMap"] = "x";
  YAML::Node notPem = GpuOn();
  notPem["gpu"]["webhook"]["clientCA"] = "Q0EgYnVuZGxlCg==";
  for (const auto& refused : {both, notPem}) {
    try {
      Render(refused);
      ADD_FAILURE() << "rendered";
    } catch (const RenderError& error) {
      EXPECT_NE(std::string(error.what()).find("gpu.webhook.clientCA"), std::string::npos)
          << error.what();
    }
  }
}

TEST(ChartController, WebhookCaComesFromCertManagerOrTheHoster) {
  const auto managed = Render(GpuOn());
  for (const char* kind : kWebhookKinds) {
    const YAML::Node configuration = Named(managed, kind, "cozy-gpu");
    EXPECT_EQ(
        configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].as<std::string>(
            ""),
        "cozy-gpu/gpu-controller-webhook")
        << kind;
    for (const auto& webhook : configuration["webhooks"]) {
      EXPECT_FALSE(webhook["clientConfig"]["caBundle"].IsDefined()) << kind;
    }
  }
  const YAML::Node serving = Named(managed, "Certificate", "gpu-controller-webhook");
  EXPECT_EQ(Strings(serving["spec"]["dnsNames"]).at(0), "gpu-controller-webhook.cozy-gpu.svc");
  EXPECT_EQ(Strings(serving["spec"]["usages"]), std::vector<std::string>{"server auth"});
  EXPECT_TRUE(Named(managed, "Certificate", "gpu-controller-ca")["spec"]["isCA"].as<bool>(false));
  EXPECT_TRUE(Named(managed, "Issuer", "gpu-controller-selfsigned")["spec"]["selfSigned"]);
  EXPECT_EQ(
      Named(managed, "Issuer", "gpu-controller-ca")["spec"]["ca"]["secretName"].as<std::string>(""),
      "gpu-controller-ca");

  const auto hosted = Render(HosterCertificate());
  EXPECT_TRUE(OfKind(hosted, "Certificate").empty());
  EXPECT_TRUE(OfKind(hosted, "Issuer").empty());
  for (const char* kind : kWebhookKinds) {
    const YAML::Node configuration = Named(hosted, kind, "cozy-gpu");
    EXPECT_FALSE(configuration["metadata"]["annotations"].IsDefined()) << kind;
    for (const auto& webhook : configuration["webhooks"]) {
      EXPECT_EQ(webhook["clientConfig"]["caBundle"].as<std::string>(""), "Q0EgYnVuZGxlCg==");
    }
  }
  const YAML::Node volumes =
      Named(hosted, "Deployment", "gpu-controller")["spec"]["template"]["spec"]["volumes"];
  ASSERT_EQ(volumes.size(), 2u);  // the serving pair, and the callers' CA (H9)
  EXPECT_EQ(volumes[0]["secret"]["secretName"].as<std::string>(""), "hoster-webhook-tls");
  EXPECT_EQ(volumes[1]["configMap"]["name"].as<std::string>(""),
            "gpu-controller-webhook-client-ca");
}

// Every object one object of the render names exists in the render: the webhooks' Service,
// the Secret the serving Certificate writes and the Deployment mounts, the Issuers the
// Certificates and the CA Issuer name, the ServiceAccount of the Deployment and of every
// binding, the roles the bindings grant, the Certificate inject-ca-from names.
TEST(ChartController, EveryObjectTheRenderNamesIsInTheRender) {
  for (const auto& overrides : {YAML::Node(), GpuOn()}) {
    const auto documents = Render(overrides);
    std::set<std::string> present;  // "Kind namespace/name"
    const auto key = [](const std::string& kind, const std::string& ns, const std::string& name) {
      return kind + " " + ns + "/" + name;
    };
    for (const auto& document : documents) {
      present.insert(key(document["kind"].as<std::string>(),
                         document["metadata"]["namespace"].as<std::string>(""),
                         document["metadata"]["name"].as<std::string>()));
    }
    // Secrets the render creates: those its Certificates write.
    for (const auto& certificate : OfKind(documents, "Certificate")) {
      present.insert(
          key("Secret", "cozy-gpu", certificate["spec"]["secretName"].as<std::string>()));
    }
    std::vector<std::string> named;
    for (const auto& document : OfKind(documents, "Deployment")) {
      const YAML::Node pod = document["spec"]["template"]["spec"];
      named.push_back(
          key("ServiceAccount", "cozy-gpu", pod["serviceAccountName"].as<std::string>("")));
      for (const auto& volume : pod["volumes"]) {
        if (volume["secret"]) {
          named.push_back(
              key("Secret", "cozy-gpu", volume["secret"]["secretName"].as<std::string>("")));
        }
      }
    }
    for (const char* kind : {"ClusterRoleBinding", "RoleBinding"}) {
      for (const auto& binding : OfKind(documents, kind)) {
        const std::string roleKind = binding["roleRef"]["kind"].as<std::string>("");
        named.push_back(key(roleKind, roleKind == "Role" ? "cozy-gpu" : "",
                            binding["roleRef"]["name"].as<std::string>("")));
        for (const auto& subject : binding["subjects"]) {
          if (subject["kind"].as<std::string>("") != "ServiceAccount") continue;
          named.push_back(key("ServiceAccount", subject["namespace"].as<std::string>(""),
                              subject["name"].as<std::string>("")));
        }
      }
    }
    for (const auto& certificate : OfKind(documents, "Certificate")) {
      EXPECT_EQ(certificate["spec"]["issuerRef"]["kind"].as<std::string>(""), "Issuer");
      named.push_back(
          key("Issuer", "cozy-gpu", certificate["spec"]["issuerRef"]["name"].as<std::string>("")));
    }
    for (const auto& issuer : OfKind(documents, "Issuer")) {
      if (issuer["spec"]["ca"]) {
        named.push_back(
            key("Secret", "cozy-gpu", issuer["spec"]["ca"]["secretName"].as<std::string>("")));
      }
    }
    for (const char* kind : kWebhookKinds) {
      for (const auto& configuration : OfKind(documents, kind)) {
        const std::string inject =
            configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
                .as<std::string>("");
        if (!inject.empty()) {
          named.push_back(key("Certificate", inject.substr(0, inject.find('/')),
                              inject.substr(inject.find('/') + 1)));
        }
        for (const auto& webhook : configuration["webhooks"]) {
          const YAML::Node service = webhook["clientConfig"]["service"];
          named.push_back(key("Service", service["namespace"].as<std::string>(""),
                              service["name"].as<std::string>("")));
        }
      }
    }
    for (const auto& policyBinding : OfKind(documents, "ValidatingAdmissionPolicyBinding")) {
      named.push_back(key("ValidatingAdmissionPolicy", "",
                          policyBinding["spec"]["policyName"].as<std::string>()));
    }
    EXPECT_GE(named.size(), 6u);
    for (const auto& name : named) EXPECT_TRUE(present.contains(name)) << name << " is missing";
  }
}

// H4: two replicas behind a PDB that keeps one, spread across nodes, probed on the health
// port, locked down, the Lease holder named after the pod, the namespace the release's.
TEST(ChartController, RunsTwoReplicasBehindAPdbProbedAndLockedDown) {
  for (const auto& overrides : {YAML::Node(), GpuOn()}) {
    Release release;
    release.ns = "gpu-system";
    const auto documents = Render(overrides, release);
    const YAML::Node deployment = Named(documents, "Deployment", "gpu-controller");
    EXPECT_EQ(deployment["spec"]["replicas"].as<int>(0), 2);
    EXPECT_EQ(deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"].as<int>(-1), 0);
    const YAML::Node pdb = Named(documents, "PodDisruptionBudget", "gpu-controller");
    EXPECT_EQ(pdb["spec"]["minAvailable"].as<int>(0), 1);
    EXPECT_EQ(YAML::Dump(pdb["spec"]["selector"]), YAML::Dump(deployment["spec"]["selector"]));
    const YAML::Node labels = deployment["spec"]["template"]["metadata"]["labels"];
    for (const auto& label : deployment["spec"]["selector"]["matchLabels"]) {
      EXPECT_EQ(labels[label.first.Scalar()].as<std::string>(""), label.second.Scalar());
    }
    const YAML::Node pod = deployment["spec"]["template"]["spec"];
    const YAML::Node spread =
        pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
    ASSERT_EQ(spread.size(), 1u);
    EXPECT_EQ(spread[0]["podAffinityTerm"]["topologyKey"].as<std::string>(""),
              "kubernetes.io/hostname");
    EXPECT_EQ(YAML::Dump(spread[0]["podAffinityTerm"]["labelSelector"]["matchLabels"]),
              YAML::Dump(deployment["spec"]["selector"]["matchLabels"]));
    EXPECT_TRUE(pod["securityContext"]["runAsNonRoot"].as<bool>(false));
    EXPECT_NE(pod["securityContext"]["runAsUser"].as<int>(0), 0);
    EXPECT_EQ(pod["securityContext"]["seccompProfile"]["type"].as<std::string>(""),
              "RuntimeDefault");
    EXPECT_FALSE(pod["hostNetwork"].as<bool>(false));

    const YAML::Node controller = Controller(documents);
    const YAML::Node security = controller["securityContext"];
    EXPECT_FALSE(security["allowPrivilegeEscalation"].as<bool>(true));
    EXPECT_TRUE(security["readOnlyRootFilesystem"].as<bool>(false));
    EXPECT_EQ(Strings(security["capabilities"]["drop"]), std::vector<std::string>{"ALL"});
    EXPECT_FALSE(security["capabilities"]["add"].IsDefined());
    EXPECT_FALSE(security["privileged"].as<bool>(false));

    const auto args = Strings(controller["args"]);
    EXPECT_EQ(args.at(0), "run");
    EXPECT_TRUE(HasArg(args, "--namespace=gpu-system"));
    EXPECT_TRUE(HasArg(args, "--identity=$(POD_NAME)"));
    EXPECT_TRUE(HasArg(args, "--health-addr=:8080"));
    ExpectFieldEnv(controller, "POD_NAME", "metadata.name");
    const std::map<std::string, std::string> paths = {{"livenessProbe", "/healthz"},
                                                      {"readinessProbe", "/readyz"}};
    for (const auto& [probe, path] : paths) {
      EXPECT_EQ(controller[probe]["httpGet"]["path"].as<std::string>(""), path);
      EXPECT_EQ(controller[probe]["httpGet"]["port"].as<std::string>(""), "health");
    }
    EXPECT_EQ(controller["resources"]["requests"]["memory"].as<std::string>(""), "128Mi");
    EXPECT_EQ(controller["resources"]["limits"]["memory"].as<std::string>(""), "512Mi");
    EXPECT_EQ(controller["image"].as<std::string>(""),
              "ghcr.io/cozystack/cozy-gpu/gpu-controller:" COZY_VERSION);
  }
  YAML::Node pinned = YAML::Load("controller: {image: {digest: 'sha256:0123'}}");
  EXPECT_EQ(Controller(Render(pinned))["image"].as<std::string>(""),
            "ghcr.io/cozystack/cozy-gpu/gpu-controller@sha256:0123");
}

// The Lease and the settings ConfigMap the Role names are the controller's (api/keys.h), in the
// release namespace the controller is told (--namespace).
TEST(ChartController, RoleNamesTheLeaseAndTheSettingsConfigMap) {
  const auto documents = Render();
  const YAML::Node role = Named(documents, "Role", "gpu-controller");
  std::set<std::string> named;
  for (const auto& rule : role["rules"]) {
    for (const auto& name : Strings(rule["resourceNames"])) named.insert(name);
    if (!rule["resourceNames"]) {
      EXPECT_EQ(Strings(rule["verbs"]), std::vector<std::string>{"create"})
          << "only create goes without a name";
    }
  }
  EXPECT_EQ(named,
            (std::set<std::string>{"gpu-controller", std::string(api::kSettingsConfigMapName)}));
}

// The least the controller needs; each rule beside a code path (controller-rbac.yaml). No
// wildcard; the GPU-only grants only with GPU on.
TEST(ChartController, RbacIsExactlyTheLeastTheControllerNeeds) {
  using Rule = std::tuple<std::string, std::string, std::set<std::string>>;
  const auto rulesOf = [](const YAML::Node& role) {
    std::map<std::pair<std::string, std::string>, std::set<std::string>> merged;
    for (const auto& rule : role["rules"]) {
      EXPECT_FALSE(rule["nonResourceURLs"].IsDefined());
      const auto verbs = Strings(rule["verbs"]);
      for (const auto& verb : verbs) EXPECT_NE(verb, "*");
      for (const auto& group : Strings(rule["apiGroups"])) {
        EXPECT_NE(group, "*");
        for (const auto& resource : Strings(rule["resources"])) {
          EXPECT_NE(resource, "*");
          EXPECT_FALSE(resource.ends_with("/*")) << resource;
          merged[{group, resource}].insert(verbs.begin(), verbs.end());
        }
      }
    }
    std::set<Rule> rules;
    for (const auto& [at, verbs] : merged) rules.insert({at.first, at.second, verbs});
    return rules;
  };
  // Besides list and watch, which each kind of the table of watched kinds adds below.
  std::map<std::pair<std::string, std::string>, std::set<std::string>> always = {
      {{"gpu.cozystack.io", "gpuclasses"}, {"patch"}},
      {{"gpu.cozystack.io", "gpudevices"}, {"patch", "delete"}},
      {{"gpu.cozystack.io", "gpudevices/status"}, {"patch"}},
      {{"kubevirt.io", "virtualmachineinstances"}, {"get"}},
      {{"cozystack.io", "workloads"}, {"create", "update", "delete"}},
      {{"cozystack.io", "workloadmonitors"}, {"create", "update", "delete"}},
  };
  std::map<std::pair<std::string, std::string>, std::set<std::string>> gpuOnly = {
      {{"gpu.cozystack.io", "gpudevices"}, {"get", "create"}},
      {{"gpu.cozystack.io", "gpunodes/status"}, {"patch"}},
      {{"events.k8s.io", "events"}, {"create"}},
      // docs/dra.md: the DeviceClass of each dra class (D20), the claim of each Bound device of
      // one (D21); never a claim's status.
      {{"resource.k8s.io", "deviceclasses"}, {"create", "update", "delete"}},
      {{"resource.k8s.io", "resourceclaims"}, {"create", "delete"}},
  };
  std::map<std::pair<std::string, std::string>, std::set<std::string>> inNamespace = {
      {{"coordination.k8s.io", "leases"}, {"get", "create", "update"}},
      {{"", "configmaps"}, {"create", "update"}},
  };
  // List and watch: each watched kind's cache (controller/watched.h), in the role that holds it
  // (ChartControllerRbac, controller_rbac_test.cpp, says why each).
  controller::ForEachWatched([&](const auto& watched) {
    auto& role = watched.inControllerNamespace ? inNamespace : watched.gpuOnly ? gpuOnly : always;
    role[{std::string(watched.kind.group), std::string(watched.kind.plural)}].insert(
        {"list", "watch"});
  });
  const auto asRules = [](const auto& merged) {
    std::set<Rule> rules;
    for (const auto& [at, verbs] : merged) rules.insert({at.first, at.second, verbs});
    return rules;
  };
  const std::set<Rule> gpu = asRules(gpuOnly);
  const std::set<Rule> namespaced = asRules(inNamespace);
  for (const auto& overrides : {YAML::Node(), GpuOn()}) {
    const auto documents = Render(overrides);
    EXPECT_EQ(rulesOf(Named(documents, "ClusterRole", "gpu-controller")), asRules(always));
    EXPECT_EQ(rulesOf(Named(documents, "Role", "gpu-controller")), namespaced);
    const bool on = overrides.IsDefined() && !overrides.IsNull();
    for (const auto& role : OfKind(documents, "ClusterRole")) {
      const std::string name = role["metadata"]["name"].as<std::string>();
      if (name == "gpu-controller-gpu") {
        EXPECT_EQ(rulesOf(role), gpu);
      }
      // The tenants' roles (docs/install.md, "Tenants"): orders and the catalog, never a
      // status subresource; the chart binds neither, the hoster does.
      if (name == "gpu-tenant") {
        EXPECT_EQ(
            rulesOf(role),
            (std::set<Rule>{{"gpu.cozystack.io",
                             "gpudevices",
                             {"get", "list", "watch", "create", "update", "patch", "delete"}}}));
      }
      if (name == "gpu-catalog-reader") {
        EXPECT_EQ(rulesOf(role),
                  (std::set<Rule>{{"gpu.cozystack.io", "gpuclasses", {"get", "list", "watch"}}}));
      }
    }
    Named(documents, "ClusterRole", "gpu-tenant");
    Named(documents, "ClusterRole", "gpu-catalog-reader");
    EXPECT_EQ(OfKind(documents, "ClusterRole").size(), on ? 5u : 4u);
    // No binding of the tenants' roles: who a tenant is, is the hoster's to say.
    EXPECT_EQ(OfKind(documents, "ClusterRoleBinding").size(), on ? 3u : 2u);
    for (const auto& binding : OfKind(documents, "ClusterRoleBinding")) {
      EXPECT_FALSE(binding["roleRef"]["name"].as<std::string>().starts_with("gpu-tenant") ||
                   binding["roleRef"]["name"].as<std::string>() == "gpu-catalog-reader");
    }
  }
}

// The controller's user as the API server names it: the Deployment's service account in the
// Deployment's namespace.
std::string ControllerUser(const std::vector<YAML::Node>& documents) {
  const YAML::Node deployment = Named(documents, "Deployment", "gpu-controller");
  return "system:serviceaccount:" + deployment["metadata"]["namespace"].as<std::string>("") + ":" +
         deployment["spec"]["template"]["spec"]["serviceAccountName"].as<std::string>("");
}

std::string MatchCondition(const YAML::Node& policy, const std::string& name) {
  for (const auto& condition : policy["spec"]["matchConditions"]) {
    if (condition["name"].as<std::string>("") == name) {
      return condition["expression"].as<std::string>("");
    }
  }
  ADD_FAILURE() << "no matchCondition " << name;
  return "";
}

// F7: installed into any namespace, the platform-fields policy trusts the chart's own
// controller, by its exact user name, and no whole namespace's service accounts, not even
// kube-system's; nothing of any policy names cozy-system when the chart is elsewhere. What the
// expressions decide is evaluated as the API server does by gpu_policies_cel (F7) and by
// kube-apiserver itself in real_cluster_policies_test and real_cluster_chart_test.
TEST(ChartController, PlatformFieldsTrustTheControllerOfTheReleaseNamespaceOnly) {
  Release release;
  release.ns = "gpu-system";
  for (const auto& overrides : {YAML::Node(), GpuOn()}) {
    const auto documents = Render(overrides, release);
    const std::string user = ControllerUser(documents);
    EXPECT_EQ(user, "system:serviceaccount:gpu-system:gpu-controller");
    const std::string expression =
        MatchCondition(Named(documents, "ValidatingAdmissionPolicy", "gpu-device-platform-fields"),
                       "not-a-platform-caller");
    EXPECT_NE(expression.find("\"" + user + "\""), std::string::npos) << expression;
    // No group of service accounts at all: named identities only.
    EXPECT_EQ(expression.find("system:serviceaccounts"), std::string::npos) << expression;
    for (const auto& policy : OfKind(documents, "ValidatingAdmissionPolicy")) {
      EXPECT_EQ(YAML::Dump(policy).find("cozy-system"), std::string::npos)
          << policy["metadata"]["name"].as<std::string>();
    }
  }
  // The hoster's extra callers join the lists; an empty entry is refused at render time.
  const auto extra =
      Render(YAML::Load("policies: {platformUsers: [system:serviceaccount:cozy-system:"
                        "cozystack-controller], platformGroups: [cozy-operators]}"),
             release);
  const std::string expression =
      MatchCondition(Named(extra, "ValidatingAdmissionPolicy", "gpu-device-platform-fields"),
                     "not-a-platform-caller");
  EXPECT_NE(expression.find("\"system:kube-controller-manager\","
                            "\"system:serviceaccount:cozy-system:cozystack-controller\"]"),
            std::string::npos)
      << expression;
  EXPECT_NE(expression.find("[\"system:masters\",\"cozy-operators\"]"), std::string::npos)
      << expression;
  EXPECT_THROW(Render(YAML::Load("policies: {platformUsers: ['']}"), release), RenderError);
  EXPECT_THROW(Render(YAML::Load("policies: {platformGroups: [1]}"), release), RenderError);
}

// B2: a GPUDevice's status is written by the controller alone, whatever RBAC a
// hoster grants: a policy on gpudevices/status, in both renders and every namespace, failing
// closed, that lets by only the controller's exact user (and cluster admins). Its decisions are
// evaluated by gpu_policies_cel (B2) and by kube-apiserver in real_cluster_chart_test.
TEST(ChartController, OnlyTheControllerMayWriteADevicesStatus) {
  Release release;
  release.ns = "gpu-system";
  for (const auto& overrides : {YAML::Node(), GpuOn()}) {
    const auto documents = Render(overrides, release);
    const YAML::Node policy =
        Named(documents, "ValidatingAdmissionPolicy", "gpu-device-status-writer");
    EXPECT_EQ(policy["spec"]["failurePolicy"].as<std::string>(""), "Fail");
    const YAML::Node rules = policy["spec"]["matchConstraints"]["resourceRules"];
    ASSERT_EQ(rules.size(), 1u);
    EXPECT_EQ(Strings(rules[0]["apiGroups"]), std::vector<std::string>{"gpu.cozystack.io"});
    EXPECT_EQ(Strings(rules[0]["operations"]), std::vector<std::string>{"UPDATE"});
    EXPECT_EQ(Strings(rules[0]["resources"]), std::vector<std::string>{"gpudevices/status"});
    const std::string user = ControllerUser(documents);
    const std::string expression = MatchCondition(policy, "not-the-controller");
    EXPECT_NE(expression.find("request.userInfo.username == '" + user + "'"), std::string::npos)
        << expression;
    EXPECT_EQ(expression.find("system:serviceaccounts:"), std::string::npos) << expression;
    ASSERT_EQ(policy["spec"]["validations"].size(), 1u);
    EXPECT_EQ(policy["spec"]["validations"][0]["expression"].as<std::string>(""), "false");
    EXPECT_NE(policy["spec"]["validations"][0]["message"].as<std::string>("").find(user),
              std::string::npos);
    const YAML::Node binding =
        Named(documents, "ValidatingAdmissionPolicyBinding", "gpu-device-status-writer");
    EXPECT_EQ(Strings(binding["spec"]["validationActions"]), std::vector<std::string>{"Deny"});
    EXPECT_FALSE(binding["spec"]["matchResources"].IsDefined()) << "every namespace";
    // The controller's ClusterRole is what lets it (and only it, of the chart's subjects) patch.
    bool granted = false;
    for (const auto& rule : Named(documents, "ClusterRole", "gpu-controller")["rules"]) {
      for (const auto& resource : Strings(rule["resources"])) {
        granted = granted || resource == "gpudevices/status";
      }
    }
    EXPECT_TRUE(granted);
  }
}

// H5: the CRDs are templates (Helm upgrades them; it never upgrades crds/) kept on uninstall.
TEST(ChartController, CrdsAreTemplatesKeptOnUninstall) {
  EXPECT_FALSE(std::filesystem::exists(kChart / "crds")) << "Helm never upgrades crds/";
  for (const auto& overrides : {YAML::Node(), GpuOn()}) {
    std::set<std::string> names;
    for (const auto& crd : OfKind(Render(overrides), "CustomResourceDefinition")) {
      names.insert(crd["metadata"]["name"].as<std::string>());
      EXPECT_EQ(crd["metadata"]["annotations"]["helm.sh/resource-policy"].as<std::string>(""),
                "keep")
          << crd["metadata"]["name"];
    }
    EXPECT_EQ(names,
              (std::set<std::string>{"gpuclasses.gpu.cozystack.io", "gpudevices.gpu.cozystack.io",
                                     "gpunodes.gpu.cozystack.io"}));
  }
}

// `helm lint --strict`: the charts as Helm itself checks them (Chart.yaml, values, every
// template rendered, warnings failing), GPUs off and on, with custom values, and vm-instance.
TEST(ChartLint, HelmLintStrictFindsNothing) {
  const std::filesystem::path source(COZY_SOURCE_DIR);
  const std::vector<std::pair<std::filesystem::path, std::filesystem::path>> cases = {
      {kChart, {}},
      {kChart, source / "test/kube/cel/gpu-on-values.yaml"},
      {kChart, source / "test/chart/custom-values.yaml"},
      {source / "charts/vm-instance", {}},
  };
  for (const auto& [chart, values] : cases) {
    std::string command = testing::ShellQuote(HelmBinary().string()) + " lint --strict " +
                          testing::ShellQuote(chart.string());
    if (!values.empty()) command += " -f " + testing::ShellQuote(values.string());
    const auto result = testing::RunCommand(command);
    EXPECT_EQ(result.exitCode, 0) << command << "\n" << result.out << result.err;
  }
}

// ---- What the chart refuses (values.schema.json) and what it says after install (NOTES.txt) ----

// helm's message refusing `overrides`; a failure when they render.
std::string Refusal(const YAML::Node& overrides) {
  try {
    Render(overrides);
  } catch (const RenderError& error) {
    return error.what();
  }
  ADD_FAILURE() << "rendered with values " << YAML::Dump(overrides);
  return "";
}

// docs/install.md, "What the chart refuses": a mistyped key anywhere, a value of the wrong type,
// one outside its set or pattern is refused by the schema before any template renders, and the
// message names the key or the value's path.
TEST(ChartSchema, AMistypedKeyAWrongTypeOrAValueOutsideItsSetIsRefusedNamingIt) {
  struct Case {
    std::string values;
    std::string named;
  };
  const std::vector<Case> cases = {
      {"controler: {replicas: 2}", "'controler'"},
      {"controller: {replica: 2}", "'replica'"},
      {"gpu: {webhook: {networkPolicy: {enabeld: true}}}", "'enabeld'"},
      {"controller: {replicas: two}", "/controller/replicas"},
      {"controller: {replicas: \"2\"}", "/controller/replicas"},
      {"controller: {replicas: -1}", "/controller/replicas"},
      {"gpu: {enabled: \"yes\"}", "/gpu/enabled"},
      {"agent: {healthPort: 70000}", "/agent/healthPort"},
      {"agent: {extraArgs: [-v, 1]}", "/agent/extraArgs/1"},
      {"gpu: {rawGpuNames: deny}", "/gpu/rawGpuNames"},
      {"agent: {image: {pullPolicy: Sometimes}}", "/agent/image/pullPolicy"},
      {"gpu: {attachmentGrace: 0s}", "/gpu/attachmentGrace"},
      {"gpu: {notReadyGrace: 5 minutes}", "/gpu/notReadyGrace"},
      {"gpu: {webhook: {shutdownDelay: -3s}}", "/gpu/webhook/shutdownDelay"},
      {"controller: {catalogTenantSeries: -1}", "/controller/catalogTenantSeries"},
      {"gpu: {webhook: {url: 'https://192.0.2.1:9443/validate'}}", "/gpu/webhook/url"},
  };
  for (const auto& [values, named] : cases) {
    const std::string message = Refusal(YAML::Load(values));
    EXPECT_NE(message.find("values don't meet the specifications of the schema"), std::string::npos)
        << values << "\n"
        << message;
    EXPECT_NE(message.find(named), std::string::npos) << values << "\n" << message;
  }
  // The schema's forms are those the controller's flags take: a bare number of seconds, "0s"
  // for at once.
  EXPECT_NO_THROW(Render(YAML::Load("gpu: {attachmentGrace: 90, notReadyGrace: 0s}")));
}

// The defaults, custom-values.yaml and the GPU-on values the tests render with all pass, and the
// free-form maps stay open: any label, annotation, toleration, resource or peer.
TEST(ChartSchema, TheDefaultsTheTestsValuesAndFreeFormMapsPass) {
  const YAML::Node gpuOnValues =
      YAML::LoadFile(std::string(COZY_SOURCE_DIR) + "/test/kube/cel/gpu-on-values.yaml");
  for (const auto& overrides :
       {YAML::Node(), Custom(), GpuOn(), HosterCertificate(), gpuOnValues}) {
    EXPECT_NO_THROW(Render(overrides)) << YAML::Dump(overrides);
  }
  YAML::Node open = Custom();
  open["agent"]["nodeSelector"]["example.com/any-label"] = "x";
  open["agent"]["tolerations"] = YAML::Load("[{key: example.com/any, operator: Exists}]");
  open["agent"]["resources"] = YAML::Load("{limits: {nvidia.com/anything: 1}}");
  open["controller"]["podAnnotations"]["example.com/any-annotation"] = "any value";
  EXPECT_NO_THROW(Render(open));
}

// Every key of values.yaml is in the schema with a description, every object whose keys are
// fixed is closed (additionalProperties false), and the schema names no key values.yaml lacks.
void ExpectSchemaCovers(const YAML::Node& values, const nlohmann::json& schema,
                        const std::string& path) {
  ASSERT_TRUE(schema.is_object()) << path;
  EXPECT_TRUE(schema.contains("description")) << path << " has no description";
  if (!values.IsMap() || !schema.contains("properties")) return;
  EXPECT_EQ(schema.value("additionalProperties", nlohmann::json(true)), false)
      << path << " takes unknown keys";
  std::set<std::string> keys;
  for (const auto& entry : values) {
    const std::string key = entry.first.as<std::string>();
    keys.insert(key);
    ASSERT_TRUE(schema["properties"].contains(key))
        << path << "." << key << " is not in the schema";
    ExpectSchemaCovers(entry.second, schema["properties"][key], path + "." + key);
  }
  for (const auto& [key, property] : schema["properties"].items()) {
    EXPECT_TRUE(keys.contains(key) || (path.empty() && key == "global"))
        << path << "." << key << " is in the schema, not in values.yaml";
  }
}

TEST(ChartSchema, EveryValueIsTypedAndDescribedAndFixedObjectsAreClosed) {
  const YAML::Node values = YAML::LoadFile((kChart / "values.yaml").string());
  std::ifstream in(kChart / "values.schema.json");
  ASSERT_TRUE(in) << "charts/gpu/values.schema.json is missing";
  const nlohmann::json schema = nlohmann::json::parse(in);
  EXPECT_EQ(schema.value("$schema", ""), "http://json-schema.org/draft-07/schema#");
  ExpectSchemaCovers(values, schema, "");
}

// templates/NOTES.txt as `helm install` prints it. `helm template` leaves NOTES.txt out, and the
// pinned Helm's `helm install --dry-run=client` still asks a cluster (is it reachable, its
// version), so the file's exact text is rendered as a template of a copy of the chart instead.
std::string Notes(const YAML::Node& overrides, const Release& release = {}) {
  const testing::TempDir scratch;
  const std::filesystem::path chart = scratch.path() / "gpu";
  std::filesystem::copy(kChart, chart, std::filesystem::copy_options::recursive);
  std::ifstream in(kChart / "templates/NOTES.txt");
  EXPECT_TRUE(in) << "charts/gpu/templates/NOTES.txt is missing";
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::ofstream(chart / "templates/_notes_under_test.tpl")
      << "{{- define \"notes-under-test\" -}}\n"
      << text << "{{- end -}}\n";
  std::ofstream(chart / "templates/notes-under-test.yaml")
      << "notes: |\n{{ include \"notes-under-test\" . | indent 2 }}\n";
  for (const auto& document : RenderChart(chart, overrides, release)) {
    if (document.source == "templates/notes-under-test.yaml") {
      return YAML::Load(document.text)["notes"].as<std::string>("");
    }
  }
  ADD_FAILURE() << "the notes did not render";
  return "";
}

size_t Count(const std::string& text, const std::string& what) {
  size_t count = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++count;
  return count;
}

// docs/install.md, "What the chart says after install": the next steps with the release's own
// namespace and node label, GPU mode's state, and no warning for the defaults.
TEST(ChartNotes, NextStepsNameTheReleasesNamespaceLabelsAndTheCatalog) {
  Release release;
  release.ns = "gpu-system";
  const std::string defaults = Notes(YAML::Node(), release);
  EXPECT_NE(defaults.find("namespace gpu-system"), std::string::npos) << defaults;
  EXPECT_NE(defaults.find("kubectl label node NODE gpu.cozystack.io/gpu-node=true"),
            std::string::npos)
      << defaults;
  EXPECT_NE(defaults.find("kubectl label namespace TENANT-NAMESPACE " +
                          std::string(api::kTenantNamespaceLabel) + "=true"),
            std::string::npos)
      << defaults;
  EXPECT_NE(defaults.find("GPUClass"), std::string::npos) << defaults;
  EXPECT_NE(defaults.find("kubectl gpu catalog --controller-namespace gpu-system"),
            std::string::npos)
      << defaults;
  EXPECT_NE(defaults.find("GPU mode is off"), std::string::npos) << defaults;
  EXPECT_EQ(defaults.find("WARNING"), std::string::npos) << defaults;

  const std::string custom = Notes(Custom());
  EXPECT_NE(custom.find("kubectl label node NODE nvidia.com/gpu.present=true"), std::string::npos)
      << custom;
  EXPECT_EQ(custom.find("gpu.cozystack.io/gpu-node"), std::string::npos) << custom;

  const std::string gpuOn = Notes(GpuOn());
  EXPECT_EQ(gpuOn.find("GPU mode is off"), std::string::npos) << gpuOn;
  EXPECT_EQ(gpuOn.find("WARNING"), std::string::npos) << "GpuOn() takes no risk\n" << gpuOn;
}

// docs/operations.md, "Scraping": the notes say which monitoring objects the cluster's APIs let
// the chart install, or that none were and what to do.
TEST(ChartNotes, TheMonitoringInstalledOrItsAbsenceIsSaid) {
  const std::string none = Notes(YAML::Node());
  EXPECT_NE(none.find("no\n   scrape objects or alert rules were installed"), std::string::npos)
      << none;
  EXPECT_NE(none.find("gpu-controller-metrics and gpu-agent-metrics"), std::string::npos) << none;
  Release prometheus;
  prometheus.apiVersions = {"monitoring.coreos.com/v1"};
  const std::string withPrometheus = Notes(YAML::Node(), prometheus);
  EXPECT_NE(
      withPrometheus.find("Installed for your monitoring: ServiceMonitors, a PrometheusRule."),
      std::string::npos)
      << withPrometheus;
  Release victoria;
  victoria.apiVersions = {"operator.victoriametrics.com/v1beta1"};
  const std::string withVictoria = Notes(YAML::Node(), victoria);
  EXPECT_NE(withVictoria.find("Installed for your monitoring: VMServiceScrapes, a VMRule."),
            std::string::npos)
      << withVictoria;
  YAML::Node noDashboard;
  noDashboard["monitoring"]["dashboard"]["enabled"] = false;
  EXPECT_NE(none.find("ConfigMap gpu-dashboard"), std::string::npos) << none;
  EXPECT_EQ(Notes(noDashboard).find("gpu-dashboard"), std::string::npos);
}

// Each risky choice of the values gets its own warning, and only that one.
TEST(ChartNotes, EachRiskyValueIsWarnedOf) {
  struct Case {
    YAML::Node values;
    std::string warning;
  };
  const auto gpuOn = [](const std::string& path, const std::string& value) {
    YAML::Node values = GpuOn();
    YAML::Node at = values;
    std::string rest = path;
    for (size_t dot; (dot = rest.find('.')) != std::string::npos; rest = rest.substr(dot + 1)) {
      at.reset(at[rest.substr(0, dot)]);
    }
    at[rest] = YAML::Load(value);
    return values;
  };
  YAML::Node unauthenticated = gpuOn("gpu.webhook.allowUnauthenticatedCallers", "true");
  unauthenticated["gpu"]["webhook"]["clientCA"] = "";
  YAML::Node outside = HosterCertificate();
  outside["gpu"]["rawGpuNames"] = "forbid";
  outside["gpu"]["webhook"]["url"] = "https://192.0.2.1:9443";
  YAML::Node oneOff = YAML::Load("controller: {replicas: 0}");
  const std::vector<Case> cases = {
      {gpuOn("controller.replicas", "1"), "controller.replicas is 1 with GPU mode on"},
      {oneOff, "controller.replicas is 0"},
      {unauthenticated, "gpu.webhook.allowUnauthenticatedCallers is true"},
      {gpuOn("gpu.webhook.networkPolicy.enabled", "false"),
       "gpu.webhook.networkPolicy.enabled is false"},
      {gpuOn("gpu.rawGpuNames", "allow"), "gpu.rawGpuNames is allow"},
      {outside, "gpu.webhook.url is https://192.0.2.1:9443"},
      {gpuOn("policies.platformGroups", "[cozy-operators]"),
       "policies.platformGroups trusts the group cozy-operators"},
  };
  for (const auto& [values, warning] : cases) {
    const std::string notes = Notes(values);
    EXPECT_NE(notes.find("WARNING: " + warning), std::string::npos) << warning << "\n" << notes;
    EXPECT_EQ(Count(notes, "WARNING: "), 1u) << warning << "\n" << notes;
  }
  // With a client CA the opt-out is moot; with GPU mode off one replica blocks no webhook.
  EXPECT_EQ(Notes(gpuOn("gpu.webhook.allowUnauthenticatedCallers", "true")).find("WARNING"),
            std::string::npos);
  EXPECT_EQ(Notes(YAML::Load("controller: {replicas: 1}")).find("WARNING"), std::string::npos);
}

// ---- charts/vm-instance: the example tenant VM ----

namespace vm {

const std::filesystem::path kVmChart =
    std::filesystem::path(COZY_SOURCE_DIR) / "charts/vm-instance";

YAML::Node VirtualMachine(const YAML::Node& overrides) {
  const auto documents = RenderChart(kVmChart, overrides, Release{"vm1", "tenant-a", {}});
  EXPECT_EQ(documents.size(), 1u);
  if (documents.empty()) return YAML::Node();
  const YAML::Node vm = YAML::Load(documents[0].text);
  EXPECT_EQ(vm["apiVersion"].as<std::string>(""), "kubevirt.io/v1");
  EXPECT_EQ(vm["kind"].as<std::string>(""), "VirtualMachine");
  return vm;
}

nlohmann::json Pins() {
  std::ifstream in(std::string(COZY_SOURCE_DIR) + "/test/chart/vm-instance-pins.json");
  return nlohmann::json::parse(in);
}

// Without GPUs the VMI template carries neither the label nor the annotation: the webhooks never
// see it.
TEST(VmInstanceChart, WithoutGpusTheTemplateHasNoDeviceReferences) {
  const YAML::Node vm = VirtualMachine(YAML::Node());
  EXPECT_EQ(vm["metadata"]["name"].as<std::string>(""), "vm1");
  EXPECT_EQ(vm["metadata"]["namespace"].as<std::string>(""), "tenant-a");
  const YAML::Node metadata = vm["spec"]["template"]["metadata"];
  EXPECT_FALSE(metadata["labels"][std::string(api::kDeviceReferenceLabel)].IsDefined());
  EXPECT_FALSE(metadata["annotations"].IsDefined());
  EXPECT_EQ(vm["spec"]["template"]["spec"]["domain"]["cpu"]["cores"].as<int>(0), 2);
  const YAML::Node chart = YAML::LoadFile((kVmChart / "Chart.yaml").string());
  EXPECT_EQ(chart["version"].as<std::string>(""), COZY_VERSION);
}

// The annotation pinned, character for character, for every case in vm-instance-pins.json (read
// back through the VMI webhook's parser by another test); with it, the label the webhooks select.
TEST(VmInstanceChart, DeviceReferenceAnnotationIsPinned) {
  const nlohmann::json pins = Pins();
  ASSERT_GE(pins.size(), 4u);
  bool devicesOnly = false, templatesOnly = false, both = false, several = false;
  for (const auto& pin : pins) {
    const std::string values = pin.at("values").dump();
    const std::string annotation = pin.at("annotation").get<std::string>();
    // JSON is YAML: the values go in as a values file would.
    const YAML::Node vm = VirtualMachine(YAML::Load(values));
    const YAML::Node metadata = vm["spec"]["template"]["metadata"];
    EXPECT_EQ(
        metadata["annotations"][std::string(api::kDeviceReferenceAnnotation)].as<std::string>(""),
        annotation)
        << values;
    const YAML::Node label = metadata["labels"][std::string(api::kDeviceReferenceLabel)];
    EXPECT_EQ(label.as<std::string>(""), api::kDeviceReferenceLabelValue) << values;
    EXPECT_EQ(label.Tag(), "!") << "the label value must stay a string";
    EXPECT_EQ(metadata["annotations"].size(), 1u);

    // The pin itself has the contract's shape: compact, keys in this order, empty lists left
    // out, and says what the values say.
    const auto parsed = nlohmann::ordered_json::parse(annotation);
    EXPECT_EQ(parsed.dump(), annotation) << "not compact";
    std::vector<std::string> keys;
    for (const auto& [key, unused] : parsed.items()) keys.push_back(key);
    const nlohmann::json gpus = pin.at("values").at("gpus");
    const auto devices = gpus.value("devices", nlohmann::json::array());
    const auto templates = gpus.value("templates", nlohmann::json::array());
    std::vector<std::string> expectedKeys;
    if (!devices.empty()) expectedKeys.push_back("devices");
    if (!templates.empty()) expectedKeys.push_back("templates");
    EXPECT_EQ(keys, expectedKeys) << annotation;
    if (!devices.empty()) {
      EXPECT_EQ(nlohmann::json(parsed.at("devices")), devices);
    }
    if (!templates.empty()) {
      ASSERT_EQ(parsed.at("templates").size(), templates.size());
      for (size_t i = 0; i < templates.size(); ++i) {
        std::vector<std::string> order;
        for (const auto& [key, unused] : parsed.at("templates")[i].items()) order.push_back(key);
        EXPECT_EQ(order, (std::vector<std::string>{"name", "className", "count"})) << annotation;
        EXPECT_EQ(nlohmann::json(parsed.at("templates")[i]), templates[i]);
        EXPECT_TRUE(parsed.at("templates")[i].at("count").is_number_integer()) << annotation;
      }
    }
    devicesOnly = devicesOnly || (devices.size() == 1 && templates.empty());
    templatesOnly = templatesOnly || (devices.empty() && templates.size() == 1);
    both = both || (!devices.empty() && !templates.empty());
    several = several || (devices.size() > 1 && templates.size() > 1);
  }
  EXPECT_TRUE(devicesOnly && templatesOnly && both && several)
      << "pins cover devices only, templates only, both, and several of each";
}

}  // namespace vm

}  // namespace
}  // namespace cozy::chart
