// The fake API server calls admission webhooks as kube-apiserver does (docs/kubernetes.md
// "Admission webhooks"): a real HTTPS webhook (cpp-httplib's SSLServer with a certificate for
// `hook.webhooks.svc` made by the openssl CLI per run, P-256 keys for speed), reached through the
// fake's service endpoint map; kubectl as a client where it shows the behaviour.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>
#include <thread>

#include "test/fakes/fake_apiserver.h"
#include "test/kube/kube_test_support.h"
#include "test/support/fixture_host.h"
#include "test/support/process.h"

namespace cozy::fake {
namespace {

using nlohmann::json;
using testing::RunCommand;
using testing::ShellQuote;

struct Call {
  std::string path;
  std::string timeout;  // the ?timeout= parameter
  json request;         // AdmissionReview.request
};

class AdmissionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string d = ShellQuote(dir_.path().string());
    const std::string script =
        "cd " + d +
        " && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "
        "ca.key -out ca.crt -days 1 "
        "-subj /CN=webhook-ca 2>/dev/null"
        " && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "
        "other.key -out other.crt "
        "-days 1 -subj /CN=other-ca 2>/dev/null"
        " && openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "
        "server.key -out server.csr "
        "-subj /CN=hook.webhooks.svc 2>/dev/null"
        " && printf 'subjectAltName=DNS:hook.webhooks.svc,IP:127.0.0.1\\n' > san.ext"
        " && openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
        "-out server.crt -days 1 -extfile san.ext 2>/dev/null";
    const auto made = RunCommand(script);
    ASSERT_EQ(made.exitCode, 0) << made.err;
    caBundle_ = RunCommand("base64 -w0 " + ShellQuote((dir_.path() / "ca.crt").string())).out;
    otherBundle_ = RunCommand("base64 -w0 " + ShellQuote((dir_.path() / "other.crt").string())).out;
    webhook_ = std::make_unique<httplib::SSLServer>((dir_.path() / "server.crt").c_str(),
                                                    (dir_.path() / "server.key").c_str());
    webhook_->Post(R"(/.*)", [this](const httplib::Request& request, httplib::Response& out) {
      json review = json::parse(request.body);
      std::function<json(const std::string&, const json&)> respond;
      {
        std::lock_guard lock(mutex_);
        calls_.push_back({request.path, request.get_param_value("timeout"), review["request"]});
        respond = respond_;
      }
      json response = respond ? respond(request.path, review["request"]) : json{{"allowed", true}};
      if (!response.contains("uid")) response["uid"] = review["request"]["uid"];
      out.set_content(json{{"apiVersion", "admission.k8s.io/v1"},
                           {"kind", "AdmissionReview"},
                           {"response", response}}
                          .dump(),
                      "application/json");
    });
    port_ = webhook_->bind_to_any_port("127.0.0.1");
    ASSERT_GT(port_, 0);
    thread_ = std::thread([this] { webhook_->listen_after_bind(); });
    FakeApiServerOptions options;
    options.crdPaths = {testing::ChartCrdDir(),
                        testing::TestCrdFile("kubevirt.io_virtualmachineinstances.yaml")};
    server_ = std::make_unique<FakeApiServer>(options);
    server_->Start();
    server_->SetServiceEndpoint("webhooks", "hook", port_);
    client_ = std::make_unique<httplib::Client>(server_->url());
    client_->set_read_timeout(30);
    ASSERT_EQ(Post("/api/v1/namespaces", Namespace("apps", {{"admission", "on"}}))->status, 201);
    ASSERT_EQ(Post("/api/v1/namespaces", Namespace("plain", json::object()))->status, 201);
  }
  void TearDown() override {
    client_.reset();
    server_.reset();
    webhook_->stop();
    thread_.join();
  }

  static json Namespace(const std::string& name, const json& labels) {
    return {{"apiVersion", "v1"},
            {"kind", "Namespace"},
            {"metadata", {{"name", name}, {"labels", labels}}}};
  }
  static json ConfigMap(const std::string& name, const json& labels = json::object()) {
    return {{"apiVersion", "v1"},
            {"kind", "ConfigMap"},
            {"metadata", {{"name", name}, {"labels", labels}}},
            {"data", {{"k", "v"}}}};
  }
  // A webhook entry calling this test's server at `path` through the service reference.
  json Webhook(const std::string& name, const std::string& path, const json& rules) const {
    return {{"name", name},
            {"clientConfig",
             {{"service", {{"namespace", "webhooks"}, {"name", "hook"}, {"path", path}}},
              {"caBundle", caBundle_}}},
            {"rules", rules},
            {"sideEffects", "None"},
            {"admissionReviewVersions", {"v1"}}};
  }
  static json Rule(const json& operations, const json& resources, const std::string& group = "",
                   const std::string& version = "v1") {
    return json::array({{{"operations", operations},
                         {"apiGroups", {group}},
                         {"apiVersions", {version}},
                         {"resources", resources}}});
  }
  void Configure(const std::string& kind, const std::string& name, const json& webhooks) {
    const std::string plural =
        kind == "Mutating" ? "mutatingwebhookconfigurations" : "validatingwebhookconfigurations";
    json config = {{"apiVersion", "admissionregistration.k8s.io/v1"},
                   {"kind", kind + "WebhookConfiguration"},
                   {"metadata", {{"name", name}}},
                   // (a braced single webhook arrives as the object itself)
                   {"webhooks", webhooks.is_array() ? webhooks : json::array({webhooks})}};
    auto result = Post("/apis/admissionregistration.k8s.io/v1/" + plural, config);
    ASSERT_TRUE(result);
    ASSERT_EQ(result->status, 201) << result->body;
  }
  httplib::Result Post(const std::string& path, const json& body,
                       const httplib::Headers& headers = {}) {
    return client_->Post(path, headers, body.dump(), "application/json");
  }
  std::vector<Call> Calls() {
    std::lock_guard lock(mutex_);
    return calls_;
  }
  void Respond(std::function<json(const std::string&, const json&)> respond) {
    std::lock_guard lock(mutex_);
    respond_ = std::move(respond);
  }
  static std::string Base64(const std::string& text) {
    static const char* alphabet =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    for (size_t i = 0; i < text.size(); i += 3) {
      auto byte = [&text](size_t at) -> unsigned {
        return at < text.size() ? static_cast<unsigned char>(text[at]) : 0u;
      };
      unsigned n = (byte(i) << 16) | (byte(i + 1) << 8) | byte(i + 2);
      out += alphabet[(n >> 18) & 63];
      out += alphabet[(n >> 12) & 63];
      out += i + 1 < text.size() ? alphabet[(n >> 6) & 63] : '=';
      out += i + 2 < text.size() ? alphabet[n & 63] : '=';
    }
    return out;
  }
  static json Patch(const json& operations) {
    return {{"allowed", true}, {"patchType", "JSONPatch"}, {"patch", Base64(operations.dump())}};
  }
  std::string Kubectl() const {
    std::ofstream(dir_.path() / "kubeconfig") << server_->Kubeconfig();
    return "kubectl --kubeconfig " + ShellQuote((dir_.path() / "kubeconfig").string()) +
           " --cache-dir " + ShellQuote((dir_.path() / "kube-cache").string()) + " ";
  }

  testing::TempDir dir_;
  std::string caBundle_;
  std::string otherBundle_;
  std::unique_ptr<httplib::SSLServer> webhook_;
  std::thread thread_;
  int port_ = 0;
  std::unique_ptr<FakeApiServer> server_;
  std::unique_ptr<httplib::Client> client_;
  std::mutex mutex_;
  std::vector<Call> calls_;
  std::function<json(const std::string&, const json&)> respond_;
};

TEST_F(AdmissionTest, MutatingWebhookGetsTheReviewAndItsPatchIsStored) {
  Configure("Mutating", "labels",
            {Webhook("labels.example.com", "/mutate", Rule({"CREATE"}, {"configmaps"}))});
  Respond([](const std::string&, const json&) {
    json response = Patch(
        json::array({{{"op", "add"}, {"path", "/metadata/labels/mutated"}, {"value", "yes"}}}));
    response["warnings"] = {"labels were \"added\""};
    return response;
  });
  auto created = Post("/api/v1/namespaces/apps/configmaps", ConfigMap("c1"));
  ASSERT_TRUE(created);
  ASSERT_EQ(created->status, 201) << created->body;
  EXPECT_EQ(json::parse(created->body)["metadata"]["labels"]["mutated"], "yes");
  EXPECT_EQ(created->get_header_value("Warning"), R"(299 - "labels were \"added\"")");
  EXPECT_EQ(server_->Object("v1", "configmaps", "apps", "c1")["metadata"]["labels"]["mutated"],
            "yes");
  auto calls = Calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].path, "/mutate");
  EXPECT_EQ(calls[0].timeout, "10s");
  const json& request = calls[0].request;
  EXPECT_FALSE(request.value("uid", "").empty());
  EXPECT_EQ(request["kind"], (json{{"group", ""}, {"version", "v1"}, {"kind", "ConfigMap"}}));
  EXPECT_EQ(request["resource"],
            (json{{"group", ""}, {"version", "v1"}, {"resource", "configmaps"}}));
  EXPECT_EQ(request["requestKind"], request["kind"]);
  EXPECT_EQ(request["requestResource"], request["resource"]);
  EXPECT_FALSE(request.contains("subResource"));
  EXPECT_EQ(request["name"], "c1");
  EXPECT_EQ(request["namespace"], "apps");
  EXPECT_EQ(request["operation"], "CREATE");
  EXPECT_EQ(request["userInfo"]["username"], "system:admin");
  EXPECT_EQ(request["userInfo"]["groups"], (json{"system:masters", "system:authenticated"}));
  EXPECT_EQ(request["object"]["data"]["k"], "v");
  EXPECT_EQ(request["object"]["metadata"]["namespace"], "apps");
  EXPECT_TRUE(request["oldObject"].is_null());
  EXPECT_EQ(request["dryRun"], false);
  EXPECT_EQ(request["options"],
            (json{{"apiVersion", "meta.k8s.io/v1"}, {"kind", "CreateOptions"}}));
}

TEST_F(AdmissionTest, UpdatesAndDeletesCarryTheOldObjectAndTheirOptions) {
  ASSERT_EQ(Post("/api/v1/namespaces/apps/configmaps", ConfigMap("c1"))->status, 201);
  Configure("Validating", "all",
            {Webhook("all.example.com", "/validate", Rule({"UPDATE", "DELETE"}, {"configmaps"}))});
  auto patched = client_->Patch("/api/v1/namespaces/apps/configmaps/c1", R"({"data":{"k":"w"}})",
                                "application/merge-patch+json");
  ASSERT_EQ(patched->status, 200) << patched->body;
  auto deleted = client_->Delete("/api/v1/namespaces/apps/configmaps/c1");
  ASSERT_EQ(deleted->status, 200) << deleted->body;
  auto calls = Calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].request["operation"], "UPDATE");
  EXPECT_EQ(calls[0].request["object"]["data"]["k"], "w");
  EXPECT_EQ(calls[0].request["oldObject"]["data"]["k"], "v");
  EXPECT_FALSE(calls[0].request["object"]["metadata"].value("uid", "").empty());
  EXPECT_EQ(calls[0].request["options"]["kind"], "UpdateOptions");
  EXPECT_EQ(calls[1].request["operation"], "DELETE");
  EXPECT_TRUE(calls[1].request["object"].is_null());
  EXPECT_EQ(calls[1].request["oldObject"]["data"]["k"], "w");
  EXPECT_EQ(calls[1].request["options"]["kind"], "DeleteOptions");
  EXPECT_EQ(calls[1].request["options"]["apiVersion"], "meta.k8s.io/v1");
}

TEST_F(AdmissionTest, ADeleteCollectionAdmitsEachObjectAndAGeneratedNameIsTheOneSeen) {
  for (const char* name : {"a", "keep", "z"}) {
    ASSERT_EQ(Post("/api/v1/namespaces/apps/configmaps", ConfigMap(name))->status, 201);
  }
  Configure("Validating", "keep",
            {Webhook("keep.example.com", "/validate", Rule({"CREATE", "DELETE"}, {"configmaps"}))});
  Respond([](const std::string&, const json& request) {
    if (request["operation"] == "DELETE" && request["name"] == "keep") {
      return json{{"allowed", false}, {"status", {{"code", 403}, {"message", "kept"}}}};
    }
    return json{{"allowed", true}};
  });
  auto refused = client_->Delete("/api/v1/namespaces/apps/configmaps");
  ASSERT_EQ(refused->status, 403) << refused->body;
  EXPECT_TRUE(server_->Object("v1", "configmaps", "apps", "a").is_null());
  EXPECT_FALSE(server_->Object("v1", "configmaps", "apps", "keep").is_null());
  EXPECT_FALSE(server_->Object("v1", "configmaps", "apps", "z").is_null());
  json generated = ConfigMap("");
  generated["metadata"].erase("name");
  generated["metadata"]["generateName"] = "gen-";
  auto created = Post("/api/v1/namespaces/apps/configmaps", generated);
  ASSERT_EQ(created->status, 201) << created->body;
  auto calls = Calls();
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_FALSE(calls[2].request.contains("name"));
  EXPECT_EQ(calls[2].request["object"]["metadata"]["name"],
            json::parse(created->body)["metadata"]["name"]);
}

TEST_F(AdmissionTest, ADenialAnswersWithTheWebhooksCodeAndMessage) {
  Configure("Validating", "deny",
            {Webhook("deny.example.com", "/validate", Rule({"CREATE"}, {"configmaps"}))});
  Respond([](const std::string&, const json&) {
    return json{{"allowed", false},
                {"status", {{"code", 403}, {"reason", "Forbidden"}, {"message", "no GPUs here"}}}};
  });
  auto refused = Post("/api/v1/namespaces/apps/configmaps", ConfigMap("c1"));
  ASSERT_EQ(refused->status, 403) << refused->body;
  json status = json::parse(refused->body);
  EXPECT_EQ(status["kind"], "Status");
  EXPECT_EQ(status["reason"], "Forbidden");
  EXPECT_EQ(status["message"],
            "admission webhook \"deny.example.com\" denied the request: no "
            "GPUs here");
  EXPECT_TRUE(server_->Object("v1", "configmaps", "apps", "c1").is_null());
  // Without a status: 400 and "without explanation" (errors/statuserror.go).
  Respond([](const std::string&, const json&) { return json{{"allowed", false}}; });
  refused = Post("/api/v1/namespaces/apps/configmaps", ConfigMap("c2"));
  ASSERT_EQ(refused->status, 400) << refused->body;
  EXPECT_EQ(json::parse(refused->body)["message"],
            "admission webhook \"deny.example.com\" denied the request without explanation");
}

TEST_F(AdmissionTest, AWebhookThatIsDownFailsClosedUnlessItsPolicyIsIgnore) {
  json hook = Webhook("down.example.com", "/validate", Rule({"CREATE"}, {"configmaps"}));
  hook["clientConfig"]["service"]["name"] = "down";
  server_->SetServiceEndpoint("webhooks", "down", 1);  // nothing listens on port 1
  Configure("Validating", "down", {hook});
  auto refused = Post("/api/v1/namespaces/apps/configmaps", ConfigMap("c1"));
  ASSERT_EQ(refused->status, 500) << refused->body;
  json status = json::parse(refused->body);
  EXPECT_EQ(status["reason"], "InternalError");
  EXPECT_EQ(status["message"].get<std::string>().rfind(
                "Internal error occurred: failed calling webhook \"down.example.com\": failed to "
                "call webhook: Post \"https://down.webhooks.svc:443/validate?timeout=10s\": ",
                0),
            0u)
      << status["message"];
  ASSERT_EQ(client_
                ->Delete("/apis/admissionregistration.k8s.io/v1/"
                         "validatingwebhookconfigurations/down")
                ->status,
            200);
  hook["failurePolicy"] = "Ignore";
  Configure("Validating", "down", {hook});
  EXPECT_EQ(Post("/api/v1/namespaces/apps/configmaps", ConfigMap("c1"))->status, 201);
}

// VerifyAdmissionResponse and the review versions: a wrong uid, a patch from a validating
// webhook, a webhook that takes no v1 review are call failures (failurePolicy Fail: 500).
TEST_F(AdmissionTest, BadAnswersAndUnknownReviewVersionsAreCallFailures) {
  Configure("Validating", "bad",
            {Webhook("bad.example.com", "/validate", Rule({"CREATE"}, {"configmaps"}))});
  Respond([](const std::string&, const json&) { return json{{"allowed", true}, {"uid", "x"}}; });
  auto refused = Post("/api/v1/namespaces/apps/configmaps", ConfigMap("c1"));
  ASSERT_EQ(refused->status, 500) << refused->body;
  EXPECT_EQ(json::parse(refused->body)["message"].get<std::string>().rfind(
                "Internal error occurred: failed calling webhook \"bad.example.com\": received "
                "invalid webhook response: expected response.uid=",
                0),
            0u)
      << refused->body;
  Respond([](const std::string&, const json&) { return Patch(json::array()); });
  refused = Post("/api/v1/namespaces/apps/configmaps", ConfigMap("c1"));
  ASSERT_EQ(refused->status, 500) << refused->body;
  EXPECT_NE(refused->body.find("validating webhook may not return response.patch"),
            std::string::npos)
      << refused->body;
  ASSERT_EQ(client_
                ->Delete("/apis/admissionregistration.k8s.io/v1/"
                         "validatingwebhookconfigurations/bad")
                ->status,
            200);
  Respond(nullptr);
  json old = Webhook("old.example.com", "/validate", Rule({"CREATE"}, {"configmaps"}));
  old["admissionReviewVersions"] = {"v1beta1"};
  Configure("Validating", "old", {old});
  refused = Post("/api/v1/namespaces/apps/configmaps", ConfigMap("c1"));
  ASSERT_EQ(refused->status, 500) << refused->body;
  EXPECT_NE(refused->body.find("webhook does not accept known AdmissionReview versions"),
            std::string::npos)
      << refused->body;
  EXPECT_EQ(Calls().size(), 2u);
}

TEST_F(AdmissionTest, AWrongCaBundleFailsClosed) {
  json hook = Webhook("tls.example.com", "/validate", Rule({"CREATE"}, {"configmaps"}));
  hook["clientConfig"]["caBundle"] = otherBundle_;
  Configure("Validating", "tls", {hook});
  auto refused = Post("/api/v1/namespaces/apps/configmaps", ConfigMap("c1"));
  ASSERT_EQ(refused->status, 500) << refused->body;
  EXPECT_NE(refused->body.find("failed calling webhook \\\"tls.example.com\\\""), std::string::npos)
      << refused->body;
  EXPECT_TRUE(Calls().empty());
  // The right bundle through a URL (the certificate names 127.0.0.1 too) passes.
  hook["clientConfig"] = {{"url", "https://127.0.0.1:" + std::to_string(port_) + "/by-url"},
                          {"caBundle", caBundle_}};
  hook["name"] = "url.example.com";
  Configure("Validating", "url", {hook});
  ASSERT_EQ(client_
                ->Delete("/apis/admissionregistration.k8s.io/v1/"
                         "validatingwebhookconfigurations/tls")
                ->status,
            200);
  EXPECT_EQ(Post("/api/v1/namespaces/apps/configmaps", ConfigMap("c1"))->status, 201);
  ASSERT_EQ(Calls().size(), 1u);
  EXPECT_EQ(Calls()[0].path, "/by-url");
}

TEST_F(AdmissionTest, TimeoutSecondsIsHonoured) {
  json hook = Webhook("slow.example.com", "/validate", Rule({"CREATE"}, {"configmaps"}));
  hook["timeoutSeconds"] = 1;
  Configure("Validating", "slow", {hook});
  Respond([](const std::string&, const json&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    return json{{"allowed", true}};
  });
  const auto start = std::chrono::steady_clock::now();
  auto refused = Post("/api/v1/namespaces/apps/configmaps", ConfigMap("c1"));
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(refused->status, 500) << refused->body;
  EXPECT_NE(refused->body.find("timeout=1s"), std::string::npos) << refused->body;
  EXPECT_NE(refused->body.find("context deadline exceeded"), std::string::npos) << refused->body;
  EXPECT_LT(took, std::chrono::milliseconds(2400));
  ASSERT_EQ(Calls().size(), 1u);
  EXPECT_EQ(Calls()[0].timeout, "1s");
}

TEST_F(AdmissionTest, NamespaceAndObjectSelectorsPickWhatIsSent) {
  json byNamespace = Webhook("ns.example.com", "/ns", Rule({"CREATE"}, {"configmaps"}));
  byNamespace["namespaceSelector"] = {{"matchLabels", {{"admission", "on"}}}};
  json byObject = Webhook("obj.example.com", "/obj", Rule({"CREATE"}, {"configmaps"}));
  byObject["objectSelector"] = {
      {"matchExpressions",
       json::array({{{"key", "hook"}, {"operator", "In"}, {"values", {"yes"}}}})}};
  Configure("Validating", "selectors", {byNamespace, byObject});
  ASSERT_EQ(Post("/api/v1/namespaces/apps/configmaps", ConfigMap("a"))->status, 201);
  ASSERT_EQ(Post("/api/v1/namespaces/plain/configmaps", ConfigMap("b"))->status, 201);
  ASSERT_EQ(Post("/api/v1/namespaces/plain/configmaps", ConfigMap("c", {{"hook", "yes"}}))->status,
            201);
  std::vector<std::string> seen;
  for (const auto& call : Calls()) {
    seen.push_back(call.path + " " + call.request["namespace"].get<std::string>() + "/" +
                   call.request["name"].get<std::string>());
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"/ns apps/a", "/obj plain/c"}));
}

TEST_F(AdmissionTest, RulesMatchSubresourcesOnlyWhenTheyNameThem) {
  Configure("Validating", "main",
            {Webhook("main.example.com", "/main", Rule({"UPDATE"}, {"namespaces"}))});
  Configure("Validating", "status",
            {Webhook("status.example.com", "/status", Rule({"UPDATE"}, {"*/status"}))});
  auto spec = client_->Patch("/api/v1/namespaces/apps", R"({"metadata":{"labels":{"x":"1"}}})",
                             "application/merge-patch+json");
  ASSERT_EQ(spec->status, 200) << spec->body;
  auto status = client_->Patch("/api/v1/namespaces/apps/status", R"({"status":{"conditions":[]}})",
                               "application/merge-patch+json");
  ASSERT_EQ(status->status, 200) << status->body;
  auto calls = Calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].path, "/main");
  EXPECT_FALSE(calls[0].request.contains("subResource"));
  EXPECT_EQ(calls[1].path, "/status");
  EXPECT_EQ(calls[1].request["subResource"], "status");
  EXPECT_EQ(calls[1].request["requestSubResource"], "status");
}

json Vmi(const std::string& name) {
  return {{"apiVersion", "kubevirt.io/v1"},
          {"kind", "VirtualMachineInstance"},
          {"metadata", {{"name", name}}},
          {"spec", {{"domain", {{"devices", json::object()}}}}}};
}

// cozy-gpu's webhook with reinvocationPolicy IfNeeded runs before the virt-api stand-in
// ("cozy-gpu" < "virt-api-mutator"); the stand-in changes the VMI, so it is called again and
// sees the stand-in's changes. With Never it is called once.
TEST_F(AdmissionTest, AnIfNeededWebhookIsReinvokedAfterTheVirtApiStandInChangesTheVmi) {
  server_->EnableVirtApiMutator();
  json hook = Webhook("vmi.gpu.cozystack.io", "/vmi",
                      Rule({"CREATE"}, {"virtualmachineinstances"}, "kubevirt.io"));
  hook["reinvocationPolicy"] = "IfNeeded";
  Configure("Mutating", "cozy-gpu", {hook});
  Respond([](const std::string&, const json& request) {
    if (request["object"]["metadata"].value("annotations", json::object()).contains("gpu")) {
      return json{{"allowed", true}};
    }
    const bool hasAnnotations = request["object"]["metadata"].contains("annotations");
    json patch = json::array();
    if (!hasAnnotations) {
      patch.push_back(
          {{"op", "add"}, {"path", "/metadata/annotations"}, {"value", json::object()}});
    }
    patch.push_back({{"op", "add"}, {"path", "/metadata/annotations/gpu"}, {"value", "planned"}});
    return Patch(patch);
  });
  auto created = Post("/apis/kubevirt.io/v1/namespaces/apps/virtualmachineinstances", Vmi("vm1"));
  ASSERT_EQ(created->status, 201) << created->body;
  auto calls = Calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_FALSE(calls[0].request["object"]["spec"]["domain"].contains("machine"));
  EXPECT_EQ(calls[1].request["object"]["spec"]["domain"]["machine"]["type"], "q35");
  EXPECT_EQ(calls[1].request["object"]["metadata"]["annotations"]
                            ["kubevirt.io/latest-observed-api-version"],
            "v1");
  EXPECT_EQ(calls[1].request["object"]["metadata"]["annotations"]["gpu"], "planned");
  EXPECT_NE(calls[0].request["uid"], calls[1].request["uid"]);
  json stored = server_->Object("kubevirt.io/v1", "virtualmachineinstances", "apps", "vm1");
  EXPECT_EQ(stored["metadata"]["annotations"]["gpu"], "planned");
  EXPECT_EQ(stored["spec"]["domain"]["machine"]["type"], "q35");
  EXPECT_FALSE(stored["spec"]["domain"]["firmware"].value("uuid", "").empty());
  EXPECT_EQ(stored["metadata"]["annotations"]["kubevirt.io/storage-observed-api-version"], "v1");

  hook["reinvocationPolicy"] = "Never";
  ASSERT_EQ(client_
                ->Delete("/apis/admissionregistration.k8s.io/v1/"
                         "mutatingwebhookconfigurations/cozy-gpu")
                ->status,
            200);
  Configure("Mutating", "cozy-gpu", {hook});
  ASSERT_EQ(
      Post("/apis/kubevirt.io/v1/namespaces/apps/virtualmachineinstances", Vmi("vm2"))->status,
      201);
  EXPECT_EQ(Calls().size(), 3u);
}

TEST_F(AdmissionTest, DryRunIsSentAndNothingIsStored) {
  json hook = Webhook("dry.example.com", "/validate", Rule({"CREATE"}, {"configmaps"}));
  Configure("Validating", "dry", {hook});
  auto answer = Post("/api/v1/namespaces/apps/configmaps?dryRun=All", ConfigMap("c1"));
  ASSERT_EQ(answer->status, 201) << answer->body;
  EXPECT_TRUE(server_->Object("v1", "configmaps", "apps", "c1").is_null());
  ASSERT_EQ(Calls().size(), 1u);
  EXPECT_EQ(Calls()[0].request["dryRun"], true);
  EXPECT_EQ(Calls()[0].request["options"]["dryRun"], json::array({"All"}));
  // A webhook with side effects is not called on a dry run: 400 (dispatcher.go).
  hook["name"] = "effects.example.com";
  hook["sideEffects"] = "Some";
  Configure("Validating", "effects", {hook});
  answer = Post("/api/v1/namespaces/apps/configmaps?dryRun=All", ConfigMap("c1"));
  ASSERT_EQ(answer->status, 400) << answer->body;
  EXPECT_EQ(json::parse(answer->body)["message"],
            "admission webhook \"effects.example.com\" does not support dry run");
}

TEST_F(AdmissionTest, TheUserOfTheTokenIsSentWithItsExtras) {
  server_->SetUser("alice-token",
                   UserInfo{"alice", "u-1", {"gpu-users"}, {{"scopes", {"a", "b"}}}});
  Configure("Validating", "who",
            {Webhook("who.example.com", "/validate", Rule({"CREATE"}, {"configmaps"}))});
  ASSERT_EQ(Post("/api/v1/namespaces/apps/configmaps", ConfigMap("c1"),
                 {{"Authorization", "Bearer alice-token"}})
                ->status,
            201);
  ASSERT_EQ(Calls().size(), 1u);
  EXPECT_EQ(Calls()[0].request["userInfo"], (json{{"username", "alice"},
                                                  {"uid", "u-1"},
                                                  {"groups", {"gpu-users", "system:authenticated"}},
                                                  {"extra", {{"scopes", {"a", "b"}}}}}));
}

// A webhook that writes back into the server while the server waits on it (the VMI webhook
// creating GPUDevices): those writes pass through their own webhook and nothing deadlocks.
TEST_F(AdmissionTest, AWebhookMayWriteBackIntoTheServerWhileItIsCalled) {
  Configure("Validating", "outer",
            {Webhook("outer.example.com", "/outer", Rule({"CREATE"}, {"secrets"}))});
  Configure("Validating", "inner",
            {Webhook("inner.example.com", "/inner", Rule({"CREATE"}, {"configmaps"}))});
  const std::string url = server_->url();
  Respond([url](const std::string& path, const json& request) {
    if (path == "/outer") {
      httplib::Client back(url);
      auto made = back.Post("/api/v1/namespaces/apps/configmaps",
                            ConfigMap("for-" + request["name"].get<std::string>()).dump(),
                            "application/json");
      if (!made || made->status != 201) return json{{"allowed", false}};
    }
    return json{{"allowed", true}};
  });
  json secret = {{"apiVersion", "v1"}, {"kind", "Secret"}, {"metadata", {{"name", "s1"}}}};
  auto created = Post("/api/v1/namespaces/apps/secrets", secret);
  ASSERT_EQ(created->status, 201) << created->body;
  EXPECT_FALSE(server_->Object("v1", "configmaps", "apps", "for-s1").is_null());
  EXPECT_EQ(Calls().size(), 2u);
}

TEST_F(AdmissionTest, KubectlAppliesConfigurationsAndSeesDenialsAndServerDryRuns) {
  ASSERT_EQ(RunCommand("command -v kubectl").exitCode, 0) << "kubectl is needed";
  const std::string kubectl = Kubectl();
  json config = {
      {"apiVersion", "admissionregistration.k8s.io/v1"},
      {"kind", "ValidatingWebhookConfiguration"},
      {"metadata", {{"name", "deny"}}},
      {"webhooks",
       json::array({Webhook("deny.example.com", "/validate", Rule({"CREATE"}, {"configmaps"}))})}};
  std::ofstream(dir_.path() / "config.json") << config.dump();
  auto applied = RunCommand(kubectl + "apply -f " +
                            ShellQuote((dir_.path() / "config.json").string()) + " 2>&1");
  ASSERT_EQ(applied.exitCode, 0) << applied.out;
  auto listed = RunCommand(kubectl + "get validatingwebhookconfigurations 2>&1");
  EXPECT_NE(listed.out.find("deny"), std::string::npos) << listed.out;
  // Applied again unchanged (client-side apply reads and patches it).
  applied = RunCommand(kubectl + "apply -f " + ShellQuote((dir_.path() / "config.json").string()) +
                       " 2>&1");
  ASSERT_EQ(applied.exitCode, 0) << applied.out;

  Respond([](const std::string&, const json& request) {
    if (request["dryRun"] == true) return json{{"allowed", true}};
    return json{{"allowed", false},
                {"status", {{"code", 403}, {"reason", "Forbidden"}, {"message", "not today"}}}};
  });
  std::ofstream(dir_.path() / "cm.json") << ConfigMap("c1").dump();
  const std::string file = ShellQuote((dir_.path() / "cm.json").string());
  auto dry = RunCommand(kubectl + "-n apps apply --dry-run=server -f " + file + " 2>&1");
  EXPECT_EQ(dry.exitCode, 0) << dry.out;
  EXPECT_NE(dry.out.find("(server dry run)"), std::string::npos) << dry.out;
  EXPECT_TRUE(server_->Object("v1", "configmaps", "apps", "c1").is_null());
  auto refused = RunCommand(kubectl + "-n apps apply -f " + file + " 2>&1");
  EXPECT_NE(refused.exitCode, 0);
  EXPECT_NE(
      refused.out.find("admission webhook \"deny.example.com\" denied the request: not today"),
      std::string::npos)
      << refused.out;
  EXPECT_TRUE(server_->Object("v1", "configmaps", "apps", "c1").is_null());
}

// The `fake_apiserver` program as a demo script runs it: the stand-in, a service endpoint and
// a user from flags; the endpoint moved through the control API.
TEST_F(AdmissionTest, TheProgramTakesTheStandInEndpointsAndUsersFromFlags) {
  const int port = testing::FreePort();
  ASSERT_GT(port, 0);
  pid_t pid =
      testing::Spawn({COZY_FAKE_APISERVER_BINARY, "--port", std::to_string(port), "--crds",
                      testing::TestCrdFile("kubevirt.io_virtualmachineinstances.yaml").string(),
                      "--virt-api-mutator", "--service-endpoint", "webhooks/hook=127.0.0.1:1",
                      "--user", R"(bob-token={"username":"bob","groups":["ops"]})"},
                     dir_.path() / "program.log");
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(testing::WaitFor([&] {
    std::ifstream in(dir_.path() / "program.log");
    return std::string(std::istreambuf_iterator<char>(in), {}).find("listening on") !=
           std::string::npos;
  }));
  httplib::Client program("127.0.0.1", port);
  json hook = Webhook("vmi.gpu.cozystack.io", "/vmi",
                      Rule({"CREATE"}, {"virtualmachineinstances"}, "kubevirt.io"));
  hook["reinvocationPolicy"] = "IfNeeded";
  json config = {{"apiVersion", "admissionregistration.k8s.io/v1"},
                 {"kind", "MutatingWebhookConfiguration"},
                 {"metadata", {{"name", "cozy-gpu"}}},
                 {"webhooks", json::array({hook})}};
  ASSERT_EQ(program
                .Post("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
                      config.dump(), "application/json")
                ->status,
            201);
  const std::string vmis = "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances";
  // The flag's endpoint (port 1) is closed: the call fails closed.
  EXPECT_EQ(program.Post(vmis, Vmi("vm1").dump(), "application/json")->status, 500);
  auto moved =
      program.Put("/_fake/service-endpoints",
                  json{{"namespace", "webhooks"}, {"name", "hook"}, {"port", port_}}.dump(),
                  "application/json");
  ASSERT_EQ(moved->status, 200) << moved->body;
  Respond([](const std::string&, const json& request) {
    if (request["object"]["metadata"].value("annotations", json::object()).contains("gpu")) {
      return json{{"allowed", true}};
    }
    return Patch(json::array(
        {{{"op", "add"}, {"path", "/metadata/annotations"}, {"value", {{"gpu", "planned"}}}}}));
  });
  auto created = program.Post(vmis, {{"Authorization", "Bearer bob-token"}}, Vmi("vm1").dump(),
                              "application/json");
  ASSERT_EQ(created->status, 201) << created->body;
  auto calls = Calls();
  ASSERT_EQ(calls.size(), 2u);  // reinvoked after the stand-in
  EXPECT_EQ(calls[1].request["object"]["spec"]["domain"]["machine"]["type"], "q35");
  EXPECT_EQ(calls[0].request["userInfo"]["username"], "bob");
  EXPECT_EQ(calls[0].request["userInfo"]["groups"], (json{"ops", "system:authenticated"}));
  json stored = json::parse(created->body);
  EXPECT_EQ(stored["metadata"]["annotations"]["gpu"], "planned");
  EXPECT_EQ(stored["metadata"]["annotations"]["kubevirt.io/latest-observed-api-version"], "v1");
  EXPECT_EQ(testing::Finish(pid), 0);
}

}  // namespace
}  // namespace cozy::fake
