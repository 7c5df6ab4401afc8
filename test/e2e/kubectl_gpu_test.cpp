// `kubectl gpu` against the fake API server on a state like the demo's: two GPU nodes (one
// cordoned), a class, a tenant with a budget and orders bound, pending and refused. Each
// command in each output format, --namespace and --context, kubeconfigs it cannot use, and one
// run through kubectl's own plugin discovery.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "api/keys.h"
#include "controller/kubectl_gpu/plugin.h"
#include "kube/client.h"
#include "kube/config.h"
#include "test/fakes/fake_apiserver.h"
#include "test/kube/kube_test_support.h"
#include "test/support/fixture_host.h"
#include "test/support/gpu_objects.h"
#include "test/support/process.h"

namespace cozy::e2e {
namespace {

using nlohmann::json;
using testing::RunCommand;
using testing::ShellQuote;

json Namespace(const std::string& name, json labels = json::object()) {
  return {{"apiVersion", "v1"},
          {"kind", "Namespace"},
          {"metadata", {{"name", name}, {"labels", labels}}}};
}

json Device(const std::string& ns, const std::string& name, int count,
            json status = json::object()) {
  json device = {{"apiVersion", "gpu.cozystack.io/v1alpha1"},
                 {"kind", "GPUDevice"},
                 {"metadata", {{"name", name}, {"namespace", ns}}},
                 {"spec", {{"className", "a100"}, {"count", count}}}};
  if (!status.empty()) device["status"] = status;
  return device;
}

// The settings ConfigMap gpu-controller publishes in its namespace.
json Settings(const std::string& ns) {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", {{"name", std::string(api::kSettingsConfigMapName)}, {"namespace", ns}}},
          {"data",
           {{std::string(api::kSettingsResourceNamesKey), "nvidia.com/GA100"},
            {std::string(api::kSettingsRawNamePolicyKey), "allowed"}}}};
}

// The lines of a table, each split on runs of two or more blanks.
std::vector<std::vector<std::string>> Rows(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::stringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::vector<std::string> cells;
    size_t start = 0;
    while (start < line.size()) {
      size_t gap = line.find("  ", start);
      cells.push_back(
          line.substr(start, gap == std::string::npos ? std::string::npos : gap - start));
      if (gap == std::string::npos) break;
      start = line.find_first_not_of(' ', gap);
    }
    rows.push_back(std::move(cells));
  }
  return rows;
}

class KubectlGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    fake::FakeApiServerOptions options;
    options.crdPaths = {testing::ChartCrdDir(), testing::TestCrdDir()};
    server_ = std::make_unique<fake::FakeApiServer>(options);
    server_->Start();
    server_->SetAcceptedTokens({"hoster"});
    // The demo's cluster: gpu-1 and gpu-2 serve 2 units each; gpu-2 is cordoned.
    // Tenant namespaces carry the label the hoster sets on them (docs/install.md, "Tenant
    // namespaces"); the controller is installed in gpu-system, not the default cozy-system, and
    // has published its settings there.
    const json tenant = {{std::string(api::kTenantNamespaceLabel), "true"}};
    server_->Seed(Namespace("tenant-root", tenant));
    json child = tenant;
    child["tenant.cozystack.io/tenant-root"] = "true";
    server_->Seed(Namespace("tenant-a", child));
    server_->Seed(Namespace("tenant-b", child));
    server_->Seed(Namespace("gpu-system"));
    server_->Seed(Settings("gpu-system"));
    server_->Seed(testing::ReadyNode("gpu-1"));
    json cordoned = testing::ReadyNode("gpu-2");
    cordoned["spec"] = {{"unschedulable", true}};
    server_->Seed(cordoned);
    server_->Seed(testing::GpuNodeObject("gpu-1", 2));
    server_->Seed(testing::GpuNodeObject("gpu-2", 2));
    server_->Seed(testing::GpuClassObject("a100"));
    // tenant-a may hold 2 A100s: one is bound, one pending order fits, a second does not.
    server_->Seed({{"apiVersion", "v1"},
                   {"kind", "ResourceQuota"},
                   {"metadata", {{"name", "gpus"}, {"namespace", "tenant-a"}}},
                   {"spec", {{"hard", {{"requests.gpu.cozystack.io/a100", "2"}}}}}});
    server_->Seed(Device("tenant-a", "bound", 1, {{"phase", "Bound"}, {"nodeName", "gpu-1"}}));
    server_->Seed(Device("tenant-a", "pending", 1));
    server_->Seed(Device("tenant-a", "too-many", 2));
    server_->Seed(Device("tenant-b", "other", 1));

    const std::string url = server_->url();
    std::ofstream(Path("kubeconfig")) << "apiVersion: v1\n"
                                         "kind: Config\n"
                                         "current-context: demo\n"
                                         "clusters:\n"
                                         "- name: fake\n"
                                         "  cluster: {server: '"
                                      << url
                                      << "'}\n"
                                         "- name: nowhere\n"
                                         "  cluster: {server: 'http://127.0.0.1:"
                                      << testing::FreePort()
                                      << "'}\n"
                                         "users:\n"
                                         "- name: hoster\n"
                                         "  user: {token: hoster}\n"
                                         "- name: stranger\n"
                                         "  user: {token: stranger}\n"
                                         "contexts:\n"
                                         "- name: demo\n"
                                         "  context: {cluster: fake, user: hoster, namespace: "
                                         "tenant-a}\n"
                                         "- name: team-b\n"
                                         "  context: {cluster: fake, user: hoster, namespace: "
                                         "tenant-b}\n"
                                         "- name: nowhere\n"
                                         "  context: {cluster: nowhere, user: hoster}\n"
                                         "- name: stranger\n"
                                         "  context: {cluster: fake, user: stranger}\n";
  }
  void TearDown() override { server_->Stop(); }

  std::filesystem::path Path(const std::string& name) const { return directory_.path() / name; }

  // kubectl-gpu with the test's kubeconfig (unless `kubeconfig` is false) and `arguments`.
  testing::CommandResult Plugin(const std::string& arguments, bool kubeconfig = true) {
    return RunCommand(
        std::string(KUBECTL_GPU) + " " + arguments +
        (kubeconfig ? " --kubeconfig " + ShellQuote(Path("kubeconfig").string()) : ""));
  }
  json PluginJson(const std::string& arguments) {
    const auto result = Plugin(arguments + " -o json");
    EXPECT_EQ(result.exitCode, 0) << arguments << ": " << result.err;
    return result.exitCode == 0 ? json::parse(result.out) : json();
  }
  YAML::Node PluginYaml(const std::string& arguments) {
    const auto result = Plugin(arguments + " -o yaml");
    EXPECT_EQ(result.exitCode, 0) << arguments << ": " << result.err;
    return YAML::Load(result.out);
  }

  testing::TempDir directory_;
  std::unique_ptr<fake::FakeApiServer> server_;
};

TEST_F(KubectlGpu, CatalogTableShowsTotalUsedAndFreeUnits) {
  const auto result = Plugin("catalog");
  ASSERT_EQ(result.exitCode, 0) << result.err;
  EXPECT_EQ(result.err, "");
  const auto rows = Rows(result.out);
  ASSERT_EQ(rows.size(), 2u) << result.out;
  EXPECT_EQ(rows[0],
            (std::vector<std::string>{"CLASS", "UNITS", "USED", "FREE", "MAXCOUNT", "SOURCE"}));
  // 4 units on two nodes, 1 held by the bound order; gpu-2 is cordoned, so 1 free.
  EXPECT_EQ(rows[1],
            (std::vector<std::string>{"a100", "4", "1", "1", "-", "devicePlugin nvidia.com/GA100"}))
      << result.out;
}

// C19: a dra class is listed like the others, its units read from gpu-agent's ResourceSlice
// (two A100s of gpu-3 no device plugin advertises) and an allocated claim holding one.
TEST_F(KubectlGpu, C19_CatalogListsADraClassFromTheSlicesAndClaims) {
  server_->Seed(testing::ReadyNode("gpu-3"));
  json status = testing::GpuNodeStatus(0);
  status["resourceNames"] = json::array();
  json function = status["devices"][0];
  function["resources"] = json::array();
  function["health"] = "Unadvertised";
  status["devices"] = {function, function};
  status["devices"][1]["pciAddress"] = "0000:af:00.0";
  server_->Seed({{"apiVersion", "gpu.cozystack.io/v1alpha1"},
                 {"kind", "GPUNode"},
                 {"metadata", {{"name", "gpu-3"}}},
                 {"status", status}});
  json draClass = testing::GpuClassObject("a100-dra");
  draClass["spec"]["source"] = {{"dra", {{"pciVendorSelector", "10DE:20B5"}}}};
  server_->Seed(draClass);
  auto device = [](const std::string& address, const std::string& name) {
    return json{{"name", name},
                {"attributes",
                 {{"resource.kubernetes.io/pciBusID", {{"string", address}}},
                  {"vendorID", {{"string", "10de"}}},
                  {"deviceID", {{"string", "20b5"}}}}}};
  };
  server_->Seed({{"apiVersion", "resource.k8s.io/v1"},
                 {"kind", "ResourceSlice"},
                 {"metadata", {{"name", "gpu-3-gpu.cozystack.io"}}},
                 {"spec",
                  {{"driver", "gpu.cozystack.io"},
                   {"nodeName", "gpu-3"},
                   {"pool", {{"name", "gpu-3"}, {"generation", 1}, {"resourceSliceCount", 1}}},
                   {"devices",
                    {device("0000:3b:00.0", "pci-0000-3b-00-0"),
                     device("0000:af:00.0", "pci-0000-af-00-0")}}}}});
  server_->Seed({{"apiVersion", "resource.k8s.io/v1"},
                 {"kind", "ResourceClaim"},
                 {"metadata", {{"name", "by-hand"}, {"namespace", "tenant-b"}}},
                 {"spec", {{"devices", {{"requests", json::array()}}}}},
                 {"status",
                  {{"allocation",
                    {{"devices",
                      {{"results",
                        {{{"request", "gpu"},
                          {"driver", "gpu.cozystack.io"},
                          {"pool", "gpu-3"},
                          {"device", "pci-0000-af-00-0"}}}}}}}}}}});
  const json catalog = PluginJson("catalog --nodes");
  ASSERT_EQ(catalog["classes"].size(), 2u) << catalog.dump(2);
  const json& dra = catalog["classes"][1];
  EXPECT_EQ(dra["name"], "a100-dra");
  EXPECT_EQ(dra["source"], "dra 10DE:20B5");
  EXPECT_EQ(dra["units"], 2);
  EXPECT_EQ(dra["used"], 1) << "the claim holds one";
  EXPECT_EQ(dra["free"], 1);
  EXPECT_EQ(catalog["classes"][0]["units"], 4) << "the device-plugin class is as before";
}

TEST_F(KubectlGpu, CatalogPerNodeInEachFormat) {
  const auto table = Plugin("catalog --nodes");
  ASSERT_EQ(table.exitCode, 0) << table.err;
  const auto rows = Rows(table.out);
  ASSERT_EQ(rows.size(), 4u) << table.out;
  EXPECT_EQ(rows[0],
            (std::vector<std::string>{"CLASS", "NODE", "TAKES BINDS", "UNITS", "USED", "FREE"}));
  EXPECT_EQ(rows[2], (std::vector<std::string>{"a100", "gpu-1", "yes", "2", "1", "1"}));
  EXPECT_EQ(rows[3], (std::vector<std::string>{"a100", "gpu-2", "no", "2", "0", "2"}));

  const json catalog = PluginJson("catalog --nodes");
  ASSERT_EQ(catalog["classes"].size(), 1u) << catalog.dump(2);
  const json& a100 = catalog["classes"][0];
  EXPECT_EQ(a100["name"], "a100");
  EXPECT_EQ(a100["units"], 4);
  EXPECT_EQ(a100["used"], 1);
  EXPECT_EQ(a100["free"], 1);
  EXPECT_TRUE(a100["maxCount"].is_null());
  ASSERT_EQ(a100["nodes"].size(), 2u);
  EXPECT_EQ(
      a100["nodes"][1],
      (json{{"name", "gpu-2"}, {"takesBinds", false}, {"units", 2}, {"used", 0}, {"free", 2}}));
  // Without --nodes, no per-node list.
  EXPECT_FALSE(PluginJson("catalog")["classes"][0].contains("nodes"));

  const YAML::Node yaml = PluginYaml("catalog --nodes");
  EXPECT_EQ(yaml["classes"][0]["name"].as<std::string>(), "a100");
  EXPECT_EQ(yaml["classes"][0]["free"].as<int>(), 1);
  EXPECT_TRUE(yaml["classes"][0]["maxCount"].IsNull());
  EXPECT_EQ(yaml["classes"][0]["nodes"][0]["name"].as<std::string>(), "gpu-1");
  EXPECT_TRUE(yaml["classes"][0]["nodes"][0]["takesBinds"].as<bool>());
}

TEST_F(KubectlGpu, NodesSayWhichTakeBindsAndWhyNotInEachFormat) {
  const auto table = Plugin("nodes");
  ASSERT_EQ(table.exitCode, 0) << table.err;
  const auto rows = Rows(table.out);
  ASSERT_EQ(rows.size(), 3u) << table.out;
  EXPECT_EQ(rows[0], (std::vector<std::string>{"NODE", "FUNCTIONS", "UNITS", "ALLOCATED", "CLASSES",
                                               "TAKES BINDS", "WHY NOT"}));
  EXPECT_EQ(rows[1], (std::vector<std::string>{"gpu-1", "1", "2", "0", "a100 1/2 free", "yes"}))
      << table.out;
  ASSERT_EQ(rows[2].size(), 7u) << table.out;
  EXPECT_EQ(rows[2][0], "gpu-2");
  EXPECT_EQ(rows[2][5], "no");
  EXPECT_NE(rows[2][6].find("cordon"), std::string::npos) << table.out;

  const json nodes = PluginJson("nodes");
  ASSERT_EQ(nodes["nodes"].size(), 2u) << nodes.dump(2);
  const json& first = nodes["nodes"][0];
  EXPECT_EQ(first["name"], "gpu-1");
  EXPECT_EQ(first["functions"], 1);
  EXPECT_EQ(first["units"], 2);
  EXPECT_EQ(first["resourceNames"], json::array({"nvidia.com/GA100"}));
  EXPECT_EQ(first["takesBinds"], true);
  EXPECT_EQ(first["reasons"], json::array());
  EXPECT_EQ(first["classes"]["a100"], (json{{"units", 2}, {"used", 1}, {"free", 1}}));
  EXPECT_TRUE(first["condition"].is_null());  // no binder ran to write TakesBinds
  EXPECT_EQ(nodes["nodes"][1]["takesBinds"], false);
  EXPECT_FALSE(nodes["nodes"][1]["reasons"].empty());

  const YAML::Node yaml = PluginYaml("nodes");
  EXPECT_EQ(yaml["nodes"][1]["name"].as<std::string>(), "gpu-2");
  EXPECT_FALSE(yaml["nodes"][1]["takesBinds"].as<bool>());
  EXPECT_EQ(yaml["nodes"][1]["reasons"][0].as<std::string>(),
            nodes["nodes"][1]["reasons"][0].get<std::string>());
}

TEST_F(KubectlGpu, WhyExplainsPendingAndRefusedOrdersInEachFormat) {
  // The context's namespace (tenant-a) is the default.
  const json pending = PluginJson("why pending");
  EXPECT_EQ(pending["device"], "tenant-a/pending");
  EXPECT_EQ(pending["phase"], "Pending");
  EXPECT_EQ(pending["decision"]["action"], "bind") << pending.dump(2);
  EXPECT_EQ(pending["decision"]["node"], "gpu-1") << pending.dump(2);
  EXPECT_EQ(pending["budget"]["limitedBy"], "tenant-a");
  EXPECT_EQ(pending["budget"]["key"], "requests.gpu.cozystack.io/a100");
  EXPECT_EQ(pending["room"]["largestNode"], "gpu-1");
  ASSERT_EQ(pending["nodes"].size(), 2u);
  EXPECT_EQ(pending["nodes"][1]["name"], "gpu-2");
  EXPECT_EQ(pending["nodes"][1]["takesBinds"], false);

  const json refused = PluginJson("why too-many");
  EXPECT_EQ(refused["count"], 2);
  EXPECT_EQ(refused["decision"]["action"], "refuse") << refused.dump(2);
  EXPECT_TRUE(refused["decision"]["node"].is_null());
  EXPECT_FALSE(refused["decision"]["reason"].get<std::string>().empty());

  const auto table = Plugin("why too-many");
  ASSERT_EQ(table.exitCode, 0) << table.err;
  EXPECT_NE(table.out.find("DEVICE:    tenant-a/too-many (2 x a100, Pending)"), std::string::npos)
      << table.out;
  EXPECT_NE(
      table.out.find("DECISION:  refuse: " + refused["decision"]["reason"].get<std::string>()),
      std::string::npos)
      << table.out;
  EXPECT_NE(table.out.find("limited by tenant-a (requests.gpu.cozystack.io/a100)"),
            std::string::npos)
      << table.out;
  EXPECT_NE(table.out.find("NODE   TAKES BINDS  UNITS  USED  FREE  WHY NOT"), std::string::npos)
      << table.out;

  const YAML::Node yaml = PluginYaml("why too-many");
  EXPECT_EQ(yaml["decision"]["action"].as<std::string>(), "refuse");
  EXPECT_EQ(yaml["decision"]["reason"].as<std::string>(),
            refused["decision"]["reason"].get<std::string>());
  EXPECT_EQ(yaml["count"].as<int>(), 2);
}

TEST_F(KubectlGpu, WhyIsTheSimulateExplanationOfTheSameCluster) {
  // The cluster as `kubectl get -o json` gives it, read offline by `gpu-controller simulate`.
  const std::string kubectl = "kubectl --kubeconfig " + ShellQuote(Path("kubeconfig").string());
  if (RunCommand("command -v kubectl").exitCode != 0) GTEST_SKIP() << "kubectl is not installed";
  server_->SetAcceptedTokens({});  // kubectl sends no bearer token over plain HTTP
  const auto list = RunCommand(kubectl +
                               " get namespaces,resourcequotas,nodes,pods,gpunodes,"
                               "gpuclasses,gpudevices -A -o json");
  ASSERT_EQ(list.exitCode, 0) << list.err;
  std::ofstream(Path("snapshot.json")) << list.out;
  const auto offline = RunCommand(std::string(GPU_CONTROLLER) + " simulate --snapshot " +
                                  ShellQuote(Path("snapshot.json").string()) +
                                  " --device tenant-a/too-many -o json");
  ASSERT_EQ(offline.exitCode, 0) << offline.err;
  EXPECT_EQ(json::parse(offline.out), PluginJson("why too-many"));
}

TEST_F(KubectlGpu, NamespaceAndContextAreHonoured) {
  // -n picks the order's namespace over the context's.
  EXPECT_EQ(PluginJson("why other -n tenant-b")["device"], "tenant-b/other");
  EXPECT_EQ(PluginJson("--namespace tenant-b why other")["device"], "tenant-b/other");
  const auto missing = Plugin("why other");  // not in tenant-a
  EXPECT_EQ(missing.exitCode, 1);
  EXPECT_EQ(missing.err, "kubectl gpu why: no GPUDevice other in namespace tenant-a\n");
  // --context picks another context, and with it its namespace.
  EXPECT_EQ(PluginJson("why other --context team-b")["device"], "tenant-b/other");
  // KUBECONFIG is read when --kubeconfig is not given.
  const auto fromEnv = RunCommand("KUBECONFIG=" + ShellQuote(Path("kubeconfig").string()) + " " +
                                  KUBECTL_GPU + " why pending -o json");
  ASSERT_EQ(fromEnv.exitCode, 0) << fromEnv.err;
  EXPECT_EQ(json::parse(fromEnv.out)["device"], "tenant-a/pending");
}

TEST_F(KubectlGpu, AKubeconfigItCannotUseIsAClearErrorAndExitTwo) {
  const std::string file = Path("kubeconfig").string();
  struct Case {
    std::string arguments;
    std::string expected;  // the one line on stderr starts so
  };
  const std::vector<Case> cases = {
      {"catalog --kubeconfig " + Path("absent").string(),
       "kubectl gpu: kubeconfig " + Path("absent").string() + " (--kubeconfig): no such file\n"},
      {"catalog --kubeconfig " + file + " --context nope",
       "kubectl gpu: kubeconfig " + file + ": context \"nope\" not found\n"},
      {"catalog --kubeconfig " + file + " --context nowhere",
       "kubectl gpu: cannot reach the API server of context \"nowhere\" of kubeconfig " + file +
           " (server http://127.0.0.1:"},
      {"nodes --kubeconfig " + file + " --context stranger",
       "kubectl gpu: the API server refused the credentials of context \"stranger\" of "
       "kubeconfig " +
           file + " (server " + server_->url() + "): 401 GET /api/v1/namespaces"},
  };
  for (const Case& c : cases) {
    const auto result = Plugin(c.arguments, /*kubeconfig=*/false);
    EXPECT_EQ(result.exitCode, 2) << c.arguments << ": " << result.err;
    EXPECT_TRUE(result.err.starts_with(c.expected)) << c.arguments << ":\n" << result.err;
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
    EXPECT_EQ(result.out, "");
  }
  const auto noFile =
      RunCommand("KUBECONFIG=" + Path("absent").string() + " " + KUBECTL_GPU + " catalog");
  EXPECT_EQ(noFile.exitCode, 2);
  EXPECT_EQ(noFile.err, "kubectl gpu: kubeconfig: no file of KUBECONFIG=" +
                            Path("absent").string() + " exists\n");
}

TEST_F(KubectlGpu, KubectlFindsThePluginOnPath) {
  if (RunCommand("command -v kubectl").exitCode != 0) GTEST_SKIP() << "kubectl is not installed";
  std::filesystem::create_directories(Path("bin"));
  std::filesystem::create_symlink(KUBECTL_GPU, Path("bin/kubectl-gpu"));
  const std::string path = "PATH=" + ShellQuote(Path("bin").string()) + ":\"$PATH\" ";
  const auto plugins = RunCommand(path + "kubectl plugin list");
  EXPECT_NE(plugins.out.find(Path("bin/kubectl-gpu").string()), std::string::npos)
      << plugins.out << plugins.err;
  const auto catalog = RunCommand(path + "kubectl gpu catalog --kubeconfig " +
                                  ShellQuote(Path("kubeconfig").string()));
  ASSERT_EQ(catalog.exitCode, 0) << catalog.err;
  EXPECT_EQ(catalog.out, Plugin("catalog").out);
  const auto why = RunCommand(path + "KUBECONFIG=" + ShellQuote(Path("kubeconfig").string()) +
                              " kubectl gpu why too-many -n tenant-a -o json");
  ASSERT_EQ(why.exitCode, 0) << why.err;
  EXPECT_EQ(json::parse(why.out)["decision"]["action"], "refuse");
  const auto bad = RunCommand(path + "kubectl gpu nodes --kubeconfig " +
                              ShellQuote(Path("kubeconfig").string()) + " --context nope");
  EXPECT_EQ(bad.exitCode, 2) << bad.err;
}

// docs/kubectl-gpu.md, "Flags": the settings ConfigMap is read where the controller is installed,
// which need not be cozy-system: --controller-namespace names it; without the flag cozy-system is
// asked first, then the one namespace holding a ConfigMap of that name. When none or several are
// found a warning says so (the command still answers).
TEST_F(KubectlGpu, SettingsAreReadWhereTheControllerIsInstalled) {
  const std::string inDefault = "/api/v1/namespaces/cozy-system/configmaps/cozy-gpu-settings";
  const std::string inRelease = "/api/v1/namespaces/gpu-system/configmaps/cozy-gpu-settings";
  const auto settingsRequests = [&] {
    std::vector<std::string> seen;
    for (const auto& request : server_->Requests()) {
      if (request.path.find("configmaps") == std::string::npos) continue;
      seen.push_back(request.method + " " + request.path +
                     (request.query.empty() ? "" : "?" + request.query));
    }
    server_->ClearRequests();
    return seen;
  };
  server_->ClearRequests();

  // Found in gpu-system by its name, without a flag.
  auto result = Plugin("catalog");
  ASSERT_EQ(result.exitCode, 0) << result.err;
  EXPECT_EQ(result.err, "");
  auto seen = settingsRequests();
  ASSERT_EQ(seen.size(), 2u) << ::testing::PrintToString(seen);
  EXPECT_EQ(seen[0], "GET " + inDefault);
  EXPECT_TRUE(seen[1].starts_with("GET /api/v1/configmaps?")) << seen[1];
  EXPECT_NE(seen[1].find("fieldSelector=metadata.name"), std::string::npos) << seen[1];
  EXPECT_NE(seen[1].find("cozy-gpu-settings"), std::string::npos) << seen[1];

  // Named: read there, nothing else asked.
  result = Plugin("catalog --controller-namespace gpu-system");
  ASSERT_EQ(result.exitCode, 0) << result.err;
  EXPECT_EQ(result.err, "");
  EXPECT_EQ(settingsRequests(), std::vector<std::string>{"GET " + inRelease});

  // Named wrong: the answer still comes, with one warning line naming the namespace.
  result = Plugin("nodes --controller-namespace cozy-system");
  ASSERT_EQ(result.exitCode, 0) << result.err;
  EXPECT_EQ(result.err,
            "kubectl gpu: warning: no ConfigMap cozy-gpu-settings in namespace cozy-system "
            "(--controller-namespace), where a running gpu-controller publishes it: the "
            "hoster's extra GPU resource names (gpu.resourceNames) are not counted\n");
  EXPECT_EQ(result.out, Plugin("nodes --controller-namespace gpu-system").out);
  settingsRequests();

  // In cozy-system (the default) it is read there alone.
  server_->Seed(Namespace("cozy-system"));
  server_->Seed(Settings("cozy-system"));
  result = Plugin("catalog -o json");
  ASSERT_EQ(result.exitCode, 0) << result.err;
  EXPECT_EQ(result.err, "");
  EXPECT_EQ(settingsRequests(), std::vector<std::string>{"GET " + inDefault});
}

// H9: an install whose webhooks answer any TLS client (the controller's opt-out, which it
// records in its settings) is a warning on every command; an authenticated one is not.
TEST_F(KubectlGpu, H9_AnInstallWhoseWebhooksAnswerAnyCallerIsAWarning) {
  json open = Settings("open-system");
  open["data"][std::string(api::kSettingsWebhookCallersKey)] =
      std::string(api::kWebhookCallersUnauthenticated);
  server_->Seed(Namespace("open-system"));
  server_->Seed(open);
  for (const std::string command : {"catalog", "nodes -o json"}) {
    const auto result = Plugin(command + " --controller-namespace open-system");
    ASSERT_EQ(result.exitCode, 0) << result.err;
    EXPECT_NE(result.err.find("kubectl gpu: warning: the GPU admission webhooks answer any TLS "
                              "client that reaches them"),
              std::string::npos)
        << command << ": " << result.err;
  }
  json authenticated = Settings("closed-system");
  authenticated["data"][std::string(api::kSettingsWebhookCallersKey)] =
      std::string(api::kWebhookCallersAuthenticated);
  server_->Seed(Namespace("closed-system"));
  server_->Seed(authenticated);
  EXPECT_EQ(Plugin("catalog --controller-namespace closed-system").err, "");
}

TEST_F(KubectlGpu, SettingsInNoneOrSeveralNamespacesAreAWarning) {
  server_->Seed(Namespace("other"));
  server_->Seed(Settings("other"));
  auto result = Plugin("catalog");
  ASSERT_EQ(result.exitCode, 0) << result.err;
  EXPECT_EQ(result.err,
            "kubectl gpu: warning: a ConfigMap cozy-gpu-settings in each of the namespaces "
            "gpu-system, other: give the one gpu-controller is installed in as "
            "--controller-namespace: the hoster's extra GPU resource names (gpu.resourceNames) "
            "are not counted\n");
  EXPECT_EQ(Plugin("catalog --controller-namespace other").err, "");

  // Gone everywhere: the controller has not published them.
  kube::ClientConfig config;
  config.server = server_->url();
  config.token = "hoster";
  kube::Client client(config);
  for (const std::string ns : {"gpu-system", "other"}) {
    client.Delete(
        kube::ResourcePath("", "v1", "configmaps", ns, std::string(api::kSettingsConfigMapName)));
  }
  result = Plugin("catalog");
  ASSERT_EQ(result.exitCode, 0) << result.err;
  EXPECT_EQ(result.err,
            "kubectl gpu: warning: no ConfigMap cozy-gpu-settings in any namespace: "
            "gpu-controller has not published its settings: the hoster's extra GPU resource "
            "names (gpu.resourceNames) are not counted\n");
}

// A namespace with GPU orders but without gpu.cozystack.io/tenant-namespace is one
// the chart's raw-name and usage-monitor policies do not cover (F16): every command says so on
// stderr, leaving its output (a JSON document here) as it was.
TEST_F(KubectlGpu, WarnsOfANamespaceWithOrdersButNoTenantLabel) {
  const json before = PluginJson("catalog");
  server_->Seed(Namespace("tenant-c", {{"tenant.cozystack.io/tenant-root", "true"}}));
  server_->Seed(Device("tenant-c", "unlabelled", 1));
  server_->Seed(Namespace("quiet"));  // no label, no orders: nothing to say
  const std::string warning =
      "kubectl gpu: warning: namespace tenant-c has GPU orders but not the label "
      "gpu.cozystack.io/tenant-namespace: the chart's raw-name and usage-monitor policies do "
      "not cover it (docs/install.md, \"Tenant namespaces\")\n"
      // F18: and, being of the tenant tree, the model names it as well.
      "kubectl gpu: warning: Namespace tenant-c: metadata.labels: carries a "
      "tenant.cozystack.io/ label but not gpu.cozystack.io/tenant-namespace: the GPU raw-name "
      "and usage-monitor policies do not cover it; label it\n";
  for (const std::string command : {"catalog -o json", "nodes", "why pending"}) {
    const auto result = Plugin(command);
    ASSERT_EQ(result.exitCode, 0) << command << ": " << result.err;
    EXPECT_EQ(result.err, warning) << command;
  }
  EXPECT_EQ(json::parse(Plugin("catalog -o json").out), before);
}

// A tenant's orders are counted whether or not a budget applies to it. tenant-b has
// no ResourceQuota; tenant-solo has none either and is no sub-tenant of anyone (only the
// tenant-namespace label), so the model's tenant tree does not list it.
TEST_F(KubectlGpu, WhyCountsTheOrdersOfATenantWithoutABudget) {
  const json other = PluginJson("why other -n tenant-b");
  EXPECT_EQ(other["budget"]["ordered"], 1) << other.dump(2);
  EXPECT_TRUE(other["budget"]["remaining"].is_null()) << other.dump(2);
  server_->Seed(Namespace("tenant-solo", {{std::string(api::kTenantNamespaceLabel), "true"}}));
  server_->Seed(Device("tenant-solo", "first", 2));
  server_->Seed(Device("tenant-solo", "second", 1, {{"phase", "Bound"}, {"nodeName", "gpu-1"}}));
  const json solo = PluginJson("why first -n tenant-solo");
  EXPECT_EQ(solo["budget"]["ordered"], 3) << solo.dump(2);
  EXPECT_TRUE(solo["budget"]["remaining"].is_null()) << solo.dump(2);
  const auto table = Plugin("why first -n tenant-solo");
  ASSERT_EQ(table.exitCode, 0) << table.err;
  EXPECT_NE(table.out.find("BUDGET:    3 ordered in tenant-solo and its sub-tenants, unlimited "
                           "remaining\n"),
            std::string::npos)
      << table.out;
}

TEST(KubectlGpuTenantLabel, OrderNamespacesWithoutTheLabelSortedOnce) {
  const auto ns = [](const std::string& name, bool labelled) {
    json object = Namespace(name);
    if (labelled) object["metadata"]["labels"][std::string(api::kTenantNamespaceLabel)] = "";
    return object;
  };
  const json cluster = {{"items",
                         {ns("b", false), ns("a", false), ns("ok", true), ns("idle", false),
                          Device("b", "1", 1), Device("b", "2", 1), Device("a", "1", 1),
                          Device("ok", "1", 1), Device("nowhere", "1", 1)}}};
  // "nowhere" has no Namespace object at all: not labelled either.
  EXPECT_EQ(controller::plugin::OrderNamespacesWithoutTenantLabel(cluster),
            (std::vector<std::string>{"a", "b", "nowhere"}));
  EXPECT_EQ(controller::plugin::OrderNamespacesWithoutTenantLabel(json::object()),
            std::vector<std::string>{});
}

// -o yaml: strings a reader could take for a number, a boolean or null come back as strings.
TEST(KubectlGpuYaml, StringsStayStrings) {
  const json document = {{"words", {"yes", "No", "on", "null", "~", "", "1", "-1", ".5", "1e3"}},
                         {"plain", "gpu-1"},
                         {"number", 2},
                         {"flag", true},
                         {"none", nullptr},
                         {"empty", json::array()}};
  const std::string text = controller::plugin::ToYaml(document);
  const YAML::Node yaml = YAML::Load(text);
  ASSERT_EQ(yaml["words"].size(), document["words"].size()) << text;
  for (size_t i = 0; i < document["words"].size(); ++i) {
    EXPECT_EQ(yaml["words"][i].Tag(), "!") << text;  // quoted: a string, whatever it reads like
    EXPECT_EQ(yaml["words"][i].as<std::string>(), document["words"][i].get<std::string>());
  }
  EXPECT_NE(text.find("plain: gpu-1\n"), std::string::npos) << text;
  EXPECT_EQ(yaml["number"].as<int>(), 2);
  EXPECT_TRUE(yaml["flag"].as<bool>());
  EXPECT_TRUE(yaml["none"].IsNull());
  EXPECT_TRUE(yaml["empty"].IsSequence());
  EXPECT_EQ(yaml["empty"].size(), 0u);
}

}  // namespace
}  // namespace cozy::e2e
