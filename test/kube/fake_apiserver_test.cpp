// The fake API server's own rules (research/k8s-api.md), kubectl 1.32 as a real client of it,
// and the GPUNode CRD's schema against every fixture host's status.
#include "test/fakes/fake_apiserver.h"

#include <cstdio>
#include <fstream>
#include <regex>
#include <set>

#include <gtest/gtest.h>

#include "agent/status/status_builder.h"
#include "kube/client.h"
#include "test/fakes/fake_apiserver_logic.h"
#include "test/kube/kube_test_support.h"
#include "test/support/fixture_host.h"

namespace cozy::fake {
namespace {
using nlohmann::json;
using testing::ConfigFor;
using testing::StartFakeApiServer;
using testing::TestClientOptions;

const std::string kGpuNodes = "/apis/gpu.cozystack.io/v1alpha1/gpunodes";

json GpuNodeCrdSchema() {
  json crd = YamlFileToJson(testing::GpuNodeCrdFile()).at(0);
  return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
}

TEST(FakeLogic, LabelSelectors) {
  json labels = {{"app", "vm"}, {"tier", "gpu"}};
  EXPECT_TRUE(LabelSelector("app=vm,tier").Matches(labels));
  EXPECT_TRUE(LabelSelector("app in (db, vm),!missing").Matches(labels));
  EXPECT_FALSE(LabelSelector("app notin (vm)").Matches(labels));
  EXPECT_TRUE(LabelSelector("missing!=x").Matches(labels));
  EXPECT_FALSE(LabelSelector("app==db").Matches(labels));
  EXPECT_THROW(LabelSelector("app in vm)"), std::invalid_argument);
}

TEST(FakeLogic, FieldSelectorsWithEscapes) {
  auto terms = ParseFieldSelector(R"(spec.nodeName=n1,metadata.name!=a\,b)");
  ASSERT_EQ(terms.size(), 2u);
  EXPECT_EQ(terms[1].value, "a,b");
  EXPECT_FALSE(terms[1].equals);
  EXPECT_EQ(FieldValue(json({{"spec", {{"nodeName", "n1"}}}}), "spec.nodeName"), "n1");
  EXPECT_EQ(FieldValue(json::object(), "spec.nodeName"), "");  // absent reads as ""
}

TEST(FakeLogic, JsonPathSubsetOfPrinterColumns) {
  json object = {{"status",
                  {{"devices",
                    {{{"pciAddress", "a"}, {"health", "Healthy"}},
                     {{"pciAddress", "b"}, {"health", "Unhealthy"}}}}}}};
  EXPECT_EQ(EvaluateJsonPath(object, ".status.devices[1].pciAddress"), std::vector<json>{"b"});
  EXPECT_EQ(EvaluateJsonPath(object, ".status.devices[*].pciAddress"),
            (std::vector<json>{"a", "b"}));
  EXPECT_EQ(EvaluateJsonPath(object, R"(.status.devices[?(@.health=="Unhealthy")].pciAddress)"),
            std::vector<json>{"b"});
  EXPECT_TRUE(EvaluateJsonPath(object, ".status.nothing[0]").empty());
  EXPECT_THROW(EvaluateJsonPath(object, "..status"), std::invalid_argument);
}

TEST(FakeLogic, HumanDurationAsKubectlPrintsAges) {
  using std::chrono::seconds;
  EXPECT_EQ(HumanDuration(seconds(45)), "45s");
  EXPECT_EQ(HumanDuration(seconds(192)), "3m12s");
  EXPECT_EQ(HumanDuration(seconds(12 * 60)), "12m");
  EXPECT_EQ(HumanDuration(seconds(5 * 3600 + 180)), "5h3m");
  EXPECT_EQ(HumanDuration(seconds(30 * 3600)), "30h");
  EXPECT_EQ(HumanDuration(seconds(40 * 86400)), "40d");
}

TEST(GpuNodeCrd, SchemaRefusesBadTypesEnumsAndMissingFieldsAndPrunesUnknownOnes) {
  json schema = GpuNodeCrdSchema();
  json object = {{"apiVersion", "gpu.cozystack.io/v1alpha1"},
                 {"kind", "GPUNode"},
                 {"metadata", {{"name", "n1"}, {"labels", {{"a", "b"}}}}},
                 {"status",
                  {{"devices",
                    {{{"pciAddress", "0000:3b:00.0"},
                      {"vendorID", "10de"},
                      {"deviceID", "20b5"},
                      {"iommuGroup", "7"},
                      {"health", "Fine"},
                      {"extra", 1}}}}}}};
  PruneUnknownFields(object, schema);
  EXPECT_FALSE(object["status"]["devices"][0].contains("extra"));
  EXPECT_EQ(object["metadata"]["labels"]["a"], "b");  // metadata is never pruned
  std::set<std::string> problems;
  for (const auto& error : ValidateAgainstSchema(object, schema)) {
    problems.insert(error.reason + " " + error.field);
  }
  EXPECT_EQ(problems, (std::set<std::string>{"FieldValueInvalid status.devices[0].iommuGroup",
                                             "FieldValueNotSupported status.devices[0].health",
                                             "FieldValueRequired status.devices[0].classCode"}));
}

TEST(GpuNodeCrd, EveryFixtureHostsStatusFitsTheSchemaUnpruned) {
  json schema = GpuNodeCrdSchema();
  for (const char* spec :
       {"a100-vfio", "h200-vfio", "hgx-h100", "l40s-sriov-mdev", "l40s-vendor-vfio", "mi210-vfio",
        "mi300x-sriov", "no-iommu", "rtx3090-audio-snd", "rtx3090-vfio", "t4-mdev", "no-gpu",
        "arc-a310-vfio", "rtx6000ada-x4"}) {
    testing::FixtureHost host(spec);
    json object = agent::BuildGpuNode("n1", agent::BuildStatus(host.Scan()));
    // The units the agent adds once pod-resources answers.
    for (auto& device : object["status"]["devices"]) {
      device["resources"] = {{{"name", "nvidia.com/gpu"}, {"allocatable", 1}, {"allocated", 0}}};
      device["allocatable"] = 1;
      device["allocated"] = 0;
      device["health"] = "Healthy";
    }
    object["status"]["resourceNames"] = {"nvidia.com/gpu"};
    object["status"]["unplaced"] = {
        {{"resourceName", "nvidia.com/gpu"}, {"allocatable", 8}, {"allocated", 2}}};
    json pruned = object;
    PruneUnknownFields(pruned, schema);
    EXPECT_EQ(pruned, object) << spec << ": the schema lacks a field the agent writes";
    for (const auto& error : ValidateAgainstSchema(object, schema)) {
      ADD_FAILURE() << spec << ": " << error.field << ": " << error.message;
    }
  }
}

class FakeServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = StartFakeApiServer();
    client_ = std::make_unique<kube::Client>(ConfigFor(*server_), TestClientOptions(time_));
    client_->Create(kGpuNodes, {{"metadata", {{"name", "n1"}}},
                                {"spec", json::object()},
                                {"status", {{"resourceNames", {"x"}}}}});
  }
  kube::FakeTimeSource time_;
  std::unique_ptr<FakeApiServer> server_;
  std::unique_ptr<kube::Client> client_;
};

TEST_F(FakeServerTest, StatusSubresourceRulesAndGeneration) {
  json created = client_->Get(kGpuNodes + "/n1");
  EXPECT_FALSE(created.contains("status"));  // create drops status
  EXPECT_EQ(created["metadata"]["generation"], 1);

  json afterMain = client_->MergePatch(kGpuNodes + "/n1",
                                       {{"spec", {{"x", 1}}}, {"status", {{"unplaced", {}}}}});
  EXPECT_FALSE(afterMain.contains("status"));         // main resource ignores status
  EXPECT_EQ(afterMain["metadata"]["generation"], 1);  // spec {} has no fields: pruned

  json afterStatus = client_->MergePatch(
      kGpuNodes + "/n1/status",
      {{"metadata", {{"labels", {{"l", "v"}}}}}, {"status", {{"resourceNames", {"a"}}}}});
  EXPECT_EQ(afterStatus["status"]["resourceNames"], json({"a"}));
  EXPECT_FALSE(afterStatus["metadata"].contains("labels"));  // /status ignores metadata
  EXPECT_EQ(afterStatus["metadata"]["generation"], 1);       // status never moves it
  EXPECT_NE(afterStatus["metadata"]["resourceVersion"], afterMain["metadata"]["resourceVersion"]);

  // A write that changes nothing keeps the resourceVersion.
  json same =
      client_->MergePatch(kGpuNodes + "/n1/status", {{"status", {{"resourceNames", {"a"}}}}});
  EXPECT_EQ(same["metadata"]["resourceVersion"], afterStatus["metadata"]["resourceVersion"]);
}

TEST_F(FakeServerTest, OptimisticConcurrencyAndCustomResourceUpdateRules) {
  json object = client_->Get(kGpuNodes + "/n1");
  json stale = object;
  client_->MergePatch(kGpuNodes + "/n1", {{"metadata", {{"labels", {{"a", "b"}}}}}});
  auto kindOf = [&](const std::function<void()>& call) {
    try {
      call();
    } catch (const kube::ApiError& error) {
      return error.kind();
    }
    return kube::ErrorKind::kOther;
  };
  EXPECT_EQ(kindOf([&] { client_->Update(kGpuNodes + "/n1", stale); }), kube::ErrorKind::kConflict);
  EXPECT_EQ(kindOf([&] {
              client_->MergePatch(kGpuNodes + "/n1", {{"metadata", {{"resourceVersion", "1"}}}});
            }),
            kube::ErrorKind::kConflict);
  stale["metadata"].erase("resourceVersion");
  EXPECT_EQ(kindOf([&] { client_->Update(kGpuNodes + "/n1", stale); }),
            kube::ErrorKind::kInvalid);  // custom resources have no unconditional update
  std::string body = "{}";
  EXPECT_EQ(kindOf([&] {
              client_->Request("PATCH", kGpuNodes + "/n1", {}, &body,
                               "application/strategic-merge-patch+json");
            }),
            kube::ErrorKind::kUnsupportedMediaType);
  EXPECT_EQ(kindOf([&] {
              client_->Create(kGpuNodes, {{"metadata", {{"name", "n1"}}}});
            }),
            kube::ErrorKind::kAlreadyExists);
}

TEST_F(FakeServerTest, DiscoveryAndCrdsAddedAndRemovedWhileRunning) {
  json resources = client_->Get("/apis/gpu.cozystack.io/v1alpha1");
  std::set<std::string> names;
  for (const auto& resource : resources["resources"]) names.insert(resource["name"]);
  EXPECT_EQ(names, (std::set<std::string>{"gpunodes", "gpunodes/status"}));
  json crd = YamlFileToJson(testing::GpuNodeCrdFile()).at(0);
  crd["metadata"]["name"] = "gpuclasses.gpu.cozystack.io";
  crd["spec"]["names"] = {{"kind", "GPUClass"}, {"plural", "gpuclasses"}};
  const std::string classes = "/apis/gpu.cozystack.io/v1alpha1/gpuclasses";
  EXPECT_THROW(client_->List(classes), kube::ApiError);
  client_->Create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd);
  EXPECT_TRUE(client_->List(classes)["items"].empty());
  client_->Delete("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/" +
                  crd["metadata"]["name"].get<std::string>());
  try {
    client_->List(classes);
    FAIL();
  } catch (const kube::ApiError& error) {
    EXPECT_EQ(error.kind(), kube::ErrorKind::kResourceNotServed);
  }
  json groups = client_->Get("/apis");
  EXPECT_EQ(groups["kind"], "APIGroupList");
}

TEST_F(FakeServerTest, TableFromPrinterColumns) {
  client_->MergePatch(
      kGpuNodes + "/n1/status",
      {{"status",
        {{"resourceNames", {"nvidia.com/gpu"}},
         {"devices",
          {{{"pciAddress", "0000:3b:00.0"},
            {"vendorID", "10de"},
            {"deviceID", "20b5"},
            {"classCode", "030200"},
            {"model", "A100"},
            {"health", "Unhealthy"}}}},
         {"summary", {{"gpus", 1}, {"healthy", 0}, {"allocatable", 0}, {"allocated", 1}}}}}});
  auto table = json::parse(
      testing::RunCommand("curl -s -H 'Accept: application/json;as=Table;v=v1;g=meta.k8s.io' " +
                          server_->url() + kGpuNodes)
          .out);
  std::vector<std::string> columns;
  for (const auto& column : table["columnDefinitions"]) columns.push_back(column["name"]);
  EXPECT_EQ(columns,
            (std::vector<std::string>{"Name", "GPUs", "Healthy", "Allocatable", "Allocated",
                                      "Resources", "Model", "Unhealthy", "Driver", "Age"}));
  json cells = table["rows"][0]["cells"];
  EXPECT_EQ(cells[0], "n1");
  EXPECT_EQ(cells[1], 1);
  EXPECT_EQ(cells[2], 0);
  EXPECT_EQ(cells[3], 0);
  EXPECT_EQ(cells[4], 1);
  EXPECT_EQ(cells[5], "[\"nvidia.com/gpu\"]");
  EXPECT_EQ(cells[6], "A100");
  EXPECT_EQ(cells[7], "0000:3b:00.0");
}

// kubectl as a real client (the cloud SDK's kubectl 1.32 or Debian's kubernetes-client).
TEST(Kubectl, GetNodesApplyCrdAndGetGpuNodesWithColumns) {
  if (testing::RunCommand("command -v kubectl").exitCode != 0) {
    GTEST_SKIP() << "kubectl is not installed";
  }
  auto server = StartFakeApiServer(/*withCrds=*/false);
  server->Seed(testing::NodeObject("n1"));
  testing::TempDir dir;
  std::ofstream(dir.path() / "kubeconfig") << server->Kubeconfig("kubectl-token");
  std::string kubectl = "kubectl --kubeconfig " + (dir.path() / "kubeconfig").string() +
                        " --cache-dir " + (dir.path() / "cache").string() + " ";
  auto run = [&kubectl](const std::string& args) {
    auto result = testing::RunCommand(kubectl + args);
    EXPECT_EQ(result.exitCode, 0) << "kubectl " << args << ": " << result.err;
    return result.out;
  };
  EXPECT_TRUE(std::regex_search(run("get nodes"), std::regex(R"(n1\s+Ready)")));
  EXPECT_NE(run("apply -f " + testing::GpuNodeCrdFile().string()).find("created"),
            std::string::npos);
  kube::FakeTimeSource time;
  kube::Client client(ConfigFor(*server), TestClientOptions(time));
  client.Create(kGpuNodes, {{"metadata", {{"name", "n1"}}}});
  client.MergePatch(
      kGpuNodes + "/n1/status",
      {{"status",
        {{"resourceNames", {"nvidia.com/gpu"}},
         {"devices",
          {{{"pciAddress", "0000:3b:00.0"},
            {"vendorID", "10de"},
            {"deviceID", "20b5"},
            {"classCode", "030200"},
            {"model", "A100"},
            {"health", "Healthy"}}}},
         {"summary", {{"gpus", 1}, {"healthy", 1}, {"allocatable", 1}, {"allocated", 0}}}}}});
  // The columns a hoster reads: GPUs, healthy, allocatable, allocated, age.
  std::string table = run("get gpunodes");
  EXPECT_TRUE(std::regex_search(
      table, std::regex(R"(NAME\s+GPUS\s+HEALTHY\s+ALLOCATABLE\s+ALLOCATED\s+AGE)")))
      << table;
  EXPECT_TRUE(std::regex_search(table, std::regex(R"(n1\s+1\s+1\s+1\s+0\s+)"))) << table;
  std::string wide = run("get gpunodes -o wide");
  EXPECT_TRUE(std::regex_search(wide, std::regex(R"(\["nvidia.com/gpu"\]\s+A100)"))) << wide;
  std::string yaml = run("get gpunode n1 -o yaml");
  EXPECT_NE(yaml.find("pciAddress: 0000:3b:00.0"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("kind: GPUNode"), std::string::npos);
  // Every request carried the kubeconfig's token.
  for (const auto& request : server->Requests()) {
    if (request.path.rfind(kGpuNodes, 0) == 0) {
      EXPECT_TRUE(request.bearerToken == "kubectl-token" || request.bearerToken.empty());
    }
  }
}

}  // namespace
}  // namespace cozy::fake
