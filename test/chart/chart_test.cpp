// charts/gpu rendered with its default values and with custom-values.yaml by the test-only
// renderer (chart_render.h), and the manifests checked as the API server and kubelet would
// take them: they parse, name what exists, mount the host read-only, ask for the least RBAC.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

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
  };
  for (const auto& overrides : {YAML::Node(), Custom()}) {
    const auto documents = Render(overrides);
    ASSERT_GE(documents.size(), 4u);
    for (const auto& document : documents) {
      ASSERT_TRUE(document.IsMap());
      const std::string kind = document["kind"].as<std::string>("");
      ASSERT_TRUE(apiVersions.contains(kind)) << "unexpected kind '" << kind << "'";
      EXPECT_EQ(document["apiVersion"].as<std::string>(""), apiVersions.at(kind)) << kind;
      EXPECT_FALSE(document["metadata"]["name"].as<std::string>("").empty()) << kind;
    }
    for (const char* kind : {"DaemonSet", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"}) {
      EXPECT_EQ(OfKind(documents, kind).size(), 1u) << kind;
    }
  }
}

TEST(Chart, NamespacedObjectsGoToTheReleaseNamespace) {
  const auto documents = Render();
  for (const char* kind : {"DaemonSet", "ServiceAccount"}) {
    EXPECT_EQ(Only(documents, kind)["metadata"]["namespace"].as<std::string>(""), "cozy-gpu");
  }
  for (const char* kind : {"ClusterRole", "ClusterRoleBinding"}) {
    EXPECT_FALSE(Only(documents, kind)["metadata"]["namespace"].IsDefined()) << kind;
  }
}

TEST(Chart, DaemonSetRunsAsTheBoundServiceAccount) {
  const auto documents = Render();
  const YAML::Node account = Only(documents, "ServiceAccount");
  const std::string name = account["metadata"]["name"].as<std::string>();
  const YAML::Node daemonSet = Only(documents, "DaemonSet");
  EXPECT_EQ(PodSpec(documents)["serviceAccountName"].as<std::string>(""), name);
  const YAML::Node binding = Only(documents, "ClusterRoleBinding");
  EXPECT_EQ(binding["roleRef"]["kind"].as<std::string>(""), "ClusterRole");
  EXPECT_EQ(binding["roleRef"]["name"].as<std::string>(""),
            Only(documents, "ClusterRole")["metadata"]["name"].as<std::string>());
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
  const YAML::Node account = Only(documents, "ServiceAccount");
  EXPECT_EQ(account["metadata"]["namespace"].as<std::string>(""), "gpu-system");
  const std::string user =
      "system:serviceaccount:gpu-system:" + account["metadata"]["name"].as<std::string>();
  std::set<std::string> policies;
  for (const auto& policy : OfKind(documents, "ValidatingAdmissionPolicy")) {
    policies.insert(policy["metadata"]["name"].as<std::string>());
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
  const std::set<Rule> expected = {
      {"gpu.cozystack.io", "gpunodes", {"get", "create"}},
      {"gpu.cozystack.io", "gpunodes/status", {"patch"}},
      {"", "nodes", {"get"}},
      {"", "pods", {"list", "watch"}},
  };
  for (const auto& overrides : {YAML::Node(), Custom()}) {
    const auto documents = Render(overrides);
    std::set<Rule> rules;
    for (const auto& rule : Only(documents, "ClusterRole")["rules"]) {
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
    EXPECT_TRUE(OfKind(documents, "Role").empty());
    EXPECT_TRUE(OfKind(documents, "RoleBinding").empty());
  }
}

TEST(Chart, CrdsParseAndTheGpuNodeHasTheStatusTheAgentPatches) {
  size_t count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kChart / "crds")) {
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

// The renderer itself: the subset it knows, and refusal of everything else.
Context TestContext() {
  Context context;
  context.values = YAML::Load(
      "a: {b: x, n: 7, t: true, f: false, zero: 0, empty: '', s: 'false', map: {k: v, q: 'true'}"
      ", list: [1, two], none: {}, nil: null}");
  context.chart = YAML::Load("{name: gpu, version: 1.2.3, appVersion: 4.5.6}");
  return context;
}

TEST(ChartRenderer, RendersTheSubsetAsHelmDoes) {
  const Context context = TestContext();
  EXPECT_EQ(RenderTemplate("v: {{ .Values.a.b }} {{ .Values.a.n | quote }}", context),
            "v: x \"7\"");
  EXPECT_EQ(RenderTemplate("{{ .Release.Name }}/{{ .Release.Namespace }} {{ .Chart.Name }}"
                           " {{ .Chart.Version }} {{ .Chart.AppVersion }}",
                           context),
            "gpu/cozy-gpu gpu 1.2.3 4.5.6");
  EXPECT_EQ(RenderTemplate("m:\n  {{- toYaml .Values.a.map | nindent 2 }}\nend", context),
            "m:\n  k: v\n  q: \"true\"\nend");
  EXPECT_EQ(RenderTemplate("l:\n{{- toYaml .Values.a.list | nindent 0 }}", context),
            "l:\n- 1\n- two");
  EXPECT_EQ(RenderTemplate("a {{- /* note */ -}} b", context), "ab");
  EXPECT_EQ(RenderTemplate("x\n{{- if .Values.a.t }}\ny{{ else }}\nn{{ end }}", context), "x\ny");
  for (const char* falsy : {"f", "zero", "empty", "none", "nil", "missing"}) {
    EXPECT_EQ(RenderTemplate(std::string("{{ if .Values.a.") + falsy + " }}y{{ else }}n{{ end }}",
                             context),
              "n")
        << falsy;
  }
  for (const char* truthy : {"t", "n", "b", "s", "map", "list"}) {
    EXPECT_EQ(RenderTemplate(std::string("{{ if .Values.a.") + truthy + " }}y{{ end }}", context),
              "y")
        << truthy;
  }
  EXPECT_EQ(RenderTemplate("{{ if .Values.a.t }}{{ if .Values.a.f }}1{{ else }}2{{ end }}{{ end }}",
                           context),
            "2");
}

TEST(ChartRenderer, RefusesWhatIsOutsideTheSubset) {
  const Context context = TestContext();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{{ range .Values.a.list }}x{{ end }}", "outside the chart's template subset"},
      {"{{ include \"x\" . }}", "outside the chart's template subset"},
      {"{{ template \"x\" }}", "outside the chart's template subset"},
      {"{{ $x := 1 }}", "outside the chart's template subset"},
      {"{{ .Values.a.b | default \"y\" }}", "outside the chart's template subset"},
      {"{{ .Values.a.b | upper }}", "outside the chart's template subset"},
      {"{{ with .Values.a }}x{{ end }}", "outside the chart's template subset"},
      {"{{ if .Values.a.t }}x{{ else if .Values.a.f }}y{{ end }}",
       "outside the chart's template subset"},
      {"{{ .Capabilities.KubeVersion }}", "outside the chart's template subset"},
      {"{{ toYaml .Values.a.map }}", "must be followed by '| nindent N'"},
      {"{{ .Values.a.map }}", "is a map or list"},
      {"{{ .Values.a.missing }}", ".Values.a.missing has no value"},
      {"{{ .Values.a.nil }}", "has no value"},
      {"{{ if .Values.a.f }}{{ .Values.a.b | upper }}{{ end }}", "outside the chart's"},
      {"{{ if .Values.a.t }}x", "'if' without 'end'"},
      {"x{{ end }}", "'end' without 'if'"},
      {"x {{ .Values.a.b ", "'{{' without '}}'"},
      {"{{-.Values.a.b }}", "needs a space"},
      {"a\n\n{{ lookup \"v1\" \"Node\" \"\" \"\" }}", "t.yaml:3:"},
  };
  for (const auto& [text, message] : cases) {
    try {
      RenderTemplate(text, context, "t.yaml");
      ADD_FAILURE() << "rendered: " << text;
    } catch (const RenderError& error) {
      EXPECT_NE(std::string(error.what()).find(message), std::string::npos)
          << text << " -> " << error.what();
    }
  }
}

TEST(ChartRenderer, MergesValuesAsHelmDoes) {
  const YAML::Node merged = MergeValues(YAML::Load("{a: {b: 1, c: 2}, l: [1, 2], s: x}"),
                                        YAML::Load("{a: {c: 3, d: 4, b: null}, l: [9], t: y}"));
  EXPECT_FALSE(merged["a"]["b"].IsDefined());
  EXPECT_EQ(merged["a"]["c"].as<int>(), 3);
  EXPECT_EQ(merged["a"]["d"].as<int>(), 4);
  EXPECT_EQ(merged["l"].size(), 1u);
  EXPECT_EQ(merged["s"].as<std::string>(), "x");
  EXPECT_EQ(merged["t"].as<std::string>(), "y");
}

}  // namespace
}  // namespace cozy::chart
