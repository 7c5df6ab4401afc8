// Typed caches with indexes over the informer: answers after the first list and after
// updates and deletes, Synced() only once listed, a LIST that never blocks the caller, and
// readers on other threads during a relist of 40,000 objects that see the state before it or
// after it, never half of it; change filters, an idle cache's wake-ups, a batched watch, and the
// optional kinds' cache that follows discovery.
#include "kube/cache.h"

#include <pthread.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include <functional>

#include "kube/optional_cache.h"
#include "test/kube/kube_test_support.h"
#include "test/support/process.h"

namespace cozy::kube {
namespace {
using nlohmann::json;
using namespace std::chrono_literals;

const std::string kClassLabel = "gpu.cozystack.io/class";
const std::string kVmiLabel = "vm.kubevirt.io/name";

json Pod(const std::string& ns, const std::string& name, const std::string& node,
         const std::string& gpuClass, const std::string& vmi = "") {
  json labels = {{kClassLabel, gpuClass}};
  if (!vmi.empty()) labels[kVmiLabel] = vmi;
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", ns}, {"labels", labels}}},
          {"spec", {{"nodeName", node}}}};
}

using Keys = std::vector<std::string>;

// The next GET of pods (a list, or a watch) is answered `ms` late.
void SlowNextPodsRequest(fake::FakeApiServer& server, int ms) {
  fake::Fault slow;
  slow.method = "GET";
  slow.pathPrefix = "/api/v1/pods";
  slow.latencyMs = ms;
  slow.count = 1;
  server.AddFault(slow);
}

TEST(Cache, IndexesAnswerAfterSyncAndAfterUpdatesAndDeletes) {
  auto server = testing::StartFakeApiServer(false);
  server->Seed(Pod("tenant-a", "p1", "n1", "a100", "vmi1"));
  server->Seed(Pod("tenant-b", "p2", "n2", "t4"));
  server->Seed(Pod("tenant-a", "p3", "n1", "t4", "vmi3"));
  Client client(testing::ConfigFor(*server), testing::TestClientOptions(DefaultTimeSource()));
  JsonCache cache(client, "/api/v1/pods", IdentityDecode);
  cache.AddIndex("byNode", FieldIndex("/spec/nodeName"));
  cache.AddIndex("byClass", LabelIndex(kClassLabel));
  cache.AddIndex("byNamespace", NamespaceIndex());
  cache.AddIndex("byVmi", LabelIndex(kVmiLabel));

  // The LIST is slow: Start() does not wait for it, and nothing is synced meanwhile.
  SlowNextPodsRequest(*server, 500);
  const auto start = Clock::now();
  cache.Start();
  EXPECT_LT(Clock::now() - start, 100ms);
  EXPECT_FALSE(cache.Synced());
  EXPECT_EQ(cache.Size(), 0u);
  EXPECT_TRUE(cache.IndexKeys("byNode", "n1").empty());
  EXPECT_THROW(cache.AddIndex("late", NamespaceIndex()), std::logic_error);

  ASSERT_TRUE(testing::WaitFor([&] { return cache.Synced(); }, 5s));
  EXPECT_EQ(cache.Size(), 3u);
  EXPECT_EQ(cache.IndexKeys("byNode", "n1"), (Keys{"tenant-a/p1", "tenant-a/p3"}));
  EXPECT_EQ(cache.IndexKeys("byClass", "t4"), (Keys{"tenant-a/p3", "tenant-b/p2"}));
  EXPECT_EQ(cache.IndexKeys("byNamespace", "tenant-b"), Keys{"tenant-b/p2"});
  EXPECT_EQ(cache.IndexValues("byVmi"), (Keys{"vmi1", "vmi3"}));
  ASSERT_EQ(cache.ByIndex("byVmi", "vmi3").size(), 1u);
  EXPECT_EQ((*cache.ByIndex("byVmi", "vmi3")[0])["metadata"]["name"], "p3");
  EXPECT_EQ((*cache.Get("tenant-b/p2"))["spec"]["nodeName"], "n2");
  EXPECT_EQ(cache.Get("tenant-b/nope"), nullptr);
  EXPECT_THROW(cache.ByIndex("byColour", "red"), std::invalid_argument);

  // An update moves an object between index values; a delete takes it out of every index.
  client.MergePatch("/api/v1/namespaces/tenant-a/pods/p3",
                    {{"metadata", {{"labels", {{kClassLabel, "a100"}, {kVmiLabel, nullptr}}}}}});
  ASSERT_TRUE(testing::WaitFor([&] { return cache.IndexKeys("byClass", "a100").size() == 2; }, 5s));
  EXPECT_EQ(cache.IndexKeys("byClass", "t4"), Keys{"tenant-b/p2"});
  EXPECT_EQ(cache.IndexValues("byVmi"), Keys{"vmi1"});
  DeleteOptions now;  // grace 0, as a bound pod's kubelet deletes it
  now.gracePeriodSeconds = 0;
  client.Delete("/api/v1/namespaces/tenant-a/pods/p1", now);
  ASSERT_TRUE(testing::WaitFor([&] { return cache.Size() == 2; }, 5s));
  EXPECT_EQ(cache.IndexKeys("byNode", "n1"), Keys{"tenant-a/p3"});
  EXPECT_EQ(cache.IndexKeys("byClass", "a100"), Keys{"tenant-a/p3"});
  EXPECT_TRUE(cache.IndexValues("byVmi").empty());
  EXPECT_EQ(cache.Get("tenant-a/p1"), nullptr);
  client.Create("/api/v1/namespaces", {{"metadata", {{"name", "tenant-c"}}}});
  client.Create("/api/v1/namespaces/tenant-c/pods", Pod("tenant-c", "p4", "n2", "t4", "vmi4"));
  ASSERT_TRUE(testing::WaitFor([&] { return cache.IndexKeys("byVmi", "vmi4").size() == 1; }, 5s));
  EXPECT_EQ(cache.IndexKeys("byNode", "n2"), (Keys{"tenant-b/p2", "tenant-c/p4"}));

  // A relist (after a 410) gives the same answers.
  const int lists = cache.Stats().lists;
  server->ExpireWatches();
  ASSERT_TRUE(testing::WaitFor([&] { return cache.Stats().lists > lists; }, 10s));
  EXPECT_EQ(cache.Size(), 3u);
  EXPECT_EQ(cache.IndexKeys("byNode", "n2"), (Keys{"tenant-b/p2", "tenant-c/p4"}));
  cache.Stop();
}

// docs/controller.md, "Who wakes for a change": a batched watch (InformerOptions::batch) is read
// again no sooner than its batch after a read that took events: ten pods created 40 ms apart reach
// the cache in a few steps, not ten, and all of them arrive. The same pods on an unbatched cache
// wake it for nearly each. Stop() ends a batch's wait at once.
TEST(Cache, ABatchedWatchTakesSeveralEventsPerRead) {
  auto server = testing::StartFakeApiServer(false);
  server->Seed({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "tenant-a"}}}});
  Client client(testing::ConfigFor(*server), testing::TestClientOptions(DefaultTimeSource()));
  auto steps = [&](Duration batch, const std::string& prefix) {
    InformerOptions options;
    options.batch = batch;
    JsonCache cache(client, "/api/v1/pods", IdentityDecode, options);
    std::atomic<int> changes{0};
    cache.SetOnChange([&] { ++changes; });
    cache.Start();
    EXPECT_TRUE(testing::WaitFor([&] { return cache.Synced(); }));
    std::this_thread::sleep_for(std::chrono::duration_cast<std::chrono::milliseconds>(batch) +
                                200ms);  // the list's batch over, the watch open
    const size_t had = cache.Size();
    const int before = changes.load();
    for (int i = 0; i < 10; ++i) {
      client.Create("/api/v1/namespaces/tenant-a/pods",
                    Pod("tenant-a", prefix + std::to_string(i), "n1", "a100"));
      std::this_thread::sleep_for(40ms);
    }
    EXPECT_TRUE(testing::WaitFor([&] { return cache.Size() == had + 10; }, 5s)) << prefix;
    const int took = changes.load() - before;
    cache.Stop();
    return took;
  };
  const int batched = steps(300ms, "b");
  const int unbatched = steps(Duration::zero(), "u");
  EXPECT_LE(batched, 4) << "ten events over 400 ms, read at most once per 300 ms";
  EXPECT_GE(unbatched, 6) << "the peer: without a batch nearly every event wakes the cache";

  InformerOptions slow;
  slow.batch = std::chrono::seconds(30);
  JsonCache cache(client, "/api/v1/pods", IdentityDecode, slow);
  cache.Start();
  ASSERT_TRUE(testing::WaitFor([&] { return cache.Synced(); }));  // now in the list's batch
  const auto stopping = Clock::now();
  cache.Stop();
  EXPECT_LT(Clock::now() - stopping, 2s) << "Stop() ends the batch's wait";
}

// A cache of a type of its own, indexed by that type's fields; an object that does not
// decode is left out and counted.
struct PodInfo {
  std::string name;
  std::string node;
};

// A fake API server as quiet as a real one (no bookmarks while idle), with namespace tenant-a and
// its pod p1.
std::unique_ptr<fake::FakeApiServer> QuietServerWithAPod() {
  fake::FakeApiServerOptions options;
  options.bookmarkInterval = std::chrono::minutes(1);
  auto server = std::make_unique<fake::FakeApiServer>(options);
  server->Start();
  server->Seed({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "tenant-a"}}}});
  server->Seed(Pod("tenant-a", "p1", "n1", "a100"));
  return server;
}

// docs/kubernetes.md, "One thread for every cache's watch": an idle cache sleeps until its watch
// has something or curl's timer is due (about once a second), not on a 100 ms poll; a change still
// arrives at once, and Stop() wakes it.
TEST(Cache, AnIdleCacheSleepsOnItsWatchAndStopWakesIt) {
  auto server = QuietServerWithAPod();
  Client client(testing::ConfigFor(*server), testing::TestClientOptions(DefaultTimeSource()));
  JsonCache cache(client, "/api/v1/pods", IdentityDecode);
  std::atomic<int> changes{0};
  cache.SetOnChange([&] { ++changes; });
  cache.Start();
  ASSERT_TRUE(testing::WaitFor([&] { return cache.Synced(); }));
  ASSERT_TRUE(testing::WaitFor([&] {
    for (const auto& request : testing::RequestsTo(*server, "GET", "/api/v1/pods")) {
      if (request.query.find("watch=1") != std::string::npos) return true;
    }
    return false;
  }));
  std::this_thread::sleep_for(200ms);  // the watch's first answer taken
  const uint64_t before = cache.Wakeups();
  std::this_thread::sleep_for(1500ms);
  // A 100 ms poll woke 15 times here; curl's timer asks for about one a second. A slower
  // machine only wakes fewer times.
  EXPECT_LE(cache.Wakeups() - before, 6u);

  const int seen = changes.load();
  client.Create("/api/v1/namespaces/tenant-a/pods", Pod("tenant-a", "p2", "n1", "a100"));
  EXPECT_TRUE(testing::WaitFor([&] { return cache.Size() == 2u; }, 2s)) << "the watch woke it";
  EXPECT_GT(changes.load(), seen);
  cache.Stop();  // its eventfd wakes the wait
}

// docs/controller.md, "Who wakes for a change": a change filter. An update that changes nothing the
// decoded value holds (a status field) is taken into the cache but wakes nobody, and is counted;
// one that changes what it holds (the class label) wakes the reader, as an object that goes does.
TEST(Cache, AChangeTheDecodedValueDoesNotShowWakesNobody) {
  struct Labelled {
    std::string name;
    std::string gpuClass;
    bool operator==(const Labelled&) const = default;
  };
  auto server = testing::StartFakeApiServer(false);
  server->Seed({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "t"}}}});
  server->Seed(Pod("t", "p1", "n1", "a100"));
  Client client(testing::ConfigFor(*server), testing::TestClientOptions(DefaultTimeSource()));
  Cache<Labelled> cache(client, "/api/v1/pods", [](const json& pod) {
    return Labelled{pod.at("metadata").at("name").get<std::string>(),
                    pod.at("metadata").at("labels").value(kClassLabel, "")};
  });
  cache.SetChangeFilter(Cache<Labelled>::WhenValueDiffers());
  std::atomic<int> changes{0};
  cache.SetOnChange([&] { ++changes; });
  cache.Start();
  ASSERT_TRUE(testing::WaitFor([&] { return cache.Synced(); }));
  EXPECT_EQ(changes.load(), 1) << "the first sync";

  const std::string path = "/api/v1/namespaces/t/pods/p1";
  json pod = client.Get(path);
  pod["status"] = {{"phase", "Running"}};
  client.Update(path + "/status", pod);
  ASSERT_TRUE(testing::WaitFor([&] { return cache.IgnoredChanges() == 1; }));
  EXPECT_EQ(changes.load(), 1) << "a status change the value does not hold";

  pod = client.Get(path);
  pod["metadata"]["labels"][kClassLabel] = "h100";
  client.Update(path, pod);
  ASSERT_TRUE(testing::WaitFor([&] { return changes.load() == 2; }));
  EXPECT_EQ(cache.Get("t/p1")->gpuClass, "h100");
  DeleteOptions now;
  now.gracePeriodSeconds = 0;  // a pod deleted with grace only gains a deletionTimestamp
  client.Delete(path, now);
  ASSERT_TRUE(testing::WaitFor([&] { return changes.load() == 3; }));
  EXPECT_EQ(cache.Size(), 0U);
  EXPECT_EQ(cache.IgnoredChanges(), 1);
}

// docs/controller.md, "Who wakes for a change": a cache that keeps only what its readers want
// (SetKeep). An object that fails `keep` is never stored, wakes nobody and is counted with the
// changes taken quietly; one that comes to pass it is stored and wakes the reader; one that comes
// to fail it leaves the cache, which wakes the reader as a deletion does; and a relist does not
// hand over again the objects the cache dropped (the informer still knows their versions).
TEST(Cache, KeepsOnlyWhatItsReadersWant) {
  auto server = testing::StartFakeApiServer(false);
  server->Seed({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "t"}}}});
  server->Seed(Pod("t", "gpu", "n1", "a100"));
  server->Seed(Pod("t", "plain", "n1", ""));
  Client client(testing::ConfigFor(*server), testing::TestClientOptions(DefaultTimeSource()));
  JsonCache cache(client, "/api/v1/pods", IdentityDecode);
  cache.SetKeep([](const json& pod) { return pod["metadata"]["labels"][kClassLabel] != ""; });
  cache.AddIndex("byNode", FieldIndex("/spec/nodeName"));
  std::atomic<int> changes{0};
  cache.SetOnChange([&] { ++changes; });
  cache.Start();
  ASSERT_TRUE(testing::WaitFor([&] { return cache.Synced(); }));
  EXPECT_EQ(changes.load(), 1) << "the first sync";
  EXPECT_EQ(cache.Size(), 1U);
  EXPECT_EQ(cache.Get("t/plain"), nullptr);
  EXPECT_EQ(cache.IndexKeys("byNode", "n1"), Keys{"t/gpu"});
  EXPECT_EQ(cache.IgnoredChanges(), 1) << "the plain pod, at the list";
  const uint64_t listed = cache.Version();
  EXPECT_GT(listed, 0U);

  // A change of the plain pod, and a new plain pod: nothing stored, nobody woken, and the
  // cache's version stays (what it holds did not change).
  const std::string plain = "/api/v1/namespaces/t/pods/plain";
  client.MergePatch(plain, {{"metadata", {{"annotations", {{"x", "1"}}}}}});
  client.Create("/api/v1/namespaces/t/pods", Pod("t", "plain2", "n1", ""));
  ASSERT_TRUE(testing::WaitFor([&] { return cache.IgnoredChanges() == 3; }));
  EXPECT_EQ(changes.load(), 1);
  EXPECT_EQ(cache.Size(), 1U);
  EXPECT_EQ(cache.Version(), listed);

  // The plain pod comes to be wanted, the GPU pod comes not to be: each wakes the reader.
  client.MergePatch(plain, {{"metadata", {{"labels", {{kClassLabel, "t4"}}}}}});
  ASSERT_TRUE(testing::WaitFor([&] { return changes.load() == 2; }));
  EXPECT_NE(cache.Get("t/plain"), nullptr);
  EXPECT_EQ(cache.Version(), listed + 1);
  client.MergePatch("/api/v1/namespaces/t/pods/gpu",
                    {{"metadata", {{"labels", {{kClassLabel, ""}}}}}});
  ASSERT_TRUE(testing::WaitFor([&] { return changes.load() == 3; }));
  EXPECT_EQ(cache.Get("t/gpu"), nullptr);
  EXPECT_EQ(cache.IndexKeys("byNode", "n1"), Keys{"t/plain"});

  // A relist after a 410: the dropped pods are unchanged, so nothing is handed over again.
  const int64_t ignored = cache.IgnoredChanges();
  const int lists = cache.Stats().lists;
  server->ExpireWatches();
  ASSERT_TRUE(testing::WaitFor([&] { return cache.Stats().lists > lists; }, 10s));
  EXPECT_EQ(cache.IgnoredChanges(), ignored);
  EXPECT_EQ(changes.load(), 3);
  EXPECT_EQ(cache.Size(), 1U);
  EXPECT_EQ(cache.Version(), listed + 2) << "a relist that changed nothing";
}

// The same with the watch skimming what the cache does not keep (InformerOptions::skim): the
// plain pod's changes reach the cache as stubs, never decoded, and still count as taken
// quietly; a pod that comes to carry a wanted key comes whole, is decoded and kept.
TEST(Cache, ASkimmingWatchDecodesNothingItDoesNotKeep) {
  auto server = testing::StartFakeApiServer(false);
  server->Seed({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "t"}}}});
  server->Seed(Pod("t", "gpu", "n1", "a100"));
  Client client(testing::ConfigFor(*server), testing::TestClientOptions(DefaultTimeSource()));
  InformerOptions options;
  options.skim = [](const std::vector<std::string>& path, const std::string& key) {
    return path == std::vector<std::string>{"metadata", "labels"} && key == kClassLabel;
  };
  std::atomic<int> decoded{0};
  JsonCache cache(
      client, "/api/v1/pods",
      [&decoded](const json& pod) {
        ++decoded;
        return pod;
      },
      options);
  cache.SetKeep([](const json& pod) { return pod["metadata"]["labels"].contains(kClassLabel); });
  cache.Start();
  ASSERT_TRUE(testing::WaitFor([&] { return cache.Synced(); }));
  EXPECT_EQ(decoded.load(), 1);

  json plain = Pod("t", "plain", "n1", "");
  plain["metadata"].erase("labels");
  client.Create("/api/v1/namespaces/t/pods", plain);
  client.MergePatch("/api/v1/namespaces/t/pods/plain",
                    {{"metadata", {{"annotations", {{"x", "1"}}}}}});
  ASSERT_TRUE(testing::WaitFor([&] { return cache.IgnoredChanges() == 2; }));
  EXPECT_EQ(decoded.load(), 1) << "a skimmed pod is never decoded";
  EXPECT_EQ(cache.Size(), 1U);

  client.MergePatch("/api/v1/namespaces/t/pods/plain",
                    {{"metadata", {{"labels", {{kClassLabel, "t4"}}}}}});
  ASSERT_TRUE(testing::WaitFor([&] { return cache.Get("t/plain") != nullptr; }));
  EXPECT_EQ(decoded.load(), 2);
  DeleteOptions now;
  now.gracePeriodSeconds = 0;
  client.Delete("/api/v1/namespaces/t/pods/plain", now);
  ASSERT_TRUE(testing::WaitFor([&] { return cache.Get("t/plain") == nullptr; }));
  EXPECT_EQ(cache.Size(), 1U);
}

// An optional kind's cache (KubeVirt's, Cozystack's) follows discovery: started when the kind is
// served, kept while discovery fails or has not answered, dropped when it is not served, and
// made anew (a new list) when it is served again. A reader's pointer outlives the drop.
TEST(OptionalCache, FollowsDiscoveryAndAFailingDiscoveryChangesNothing) {
  auto server = testing::StartFakeApiServer(false);
  server->Seed(Pod("t", "p1", "n1", "a100"));
  Client client(testing::ConfigFor(*server), testing::TestClientOptions(DefaultTimeSource()));
  int made = 0;
  OptionalCache<json> optional([&] {
    ++made;
    return std::make_shared<JsonCache>(client, "/api/v1/pods", IdentityDecode);
  });
  EXPECT_FALSE(optional.Follow(Served::kNotSynced));
  EXPECT_FALSE(optional.Follow(Served::kNotServed));
  EXPECT_EQ(optional.Get(), nullptr);
  EXPECT_TRUE(optional.Follow(Served::kServed));
  const auto held = optional.Get();
  ASSERT_NE(held, nullptr);
  ASSERT_TRUE(testing::WaitFor([&] { return held->Synced(); }));
  EXPECT_FALSE(optional.Follow(Served::kServed)) << "already there";
  EXPECT_FALSE(optional.Follow(Served::kFailing)) << "a failing discovery keeps the cache";
  EXPECT_EQ(optional.Get(), held);
  EXPECT_TRUE(optional.Follow(Served::kNotServed));
  EXPECT_EQ(optional.Get(), nullptr);
  EXPECT_EQ(held->Size(), 1U) << "a reader's pointer outlives the drop";
  EXPECT_TRUE(optional.Follow(Served::kServed));
  EXPECT_NE(optional.Get(), held);
  EXPECT_EQ(made, 2);
  optional.Stop();
  EXPECT_EQ(optional.Get(), nullptr);
}

TEST(Cache, TypedObjectsWithTypedIndexesAndObjectsThatDoNotDecode) {
  auto server = testing::StartFakeApiServer(false);
  server->Seed(Pod("t", "p1", "n1", "a100"));
  json odd = Pod("t", "odd", "n1", "a100");
  odd["spec"].erase("nodeName");
  server->Seed(odd);
  Client client(testing::ConfigFor(*server), testing::TestClientOptions(DefaultTimeSource()));
  Cache<PodInfo> cache(client, "/api/v1/pods", [](const json& pod) {
    return PodInfo{pod.at("metadata").at("name").get<std::string>(),
                   pod.at("spec").at("nodeName").get<std::string>()};
  });
  cache.AddIndex("byNode", [](const PodInfo& pod) { return std::vector<std::string>{pod.node}; });
  cache.Start();
  ASSERT_TRUE(testing::WaitFor([&] { return cache.Synced(); }, 5s));
  ASSERT_EQ(cache.ByIndex("byNode", "n1").size(), 1u);
  EXPECT_EQ(cache.ByIndex("byNode", "n1")[0]->name, "p1");
  EXPECT_EQ(cache.Size(), 1u);
  EXPECT_EQ(cache.DecodeFailures(), 1);
  EXPECT_NE(cache.LastError().find("t/odd"), std::string::npos) << cache.LastError();
}

// Readers on three threads while the cache relists from 40,000 to 80,000 objects: every view
// is the whole old state or the whole new one.
TEST(Cache, ReadersDuringARelistOfFortyThousandObjectsSeeTheOldOrTheNewState) {
#ifdef COZY_SANITIZED
  constexpr int kCount = 10000;  // a quarter under the sanitizers (test/kube/CMakeLists.txt)
#else
  constexpr int kCount = 40000;
#endif
  auto server = testing::StartFakeApiServer(false);
  auto bulk = [](int i, const char* generation) {
    return json{{"apiVersion", "v1"},
                {"kind", "Pod"},
                {"metadata",
                 {{"name", std::string(generation) + std::to_string(i)},
                  {"namespace", "bulk"},
                  {"labels", {{"gen", generation}}}}}};
  };
  for (int i = 0; i < kCount; ++i) server->Seed(bulk(i, "a"));
  ClientOptions options = testing::TestClientOptions(DefaultTimeSource());
  options.maxResponseBytes = size_t{256} << 20;
  options.requestTimeout = 100s;
  Client client(testing::ConfigFor(*server), options);
  InformerOptions informer;
  informer.backoff = {100ms, 200ms, 2.0, 0.0};
  // No watch succeeds until the new objects are in and the history is compacted: the cache
  // learns of them only through a relist (the LIST itself is not faulted).
  fake::Fault noWatch = fake::Fault::Answer(500, -1, "GET");
  noWatch.pathPrefix = "/api/v1/pods";
  noWatch.watchOnly = true;
  server->AddFault(noWatch);
  JsonCache cache(client, "/api/v1/pods", IdentityDecode, informer);
  cache.AddIndex("gen", LabelIndex("gen"));
  cache.Start();
  ASSERT_TRUE(testing::WaitFor([&] { return cache.Synced(); }, 100s)) << cache.LastError();
  ASSERT_EQ(cache.Size(), size_t{kCount});

  std::atomic<bool> done{false};
  std::atomic<int> torn{0};
  std::atomic<int> sawOld{0};
  std::atomic<int> sawNew{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&, r] {
      int i = r;
      while (!done) {
        cache.WithView([&](const JsonCache::View& view) {
          const size_t size = view.Size();
          const size_t a = view.IndexCount("gen", "a");
          const size_t b = view.IndexCount("gen", "b");
          const bool b0 = view.Get("bulk/b0") != nullptr;
          if (size == kCount && a == kCount && b == 0 && !b0) {
            ++sawOld;
          } else if (size == 2 * kCount && a == kCount && b == kCount && b0) {
            ++sawNew;
          } else {
            ++torn;
          }
        });
        auto one = cache.Get("bulk/a" + std::to_string(i++ % kCount));
        if (!one || (*one)["metadata"]["labels"]["gen"] != "a") ++torn;
        std::this_thread::sleep_for(50us);  // busy, but leaves the machine to the relist
      }
    });
  }
  for (int i = 0; i < kCount; ++i) server->Seed(bulk(i, "b"));
  server->Compact();
  server->ClearFaults();
  const bool relisted = testing::WaitFor([&] { return cache.Size() == 2 * kCount; }, 100s);
  std::this_thread::sleep_for(100ms);
  done = true;
  for (auto& reader : readers) reader.join();
  ASSERT_TRUE(relisted) << cache.LastError();
  EXPECT_EQ(torn.load(), 0);
  EXPECT_GT(sawOld.load(), 0);
  EXPECT_GT(sawNew.load(), 0);
  EXPECT_EQ(cache.IndexKeys("gen", "b").size(), size_t{kCount});
  // The new state is published before the informer counts its list (and freeing the old
  // 40,000 objects takes a while under ASan), so the count is waited for, not read at once.
  EXPECT_TRUE(testing::WaitFor([&] { return cache.Stats().lists >= 2; }, 30s))
      << "lists: " << cache.Stats().lists;
  cache.Stop();
}

// The names of this process's threads, as /proc shows them.
std::multiset<std::string> ThreadNames() {
  std::multiset<std::string> found;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream in(task.path() / "comm");
    std::string name;
    std::getline(in, name);
    found.insert(name);
  }
  return found;
}

// docs/kubernetes.md, "One thread for every cache's watch": the caches of a daemon share one
// informer loop. Their watch events are taken on its one thread (named for it; no cache has a
// thread of its own), and it sleeps while they are idle. A list never runs on it: while a relist of
// pods hangs for 3 s, a ConfigMap made meanwhile reaches its cache on the loop at once, and a cache
// stopped leaves the others running.
TEST(InformerLoop, EveryCacheWatchesOnOneThreadAndAHangingListHoldsNoOtherCache) {
  auto server = QuietServerWithAPod();
  Client client(testing::ConfigFor(*server), testing::TestClientOptions(DefaultTimeSource()));
  const auto configMap = [](const std::string& name) {
    return json{{"apiVersion", "v1"},
                {"kind", "ConfigMap"},
                {"metadata", {{"name", name}, {"namespace", "tenant-a"}}}};
  };
  std::mutex mutex;
  std::set<std::string> changedOn;  // the threads the watch events' changes came on
  const auto onChange = [&] {
    char name[16] = {};
    pthread_getname_np(pthread_self(), name, sizeof name);
    std::lock_guard lock(mutex);
    changedOn.insert(name);
  };
  const auto names = [&] {
    std::lock_guard lock(mutex);
    return changedOn;
  };
  ASSERT_EQ(ThreadNames().count("informers"), 0u);
  InformerLoop loop("informers", DefaultTimeSource());
  JsonCache pods(client, "/api/v1/pods", IdentityDecode);
  JsonCache configMaps(client, "/api/v1/configmaps", IdentityDecode);
  JsonCache quotas(client, "/api/v1/resourcequotas", IdentityDecode);
  pods.SetOnChange(onChange);
  configMaps.SetOnChange(onChange);
  pods.Start(&loop);
  configMaps.Start(&loop);
  quotas.Start(&loop);
  ASSERT_TRUE(
      testing::WaitFor([&] { return pods.Synced() && configMaps.Synced() && quotas.Synced(); }));
  EXPECT_EQ(loop.Lists(), 3u);
  ASSERT_TRUE(testing::WaitFor([&] {
    int watches = 0;
    for (const auto& request : server->Requests()) {
      watches += request.query.find("watch=1") != std::string::npos ? 1 : 0;
    }
    return watches == 3;
  }));
  std::this_thread::sleep_for(200ms);  // the watches' first answers taken
  {
    std::lock_guard lock(mutex);
    changedOn.clear();  // the first lists' changes came on the lists' threads
  }
  client.Create("/api/v1/namespaces/tenant-a/pods", Pod("tenant-a", "p2", "n1", "a100"));
  client.Create("/api/v1/namespaces/tenant-a/configmaps", configMap("c1"));
  ASSERT_TRUE(testing::WaitFor([&] { return pods.Size() == 2u && configMaps.Size() == 1u; }));
  EXPECT_EQ(names(), std::set<std::string>{"informers"});
  const auto threads = ThreadNames();
  EXPECT_EQ(threads.count("informers"), 1u);
  EXPECT_EQ(
      threads.count("c:pods") + threads.count("c:configmaps") + threads.count("c:resourcequota"),
      0u);
  // Three idle watches: the loop wakes when curl's timers ask (about once a second each), not on
  // a 100 ms poll of each.
  const uint64_t woken = loop.Wakeups();
  std::this_thread::sleep_for(1500ms);
  EXPECT_LE(loop.Wakeups() - woken, 12u);

  // Every watch expires; the pods' relist hangs for 3 s.
  SlowNextPodsRequest(*server, 3000);
  const int podLists = pods.Stats().lists;
  const int configMapLists = configMaps.Stats().lists;
  server->ExpireWatches();
  ASSERT_TRUE(testing::WaitFor([&] { return configMaps.Stats().lists > configMapLists; }, 2s))
      << "the ConfigMaps' relist does not wait for the pods'";
  const auto made = Clock::now();
  client.Create("/api/v1/namespaces/tenant-a/configmaps", configMap("c2"));
  ASSERT_TRUE(testing::WaitFor([&] { return configMaps.Size() == 2u; }, 2s));
  EXPECT_LT(Clock::now() - made, 1s);
  EXPECT_EQ(pods.Stats().lists, podLists) << "the pods' list still hangs";
  ASSERT_TRUE(testing::WaitFor([&] { return pods.Stats().lists > podLists; }, 10s));
  EXPECT_EQ(pods.Size(), 2u);

  // The list workers stay, idle, for the relists that follow (a worker that ended would hand
  // its malloc arena, full of its list's objects, to the next thread made): after two more waves
  // of relists there are still no more workers than lists ever ran at once (three caches), not
  // one per list.
  const auto quotaWatches = [&] {
    int watches = 0;
    for (const auto& request : server->Requests()) {
      watches += request.path == "/api/v1/resourcequotas" &&
                 request.query.find("watch=1") != std::string::npos;
    }
    return watches;
  };
  for (int wave = 0; wave < 2; ++wave) {
    const int relisted = quotas.Stats().lists;
    // The watch after the last relist is open: an expiry before it comes would find no watch of
    // the quotas to end (seen on a loaded machine), and no relist would follow.
    ASSERT_TRUE(testing::WaitFor([&] { return quotaWatches() >= relisted; }));
    std::this_thread::sleep_for(100ms);
    server->ExpireWatches();
    ASSERT_TRUE(testing::WaitFor([&] { return quotas.Stats().lists > relisted; }, 5s));
  }
  ASSERT_TRUE(
      testing::WaitFor([&] { return ThreadNames().count("l:idle") == loop.ListWorkers(); }));
  EXPECT_GE(loop.Lists(), 9u);
  EXPECT_GE(loop.ListWorkers(), 1u);
  EXPECT_LE(loop.ListWorkers(), 3u);

  // One cache leaves the loop; the others go on.
  pods.Stop();
  client.Create("/api/v1/namespaces/tenant-a/configmaps", configMap("c3"));
  EXPECT_TRUE(testing::WaitFor([&] { return configMaps.Size() == 3u; }, 2s));
  configMaps.Stop();
  quotas.Stop();
}
}  // namespace
// A cache's thread carries its collection's name, as `top -H`, perf and bench_churn's CPU by
// thread show it: "c:" and the last segment of the path, within Linux's 15 bytes.
TEST(Cache, ItsThreadIsNamedForItsCollection) {
  auto server = testing::StartFakeApiServer(false);
  Client client(testing::ConfigFor(*server), testing::TestClientOptions(DefaultTimeSource()));
  JsonCache pods(client, "/api/v1/pods", IdentityDecode);
  JsonCache quotas(client, "/api/v1/resourcequotas", IdentityDecode);
  const auto names = ThreadNames;
  EXPECT_EQ(names().count("c:pods"), 0u);
  pods.Start();
  quotas.Start();
  ASSERT_TRUE(testing::WaitFor([&] { return pods.Synced() && quotas.Synced(); }, 5s));
  EXPECT_EQ(names().count("c:pods"), 1u);
  EXPECT_EQ(names().count("c:resourcequota"), 1u);  // "c:resourcequotas" cut to 15 bytes
  pods.Stop();
  quotas.Stop();
  EXPECT_EQ(names().count("c:pods"), 0u);
}

}  // namespace cozy::kube
