// The fake API server where a controller lives: deletion with finalizers, namespace
// termination, dryRun on every write, delete preconditions, owner-reference garbage
// collection, the built-in kinds a controller uses (through kubectl too), the test-only CRDs
// served and withheld, and hundreds of concurrent watches. Real HTTP throughout.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <regex>
#include <set>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>

#include "kube/client.h"
#include "kube/errors.h"
#include "test/fakes/fake_apiserver.h"
#include "test/fakes/fake_apiserver_logic.h"
#include "test/kube/kube_test_support.h"
#include "test/support/fixture_host.h"
#include "test/support/process.h"

namespace cozy::fake {
namespace {
using nlohmann::json;
using testing::StartFakeApiServer;

const std::string kConfigMaps = "/api/v1/namespaces/t1/configmaps";
const std::string kSecrets = "/api/v1/namespaces/t1/secrets";

struct Answer {
  int status = 0;
  json body;
};

Answer Call(const FakeApiServer& server, const std::string& method, const std::string& path,
            const json& body = nullptr, const std::string& contentType = "application/json") {
  httplib::Client client(server.url());
  client.set_read_timeout(10, 0);
  std::string text = body.is_null() ? "" : body.dump();
  auto send = [&]() -> httplib::Result {
    if (method == "GET") return client.Get(path.c_str());
    if (method == "POST") return client.Post(path.c_str(), text, contentType.c_str());
    if (method == "PUT") return client.Put(path.c_str(), text, contentType.c_str());
    if (method == "PATCH") return client.Patch(path.c_str(), text, contentType.c_str());
    return client.Delete(path.c_str(), text, contentType.c_str());
  };
  auto result = send();
  if (!result) return {-1, nullptr};
  return {result->status, json::parse(result->body, nullptr, false)};
}

json ConfigMap(const std::string& name, const json& finalizers = json::array()) {
  json object = {{"apiVersion", "v1"},
                 {"kind", "ConfigMap"},
                 {"metadata", {{"name", name}}},
                 {"data", {{"k", "v"}}}};
  if (!finalizers.empty()) object["metadata"]["finalizers"] = finalizers;
  return object;
}

// A started server with the namespace t1 that most tests write into, made as a client makes
// it: the server refuses a create into a namespace that does not exist.
std::unique_ptr<FakeApiServer> StartWithNamespace() {
  auto server = StartFakeApiServer(false);
  EXPECT_EQ(Call(*server, "POST", "/api/v1/namespaces", {{"metadata", {{"name", "t1"}}}}).status,
            201);
  return server;
}

json OwnerRef(const json& owner, bool block = false) {
  json reference = {{"apiVersion", owner["apiVersion"]},
                    {"kind", owner["kind"]},
                    {"name", owner["metadata"]["name"]},
                    {"uid", owner["metadata"]["uid"]}};
  if (block) reference["blockOwnerDeletion"] = true;
  return reference;
}

// A watch read on a thread of its own; bookmarks (every 100 ms on the test server) let it
// notice that it should stop.
class WatchRecorder {
 public:
  WatchRecorder(const FakeApiServer& server, const std::string& collection) {
    std::string path = collection + "?watch=1&allowWatchBookmarks=true&resourceVersion=" +
                       server.CurrentResourceVersion();
    thread_ = std::thread([this, url = server.url(), path] {
      httplib::Client client(url);
      client.set_read_timeout(30, 0);
      std::string buffer;
      client.Get(path.c_str(), [this, &buffer](const char* data, size_t length) {
        buffer.append(data, length);
        for (size_t end; (end = buffer.find('\n')) != std::string::npos;) {
          json event = json::parse(buffer.substr(0, end), nullptr, false);
          buffer.erase(0, end + 1);
          if (event.is_discarded() || event.value("type", "") == "BOOKMARK") continue;
          std::lock_guard lock(mutex_);
          events_.push_back(event);
          changed_.notify_all();
        }
        std::lock_guard lock(mutex_);
        return !stop_;
      });
    });
  }
  ~WatchRecorder() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    thread_.join();
  }
  WatchRecorder(const WatchRecorder&) = delete;
  WatchRecorder& operator=(const WatchRecorder&) = delete;

  // The event types seen for `name`, once an event of `lastType` for it arrived (or 10 s).
  std::vector<std::string> TypesFor(const std::string& name, const std::string& lastType) {
    std::unique_lock lock(mutex_);
    auto types = [&] {
      std::vector<std::string> seen;
      for (const auto& event : events_) {
        if (event["object"]["metadata"].value("name", "") == name) {
          seen.push_back(event.value("type", ""));
        }
      }
      return seen;
    };
    changed_.wait_for(lock, std::chrono::seconds(10), [&] {
      auto seen = types();
      return std::find(seen.begin(), seen.end(), lastType) != seen.end();
    });
    return types();
  }
  std::vector<json> Events() {
    std::lock_guard lock(mutex_);
    return events_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<json> events_;
  bool stop_ = false;
  std::thread thread_;
};

TEST(FakeFinalizers, DeleteHoldsTheObjectUntilTheLastFinalizerGoes) {
  auto server = StartWithNamespace();
  WatchRecorder watch(*server, kConfigMaps);
  auto created = Call(*server, "POST", kConfigMaps, ConfigMap("held", {"test.cozystack.io/hold"}));
  ASSERT_EQ(created.status, 201);
  EXPECT_EQ(created.body["metadata"]["generation"], 1);

  auto deleted = Call(*server, "DELETE", kConfigMaps + "/held");
  EXPECT_EQ(deleted.status, 200);
  ASSERT_TRUE(deleted.body["metadata"].contains("deletionTimestamp")) << deleted.body;
  EXPECT_EQ(deleted.body["metadata"]["deletionGracePeriodSeconds"], 0);
  EXPECT_EQ(deleted.body["metadata"]["generation"], 2);  // markAsDeleting bumps it
  const json stamp = deleted.body["metadata"]["deletionTimestamp"];
  EXPECT_EQ(Call(*server, "GET", kConfigMaps + "/held").status, 200);

  // A second DELETE leaves the timestamp alone.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  auto again = Call(*server, "DELETE", kConfigMaps + "/held");
  EXPECT_EQ(again.status, 200);
  EXPECT_EQ(again.body["metadata"]["deletionTimestamp"], stamp);

  // No finalizer may be added now.
  auto added = Call(*server, "PATCH", kConfigMaps + "/held",
                    {{"metadata", {{"finalizers", {"test.cozystack.io/hold", "another/one"}}}}},
                    "application/merge-patch+json");
  EXPECT_EQ(added.status, 422);
  EXPECT_EQ(added.body["reason"], "Invalid");
  EXPECT_NE(added.body.value("message", "")
                .find("metadata.finalizers: Forbidden: no new finalizers can be added if the "
                      "object is being deleted"),
            std::string::npos)
      << added.body;
  EXPECT_EQ(added.body["details"]["causes"][0]["reason"], "FieldValueForbidden");

  // The update that drops the last finalizer deletes it: MODIFIED, then DELETED.
  auto released = Call(*server, "PATCH", kConfigMaps + "/held",
                       {{"metadata", {{"finalizers", nullptr}}}}, "application/merge-patch+json");
  EXPECT_EQ(released.status, 200);
  EXPECT_EQ(Call(*server, "GET", kConfigMaps + "/held").status, 404);
  EXPECT_EQ(watch.TypesFor("held", "DELETED"),
            (std::vector<std::string>{"ADDED", "MODIFIED", "MODIFIED", "DELETED"}));
}

// The fake's fidelity, not the product's behaviour: a namespace deletion goes once finalizers
// let it, as the controller's test of deleting a namespace with GPUs off needs.
TEST(FakeNamespaces, TerminationRemovesContentRefusesCreatesAndEndsWhenEmpty) {
  auto server = StartFakeApiServer(false);
  ASSERT_EQ(Call(*server, "POST", "/api/v1/namespaces", {{"metadata", {{"name", "t1"}}}}).status,
            201);
  auto active = Call(*server, "GET", "/api/v1/namespaces/t1");
  EXPECT_EQ(active.body["status"]["phase"], "Active");
  EXPECT_EQ(active.body["spec"]["finalizers"], json({"kubernetes"}));
  ASSERT_EQ(Call(*server, "POST", kConfigMaps, ConfigMap("plain")).status, 201);
  ASSERT_EQ(
      Call(*server, "POST", kConfigMaps, ConfigMap("held", {"test.cozystack.io/hold"})).status,
      201);
  ASSERT_EQ(Call(*server, "POST", kSecrets, {{"metadata", {{"name", "s"}}}}).status, 201);

  auto deleting = Call(*server, "DELETE", "/api/v1/namespaces/t1");
  EXPECT_EQ(deleting.status, 200);
  EXPECT_EQ(deleting.body["status"]["phase"], "Terminating");
  EXPECT_TRUE(deleting.body["metadata"].contains("deletionTimestamp"));
  EXPECT_EQ(deleting.body["spec"]["finalizers"], json({"kubernetes"}));

  // Content goes as a DELETE of each would have it: the finalizer holds one.
  EXPECT_EQ(Call(*server, "GET", kConfigMaps + "/plain").status, 404);
  EXPECT_EQ(Call(*server, "GET", kSecrets + "/s").status, 404);
  auto held = Call(*server, "GET", kConfigMaps + "/held");
  EXPECT_EQ(held.status, 200);
  EXPECT_TRUE(held.body["metadata"].contains("deletionTimestamp"));
  auto ns = Call(*server, "GET", "/api/v1/namespaces/t1");
  EXPECT_EQ(ns.status, 200);
  EXPECT_EQ(ns.body["status"]["phase"], "Terminating");

  auto refused = Call(*server, "POST", kConfigMaps, ConfigMap("late"));
  EXPECT_EQ(refused.status, 403);
  EXPECT_EQ(refused.body["reason"], "Forbidden");
  EXPECT_EQ(refused.body["message"],
            "configmaps \"late\" is forbidden: unable to create new content in namespace t1 "
            "because it is being terminated");
  EXPECT_EQ(refused.body["details"]["causes"][0]["reason"], "NamespaceTerminating");

  // The last finalizer goes: the object, then the namespace.
  ASSERT_EQ(Call(*server, "PATCH", kConfigMaps + "/held", {{"metadata", {{"finalizers", nullptr}}}},
                 "application/merge-patch+json")
                .status,
            200);
  EXPECT_EQ(Call(*server, "GET", kConfigMaps + "/held").status, 404);
  EXPECT_EQ(Call(*server, "GET", "/api/v1/namespaces/t1").status, 404);
  // spec.finalizers moves only through /finalize.
  ASSERT_EQ(Call(*server, "POST", "/api/v1/namespaces", {{"metadata", {{"name", "t2"}}}}).status,
            201);
  auto patched = Call(*server, "PATCH", "/api/v1/namespaces/t2",
                      {{"spec", {{"finalizers", nullptr}}}}, "application/merge-patch+json");
  EXPECT_EQ(patched.body["spec"]["finalizers"], json({"kubernetes"}));
  ASSERT_EQ(Call(*server, "POST", "/api/v1/namespaces/t2/configmaps",
                 ConfigMap("held", {"test.cozystack.io/hold"}))
                .status,
            201);
  Call(*server, "DELETE", "/api/v1/namespaces/t2");
  EXPECT_EQ(Call(*server, "GET", "/api/v1/namespaces/t2").status, 200);
  auto finalized =
      Call(*server, "PUT", "/api/v1/namespaces/t2/finalize",
           {{"metadata", {{"name", "t2"}}}, {"spec", {{"finalizers", json::array()}}}});
  EXPECT_EQ(finalized.status, 200);
  EXPECT_EQ(Call(*server, "GET", "/api/v1/namespaces/t2").status, 404);
  // A namespace of the same name can be made again, Active.
  EXPECT_EQ(Call(*server, "POST", "/api/v1/namespaces", {{"metadata", {{"name", "t1"}}}}).status,
            201);
  EXPECT_EQ(Call(*server, "POST", kConfigMaps, ConfigMap("fresh")).status, 201);
}

// The NamespaceLifecycle admission plugin's other half: a create into a namespace that does
// not exist is the NotFound of that namespace (404, before any validation of the object), as
// raw HTTP and as the project's client sees it; the four namespaces of a new cluster exist
// from the start and the first three may not be deleted.
TEST(FakeNamespaces, ACreateIntoAMissingNamespaceIsNotFoundAndTheSystemOnesExist) {
  auto server = StartFakeApiServer(false);
  std::set<std::string> names;
  const json namespaces = Call(*server, "GET", "/api/v1/namespaces").body;
  for (const auto& ns : namespaces["items"]) {
    EXPECT_EQ(ns["status"]["phase"], "Active") << ns;
    names.insert(ns["metadata"]["name"].get<std::string>());
  }
  EXPECT_EQ(names,
            (std::set<std::string>{"default", "kube-node-lease", "kube-public", "kube-system"}));

  const std::string absentConfigMaps = "/api/v1/namespaces/absent/configmaps";
  auto refused = Call(*server, "POST", absentConfigMaps, ConfigMap("c"));
  EXPECT_EQ(refused.status, 404);
  EXPECT_EQ(refused.body["kind"], "Status");
  EXPECT_EQ(refused.body["reason"], "NotFound");
  EXPECT_EQ(refused.body["message"], "namespaces \"absent\" not found");
  EXPECT_EQ(refused.body["details"], json({{"name", "absent"}, {"kind", "namespaces"}}));
  // Admission comes before validation and before a dry run's end; every namespaced kind.
  EXPECT_EQ(Call(*server, "POST", absentConfigMaps, ConfigMap("Not_A_Name")).status, 404);
  EXPECT_EQ(Call(*server, "POST", absentConfigMaps + "?dryRun=All", ConfigMap("c")).status, 404);
  EXPECT_EQ(Call(*server, "POST", "/apis/coordination.k8s.io/v1/namespaces/absent/leases",
                 {{"metadata", {{"name", "l"}}}, {"spec", {{"holderIdentity", "a"}}}})
                .status,
            404);
  // The handler's own check comes first: a body naming another namespace is a 400.
  json elsewhere = ConfigMap("c");
  elsewhere["metadata"]["namespace"] = "other";
  EXPECT_EQ(Call(*server, "POST", absentConfigMaps, elsewhere).status, 400);
  EXPECT_EQ(Call(*server, "GET", absentConfigMaps + "/c").status, 404);

  // The client's view: kNotFound (the Status names the namespace), not an unserved kind.
  kube::Client client(testing::ConfigFor(*server),
                      testing::TestClientOptions(kube::DefaultTimeSource()));
  try {
    client.Create(absentConfigMaps, ConfigMap("c"));
    ADD_FAILURE() << "created into a namespace that does not exist";
  } catch (const kube::ApiError& error) {
    EXPECT_EQ(error.kind(), kube::ErrorKind::kNotFound) << error.what();
    EXPECT_NE(std::string(error.what()).find("namespaces \"absent\" not found"), std::string::npos)
        << error.what();
  }
  // Once the namespace is made, the same create goes through; "default" takes one at once.
  client.Create("/api/v1/namespaces", {{"metadata", {{"name", "absent"}}}});
  EXPECT_EQ(client.Create(absentConfigMaps, ConfigMap("c"))["metadata"]["namespace"], "absent");
  EXPECT_EQ(Call(*server, "POST", "/api/v1/namespaces/default/configmaps", ConfigMap("c")).status,
            201);
  // Seed is the test's back door: no admission, the namespace need not exist.
  json seeded = ConfigMap("seeded");
  seeded["metadata"]["namespace"] = "nowhere";
  EXPECT_EQ(server->Seed(seeded)["metadata"]["namespace"], "nowhere");

  // While a namespace terminates, a create with generateName is refused without a name.
  ASSERT_EQ(Call(*server, "POST", "/api/v1/namespaces/absent/configmaps",
                 ConfigMap("held", {"test.cozystack.io/hold"}))
                .status,
            201);
  ASSERT_EQ(Call(*server, "DELETE", "/api/v1/namespaces/absent").status, 200);
  auto generated = Call(*server, "POST", absentConfigMaps,
                        {{"metadata", {{"generateName", "late-"}}}, {"data", {{"k", "v"}}}});
  EXPECT_EQ(generated.status, 403);
  EXPECT_EQ(generated.body["message"],
            "configmaps is forbidden: unable to create new content in namespace absent because "
            "it is being terminated");

  // The immortal namespaces (dry run or not); kube-node-lease is not one of them.
  for (const char* name : {"default", "kube-system", "kube-public"}) {
    for (const char* query : {"", "?dryRun=All"}) {
      auto kept = Call(*server, "DELETE", std::string("/api/v1/namespaces/") + name + query);
      EXPECT_EQ(kept.status, 403) << name << query;
      EXPECT_EQ(kept.body["reason"], "Forbidden");
      EXPECT_EQ(kept.body["message"], std::string("namespaces \"") + name +
                                          "\" is forbidden: this namespace may not be deleted");
    }
    EXPECT_EQ(Call(*server, "GET", std::string("/api/v1/namespaces/") + name).status, 200);
  }
}

// The fake's fidelity, not the product's behaviour: a dry run stores and emits nothing, as the
// webhooks' tests of a dry run that leaves no trace need.
TEST(FakeDryRun, EveryVerbValidatesAnswersAndStoresAndEmitsNothing) {
  auto server = StartWithNamespace();
  ASSERT_EQ(Call(*server, "POST", kConfigMaps, ConfigMap("kept")).status, 201);
  const json before = server->Object("v1", "configmaps", "t1", "kept");
  const std::string version = server->CurrentResourceVersion();
  WatchRecorder watch(*server, kConfigMaps);

  auto created = Call(*server, "POST", kConfigMaps + "?dryRun=All", ConfigMap("ghost"));
  EXPECT_EQ(created.status, 201);
  EXPECT_EQ(created.body["metadata"]["name"], "ghost");
  EXPECT_TRUE(created.body["metadata"].contains("uid"));
  EXPECT_EQ(Call(*server, "GET", kConfigMaps + "/ghost").status, 404);
  // Validation still runs.
  EXPECT_EQ(Call(*server, "POST", kConfigMaps + "?dryRun=All", ConfigMap("Bad_Name")).status, 422);
  EXPECT_EQ(Call(*server, "POST", kConfigMaps + "?dryRun=All", ConfigMap("kept")).status, 409);

  json changed = before;
  changed["data"]["k"] = "put";
  auto put = Call(*server, "PUT", kConfigMaps + "/kept?dryRun=All", changed);
  EXPECT_EQ(put.status, 200);
  EXPECT_EQ(put.body["data"]["k"], "put");
  auto merge = Call(*server, "PATCH", kConfigMaps + "/kept?dryRun=All",
                    {{"data", {{"k", "merge"}}}}, "application/merge-patch+json");
  EXPECT_EQ(merge.status, 200);
  EXPECT_EQ(merge.body["data"]["k"], "merge");
  auto jsonPatch = Call(*server, "PATCH", kConfigMaps + "/kept?dryRun=All",
                        json::array({{{"op", "replace"}, {"path", "/data/k"}, {"value", "json"}}}),
                        "application/json-patch+json");
  EXPECT_EQ(jsonPatch.status, 200);
  EXPECT_EQ(jsonPatch.body["data"]["k"], "json");
  auto strategic = Call(*server, "PATCH", kConfigMaps + "/kept?dryRun=All",
                        {{"data", {{"k", "strategic"}}}}, "application/strategic-merge-patch+json");
  EXPECT_EQ(strategic.status, 200);
  EXPECT_EQ(strategic.body["data"]["k"], "strategic");
  // A stale resourceVersion is still a conflict.
  json stale = changed;
  stale["metadata"]["resourceVersion"] = "1";
  EXPECT_EQ(Call(*server, "PUT", kConfigMaps + "/kept?dryRun=All", stale).status, 409);

  auto deleted = Call(*server, "DELETE", kConfigMaps + "/kept",
                      {{"kind", "DeleteOptions"}, {"apiVersion", "v1"}, {"dryRun", {"All"}}});
  EXPECT_EQ(deleted.status, 200);
  EXPECT_EQ(Call(*server, "DELETE", kConfigMaps + "/kept?dryRun=All").status, 200);
  auto collection = Call(*server, "DELETE", kConfigMaps + "?dryRun=All");
  EXPECT_EQ(collection.status, 200);
  EXPECT_EQ(collection.body["items"].size(), 1u);
  auto ns = Call(*server, "DELETE", "/api/v1/namespaces/absent?dryRun=All");
  EXPECT_EQ(ns.status, 404);  // nothing made it

  // An unknown value is refused (422 Invalid on the options, as ValidateDryRun has it).
  auto bogus = Call(*server, "POST", kConfigMaps + "?dryRun=Some", ConfigMap("ghost"));
  EXPECT_EQ(bogus.status, 422);
  EXPECT_EQ(bogus.body["details"]["kind"], "CreateOptions");
  EXPECT_EQ(Call(*server, "DELETE", kConfigMaps + "/kept?dryRun=yes").status, 422);

  EXPECT_EQ(server->Object("v1", "configmaps", "t1", "kept"), before);
  EXPECT_EQ(server->CurrentResourceVersion(), version);
  // Nothing was emitted: the next event the watch sees is the marker's.
  ASSERT_EQ(Call(*server, "POST", kConfigMaps, ConfigMap("marker")).status, 201);
  EXPECT_EQ(watch.TypesFor("marker", "ADDED"), std::vector<std::string>{"ADDED"});
  ASSERT_EQ(watch.Events().size(), 1u) << watch.Events()[0];
}

TEST(FakeDelete, PreconditionsOnUidAndResourceVersionConflict) {
  auto server = StartWithNamespace();
  auto created = Call(*server, "POST", kConfigMaps, ConfigMap("c"));
  const std::string uid = created.body["metadata"]["uid"];
  const std::string version = created.body["metadata"]["resourceVersion"];
  auto wrongUid = Call(*server, "DELETE", kConfigMaps + "/c",
                       {{"preconditions", {{"uid", "00000000-0000-0000-0000-000000000000"}}}});
  EXPECT_EQ(wrongUid.status, 409);
  EXPECT_EQ(wrongUid.body["reason"], "Conflict");
  EXPECT_NE(wrongUid.body.value("message", "").find("Precondition failed: UID in precondition"),
            std::string::npos)
      << wrongUid.body;
  auto wrongVersion =
      Call(*server, "DELETE", kConfigMaps + "/c", {{"preconditions", {{"resourceVersion", "1"}}}});
  EXPECT_EQ(wrongVersion.status, 409);
  EXPECT_NE(wrongVersion.body.value("message", "").find("ResourceVersion in precondition: 1"),
            std::string::npos);
  EXPECT_EQ(Call(*server, "GET", kConfigMaps + "/c").status, 200);
  EXPECT_EQ(Call(*server, "DELETE", kConfigMaps + "/c",
                 {{"preconditions", {{"uid", uid}, {"resourceVersion", version}}}})
                .status,
            200);
  EXPECT_EQ(Call(*server, "GET", kConfigMaps + "/c").status, 404);
  // An unknown propagation policy is refused.
  Call(*server, "POST", kConfigMaps, ConfigMap("d"));
  EXPECT_EQ(Call(*server, "DELETE", kConfigMaps + "/d", {{"propagationPolicy", "Later"}}).status,
            422);
}

// The pod registry's graceful deletion, as the real server showed it (docs/kubernetes.md,
// "What the real server showed"): a pod bound to
// a node stays Terminating for its grace period until its kubelet deletes it with grace 0; an
// unscheduled or finished pod goes at once; a later DELETE may only shorten the grace; and a
// namespace holding a bound pod stays Terminating meanwhile.
TEST(FakeDelete, APodOnANodeStaysTerminatingUntilAGraceZeroDelete) {
  auto server = StartWithNamespace();
  const std::string pods = "/api/v1/namespaces/t1/pods";
  auto pod = [](const std::string& name, const std::string& node) {
    json object = {{"apiVersion", "v1"},
                   {"kind", "Pod"},
                   {"metadata", {{"name", name}}},
                   {"spec", {{"containers", {{{"name", "c"}, {"image", "busybox"}}}}}}};
    if (!node.empty()) object["spec"]["nodeName"] = node;
    return object;
  };
  ASSERT_EQ(Call(*server, "POST", pods, pod("bound", "n1")).status, 201);
  ASSERT_EQ(Call(*server, "POST", pods, pod("pending", "")).status, 201);
  json shortGrace = pod("short", "n1");
  shortGrace["spec"]["terminationGracePeriodSeconds"] = 5;
  ASSERT_EQ(Call(*server, "POST", pods, shortGrace).status, 201);
  ASSERT_EQ(Call(*server, "POST", pods, pod("finished", "n1")).status, 201);
  ASSERT_EQ(Call(*server, "PATCH", pods + "/finished/status",
                 {{"status", {{"phase", "Succeeded"}}}}, "application/merge-patch+json")
                .status,
            200);

  // Bound and running: Terminating, with the default 30 s.
  auto deleting = Call(*server, "DELETE", pods + "/bound");
  EXPECT_EQ(deleting.status, 200);
  auto bound = Call(*server, "GET", pods + "/bound");
  ASSERT_EQ(bound.status, 200) << "a pod on a node waits for its kubelet";
  EXPECT_EQ(bound.body["metadata"]["deletionGracePeriodSeconds"], 30);
  const auto when = ParseTimestamp(bound.body["metadata"].value("deletionTimestamp", ""));
  ASSERT_TRUE(when);
  EXPECT_GT(*when, std::chrono::system_clock::now() + std::chrono::seconds(20));
  // A second DELETE with a longer grace changes nothing; the kubelet's grace 0 removes it.
  EXPECT_EQ(Call(*server, "DELETE", pods + "/bound", {{"gracePeriodSeconds", 60}}).status, 200);
  EXPECT_EQ(Call(*server, "GET", pods + "/bound").body["metadata"]["deletionGracePeriodSeconds"],
            30);
  EXPECT_EQ(Call(*server, "DELETE", pods + "/bound", {{"gracePeriodSeconds", 0}}).status, 200);
  EXPECT_EQ(Call(*server, "GET", pods + "/bound").status, 404);
  // The pod's own grace; unscheduled and finished pods go at once.
  EXPECT_EQ(Call(*server, "DELETE", pods + "/short").status, 200);
  EXPECT_EQ(Call(*server, "GET", pods + "/short").body["metadata"]["deletionGracePeriodSeconds"],
            5);
  EXPECT_EQ(Call(*server, "DELETE", pods + "/pending").status, 200);
  EXPECT_EQ(Call(*server, "GET", pods + "/pending").status, 404);
  EXPECT_EQ(Call(*server, "DELETE", pods + "/finished").status, 200);
  EXPECT_EQ(Call(*server, "GET", pods + "/finished").status, 404);

  // The namespace controller's deletes leave a bound pod Terminating, and the namespace with it.
  EXPECT_EQ(Call(*server, "DELETE", "/api/v1/namespaces/t1").status, 200);
  EXPECT_EQ(Call(*server, "GET", "/api/v1/namespaces/t1").body["status"]["phase"], "Terminating");
  EXPECT_EQ(Call(*server, "GET", pods + "/short").status, 200);
  EXPECT_EQ(Call(*server, "DELETE", pods + "/short?gracePeriodSeconds=0").status, 200);
  EXPECT_TRUE(testing::WaitFor(
      [&] { return Call(*server, "GET", "/api/v1/namespaces/t1").status == 404; }));
}

TEST(FakeGarbageCollector, BackgroundDeletesDependentsAfterTheOwnerGoes) {
  auto server = StartWithNamespace();
  auto owner = Call(*server, "POST", kConfigMaps, ConfigMap("owner")).body;
  json dependent = ConfigMap("dependent");
  dependent["metadata"]["ownerReferences"] = {OwnerRef(owner)};
  ASSERT_EQ(Call(*server, "POST", kConfigMaps, dependent).status, 201);
  // An owner of a kind this server does not serve cannot be resolved: the object stays.
  json foreign = ConfigMap("foreign");
  foreign["metadata"]["ownerReferences"] = {{{"apiVersion", "apps/v1"},
                                             {"kind", "ReplicaSet"},
                                             {"name", "rs"},
                                             {"uid", "00000000-0000-4000-8000-00000000ffff"}}};
  ASSERT_EQ(Call(*server, "POST", kConfigMaps, foreign).status, 201);
  WatchRecorder watch(*server, kConfigMaps);
  EXPECT_EQ(Call(*server, "GET", kConfigMaps + "/dependent").status, 200);

  EXPECT_EQ(
      Call(*server, "DELETE", kConfigMaps + "/owner", {{"propagationPolicy", "Background"}}).status,
      200);
  EXPECT_EQ(Call(*server, "GET", kConfigMaps + "/owner").status, 404);
  EXPECT_EQ(Call(*server, "GET", kConfigMaps + "/dependent").status, 404);
  EXPECT_EQ(Call(*server, "GET", kConfigMaps + "/foreign").status, 200);
  // The owner went first.
  auto events = watch.Events();
  watch.TypesFor("dependent", "DELETED");
  events = watch.Events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0]["object"]["metadata"]["name"], "owner");
  EXPECT_EQ(events[1]["object"]["metadata"]["name"], "dependent");
}

// The fake's fidelity, not the product's behaviour: the foregroundDeletion finalizer belongs to
// the garbage collector, as on a real API server.
TEST(FakeGarbageCollector, ForegroundDeletesBlockingDependentsFirst) {
  auto server = StartWithNamespace();
  auto owner = Call(*server, "POST", kConfigMaps, ConfigMap("owner")).body;
  json blocking = ConfigMap("blocking", {"test.cozystack.io/hold"});
  blocking["metadata"]["ownerReferences"] = {OwnerRef(owner, true)};
  json loose = ConfigMap("loose");
  loose["metadata"]["ownerReferences"] = {OwnerRef(owner)};
  ASSERT_EQ(Call(*server, "POST", kConfigMaps, blocking).status, 201);
  ASSERT_EQ(Call(*server, "POST", kConfigMaps, loose).status, 201);

  auto deleting =
      Call(*server, "DELETE", kConfigMaps + "/owner", {{"propagationPolicy", "Foreground"}});
  EXPECT_EQ(deleting.status, 200);
  EXPECT_TRUE(deleting.body["metadata"].contains("deletionTimestamp"));
  EXPECT_EQ(deleting.body["metadata"]["finalizers"], json({"foregroundDeletion"}));
  // Every dependent is deleted; the one with blockOwnerDeletion (held by its finalizer) keeps
  // the owner.
  EXPECT_EQ(Call(*server, "GET", kConfigMaps + "/loose").status, 404);
  auto held = Call(*server, "GET", kConfigMaps + "/blocking");
  EXPECT_TRUE(held.body["metadata"].contains("deletionTimestamp"));
  auto waiting = Call(*server, "GET", kConfigMaps + "/owner");
  EXPECT_EQ(waiting.status, 200);
  EXPECT_EQ(waiting.body["metadata"]["finalizers"], json({"foregroundDeletion"}));

  ASSERT_EQ(Call(*server, "PATCH", kConfigMaps + "/blocking",
                 {{"metadata", {{"finalizers", nullptr}}}}, "application/merge-patch+json")
                .status,
            200);
  EXPECT_EQ(Call(*server, "GET", kConfigMaps + "/blocking").status, 404);
  EXPECT_EQ(Call(*server, "GET", kConfigMaps + "/owner").status, 404);
}

TEST(FakeGarbageCollector, OrphanRemovesTheReferencesAndKeepsTheDependents) {
  auto server = StartWithNamespace();
  auto owner = Call(*server, "POST", kConfigMaps, ConfigMap("owner")).body;
  auto other = Call(*server, "POST", kConfigMaps, ConfigMap("other")).body;
  json dependent = ConfigMap("dependent");
  dependent["metadata"]["ownerReferences"] = {OwnerRef(owner), OwnerRef(other)};
  ASSERT_EQ(Call(*server, "POST", kConfigMaps, dependent).status, 201);
  json only = ConfigMap("only");
  only["metadata"]["ownerReferences"] = {OwnerRef(owner)};
  ASSERT_EQ(Call(*server, "POST", kConfigMaps, only).status, 201);

  EXPECT_EQ(
      Call(*server, "DELETE", kConfigMaps + "/owner", {{"propagationPolicy", "Orphan"}}).status,
      200);
  EXPECT_EQ(Call(*server, "GET", kConfigMaps + "/owner").status, 404);
  auto kept = Call(*server, "GET", kConfigMaps + "/dependent");
  ASSERT_EQ(kept.status, 200);
  EXPECT_EQ(kept.body["metadata"]["ownerReferences"], json::array({OwnerRef(other)}));
  auto orphan = Call(*server, "GET", kConfigMaps + "/only");
  ASSERT_EQ(orphan.status, 200);
  EXPECT_FALSE(orphan.body["metadata"].contains("ownerReferences"));
}

// The collector visits only objects that have owners or hold its finalizers (the fake keeps
// them in an index, so a write on a server of 100,000 ownerless pods does not walk them all):
// an owner gained or dropped by a later write counts as at creation, and an owner that goes
// while its dependents wait takes them with it.
TEST(FakeGarbageCollector, OwnersGainedOrDroppedByAWriteCountAsAtCreation) {
  auto server = StartWithNamespace();
  auto owner = Call(*server, "POST", kConfigMaps, ConfigMap("owner")).body;
  ASSERT_EQ(Call(*server, "POST", kConfigMaps, ConfigMap("adopted")).status, 201);
  json released = ConfigMap("released");
  released["metadata"]["ownerReferences"] = {OwnerRef(owner)};
  ASSERT_EQ(Call(*server, "POST", kConfigMaps, released).status, 201);
  for (int i = 0; i < 50; ++i) {
    ASSERT_EQ(
        Call(*server, "POST", kConfigMaps, ConfigMap("bystander-" + std::to_string(i))).status,
        201);
  }
  ASSERT_EQ(
      Call(*server, "PATCH", kConfigMaps + "/adopted",
           {{"metadata", {{"ownerReferences", {OwnerRef(owner)}}}}}, "application/merge-patch+json")
          .status,
      200);
  ASSERT_EQ(Call(*server, "PATCH", kConfigMaps + "/released",
                 {{"metadata", {{"ownerReferences", nullptr}}}}, "application/merge-patch+json")
                .status,
            200);
  // A bystander deleted first wakes the collector with nothing of its own to do.
  ASSERT_EQ(Call(*server, "DELETE", kConfigMaps + "/bystander-0").status, 200);
  EXPECT_EQ(Call(*server, "GET", kConfigMaps + "/adopted").status, 200);

  ASSERT_EQ(
      Call(*server, "DELETE", kConfigMaps + "/owner", {{"propagationPolicy", "Background"}}).status,
      200);
  EXPECT_EQ(Call(*server, "GET", kConfigMaps + "/adopted").status, 404);
  EXPECT_EQ(Call(*server, "GET", kConfigMaps + "/released").status, 200);
  EXPECT_EQ(Call(*server, "GET", kConfigMaps + "/bystander-1").status, 200);

  // A dependent created after its owner went is collected at once, as the real collector does
  // once it resolves the reference; a same-named object in its place is a new one.
  json late = ConfigMap("late");
  late["metadata"]["ownerReferences"] = {OwnerRef(owner)};
  ASSERT_EQ(Call(*server, "POST", kConfigMaps, late).status, 201);
  EXPECT_EQ(Call(*server, "GET", kConfigMaps + "/late").status, 404);
  ASSERT_EQ(Call(*server, "POST", kConfigMaps, ConfigMap("late")).status, 201);
  ASSERT_EQ(Call(*server, "DELETE", kConfigMaps + "/bystander-2").status, 200);
  EXPECT_EQ(Call(*server, "GET", kConfigMaps + "/late").status, 200);
}

TEST(FakeKinds, BuiltinKindsValidateTheBasics) {
  auto server = StartWithNamespace();
  auto badName = Call(*server, "POST", kConfigMaps, ConfigMap("Not_A_Name"));
  EXPECT_EQ(badName.status, 422);
  EXPECT_EQ(badName.body["details"]["causes"][0]["field"], "metadata.name");
  json badKey = ConfigMap("c");
  badKey["data"] = {{"a key", "v"}};
  EXPECT_EQ(Call(*server, "POST", kConfigMaps, badKey).status, 422);
  json wrongType = ConfigMap("c");
  wrongType["data"] = {{"k", 1}};
  EXPECT_EQ(Call(*server, "POST", kConfigMaps, wrongType).status, 400);

  // Secrets: stringData becomes base64 data; the type defaults to Opaque.
  auto secret = Call(*server, "POST", kSecrets,
                     {{"metadata", {{"name", "s"}}}, {"stringData", {{"a", "hi"}}}});
  ASSERT_EQ(secret.status, 201);
  EXPECT_EQ(secret.body["data"]["a"], "aGk=");
  EXPECT_EQ(secret.body["type"], "Opaque");
  EXPECT_FALSE(secret.body.contains("stringData"));
  EXPECT_EQ(Call(*server, "POST", kSecrets,
                 {{"metadata", {{"name", "tls"}}}, {"type", "kubernetes.io/tls"}})
                .status,
            422);

  const std::string leases = "/apis/coordination.k8s.io/v1/namespaces/t1/leases";
  auto lease = Call(*server, "POST", leases,
                    {{"metadata", {{"name", "gpu-controller"}}},
                     {"spec", {{"holderIdentity", "replica-a"}, {"leaseDurationSeconds", 15}}}});
  ASSERT_EQ(lease.status, 201);
  EXPECT_EQ(lease.body["apiVersion"], "coordination.k8s.io/v1");
  EXPECT_EQ(Call(*server, "POST", leases,
                 {{"metadata", {{"name", "bad"}}}, {"spec", {{"leaseDurationSeconds", 0}}}})
                .status,
            422);
  // renewTime and acquireTime are MicroTimes: the real server refuses a Time's
  // "...05Z" as undecodable, and so does the fake.
  for (const std::string time :
       {"2026-12-02T07:36:47Z", "2026-12-02T07:36:47.123Z", "2026-12-02T07:36:47.1234567Z"}) {
    const auto refused = Call(*server, "POST", leases,
                              {{"metadata", {{"name", "seconds"}}},
                               {"spec", {{"holderIdentity", "x"}, {"renewTime", time}}}});
    EXPECT_EQ(refused.status, 400) << time;
    EXPECT_NE(refused.body.value("message", "").find("2006-01-02T15:04:05.000000Z07:00"),
              std::string::npos)
        << refused.body;
  }
  EXPECT_EQ(Call(*server, "POST", leases,
                 {{"metadata", {{"name", "micro"}}},
                  {"spec",
                   {{"holderIdentity", "x"},
                    {"renewTime", "2026-12-02T07:36:47.000000Z"},
                    {"acquireTime", "2026-12-02T07:36:47.123456+01:00"}}}})
                .status,
            201);
  // A Lease takes no unconditional update.
  json unconditional = lease.body;
  unconditional["metadata"].erase("resourceVersion");
  EXPECT_EQ(Call(*server, "PUT", leases + "/gpu-controller", unconditional).status, 422);
  json stale = lease.body;
  stale["spec"]["holderIdentity"] = "replica-b";
  EXPECT_EQ(Call(*server, "PUT", leases + "/gpu-controller", stale).status, 200);
  EXPECT_EQ(Call(*server, "PUT", leases + "/gpu-controller", stale).status, 409);

  const std::string quotas = "/api/v1/namespaces/t1/resourcequotas";
  auto quota = Call(*server, "POST", quotas,
                    {{"metadata", {{"name", "gpu"}}},
                     {"spec", {{"hard", {{"requests.nvidia.com/gpu", "2"}}}}},
                     {"status", {{"used", {{"requests.nvidia.com/gpu", "1"}}}}}});
  ASSERT_EQ(quota.status, 201);
  EXPECT_FALSE(quota.body.contains("status"));  // status is a subresource
  EXPECT_EQ(Call(*server, "POST", quotas,
                 {{"metadata", {{"name", "neg"}}}, {"spec", {{"hard", {{"pods", "-1"}}}}}})
                .status,
            422);
  EXPECT_EQ(Call(*server, "PATCH", quotas + "/gpu/status",
                 {{"status", {{"used", {{"requests.nvidia.com/gpu", "1"}}}}}},
                 "application/merge-patch+json")
                .status,
            200);

  auto event = Call(*server, "POST", "/api/v1/namespaces/t1/events",
                    {{"metadata", {{"name", "vm.1"}}},
                     {"involvedObject", {{"kind", "Pod"}, {"name", "p"}, {"namespace", "t1"}}},
                     {"reason", "Bound"},
                     {"type", "Normal"},
                     {"message", "bound"}});
  EXPECT_EQ(event.status, 201);
  EXPECT_EQ(Call(*server, "POST", "/api/v1/namespaces/t1/events",
                 {{"metadata", {{"name", "vm.2"}}},
                  {"involvedObject", {{"kind", "Pod"}, {"name", "p"}, {"namespace", "other"}}}})
                .status,
            422);
  auto selected = Call(*server, "GET", "/api/v1/namespaces/t1/events?fieldSelector=reason%3DBound");
  EXPECT_EQ(selected.body["items"].size(), 1u);

  // Discovery lists them all.
  auto core = Call(*server, "GET", "/api/v1");
  std::set<std::string> names;
  for (const auto& resource : core.body["resources"]) names.insert(resource["name"]);
  for (const char* name : {"configmaps", "secrets", "resourcequotas", "resourcequotas/status",
                           "events", "namespaces/finalize"}) {
    EXPECT_TRUE(names.count(name)) << name;
  }
  EXPECT_EQ(Call(*server, "GET", "/apis/coordination.k8s.io/v1").body["resources"][0]["kind"],
            "Lease");
}

// An events.k8s.io/v1 Event as client-go's events recorder writes it.
json EventV1(const std::string& name) {
  return {{"apiVersion", "events.k8s.io/v1"},
          {"kind", "Event"},
          {"metadata", {{"name", name}}},
          {"eventTime", "2025-01-02T03:04:05.000000Z"},
          {"reportingController", "gpu.cozystack.io/controller"},
          {"reportingInstance", "gpu-controller-0"},
          {"action", "Bind"},
          {"reason", "Bound"},
          {"type", "Normal"},
          {"note", "bound to node n1"},
          {"regarding",
           {{"apiVersion", "gpu.cozystack.io/v1alpha1"},
            {"kind", "GPUDevice"},
            {"name", "gpu-1"},
            {"namespace", "t1"}}}};
}

std::set<std::string> CauseFields(const json& status) {
  std::set<std::string> fields;
  for (const auto& cause : status["details"].value("causes", json::array())) {
    fields.insert(cause.value("field", ""));
  }
  return fields;
}

// events.k8s.io/v1 is served and is the same storage as core v1 Events, as on a real server:
// written through one API, read, listed, selected and watched through both, each in its own
// shape; the v1 API's validation (pkg/apis/core/validation/events.go) on create and update.
TEST(FakeKinds, EventsV1IsServedAndSharesTheCoreEventsStorage) {
  auto server = StartWithNamespace();
  bool listed = false;
  const json groups = Call(*server, "GET", "/apis").body["groups"];
  for (const auto& group : groups) {
    listed = listed || (group["name"] == "events.k8s.io" &&
                        group["preferredVersion"]["groupVersion"] == "events.k8s.io/v1");
  }
  EXPECT_TRUE(listed);
  const json resources = Call(*server, "GET", "/apis/events.k8s.io/v1").body["resources"];
  ASSERT_EQ(resources.size(), 1u) << resources;
  EXPECT_EQ(resources[0]["name"], "events");
  EXPECT_EQ(resources[0]["singularName"], "event");
  EXPECT_EQ(resources[0]["kind"], "Event");
  EXPECT_EQ(resources[0]["namespaced"], true);
  EXPECT_EQ(resources[0]["shortNames"], json({"ev"}));

  const std::string v1 = "/apis/events.k8s.io/v1/namespaces/t1/events";
  const std::string core = "/api/v1/namespaces/t1/events";
  WatchRecorder watch(*server, v1);
  auto created = Call(*server, "POST", v1, EventV1("gpu-1.bound"));
  ASSERT_EQ(created.status, 201) << created.body;
  EXPECT_EQ(created.body["apiVersion"], "events.k8s.io/v1");
  EXPECT_EQ(created.body["regarding"]["name"], "gpu-1");
  EXPECT_EQ(created.body["note"], "bound to node n1");
  EXPECT_EQ(created.body["reportingController"], "gpu.cozystack.io/controller");
  EXPECT_FALSE(created.body.contains("involvedObject"));
  EXPECT_EQ(server->Object("events.k8s.io/v1", "events", "t1", "gpu-1.bound"), created.body);

  // The same object through the core API, in the core shape.
  auto asCore = Call(*server, "GET", core + "/gpu-1.bound");
  ASSERT_EQ(asCore.status, 200);
  EXPECT_EQ(asCore.body["apiVersion"], "v1");
  EXPECT_EQ(asCore.body["involvedObject"]["kind"], "GPUDevice");
  EXPECT_EQ(asCore.body["message"], "bound to node n1");
  EXPECT_EQ(asCore.body["reportingComponent"], "gpu.cozystack.io/controller");
  EXPECT_EQ(asCore.body["eventTime"], "2025-01-02T03:04:05.000000Z");
  EXPECT_FALSE(asCore.body.contains("regarding"));
  EXPECT_EQ(asCore.body["metadata"]["resourceVersion"],
            created.body["metadata"]["resourceVersion"]);
  // Field selectors by each API's names.
  EXPECT_EQ(Call(*server, "GET", core + "?fieldSelector=involvedObject.name%3Dgpu-1")
                .body["items"]
                .size(),
            1u);
  auto selected =
      Call(*server, "GET", v1 + "?fieldSelector=regarding.name%3Dgpu-1%2Creason%3DBound");
  ASSERT_EQ(selected.body["items"].size(), 1u) << selected.body;
  EXPECT_EQ(selected.body["items"][0]["note"], "bound to node n1");
  EXPECT_EQ(
      Call(*server, "GET", v1 + "?fieldSelector=reportingController%3Dother").body["items"].size(),
      0u);
  EXPECT_EQ(Call(*server, "GET", v1 + "?fieldSelector=involvedObject.name%3Dgpu-1").status, 400);

  // A core Event (old style, no eventTime) reaches the v1 watch in the v1 shape.
  ASSERT_EQ(Call(*server, "POST", core,
                 {{"metadata", {{"name", "pod.1"}}},
                  {"involvedObject", {{"kind", "Pod"}, {"name", "p"}, {"namespace", "t1"}}},
                  {"reason", "Started"},
                  {"message", "started"},
                  {"count", 2},
                  {"type", "Normal"}})
                .status,
            201);
  EXPECT_EQ(watch.TypesFor("pod.1", "ADDED"), std::vector<std::string>{"ADDED"});
  for (const auto& event : watch.Events()) {
    const json& object = event["object"];
    EXPECT_EQ(object["apiVersion"], "events.k8s.io/v1") << object;
    EXPECT_TRUE(object.contains("regarding")) << object;
    EXPECT_FALSE(object.contains("involvedObject")) << object;
    if (object["metadata"]["name"] == "pod.1") {
      EXPECT_EQ(object["note"], "started");
      EXPECT_EQ(object["deprecatedCount"], 2);
    }
  }

  // Create: what events.k8s.io/v1 requires.
  auto refuse = [&](json event, const std::set<std::string>& fields) {
    auto answer = Call(*server, "POST", v1, event);
    EXPECT_EQ(answer.status, 422) << event;
    EXPECT_EQ(answer.body["reason"], "Invalid");
    EXPECT_EQ(answer.body["details"]["kind"], "Event");
    EXPECT_EQ(answer.body["details"]["group"], "events.k8s.io");
    EXPECT_EQ(CauseFields(answer.body), fields) << answer.body;
    return answer.body;
  };
  json bare = {{"metadata", {{"name", "bare"}}},
               {"eventTime", "2025-01-02T03:04:05.000000Z"},
               {"regarding", {{"kind", "Pod"}, {"name", "p"}, {"namespace", "t1"}}}};
  json missing =
      refuse(bare, {"reportingController", "reportingInstance", "action", "reason", "type"});
  EXPECT_NE(missing.value("message", "").find("Event.events.k8s.io \"bare\" is invalid: "),
            std::string::npos)
      << missing;
  EXPECT_NE(missing.value("message", "").find("reportingController: Required value"),
            std::string::npos);
  json noTime = EventV1("no-time");
  noTime.erase("eventTime");
  refuse(noTime, {"eventTime"});
  json info = EventV1("info");
  info["type"] = "Info";
  auto badType = refuse(info, {"type"});
  EXPECT_EQ(badType["details"]["causes"][0]["message"],
            "Invalid value: \"\": has invalid value: Info");
  json counted = EventV1("counted");
  counted["deprecatedCount"] = 3;
  refuse(counted, {"count"});
  json shortSeries = EventV1("series");
  shortSeries["series"] = {{"count", 1}, {"lastObservedTime", "2025-01-02T03:04:06.000000Z"}};
  refuse(shortSeries, {"series.count"});
  json clusterScoped = EventV1("cluster");
  clusterScoped["regarding"].erase("namespace");
  refuse(clusterScoped, {"involvedObject.namespace"});  // only default or kube-system
  json badController = EventV1("controller");
  badController["reportingController"] = "not a name";
  refuse(badController, {"reportingController"});
  json badTime = EventV1("time");
  badTime["eventTime"] = "yesterday";
  EXPECT_EQ(Call(*server, "POST", v1, badTime).status, 400);
  badTime["eventTime"] = "2025-01-02T03:04:05Z";  // a MicroTime has six fractional digits
  EXPECT_EQ(Call(*server, "POST", v1, badTime).status, 400);
  // A cluster-scoped object's Event lives in default.
  clusterScoped["regarding"] = {{"kind", "Node"}, {"name", "n1"}};
  EXPECT_EQ(Call(*server, "POST", "/apis/events.k8s.io/v1/namespaces/default/events", clusterScoped)
                .status,
            201);
  // The core API keeps its legacy rules only: an eventTime brings reportingComponent & co.
  auto coreNew = Call(*server, "POST", core,
                      {{"metadata", {{"name", "core-new"}}},
                       {"eventTime", "2025-01-02T03:04:05.000000Z"},
                       {"involvedObject", {{"kind", "Pod"}, {"name", "p"}, {"namespace", "t1"}}},
                       {"type", "Info"}});
  EXPECT_EQ(coreNew.status, 422);
  EXPECT_EQ(
      CauseFields(coreNew.body),
      (std::set<std::string>{"reportingController", "reportingInstance", "action", "reason"}));

  // Update: a series may grow; what the event says may not change.
  auto series =
      Call(*server, "PATCH", v1 + "/gpu-1.bound",
           {{"series", {{"count", 2}, {"lastObservedTime", "2025-01-02T03:05:05.000000Z"}}}},
           "application/merge-patch+json");
  ASSERT_EQ(series.status, 200) << series.body;
  EXPECT_EQ(series.body["series"]["count"], 2);
  EXPECT_EQ(series.body["apiVersion"], "events.k8s.io/v1");
  EXPECT_EQ(Call(*server, "GET", core + "/gpu-1.bound").body["series"]["count"], 2);
  auto renote = Call(*server, "PATCH", v1 + "/gpu-1.bound", {{"note", "something else"}},
                     "application/merge-patch+json");
  EXPECT_EQ(renote.status, 422);
  EXPECT_EQ(CauseFields(renote.body), std::set<std::string>{"message"});
  json put = Call(*server, "GET", v1 + "/gpu-1.bound").body;
  put["action"] = "Unbind";
  EXPECT_EQ(Call(*server, "PUT", v1 + "/gpu-1.bound", put).status, 422);

  // Delete through one API: gone from both.
  EXPECT_EQ(Call(*server, "DELETE", v1 + "/gpu-1.bound").body["apiVersion"], "events.k8s.io/v1");
  EXPECT_EQ(Call(*server, "GET", core + "/gpu-1.bound").status, 404);
  EXPECT_EQ(watch.TypesFor("gpu-1.bound", "DELETED"),
            (std::vector<std::string>{"ADDED", "MODIFIED", "DELETED"}));
  // And a missing namespace is a missing namespace.
  EXPECT_EQ(
      Call(*server, "POST", "/apis/events.k8s.io/v1/namespaces/absent/events", EventV1("lost"))
          .status,
      404);
}

// The fake's fidelity, not the product's behaviour: KubeVirt's kinds withheld, then served while
// running, as the controller's tests of KubeVirt absent and then served need.
TEST(FakeCrds, TestOnlyKindsAreServedAndWithheldFileByFile) {
  FakeApiServerOptions options;
  options.crdPaths.push_back(testing::TestCrdDir());
  FakeApiServer server(options);
  server.Start();
  ASSERT_EQ(Call(server, "POST", "/api/v1/namespaces", {{"metadata", {{"name", "t1"}}}}).status,
            201);
  for (const char* path : {"/apis/kubevirt.io/v1/namespaces/t1/virtualmachineinstances",
                           "/apis/kubevirt.io/v1/namespaces/t1/virtualmachines",
                           "/apis/kubevirt.io/v1/namespaces/t1/kubevirts",
                           "/apis/cozystack.io/v1alpha1/namespaces/t1/workloadmonitors",
                           "/apis/cozystack.io/v1alpha1/namespaces/t1/workloads"}) {
    EXPECT_EQ(Call(server, "GET", path).status, 200) << path;
  }
  const std::string vmis = "/apis/kubevirt.io/v1/namespaces/t1/virtualmachineinstances";
  json vmi = {{"apiVersion", "kubevirt.io/v1"},
              {"kind", "VirtualMachineInstance"},
              {"metadata", {{"name", "vm"}}},
              {"spec",
               {{"nodeSelector", {{"kubernetes.io/hostname", "n1"}}},
                {"domain",
                 {{"devices", {{"gpus", {{{"name", "gpu0"}, {"deviceName", "nvidia.com/A100"}}}}}},
                  {"memory", {{"guest", "1Gi"}}}}}}},
              {"status", {{"nodeName", "n1"}, {"phase", "Running"}}}};
  auto created = Call(server, "POST", vmis, vmi);
  ASSERT_EQ(created.status, 201) << created.body;
  EXPECT_EQ(created.body["spec"]["domain"]["memory"]["guest"], "1Gi");  // unknown fields kept
  EXPECT_EQ(created.body["status"]["phase"], "Running");                // no status subresource
  // A gpus entry needs its name; a DRA one names a claim's request instead of a deviceName
  // (KubeVirt's GPUsWithDRA), and spec.resourceClaims lists the claims.
  json noName = vmi;
  noName["metadata"]["name"] = "bad";
  noName["spec"]["domain"]["devices"]["gpus"][0].erase("name");
  EXPECT_EQ(Call(server, "POST", vmis, noName).status, 422);
  json dra = vmi;
  dra["metadata"]["name"] = "dra";
  dra["spec"]["domain"]["devices"]["gpus"][0] = {
      {"name", "gpu0"}, {"claimName", "gpu"}, {"requestName", "gpu-0"}};
  dra["spec"]["resourceClaims"] = {{{"name", "gpu"}, {"resourceClaimName", "held"}}};
  const auto draCreated = Call(server, "POST", vmis, dra);
  ASSERT_EQ(draCreated.status, 201) << draCreated.body;
  EXPECT_EQ(draCreated.body["spec"]["resourceClaims"][0]["resourceClaimName"], "held");
  auto kubevirt = Call(server, "POST", "/apis/kubevirt.io/v1/namespaces/t1/kubevirts",
                       {{"metadata", {{"name", "kubevirt"}}},
                        {"spec",
                         {{"configuration",
                           {{"permittedHostDevices",
                             {{"pciHostDevices",
                               {{{"pciVendorSelector", "10DE:20B5"},
                                 {"resourceName", "nvidia.com/A100"},
                                 {"externalResourceProvider", true}}}},
                              {"mediatedDevices", json::array()}}}}}}}});
  EXPECT_EQ(kubevirt.status, 201) << kubevirt.body;
  auto monitor = Call(server, "POST", "/apis/cozystack.io/v1alpha1/namespaces/t1/workloadmonitors",
                      {{"metadata", {{"name", "vm"}}},
                       {"spec", {{"selector", {{"app", "vm"}}}, {"kind", "vm"}, {"replicas", 1}}}});
  EXPECT_EQ(monitor.status, 201) << monitor.body;
  auto workload = Call(server, "POST", "/apis/cozystack.io/v1alpha1/namespaces/t1/workloads",
                       {{"metadata", {{"name", "vm"}}},
                        {"status",
                         {{"kind", "vm"},
                          {"type", "gpu"},
                          {"resources", {{"nvidia.com/A100", "1"}, {"cpu", 2}}},
                          {"operational", true}}}});
  EXPECT_EQ(workload.status, 201) << workload.body;

  // Withheld: the kind goes with its CRD (plain 404), and comes back from its file.
  server.DeleteCrd("virtualmachineinstances.kubevirt.io");
  auto gone = Call(server, "GET", vmis);
  EXPECT_EQ(gone.status, 404);
  EXPECT_TRUE(gone.body.is_discarded());  // "404 page not found", not a Status
  EXPECT_EQ(Call(server, "GET", "/apis/kubevirt.io/v1/namespaces/t1/virtualmachines").status, 200);
  for (const auto& crd :
       YamlFileToJson(testing::TestCrdFile("kubevirt.io_virtualmachineinstances.yaml"))) {
    server.LoadCrd(crd);
  }
  EXPECT_EQ(Call(server, "GET", vmis).status, 200);

  // One file alone serves one kind.
  FakeApiServerOptions one;
  one.crdPaths.push_back(testing::TestCrdFile("cozystack.io_workloadmonitors.yaml"));
  FakeApiServer single(one);
  single.Start();
  EXPECT_EQ(Call(single, "GET", "/apis/cozystack.io/v1alpha1/workloadmonitors").status, 200);
  EXPECT_EQ(Call(single, "GET", "/apis/cozystack.io/v1alpha1/workloads").status, 404);
  EXPECT_EQ(Call(single, "GET", "/apis/kubevirt.io/v1/virtualmachineinstances").status, 404);
}

// Two controller replicas and a fleet of agents: 200 watches open at once, each sees the event.
TEST(FakeWatches, TwoHundredConcurrentWatchesEachSeeTheEvent) {
  auto server = StartWithNamespace();
  constexpr int kWatches = 200;
  // Pods: a kind every version of the fake serves, so only the number of watches is new.
  const std::string pods = "/api/v1/namespaces/t1/pods";
  const std::string request = "GET " + pods +
                              "?watch=1&resourceVersion=" + server->CurrentResourceVersion() +
                              " HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/json\r\n\r\n";
  std::vector<int> sockets;
  std::vector<std::string> received(kWatches);
  for (int i = 0; i < kWatches; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(server->port()));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    ASSERT_EQ(send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
    sockets.push_back(fd);
  }
  // Reads what has come on every socket until `done` holds for each, or 30 s.
  auto readUntil = [&](const std::function<bool(const std::string&)>& done) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      std::vector<pollfd> polls;
      for (int fd : sockets) polls.push_back({fd, POLLIN, 0});
      poll(polls.data(), polls.size(), 100);
      for (size_t i = 0; i < polls.size(); ++i) {
        if (polls[i].revents & POLLIN) {
          char buffer[4096];
          ssize_t got = recv(sockets[i], buffer, sizeof buffer, 0);
          if (got > 0) received[i].append(buffer, static_cast<size_t>(got));
        }
      }
      if (std::all_of(received.begin(), received.end(), done)) return true;
    }
    return false;
  };
  // Every watch is answered (streaming) while all are open...
  EXPECT_TRUE(readUntil(
      [](const std::string& text) { return text.find("\r\n\r\n") != std::string::npos; }));
  for (const auto& text : received) ASSERT_EQ(text.rfind("HTTP/1.1 200", 0), 0u) << text;
  // ...and each sees the next event.
  ASSERT_EQ(Call(*server, "POST", pods,
                 {{"metadata", {{"name", "everyone"}}},
                  {"spec", {{"containers", {{{"name", "c"}, {"image", "i"}}}}}}})
                .status,
            201);
  EXPECT_TRUE(readUntil([](const std::string& text) {
    return text.find("\"type\":\"ADDED\"") != std::string::npos &&
           text.find("\"everyone\"") != std::string::npos;
  }));
  size_t seen = 0;
  for (const auto& text : received) seen += text.find("\"everyone\"") != std::string::npos;
  EXPECT_EQ(seen, static_cast<size_t>(kWatches));
  for (int fd : sockets) close(fd);
}

// A client that accepts gzip (kubectl's Go transport always does) gets its watch as
// kube-apiserver sends one: uncompressed, each event as it happens. cpp-httplib used to gzip the
// stream and hold every event in the compressor until the watch ended, so `kubectl delete`
// never saw the DELETED event it waits for.
TEST(FakeWatches, AWatchThatAcceptsGzipGetsEachEventUncompressedAtOnce) {
  auto server = StartWithNamespace();
  ASSERT_EQ(
      Call(*server, "POST", kConfigMaps, ConfigMap("held", {"test.cozystack.io/hold"})).status,
      201);
  const std::string request = "GET " + kConfigMaps +
                              "?watch=true&fieldSelector=metadata.name%3Dheld&resourceVersion=" +
                              server->CurrentResourceVersion() +
                              " HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/json\r\n"
                              "Accept-Encoding: gzip, br\r\n\r\n";
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(server->port()));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  std::string received;
  // Reads until `text` has come in plain bytes, or 10 s: bounded, so a regression fails.
  auto readUntil = [&](const std::string& text) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      if (received.find(text) != std::string::npos) return true;
      pollfd one{fd, POLLIN, 0};
      if (poll(&one, 1, 100) > 0 && (one.revents & POLLIN)) {
        char buffer[4096];
        ssize_t got = recv(fd, buffer, sizeof buffer, 0);
        if (got <= 0) break;
        received.append(buffer, static_cast<size_t>(got));
      }
    }
    return received.find(text) != std::string::npos;
  };
  ASSERT_TRUE(readUntil("\r\n\r\n"));
  const std::string headers = received.substr(0, received.find("\r\n\r\n"));
  EXPECT_EQ(headers.rfind("HTTP/1.1 200", 0), 0u) << headers;
  EXPECT_EQ(headers.find("Content-Encoding"), std::string::npos) << headers;
  EXPECT_NE(headers.find("Transfer-Encoding: chunked"), std::string::npos) << headers;
  // The DELETE marks it; the update that drops the finalizer removes it: MODIFIED, MODIFIED,
  // DELETED, each readable while the watch is still open.
  ASSERT_EQ(Call(*server, "DELETE", kConfigMaps + "/held").status, 200);
  EXPECT_TRUE(readUntil("\"deletionTimestamp\"")) << received;
  ASSERT_EQ(Call(*server, "PATCH", kConfigMaps + "/held", {{"metadata", {{"finalizers", nullptr}}}},
                 "application/merge-patch+json")
                .status,
            200);
  EXPECT_TRUE(readUntil("\"type\":\"DELETED\"")) << received;
  close(fd);
}

// kubectl as the client of each built-in kind: apply (create, then configure), get, delete.
TEST(Kubectl, AppliesAndGetsTheBuiltinKindsAndWaitsOnFinalizers) {
  if (testing::RunCommand("command -v kubectl").exitCode != 0) {
    GTEST_SKIP() << "kubectl is not installed";
  }
  auto server = StartFakeApiServer(false);
  testing::TempDir dir;
  std::ofstream(dir.path() / "kubeconfig") << server->Kubeconfig();
  std::string kubectl = "kubectl --kubeconfig " + (dir.path() / "kubeconfig").string() +
                        " --cache-dir " + (dir.path() / "cache").string() + " ";
  auto run = [&kubectl](const std::string& args) {
    auto result = testing::RunCommand(kubectl + args + " 2>&1");
    EXPECT_EQ(result.exitCode, 0) << "kubectl " << args << ": " << result.out << result.err;
    return result.out;
  };
  const std::string manifest = (dir.path() / "kinds.yaml").string();
  std::ofstream(manifest) << R"(apiVersion: v1
kind: Namespace
metadata:
  name: gpu-system
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: gpu-settings
  namespace: gpu-system
data:
  mode: strict
---
apiVersion: v1
kind: Secret
metadata:
  name: gpu-token
  namespace: gpu-system
stringData:
  token: hunter2
---
apiVersion: v1
kind: ResourceQuota
metadata:
  name: gpus
  namespace: gpu-system
spec:
  hard:
    requests.nvidia.com/gpu: "4"
---
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata:
  name: gpu-controller
  namespace: gpu-system
spec:
  holderIdentity: replica-a
  leaseDurationSeconds: 15
---
apiVersion: v1
kind: Event
metadata:
  name: vm.1
  namespace: gpu-system
involvedObject:
  kind: Pod
  name: launcher
  namespace: gpu-system
reason: Bound
type: Normal
message: device bound
---
apiVersion: events.k8s.io/v1
kind: Event
metadata:
  name: gpu-1.bound
  namespace: gpu-system
eventTime: "2025-01-02T03:04:05.000000Z"
reportingController: gpu.cozystack.io/controller
reportingInstance: gpu-controller-0
action: Bind
reason: Bound
type: Normal
note: gpu-1 bound to n1
regarding:
  apiVersion: gpu.cozystack.io/v1alpha1
  kind: GPUDevice
  name: gpu-1
  namespace: gpu-system
)";
  // Nothing made the namespace yet: the server refuses, as a real one does.
  const std::string early = (dir.path() / "early.yaml").string();
  std::ofstream(early) << "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: early\n"
                          "  namespace: gpu-system\n";
  auto refused = testing::RunCommand(kubectl + "apply -f " + early + " 2>&1");
  EXPECT_NE(refused.exitCode, 0);
  EXPECT_NE((refused.out + refused.err).find("namespaces \"gpu-system\" not found"),
            std::string::npos)
      << refused.out << refused.err;
  EXPECT_TRUE(std::regex_search(run("get namespaces"), std::regex(R"(kube-system\s+Active)")));
  std::string applied = run("apply -f " + manifest);
  for (const char* what : {"namespace/gpu-system created", "configmap/gpu-settings created",
                           "secret/gpu-token created", "resourcequota/gpus created",
                           "lease.coordination.k8s.io/gpu-controller created", "event/vm.1 created",
                           "event.events.k8s.io/gpu-1.bound created"}) {
    EXPECT_NE(applied.find(what), std::string::npos) << what << "\n" << applied;
  }
  EXPECT_NE(run("apply -f " + manifest).find("configmap/gpu-settings unchanged"),
            std::string::npos);
  EXPECT_EQ(run("-n gpu-system get configmap gpu-settings -o jsonpath={.data.mode}"), "strict");
  EXPECT_EQ(run("-n gpu-system get secret gpu-token -o jsonpath={.data.token}"), "aHVudGVyMg==");
  EXPECT_EQ(run("-n gpu-system get lease gpu-controller -o jsonpath={.spec.holderIdentity}"),
            "replica-a");
  EXPECT_TRUE(std::regex_search(run("-n gpu-system get cm"), std::regex(R"(gpu-settings\s+1\s+)")));
  EXPECT_TRUE(std::regex_search(run("-n gpu-system get secrets"),
                                std::regex(R"(gpu-token\s+Opaque\s+1\s+)")));
  EXPECT_TRUE(std::regex_search(run("-n gpu-system get leases"),
                                std::regex(R"(gpu-controller\s+replica-a\s+)")));
  EXPECT_NE(run("-n gpu-system get quota gpus -o yaml").find("requests.nvidia.com/gpu"),
            std::string::npos);
  // One storage: `get events` (core) shows both Events, the events.k8s.io one too.
  const std::string events = run("-n gpu-system get events");
  EXPECT_NE(events.find("device bound"), std::string::npos) << events;
  EXPECT_NE(events.find("gpu-1 bound to n1"), std::string::npos) << events;
  EXPECT_TRUE(std::regex_search(run("-n gpu-system get events.events.k8s.io"),
                                std::regex(R"(gpu-1\.bound\s+Normal\s+Bound\s+gpudevice/gpu-1)")));
  EXPECT_EQ(run("-n gpu-system get events.v1.events.k8s.io gpu-1.bound -o jsonpath={.note}"),
            "gpu-1 bound to n1");
  std::string resources = run("api-resources --no-headers");
  for (const char* kind : {"ConfigMap", "Secret", "ResourceQuota", "Lease", "Event"}) {
    EXPECT_NE(resources.find(kind), std::string::npos) << kind;
  }
  // A change is applied as a patch.
  std::string changed = manifest + ".2";
  std::ofstream(changed) << "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gpu-settings\n"
                            "  namespace: gpu-system\ndata:\n  mode: loose\n";
  EXPECT_NE(run("apply -f " + changed).find("configured"), std::string::npos);
  EXPECT_EQ(run("-n gpu-system get cm gpu-settings -o jsonpath={.data.mode}"), "loose");
  // Deleting the namespace (without waiting) leaves it Terminating while a finalizer holds an
  // object in it.
  run("-n gpu-system patch cm gpu-settings --type merge -p "
      "'{\"metadata\":{\"finalizers\":[\"test.cozystack.io/hold\"]}}'");
  run("delete namespace gpu-system --wait=false");
  EXPECT_TRUE(std::regex_search(run("get namespace gpu-system"),
                                std::regex(R"(gpu-system\s+Terminating)")));
  run("-n gpu-system patch cm gpu-settings --type json -p "
      "'[{\"op\":\"remove\",\"path\":\"/metadata/finalizers\"}]'");
  auto gone = testing::RunCommand(kubectl + "get namespace gpu-system 2>&1");
  EXPECT_NE(gone.exitCode, 0);
  EXPECT_NE((gone.out + gone.err).find("NotFound"), std::string::npos) << gone.out << gone.err;
}

// `kubectl delete` waits (--wait=true, its default) until the object is gone: a GET, then a
// LIST and a watch from the list's resourceVersion with fieldSelector metadata.name=<name>,
// until the DELETED event (pkg/cmd/wait IsDeleted, watchtools.UntilWithSync). Another client
// drops the finalizer once that watch is open; kubectl must return promptly, for a namespaced
// and a cluster-scoped object and for a namespace whose content the namespace controller
// removes once its finalizer is gone. kubectl's own --timeout bounds a regression.
// kubectl apply of a changed built-in object sends a strategic merge patch: its `webhooks` list
// carries only what changed, keyed by name, and a `$setElementOrder/webhooks` directive. The real
// server merges by key and obeys the directive; the fake applied it as a plain merge patch,
// replacing the list with the partial entries and storing the directive (found by
// AdmissionEndToEnd.E8_NoWriteIsStarted…).
TEST(Kubectl, ApplyOfAChangedListEntryMergesByKeyAsTheRealServer) {
  auto server = StartFakeApiServer(false);
  testing::TempDir dir;
  std::ofstream(dir.path() / "kubeconfig") << server->Kubeconfig();
  const std::string kubectl = "kubectl --kubeconfig " + (dir.path() / "kubeconfig").string() +
                              " --cache-dir " + (dir.path() / "cache").string() + " ";
  auto apply = [&](int timeout, bool withFinalizer) {
    const std::string file = (dir.path() / "webhooks.yaml").string();
    std::ofstream(file) << "apiVersion: admissionregistration.k8s.io/v1\n"
                           "kind: MutatingWebhookConfiguration\n"
                           "metadata:\n  name: cozy-gpu\n" +
                               std::string(withFinalizer ? "  finalizers: [example.com/keep]\n"
                                                         : "") +
                               "webhooks:\n"
                               "- name: a.example.com\n"
                               "  admissionReviewVersions: [v1]\n"
                               "  sideEffects: None\n"
                               "  timeoutSeconds: " +
                               std::to_string(timeout) +
                               "\n"
                               "  clientConfig: {url: 'https://127.0.0.1:9443/a'}\n"
                               "- name: b.example.com\n"
                               "  admissionReviewVersions: [v1]\n"
                               "  sideEffects: None\n"
                               "  clientConfig: {url: 'https://127.0.0.1:9443/b'}\n";
    const auto result = testing::RunCommand(kubectl + "apply -f " + file + " 2>&1");
    EXPECT_EQ(result.exitCode, 0) << result.out;
  };
  apply(10, false);
  apply(3, true);
  const json stored = Call(*server, "GET",
                           "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/"
                           "cozy-gpu")
                          .body;
  ASSERT_EQ(stored["webhooks"].size(), 2u) << stored.dump(2);
  EXPECT_EQ(stored["webhooks"][0]["name"], "a.example.com");
  EXPECT_EQ(stored["webhooks"][0]["timeoutSeconds"], 3);
  EXPECT_EQ(stored["webhooks"][0]["clientConfig"]["url"], "https://127.0.0.1:9443/a");
  EXPECT_EQ(stored["webhooks"][1]["clientConfig"]["url"], "https://127.0.0.1:9443/b");
  EXPECT_EQ(stored["metadata"]["finalizers"], json({"example.com/keep"}));
  EXPECT_EQ(stored.dump().find("$setElementOrder"), std::string::npos) << stored.dump(2);
  // The unit rules beside it: delete by key, order, a primitive list's removal.
  const json merged = StrategicMergePatch(
      {{"webhooks", {{{"name", "a"}, {"x", 1}}, {{"name", "b"}}, {{"name", "c"}}}},
       {"finalizers", {"f1", "f2"}}},
      {{"$setElementOrder/webhooks", {{{"name", "c"}}, {{"name", "a"}}}},
       {"webhooks", {{{"name", "b"}, {"$patch", "delete"}}, {{"name", "a"}, {"x", 2}}}},
       {"$deleteFromPrimitiveList/finalizers", {"f1"}}});
  EXPECT_EQ(merged, json({{"webhooks", {{{"name", "c"}}, {{"name", "a"}, {"x", 2}}}},
                          {"finalizers", {"f2"}}}));
}

TEST(Kubectl, DeleteReturnsOnceAFinalizedObjectIsGone) {
  if (testing::RunCommand("command -v kubectl").exitCode != 0) {
    GTEST_SKIP() << "kubectl is not installed";
  }
  auto server = StartWithNamespace();
  testing::TempDir dir;
  std::ofstream(dir.path() / "kubeconfig") << server->Kubeconfig();
  const std::string kubectl = "kubectl --kubeconfig " + (dir.path() / "kubeconfig").string() +
                              " --cache-dir " + (dir.path() / "cache").string() + " ";
  const json hold = {"test.cozystack.io/hold"};
  const json release = {{"metadata", {{"finalizers", nullptr}}}};
  // Runs `kubectl delete <args>`; once its watch on `watchPath` for `name` is open, sends
  // `release` to `releasePath`; expects kubectl to be done within 10 s of that.
  auto deleteAndRelease = [&](const std::string& args, const std::string& watchPath,
                              const std::string& name, const std::string& releasePath) {
    SCOPED_TRACE("kubectl delete " + args);
    server->ClearRequests();
    testing::CommandResult result;
    std::atomic<bool> done = false;
    std::thread run([&] {
      result =
          testing::RunCommand("timeout 40 " + kubectl + "delete " + args + " --timeout=20s 2>&1");
      done = true;
    });
    bool watching = testing::WaitFor([&] {
      for (const auto& request : server->Requests()) {
        if (request.path == watchPath && request.query.find("watch=true") != std::string::npos &&
            request.query.find("metadata.name=" + name) != std::string::npos) {
          return true;
        }
      }
      return false;
    });
    EXPECT_TRUE(watching) << "kubectl opened no watch on " << watchPath;
    EXPECT_FALSE(done) << "kubectl returned while the finalizer held the object: " << result.out;
    EXPECT_EQ(Call(*server, "PATCH", releasePath, release, "application/merge-patch+json").status,
              200);
    auto released = std::chrono::steady_clock::now();
    run.join();
    EXPECT_EQ(result.exitCode, 0) << result.out << result.err;
    EXPECT_LT(std::chrono::steady_clock::now() - released, std::chrono::seconds(10)) << result.out;
    EXPECT_EQ(Call(*server, "GET", releasePath).status, 404);
  };

  // Namespaced.
  ASSERT_EQ(Call(*server, "POST", kConfigMaps, ConfigMap("held", hold)).status, 201);
  deleteAndRelease("-n t1 configmap held", kConfigMaps, "held", kConfigMaps + "/held");

  // Cluster-scoped.
  json node = testing::NodeObject("n1");
  node["metadata"]["finalizers"] = hold;
  ASSERT_EQ(Call(*server, "POST", "/api/v1/nodes", node).status, 201);
  deleteAndRelease("node n1", "/api/v1/nodes", "n1", "/api/v1/nodes/n1");

  // A namespace stays Terminating while a finalizer holds its content; freeing that lets the
  // namespace controller empty and remove it.
  ASSERT_EQ(Call(*server, "POST", kConfigMaps, ConfigMap("content", hold)).status, 201);
  deleteAndRelease("namespace t1", "/api/v1/namespaces", "t1", kConfigMaps + "/content");
  EXPECT_EQ(Call(*server, "GET", "/api/v1/namespaces/t1").status, 404);

  // Nothing holds it: the GET after the DELETE finds nothing, no watch is needed.
  ASSERT_EQ(Call(*server, "POST", "/api/v1/nodes", testing::NodeObject("n2")).status, 201);
  auto plain = testing::RunCommand("timeout 40 " + kubectl + "delete node n2 --timeout=20s 2>&1");
  EXPECT_EQ(plain.exitCode, 0) << plain.out << plain.err;
  EXPECT_EQ(Call(*server, "GET", "/api/v1/nodes/n2").status, 404);
}

// A webhook rule's resources as kube-apiserver validates them (validateResources): "*/*" alone
// covers every resource and subresource and may not be listed with others. The chart once had
// ["*", "*/*"] in a policy; the fake took it, the real server refused `helm install`.
TEST(FakeKinds, WebhookRuleResourcesOverlappingAWildcardAreInvalidAsInTheRealServer) {
  auto server = StartFakeApiServer(false);
  const std::string configs =
      "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations";
  auto config = [](const std::string& name, const json& resources) {
    return json{{"metadata", {{"name", name}}},
                {"webhooks",
                 {{{"name", "w.example.com"},
                   {"admissionReviewVersions", {"v1"}},
                   {"sideEffects", "None"},
                   {"clientConfig", {{"url", "https://127.0.0.1:1/x"}}},
                   {"rules",
                    {{{"apiGroups", {"*"}},
                      {"apiVersions", {"*"}},
                      {"operations", {"CREATE"}},
                      {"resources", resources}}}}}}}};
  };
  auto both = Call(*server, "POST", configs, config("both", {"*", "*/*"}));
  EXPECT_EQ(both.status, 422);
  EXPECT_EQ(both.body["details"]["causes"][0]["field"], "webhooks[0].rules[0].resources");
  EXPECT_NE(both.body.dump().find("if '*/*' is present, must not specify other resources"),
            std::string::npos)
      << both.body.dump();
  auto plain = Call(*server, "POST", configs, config("plain", {"*", "pods"}));
  EXPECT_EQ(plain.status, 422);
  EXPECT_NE(plain.body.dump().find("if '*' is present, must not specify other resources without "
                                   "subresources"),
            std::string::npos);
  auto sub = Call(*server, "POST", configs, config("sub", {"pods/*", "pods/status"}));
  EXPECT_EQ(sub.status, 422);
  EXPECT_NE(sub.body.dump().find("if 'pods/*' is present, must not specify pods/status"),
            std::string::npos);
  EXPECT_EQ(Call(*server, "POST", configs, config("all", {"*/*"})).status, 201);
  EXPECT_EQ(Call(*server, "POST", configs, config("some", {"*", "pods/status"})).status, 201);
}

// generateName is validated as kube-apiserver does: as a name with a trailing '-' masked. The
// binder once named its Events "<device>.", which the fake took and kube-apiserver refused, so
// no Event of the binder reached a real cluster.
TEST(FakeKinds, GenerateNameIsValidatedAsANameWithItsTrailingDashMasked) {
  auto server = StartWithNamespace();
  json dotted = ConfigMap("");
  dotted["metadata"].erase("name");
  dotted["metadata"]["generateName"] = "train.";
  auto refused = Call(*server, "POST", kConfigMaps, dotted);
  EXPECT_EQ(refused.status, 422);
  EXPECT_EQ(refused.body["details"]["causes"][0]["field"], "metadata.generateName");
  EXPECT_NE(refused.body["message"].get<std::string>().find("Invalid value: \"train.\""),
            std::string::npos)
      << refused.body.dump();
  json dashed = dotted;
  dashed["metadata"]["generateName"] = "train-";
  auto created = Call(*server, "POST", kConfigMaps, dashed);
  ASSERT_EQ(created.status, 201);
  EXPECT_TRUE(created.body["metadata"]["name"].get<std::string>().starts_with("train-"));
  json event = {{"metadata", {{"generateName", "train."}}},
                {"eventTime", "2026-01-01T00:00:00.000000Z"},
                {"reportingController", "gpu.cozystack.io/gpu-controller"},
                {"reportingInstance", "r"},
                {"action", "Move"},
                {"reason", "Moved"},
                {"type", "Normal"},
                {"regarding", {{"kind", "Pod"}, {"name", "p"}, {"namespace", "t1"}}}};
  EXPECT_EQ(Call(*server, "POST", "/apis/events.k8s.io/v1/namespaces/t1/events", event).status,
            422);
  event["metadata"] = {{"name", "train.18a2b3c4d5e6f708"}};
  EXPECT_EQ(Call(*server, "POST", "/apis/events.k8s.io/v1/namespaces/t1/events", event).status,
            201);
}

}  // namespace
}  // namespace cozy::fake
