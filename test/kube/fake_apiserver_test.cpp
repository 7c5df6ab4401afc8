// The fake API server's own rules (research/k8s-api.md), kubectl 1.32 as a real client of it,
// and the GPUNode CRD's schema against every fixture host's status.
#include "test/fakes/fake_apiserver.h"

#include <cstdio>
#include <fstream>
#include <regex>
#include <set>

#include <gtest/gtest.h>
#include <httplib.h>

#include "agent/status/status_builder.h"
#include "kube/client.h"
#include "test/fakes/fake_apiserver_logic.h"
#include "test/kube/kube_test_support.h"
#include "test/support/fixture_host.h"
#include "test/support/process.h"

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
                                {"status", {{"resourceNames", {"example.com/x"}}}}});
  }
  kube::FakeTimeSource time_;
  std::unique_ptr<FakeApiServer> server_;
  std::unique_ptr<kube::Client> client_;
};

// A fault can let the first requests it matches through: a write that follows a read of the same
// path (as a VM start's attach, then its undo) is faulted without faulting the first.
TEST_F(FakeServerTest, AFaultSkipsTheFirstRequestsItMatches) {
  Fault conflict = Fault::Answer(409, 1, "PATCH");
  conflict.pathPrefix = kGpuNodes + "/n1/status";
  conflict.skip = 1;
  server_->AddFault(conflict);
  const json patch = {{"status", {{"resourceNames", {"example.com/y"}}}}};
  client_->Get(kGpuNodes + "/n1");  // another method: neither skipped nor faulted
  EXPECT_NO_THROW(client_->MergePatch(kGpuNodes + "/n1/status", patch));
  try {
    client_->MergePatch(kGpuNodes + "/n1/status", patch);
    ADD_FAILURE() << "the second PATCH was not faulted";
  } catch (const kube::ApiError& error) {
    EXPECT_EQ(error.kind(), kube::ErrorKind::kConflict) << error.what();
  }
  EXPECT_NO_THROW(client_->MergePatch(kGpuNodes + "/n1/status", patch));
  std::vector<std::string> faults;
  for (const auto& request : server_->Requests()) {
    if (request.method == "PATCH") faults.push_back(request.fault);
  }
  EXPECT_EQ(faults, (std::vector<std::string>{"", "status", ""}));
  EXPECT_EQ(Fault::FromJson(conflict.ToJson()).skip, 1);
}

TEST_F(FakeServerTest, StatusSubresourceRulesAndGeneration) {
  json created = client_->Get(kGpuNodes + "/n1");
  EXPECT_FALSE(created.contains("status"));  // create drops status
  EXPECT_EQ(created["metadata"]["generation"], 1);

  json afterMain = client_->MergePatch(kGpuNodes + "/n1",
                                       {{"spec", {{"x", 1}}}, {"status", {{"unplaced", {}}}}});
  EXPECT_FALSE(afterMain.contains("status"));         // main resource ignores status
  EXPECT_EQ(afterMain["metadata"]["generation"], 1);  // spec {} has no fields: pruned

  json afterStatus = client_->MergePatch(kGpuNodes + "/n1/status",
                                         {{"metadata", {{"labels", {{"l", "v"}}}}},
                                          {"status", {{"resourceNames", {"example.com/a"}}}}});
  EXPECT_EQ(afterStatus["status"]["resourceNames"], json({"example.com/a"}));
  EXPECT_FALSE(afterStatus["metadata"].contains("labels"));  // /status ignores metadata
  EXPECT_EQ(afterStatus["metadata"]["generation"], 1);       // status never moves it
  EXPECT_NE(afterStatus["metadata"]["resourceVersion"], afterMain["metadata"]["resourceVersion"]);

  // A write that changes nothing keeps the resourceVersion.
  json same = client_->MergePatch(kGpuNodes + "/n1/status",
                                  {{"status", {{"resourceNames", {"example.com/a"}}}}});
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

TEST(FakeFaults, FromJsonIsStrictAndNamesWhatIsWrong) {
  Fault fault = Fault::FromJson(json::parse(
      R"({"mode":"watchCloseAtOnce","pathPrefix":"/api/v1/pods","count":2,"latencyMs":5})"));
  EXPECT_EQ(fault.mode, FaultMode::kWatchCloseAtOnce);
  EXPECT_EQ(fault.count, 2);
  EXPECT_EQ(Fault::FromJson(fault.ToJson()).ToJson(), fault.ToJson());
  auto refusal = [](const std::string& text) {
    try {
      Fault::FromJson(json::parse(text));
    } catch (const std::invalid_argument& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(refusal(R"({"mdoe":"endlessBody"})"), "unknown fault field \"mdoe\"");
  EXPECT_EQ(refusal(R"({"count":"2"})"),
            "fault field \"count\" must be an integer from -1 to 2147483647, not string");
  EXPECT_EQ(refusal(R"({"watchOnly":1})"),
            "fault field \"watchOnly\" must be true or false, not number");
  std::string unknown = refusal(R"({"mode":"endless"})");
  EXPECT_NE(unknown.find("unknown fault mode \"endless\" (known: listResourceVersionNumber,"),
            std::string::npos)
      << unknown;
  EXPECT_NE(unknown.find("endlessString)"), std::string::npos) << unknown;
}

TEST(FakeFaults, ControlApiSetsModesRetryAfterDatesAndTheBrownout) {
  auto server = StartFakeApiServer(/*withCrds=*/false);
  server->Seed(testing::NodeObject("n1"));
  httplib::Client http("127.0.0.1", server->port());
  auto post = [&http](const std::string& path, const json& body) {
    auto answer = http.Post(path.c_str(), body.dump(), "application/json");
    return answer ? answer->status : -1;
  };
  // A list mode: only the list it changes spends it, not the GET of one object before it.
  ASSERT_EQ(post("/_fake/faults", {{"mode", "listItemsNotArray"}, {"count", 1}}), 200);
  auto one = http.Get("/api/v1/nodes/n1");
  ASSERT_TRUE(one);
  EXPECT_EQ(json::parse(one->body)["metadata"]["name"], "n1");
  auto list = http.Get("/api/v1/nodes");
  ASSERT_TRUE(list);
  EXPECT_TRUE(json::parse(list->body)["items"].is_object()) << list->body;
  EXPECT_TRUE(json::parse(http.Get("/api/v1/nodes")->body)["items"].is_array());
  EXPECT_EQ(server->Requests()[1].fault, "listItemsNotArray");
  EXPECT_EQ(server->Requests()[0].fault, "");
  // A refused fault says why.
  auto refused = http.Post("/_fake/faults", R"({"mode":"sideways"})", "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400);
  EXPECT_NE(refused->body.find("unknown fault mode"), std::string::npos) << refused->body;
  // Retry-After as an IMF-fixdate two minutes ahead, and verbatim.
  ASSERT_EQ(post("/_fake/faults", {{"status", 503},
                                   {"retryAfterSeconds", 120},
                                   {"retryAfterHttpDate", true},
                                   {"count", 1}}),
            200);
  auto dated = http.Get("/api/v1/nodes");
  ASSERT_TRUE(dated);
  EXPECT_EQ(dated->status, 503);
  const std::string date = dated->get_header_value("Retry-After");
  EXPECT_TRUE(std::regex_match(
      date,
      std::regex(
          R"((Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d\d (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{4} \d\d:\d\d:\d\d GMT)")))
      << date;
  auto wait = kube::ParseRetryAfter(date);
  ASSERT_TRUE(wait);
  EXPECT_GE(*wait, std::chrono::seconds(118));
  EXPECT_LE(*wait, std::chrono::seconds(120));
  ASSERT_EQ(post("/_fake/faults", {{"status", 429}, {"retryAfterRaw", "soon"}, {"count", 1}}), 200);
  EXPECT_EQ(http.Get("/api/v1/nodes")->get_header_value("Retry-After"), "soon");
  // The brownout: set, read back, applied, refused when malformed, lifted.
  auto put = http.Put("/_fake/delay", R"({"ms":300})", "application/json");
  ASSERT_TRUE(put);
  EXPECT_EQ(put->status, 200);
  EXPECT_EQ(json::parse(http.Get("/_fake/delay")->body)["ms"], 300);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(http.Get("/api/v1/nodes")->status, 200);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(300));
  EXPECT_EQ(http.Put("/_fake/delay", R"({"ms":-1})", "application/json")->status, 400);
  EXPECT_EQ(http.Put("/_fake/delay", R"({"ms":0})", "application/json")->status, 200);
  EXPECT_EQ(server->RequestDelay(), std::chrono::milliseconds(0));
}

// The program, as the agent's end-to-end tests run it: faults and a brownout from flags.
TEST(FakeProgram, FaultsAndTheBrownoutFromFlags) {
  testing::TempDir dir;
  const int port = testing::FreePort();
  ASSERT_GT(port, 0);
  pid_t pid = testing::Spawn(
      {COZY_FAKE_APISERVER_BINARY, "--port", std::to_string(port), "--request-delay-ms", "300",
       "--fault", R"({"mode":"watchCloseAtOnce","count":1})", "--fault",
       R"({"mode":"listResourceVersionNumber","pathPrefix":"/api/v1/nodes","count":1})"},
      dir.path() / "log");
  ASSERT_GT(pid, 0);
  auto log = [&dir] {
    std::ifstream in(dir.path() / "log");
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  ASSERT_TRUE(testing::WaitFor([&] { return log().find("listening on") != std::string::npos; }))
      << log();
  {  // the client's kept-alive connection closes with it, so the server stops at once
    httplib::Client http("127.0.0.1", port);
    const auto start = std::chrono::steady_clock::now();
    auto list = http.Get("/api/v1/nodes");
    ASSERT_TRUE(list);
    EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(300));
    EXPECT_TRUE(json::parse(list->body)["metadata"]["resourceVersion"].is_number()) << list->body;
    // The watch: 200, and the stream is over before it said anything.
    auto watch = http.Get("/api/v1/nodes?watch=1&timeoutSeconds=30");
    ASSERT_TRUE(watch);
    EXPECT_EQ(watch->status, 200);
    EXPECT_EQ(watch->body, "");
    // Both were spent: the next list is a good one.
    EXPECT_TRUE(
        json::parse(http.Get("/api/v1/nodes")->body)["metadata"]["resourceVersion"].is_string());
  }
  EXPECT_EQ(testing::Finish(pid), 0);

  auto bad = testing::RunCommand(std::string(COZY_FAKE_APISERVER_BINARY) +
                                 " --fault '{\"mode\":\"nope\"}'");
  EXPECT_EQ(bad.exitCode, 2);
  EXPECT_NE(bad.err.find("unknown fault mode \"nope\""), std::string::npos) << bad.err;
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
