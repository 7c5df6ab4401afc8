// The binder against the fake API server, without the daemon around it: D3 (a cache behind the
// binder's own writes, or the last leader's, is read past, and a stale pass cannot book a unit
// twice), D4 (an answers-only pass writes what its answers stand on), and the writes a pass
// makes for its decisions.
#include "controller/binder/binder.h"

#include <gtest/gtest.h>

#include <map>
#include <thread>
#include <utility>

#include "controller/snapshot_json.h"
#include "test/kube/kube_test_support.h"
#include "test/support/gpu_objects.h"
#include "test/support/process.h"

namespace cozy::controller {
namespace {

using nlohmann::json;

class BinderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = testing::StartChartApiServer();
    client_ = std::make_unique<kube::Client>(testing::ConfigFor(*server_));
    testing::SeedOneGpuNode(*server_, "t1", "n1", 1);
    server_->Seed(Device("d1", "a100"));
    server_->Seed(Told(Device("d2", "a100")));
  }

  // d2 as a pass before left it: n1's one unit taken by d1, d2 told why it waits (docs/
  // controller.md, "Why an order waits"), so the passes of these tests write d1 alone.
  static json Told(json device) {
    device["status"]["conditions"] = {{{"type", "Bound"},
                                       {"status", "False"},
                                       {"reason", "Refused"},
                                       {"message", kNoRoom},
                                       {"lastTransitionTime", "2026-01-01T00:00:00Z"}}};
    return device;
  }
  inline static const std::string kNoRoom =
      "no eligible node has room for 1 unit of nvidia.com/GA100";

  static json Class(const std::string& name, json nodeSelector = nullptr) {
    json object = testing::GpuClassObject(name);
    if (!nodeSelector.is_null()) object["spec"]["nodeSelector"] = nodeSelector;
    return object;
  }
  static json Device(const std::string& name, const std::string& className) {
    return {{"apiVersion", "gpu.cozystack.io/v1alpha1"},
            {"kind", "GPUDevice"},
            {"metadata", {{"name", name}, {"namespace", "t1"}}},
            {"spec", {{"className", className}, {"count", 1}}}};
  }

  // The cluster as a cache would hold it now.
  model::Snapshot Read() {
    json items = json::array();
    for (const char* path : {"/api/v1/nodes", "/apis/gpu.cozystack.io/v1alpha1/gpunodes",
                             "/apis/gpu.cozystack.io/v1alpha1/gpuclasses",
                             "/apis/gpu.cozystack.io/v1alpha1/gpudevices"}) {
      const json list = client_->List(path);
      std::string kind = list.value("kind", "");
      kind.resize(kind.size() - 4);  // "GPUDeviceList": list items carry no kind of their own
      for (json item : list["items"]) {
        item["kind"] = kind;
        items.push_back(item);
      }
    }
    return DecodeSnapshotList({{"kind", "List"}, {"items", items}});
  }
  static std::vector<std::shared_ptr<const api::GpuDevice>> Shared(const model::Snapshot& s) {
    return s.devices.Items();  // the snapshot's own elements, as a cache's
  }
  // The snapshot's devices by "namespace/name", as a pass looks a cache up.
  static ReadPastCache::CachedLookup Cached(const model::Snapshot& s) {
    auto byKey = std::make_shared<std::map<std::string, std::shared_ptr<const api::GpuDevice>>>();
    for (const auto& device : Shared(s)) {
      (*byKey)[device->metadata.namespaceName + "/" + device->metadata.name] = device;
    }
    return [byKey](const std::string& key) -> std::shared_ptr<const api::GpuDevice> {
      auto found = byKey->find(key);
      return found == byKey->end() ? nullptr : found->second;
    };
  }
  // n2 joins with one unit; class pool-a serves only nodes labelled pool=a, which n1 no longer
  // is. d1 (pool-a) holds n1's unit and must move to n2; d3 (a100, any node) is a new order the
  // plan gives the unit d1's move frees on n1.
  void SeedAMoveThatMakesRoom() {
    json n2 = testing::ReadyNode("n2");
    n2["metadata"]["labels"] = {{"pool", "a"}};
    server_->Seed(n2);
    server_->Seed(testing::GpuNodeObject("n2", 1));
    server_->Seed(Class("pool-a", {{"matchLabels", {{"pool", "a"}}}}));
    client_->Delete(kDevices + "d2");
    client_->MergePatch(kDevices + "d1", {{"spec", {{"className", "pool-a"}}}});
    client_->MergePatch(kDevices + "d1/status",
                        {{"status", {{"phase", "Bound"}, {"nodeName", "n1"}}}});
    server_->Seed(Device("d3", "a100"));
  }
  // Every status write of `device` answered `code` until the faults are cleared.
  void RefuseStatusWrites(const std::string& device, int code) {
    fake::Fault refused = fake::Fault::Answer(code, -1, "PATCH");
    refused.pathPrefix = kDevices + device + "/status";
    server_->AddFault(refused);
  }
  inline static const std::string kDevices =
      "/apis/gpu.cozystack.io/v1alpha1/namespaces/t1/gpudevices/";

  // A client with no rate limit of its own (the daemon's is --qps): the binder's writes go out
  // as fast as it sends them.
  kube::Client Unlimited() {
    kube::ClientOptions options;
    options.qps = 0;
    return kube::Client(testing::ConfigFor(*server_), options);
  }

  // The status writes sent, applied or not.
  std::vector<fake::LoggedRequest> Patches() {
    return testing::RequestsTo(*server_, "PATCH", "/apis/gpu.cozystack.io/");
  }
  int Bound() {
    int bound = 0;
    const json list = client_->List("/apis/gpu.cozystack.io/v1alpha1/gpudevices");
    for (const auto& item : list["items"]) {
      bound += item.value("status", json::object()).value("phase", "") == "Bound";
    }
    return bound;
  }
  // Ten orders that bind (d1 or d2 on n1, the rest on a node "big"), and a server that holds
  // each Event it is sent 700 ms.
  void TenBindsWithEventsHeld700Ms() {
    server_->Seed(testing::ReadyNode("big"));
    server_->Seed(testing::GpuNodeObject("big", 16));
    for (int i = 3; i <= 10; ++i) server_->Seed(Device("d" + std::to_string(i), "a100"));
    fake::Fault slow;
    slow.method = "POST";
    slow.pathPrefix = "/apis/events.k8s.io/";
    slow.latencyMs = 700;
    server_->AddFault(slow);
  }

  std::unique_ptr<fake::FakeApiServer> server_;
  std::unique_ptr<kube::Client> client_;
  kube::Leadership leading_{true};
};

TEST_F(BinderTest, D3_ACacheBehindTheBindersWritesIsReadPastAndNoUnitIsBookedTwice) {
  Binder binder(*client_, leading_);
  const model::Snapshot before = Read();
  EXPECT_TRUE(binder.readPast().StaleInCache(Cached(before)).empty());
  BinderResult first = binder.Pass(before, false, true, std::chrono::system_clock::now());
  ASSERT_TRUE(first.error.empty()) << first.error;

  EXPECT_EQ(first.writes, 1);  // the oldest order takes the one unit; the other is refused
  EXPECT_EQ(Bound(), 1);

  // A watch that has not delivered the write leaves the cache showing the unit free: the
  // written device, and only it, is stale.
  const std::vector<std::string> staleKeys = binder.readPast().StaleInCache(Cached(before));
  EXPECT_EQ(staleKeys, (std::vector<std::string>{"t1/d1"}));
  // Read past it: the API server's answer to the write shows the bind, so the next pass books
  // nothing, and no request is made for it. (The first pass's Events are in first: they go
  // out on the binder's event sender, after the pass.)
  EXPECT_TRUE(binder.readPast().NeedReading(staleKeys).empty());
  ASSERT_TRUE(binder.WaitForEvents(std::chrono::seconds(10)));
  server_->ClearRequests();
  model::Snapshot fresh = before;
  int fromOwnWrites = 0;
  EXPECT_EQ(binder.readPast().ReadPast(Shared(before), staleKeys, fresh.devices, &fromOwnWrites),
            0);
  EXPECT_EQ(fromOwnWrites, 1);
  EXPECT_TRUE(server_->Requests().empty());  // neither a GET of d1 nor a LIST of every device
  ASSERT_EQ(fresh.devices.size(), 2u);
  for (const api::GpuDevice& device : fresh.devices) {
    if (device.metadata.name == "d1") {
      EXPECT_EQ(device.Phase(), api::DevicePhase::kBound);
    }
  }
  // Until the cache itself shows the write, every pass reads the device again.
  EXPECT_EQ(binder.readPast().StaleInCache(Cached(before)), staleKeys);
  BinderResult second = binder.Pass(fresh, false, true, std::chrono::system_clock::now());
  EXPECT_EQ(second.writes, 0);
  EXPECT_EQ(Bound(), 1);
  EXPECT_TRUE(
      binder.readPast().StaleInCache(Cached(fresh)).empty());  // a cache that shows it: done

  // Even a pass that did plan from the stale view cannot double-book: its first write is
  // conditional on the version it read, conflicts, and the pass stops there.
  BinderResult stale = binder.Pass(before, false, true, std::chrono::system_clock::now());
  EXPECT_EQ(stale.writes, 0);
  EXPECT_EQ(stale.conflicts, 1);
  EXPECT_TRUE(stale.incomplete);
  EXPECT_EQ(Bound(), 1);
}

TEST_F(BinderTest, D3_AWriteWhoseAnswerDoesNotSayWhatTheDeviceIsIsReadWithAGet) {
  // The server answers d1's bind with a Status, not the device (and does not apply it): the
  // binder cannot plan from that answer, so the device is read from the API server.
  fake::Fault status;
  status.method = "PATCH";
  status.pathPrefix = kDevices + "d1/status";
  status.status = 200;
  status.count = 1;
  server_->AddFault(status);
  Binder binder(*client_, leading_);
  const model::Snapshot before = Read();
  ASSERT_EQ(binder.Pass(before, false, true, std::chrono::system_clock::now()).writes, 1);
  const std::vector<std::string> stale = binder.readPast().StaleInCache(Cached(before));
  EXPECT_EQ(stale, (std::vector<std::string>{"t1/d1"}));
  EXPECT_EQ(binder.readPast().NeedReading(stale), stale);
  ASSERT_TRUE(binder.WaitForEvents(std::chrono::seconds(10)));
  server_->ClearRequests();
  model::Snapshot read = before;
  int fromOwnWrites = -1;
  EXPECT_EQ(binder.readPast().ReadPast(Shared(before), stale, read.devices, &fromOwnWrites), 1);
  EXPECT_EQ(fromOwnWrites, 0);
  ASSERT_EQ(server_->Requests().size(), 1u);
  EXPECT_EQ(server_->Requests()[0].method, "GET");
  // The server's d1 is still waiting (the write did not apply): the next pass binds it again.
  BinderResult again = binder.Pass(read, false, true, std::chrono::system_clock::now());
  EXPECT_EQ(again.writes, 1);
  EXPECT_EQ(again.conflicts, 0);
  EXPECT_EQ(Bound(), 1);
}

TEST_F(BinderTest, D3_AWriteOfAWrittenDeviceKeepsEveryVersionTheCacheMayStillShowStale) {
  // Two writes of d1 in two passes, the second planned from the first's answer, with the watch
  // delivering neither: the cache may show the version before either write, and both are
  // stale (with only the last replaced version kept, a cache showing the first looked caught up
  // after the second write, and a pass planned from it).
  Binder binder(*client_, leading_);
  const model::Snapshot before = Read();
  ASSERT_EQ(binder.Pass(before, false, true, std::chrono::system_clock::now()).writes, 1);
  model::Snapshot first = before;
  ASSERT_EQ(binder.readPast().ReadPast(
                Shared(before), binder.readPast().StaleInCache(Cached(before)), first.devices),
            0);  // d1 as the first write's answer shows it
  // A bind request on d1 that pass plans from (as if d1's answer carried it): an answer to
  // write, conditional on the version the first write made.
  std::vector<api::GpuDevice> devices = first.devices.Copy();
  for (api::GpuDevice& device : devices) {
    if (device.metadata.name == "d1") {
      device.status.bindRequest = api::BindRequest{"r9", "2026-12-01T00:00:01Z"};
    }
  }
  model::Snapshot second = first;
  second.devices = model::SharedVector<api::GpuDevice>(std::move(devices));
  ASSERT_EQ(binder.Pass(second, true, true, std::chrono::system_clock::now()).writes, 1);
  // The cache at the version before the first write, or at the one the first made: stale.
  EXPECT_EQ(binder.readPast().StaleInCache(Cached(before)), (std::vector<std::string>{"t1/d1"}));
  EXPECT_EQ(binder.readPast().StaleInCache(Cached(first)), (std::vector<std::string>{"t1/d1"}));
  model::Snapshot seen = before;
  EXPECT_EQ(binder.readPast().ReadPast(Shared(before), {"t1/d1"}, seen.devices), 0);
  for (const api::GpuDevice& device : seen.devices) {
    if (device.metadata.name == "d1") {
      ASSERT_TRUE(device.status.bindResponse);
      EXPECT_EQ(device.status.bindResponse->id, "r9");  // the second write's answer
    }
  }
  // The cache at the second write's answer: caught up.
  EXPECT_TRUE(binder.readPast().StaleInCache(Cached(Read())).empty());
}

TEST_F(BinderTest, D3_ANewLeaderReadsPastACacheBehindTheLastLeadersWrites) {
  // The last leader bound d1, the oldest order, onto the one unit. The new leader's cache has
  // not even seen d1 yet: planned from it alone, d2 would take the unit d1 holds.
  const model::Snapshot before = Read();
  Binder last(*client_, leading_);
  ASSERT_EQ(last.Pass(before, false, true, std::chrono::system_clock::now()).writes, 1);
  ASSERT_EQ(Bound(), 1);
  model::Snapshot behind = before;
  behind.devices.EraseIf([](const api::GpuDevice& d) { return d.metadata.name == "d1"; });
  bool wouldBindD2 = false;
  for (const model::Decision& decision : model::Model(behind).PlanPass()) {
    wouldBindD2 |= decision.deviceName == "d2" && decision.action == model::Action::kBind;
  }
  ASSERT_TRUE(wouldBindD2) << "the scenario no longer shows the hazard";

  // On taking the lead, one list marks the device the cache lacks; it is read past (a GET)
  // until the cache shows it, and d2 is refused.
  Binder next(*client_, leading_);
  std::vector<api::GpuDevice> listed = Read().devices.Copy();
  EXPECT_EQ(next.readPast().Resync(Shared(behind), listed), 1);
  const std::vector<std::string> stale = next.readPast().StaleInCache(Cached(behind));
  EXPECT_EQ(stale, (std::vector<std::string>{"t1/d1"}));
  model::Snapshot seen = behind;
  EXPECT_EQ(next.readPast().ReadPast(Shared(behind), stale, seen.devices), 1);
  ASSERT_EQ(seen.devices.size(), 2u);
  BinderResult pass = next.Pass(seen, false, true, std::chrono::system_clock::now());
  ASSERT_TRUE(pass.error.empty()) << pass.error;
  EXPECT_EQ(pass.writes, 0);
  EXPECT_EQ(pass.decisions["refuse"], 1);
  EXPECT_EQ(Bound(), 1);
  // Still behind: still read past. Once the cache shows the server's version: done.
  EXPECT_EQ(next.readPast().StaleInCache(Cached(behind)), stale);
  const model::Snapshot caughtUp = Read();
  model::Snapshot again = caughtUp;
  next.readPast().ReadPast(Shared(caughtUp), next.readPast().StaleInCache(Cached(caughtUp)),
                           again.devices);
  EXPECT_TRUE(next.readPast().StaleInCache(Cached(caughtUp)).empty());

  // A cache showing an older version of a device than the list is marked as well.
  Binder third(*client_, leading_);
  EXPECT_EQ(third.readPast().Resync(Shared(before), listed),
            1);  // d1: Pending in the cache, Bound listed
  EXPECT_EQ(third.readPast().StaleInCache(Cached(before)), stale);
  EXPECT_EQ(Binder(*client_, leading_).readPast().Resync(Shared(caughtUp), listed), 0);
}

TEST_F(BinderTest, D4_AnAnswersOnlyPassWritesTheMoveThatFreesTheUnitItAnswersWith) {
  // d3 asks to be bound, and the plan gives it the unit d1's move frees.
  SeedAMoveThatMakesRoom();
  const std::string& devices = kDevices;
  client_->MergePatch(
      devices + "d3/status",
      {{"status", {{"bindRequest", {{"id", "r1"}, {"requestedAt", "2026-12-01T00:00:00Z"}}}}}});
  const model::Snapshot snapshot = Read();
  std::map<std::string, std::pair<model::Action, std::string>> plan;
  for (const model::Decision& d : model::Model(snapshot).PlanPass()) {
    plan[d.deviceName] = {d.action, d.node};
  }
  ASSERT_EQ(plan["d1"], std::make_pair(model::Action::kMove, std::string("n2")));
  ASSERT_EQ(plan["d3"], std::make_pair(model::Action::kBind, std::string("n1")));

  Binder binder(*client_, leading_);
  BinderResult pass = binder.Pass(snapshot, true, true, std::chrono::system_clock::now());
  ASSERT_TRUE(pass.error.empty()) << pass.error;
  EXPECT_EQ(pass.writes, 2);  // the move, then the answer it makes room for
  const json d1 = client_->Get(devices + "d1");
  const json d3 = client_->Get(devices + "d3");
  EXPECT_EQ(d1["status"]["nodeName"], "n2");
  EXPECT_EQ(d3["status"]["nodeName"], "n1");
  EXPECT_EQ(d3["status"]["bindResponse"]["result"], "Succeeded");
}

// The quiet room (docs/controller.md, "Who wakes for a change"): only a full pass that decided held
// keeps alone leaves one (the room each node has left), so the pods cache may take GPU pods without
// a pass; a pass that binds or refuses, and an answers-only pass, leave none.
TEST_F(BinderTest, OnlyAFullPassOfHeldKeepsLeavesAQuietRoom) {
  server_->Seed(testing::ReadyNode("n2"));
  server_->Seed(testing::GpuNodeObject("n2", 2));
  client_->Delete(kDevices + "d2");
  Binder binder(*client_, leading_);
  const auto now = std::chrono::system_clock::now();
  BinderResult pass = binder.Pass(Read(), false, true, now);  // d1 is bound: not quiet
  ASSERT_TRUE(pass.error.empty()) << pass.error;
  EXPECT_EQ(pass.writes, 1);
  EXPECT_FALSE(pass.quietRoom);
  pass = binder.Pass(Read(), true, true, now);  // held keeps, but answers only
  EXPECT_FALSE(pass.quietRoom);
  pass = binder.Pass(Read(), false, true, now);
  ASSERT_TRUE(pass.quietRoom);
  const std::string node = client_->Get(kDevices + "d1")["status"]["nodeName"];
  const std::string other = node == "n1" ? "n2" : "n1";
  const std::string resource =
      testing::GpuClassObject("a100")["spec"]["source"]["devicePlugin"]["resourceName"];
  auto served = [](const std::string& n) { return n == "n1" ? 1 : 2; };
  auto& byNode = pass.quietRoom->byNode;
  EXPECT_EQ(byNode[node][resource], served(node) - 1) << "d1 holds one of its node's units";
  EXPECT_EQ(byNode[other][resource], served(other));
  EXPECT_EQ(pass.quietRoom->resources, std::set<std::string>{resource});
  server_->Seed(Device("d4", "a100"));  // a new order: the pass binds, not quiet
  EXPECT_FALSE(binder.Pass(Read(), false, true, now).quietRoom);
}

// docs/controller.md, "The binder", concurrent writes: the binds of a pass, which stand on no write
// before them, are in flight together (up to Binder::kWriters): with every status write held 2 s by
// the server, eight are received before the first is answered. One after the other, the second
// would come only after that.
TEST_F(BinderTest, BindsOfAPassAreWrittenConcurrently) {
  server_->Seed(testing::ReadyNode("big"));
  server_->Seed(testing::GpuNodeObject("big", 16));
  for (int i = 3; i <= 12; ++i) server_->Seed(Device("d" + std::to_string(i), "a100"));
  const model::Snapshot snapshot = Read();
  fake::Fault slow;
  slow.method = "PATCH";
  slow.pathPrefix = kDevices;
  slow.latencyMs = 2000;
  server_->AddFault(slow);
  server_->ClearRequests();
  kube::Client unlimited = Unlimited();
  Binder binder(unlimited, leading_);
  BinderResult pass;
  std::thread run(
      [&] { pass = binder.Pass(snapshot, false, true, std::chrono::system_clock::now()); });
  const bool inFlight = testing::WaitFor([&] { return Patches().size() >= Binder::kWriters; },
                                         std::chrono::seconds(10));
  const std::vector<fake::LoggedRequest> received = Patches();
  run.join();
  ASSERT_TRUE(inFlight) << received.size() << " status writes received";
  for (const fake::LoggedRequest& request : received) {
    EXPECT_EQ(request.status, 0) << request.path << " was answered before the eighth was sent";
  }
  EXPECT_EQ(pass.writes, 12);  // d1 or d2 takes n1's unit; the other and d3..d12 go to big
  EXPECT_EQ(Bound(), 12);
}

// docs/controller.md, "The binder": a pass's Events go to a sender of their own, one at a time, as
// client-go's recorder sends them: with every Event held 700 ms by the server, a pass of ten binds
// is done before its first Event is written (a pass that waited for them would take 700 ms at
// least), and they are all written after it.
TEST_F(BinderTest, EventsNeverHoldUpThePass) {
  TenBindsWithEventsHeld700Ms();
  kube::Client unlimited = Unlimited();
  Binder binder(unlimited, leading_);
  const auto started = std::chrono::steady_clock::now();
  const BinderResult pass = binder.Pass(Read(), false, true, std::chrono::system_clock::now());
  const auto passTook = std::chrono::steady_clock::now() - started;
  EXPECT_EQ(pass.writes, 10);
  EXPECT_EQ(pass.events, 10) << "each bind's Event, handed to the sender";
  EXPECT_LT(passTook, std::chrono::milliseconds(700));
  EXPECT_EQ(binder.EventsWritten(), 0);
  ASSERT_TRUE(binder.WaitForEvents(std::chrono::seconds(30)));
  EXPECT_EQ(binder.EventsWritten(), 10);
  EXPECT_EQ(binder.EventsFailed(), 0);
  const json events = client_->List("/apis/events.k8s.io/v1/events")["items"];
  EXPECT_EQ(events.size(), 10u);
  for (const json& event : events) EXPECT_EQ(event["reason"], "Bound") << event.dump();
}

// The sender's queue is bounded: with the server holding each Event 700 ms and room for two,
// the first two Events of a pass of ten binds wait and are written, the other eight are dropped
// and counted, and the pass is not held up by any of them.
TEST_F(BinderTest, EventsPastTheSendersQueueAreDroppedAndCounted) {
  TenBindsWithEventsHeld700Ms();
  kube::Client unlimited = Unlimited();
  Binder binder(unlimited, leading_);
  binder.SetEventQueueLimit(2);
  const BinderResult pass = binder.Pass(Read(), false, true, std::chrono::system_clock::now());
  EXPECT_EQ(pass.writes, 10);
  EXPECT_EQ(pass.events, 2);
  EXPECT_EQ(binder.EventsDropped(), 8);
  ASSERT_TRUE(binder.WaitForEvents(std::chrono::seconds(30)));
  EXPECT_EQ(binder.EventsWritten(), 2);
  EXPECT_EQ(client_->List("/apis/events.k8s.io/v1/events")["items"].size(), 2u);
}

// A decision that frees units is written alone, after every write before it and before any
// after it: the bind that takes the unit d1's move frees is sent only once the move is answered.
TEST_F(BinderTest, AMoveThatFreesUnitsIsAnsweredBeforeTheBindThatTakesThemIsSent) {
  SeedAMoveThatMakesRoom();
  const model::Snapshot snapshot = Read();
  fake::Fault slow;
  slow.method = "PATCH";
  slow.pathPrefix = kDevices;
  slow.latencyMs = 300;
  server_->AddFault(slow);
  server_->ClearRequests();
  Binder binder(*client_, leading_);
  const BinderResult pass = binder.Pass(snapshot, false, true, std::chrono::system_clock::now());
  EXPECT_EQ(pass.writes, 2);
  const std::vector<fake::LoggedRequest> patches = Patches();
  ASSERT_EQ(patches.size(), 2u);
  EXPECT_EQ(patches[0].path, kDevices + "d1/status");
  EXPECT_EQ(patches[1].path, kDevices + "d3/status");
  // Received no sooner than the move's answer, which the server held 300 ms.
  EXPECT_GE(patches[1].received - patches[0].received, std::chrono::milliseconds(300));
}

// A conflict stops the pass at once: the writes in flight beside it (binds: they take units only,
// so none stood on it) are taken as they come, none after it is sent, and the next pass writes
// the rest. The server answers the first write 409 at once and holds every other 300 ms, so a
// write sent after the conflict came back would be received 300 ms after the first or later.
TEST_F(BinderTest, AConflictStopsThePassAndNoWriteIsSentAfterIt) {
  server_->Seed(testing::ReadyNode("big"));
  server_->Seed(testing::GpuNodeObject("big", 80));
  const int orders = 70;
  for (int i = 3; i < 3 + orders; ++i) server_->Seed(Device("d" + std::to_string(i), "a100"));
  fake::Fault conflict = fake::Fault::Answer(409, 1, "PATCH");
  conflict.pathPrefix = kDevices;
  server_->AddFault(conflict);
  fake::Fault slow;
  slow.method = "PATCH";
  slow.pathPrefix = kDevices;
  slow.latencyMs = 300;
  server_->AddFault(slow);
  server_->ClearRequests();
  kube::Client unlimited = Unlimited();
  Binder binder(unlimited, leading_);
  BinderResult pass = binder.Pass(Read(), false, true, std::chrono::system_clock::now());
  EXPECT_EQ(pass.conflicts, 1);
  EXPECT_TRUE(pass.incomplete);
  const std::vector<fake::LoggedRequest> patches = Patches();
  ASSERT_FALSE(patches.empty());
  EXPECT_LE(patches.size(), Binder::kWriters) << "the conflict and those in flight beside it";
  for (const fake::LoggedRequest& request : patches) {
    EXPECT_LT(request.received - patches.front().received, std::chrono::milliseconds(250))
        << request.path << " was sent after the conflict came back";
  }
  EXPECT_EQ(pass.writes, static_cast<int64_t>(patches.size()) - 1);
  server_->ClearFaults();
  pass = binder.Pass(Read(), false, true, std::chrono::system_clock::now());
  EXPECT_FALSE(pass.incomplete);
  EXPECT_EQ(Bound(), orders + 2);  // one of d1 and d2 on n1, every other order on big
}

// docs/controller.md, "The binder": a device whose write the server refuses for what it is (a
// hoster's policy or webhook answering 422) is held off on its own: the decisions after it that
// only take units are still written, its write is not sent again until its backoff ends or the
// device changes, and the pass says when to try it again.
TEST_F(BinderTest, ARefusedDeviceIsHeldOffAndTheRestOfThePassIsWritten) {
  server_->Seed(testing::ReadyNode("n2"));
  server_->Seed(testing::GpuNodeObject("n2", 1));
  const std::string devices = "/apis/gpu.cozystack.io/v1alpha1/namespaces/t1/gpudevices/";
  model::Snapshot snapshot = Read();
  const std::vector<model::Decision> plan = model::Model(snapshot).PlanPass();
  ASSERT_EQ(plan.size(), 2u);
  ASSERT_EQ(plan[0].deviceName, "d1");  // the refused one comes first: d2 is after it
  ASSERT_EQ(plan[0].action, model::Action::kBind);
  ASSERT_EQ(plan[1].action, model::Action::kBind);
  RefuseStatusWrites("d1", 422);
  kube::FakeTimeSource time;
  Binder binder(*client_, leading_, "", &time);

  server_->ClearRequests();
  BinderResult pass = binder.Pass(snapshot, false, true, std::chrono::system_clock::now());
  EXPECT_EQ(pass.failures, 1);
  EXPECT_EQ(pass.writes, 1);  // d2, after the refused d1
  EXPECT_FALSE(pass.incomplete);
  EXPECT_EQ(pass.backingOff, 1u);
  ASSERT_TRUE(pass.retryAt);
  EXPECT_EQ(*pass.retryAt - time.Now(), std::chrono::seconds(1));
  EXPECT_EQ(Bound(), 1);
  EXPECT_EQ(Patches().size(), 2u);

  // Held off: the next passes send nothing for d1, however often they run.
  snapshot = Read();
  server_->ClearRequests();
  for (int i = 0; i < 3; ++i) {
    pass = binder.Pass(snapshot, false, true, std::chrono::system_clock::now());
    EXPECT_EQ(pass.heldOff, 1);
    EXPECT_EQ(pass.failures, 0);
  }
  EXPECT_TRUE(Patches().empty());

  // Its backoff over, it is sent again; refused again, it waits twice as long.
  time.Advance(std::chrono::seconds(1));
  pass = binder.Pass(snapshot, false, true, std::chrono::system_clock::now());
  EXPECT_EQ(pass.failures, 1);
  ASSERT_TRUE(pass.retryAt);
  EXPECT_EQ(*pass.retryAt - time.Now(), std::chrono::seconds(2));
  EXPECT_EQ(Patches().size(), 1u);

  // The device changes (its owner fixes what the policy refused): it is tried at once.
  server_->ClearFaults();
  client_->MergePatch(devices + "d1", {{"metadata", {{"labels", {{"fixed", "yes"}}}}}});
  pass = binder.Pass(Read(), false, true, std::chrono::system_clock::now());
  EXPECT_EQ(pass.writes, 1);
  EXPECT_EQ(pass.backingOff, 0u);
  EXPECT_FALSE(pass.retryAt);
  EXPECT_EQ(Bound(), 2);
}

// A refused write that frees units (a move off a node) is one the decisions after it may
// stand on: the pass stops before them, and while it is held off the passes stop there without
// sending it; once it is written, the bind it made room for is too.
TEST_F(BinderTest, ARefusedMoveHoldsBackTheDecisionsAfterItWithoutResending) {
  SeedAMoveThatMakesRoom();
  const std::string& devices = kDevices;
  const model::Snapshot snapshot = Read();
  const std::vector<model::Decision> plan = model::Model(snapshot).PlanPass();
  ASSERT_EQ(plan.size(), 2u);
  ASSERT_EQ(plan[0].deviceName, "d1");
  ASSERT_EQ(plan[0].action, model::Action::kMove);
  ASSERT_EQ(plan[1].deviceName, "d3");
  ASSERT_EQ(plan[1].node, "n1");  // the unit d1's move frees
  RefuseStatusWrites("d1", 403);
  kube::FakeTimeSource time;
  Binder binder(*client_, leading_, "", &time);

  server_->ClearRequests();
  BinderResult pass = binder.Pass(snapshot, false, true, std::chrono::system_clock::now());
  EXPECT_EQ(pass.failures, 1);
  EXPECT_EQ(pass.writes, 0);
  EXPECT_TRUE(pass.stoppedAtHeldOff);
  EXPECT_FALSE(pass.incomplete);  // not a reason to run again in 50 ms
  ASSERT_TRUE(pass.retryAt);
  EXPECT_EQ(Patches().size(), 1u);

  server_->ClearRequests();
  pass = binder.Pass(snapshot, false, true, std::chrono::system_clock::now());
  EXPECT_TRUE(pass.stoppedAtHeldOff);
  EXPECT_EQ(pass.heldOff, 1);
  EXPECT_TRUE(Patches().empty());  // neither the move nor the bind behind it
  EXPECT_EQ(Bound(), 1);           // d1, still on n1

  server_->ClearFaults();
  time.Advance(std::chrono::seconds(1));
  pass = binder.Pass(snapshot, false, true, std::chrono::system_clock::now());
  EXPECT_EQ(pass.writes, 2);
  EXPECT_FALSE(pass.stoppedAtHeldOff);
  EXPECT_EQ(client_->Get(devices + "d1")["status"]["nodeName"], "n2");
  EXPECT_EQ(client_->Get(devices + "d3")["status"]["nodeName"], "n1");
}

// An error of the server's (5xx, 429, a dropped connection) is no device's fault: the pass
// stops there and runs again soon, and no device is held off for it.
TEST_F(BinderTest, AServerErrorStopsThePassWithoutHoldingTheDeviceOff) {
  fake::Fault down = fake::Fault::Answer(500, 4, "PATCH");
  down.pathPrefix = "/apis/gpu.cozystack.io/v1alpha1/namespaces/t1/gpudevices/";
  server_->AddFault(down);
  kube::FakeTimeSource time;
  Binder binder(*client_, leading_, "", &time);
  BinderResult pass = binder.Pass(Read(), false, true, std::chrono::system_clock::now());
  EXPECT_EQ(pass.failures, 1);
  EXPECT_TRUE(pass.incomplete);
  EXPECT_EQ(pass.backingOff, 0u);
  EXPECT_FALSE(pass.retryAt);
  server_->ClearFaults();
  pass = binder.Pass(Read(), false, true, std::chrono::system_clock::now());
  EXPECT_EQ(pass.writes, 1);
}

TEST_F(BinderTest, TakesBindsSaysWhyANodeDoesNotAndIsWrittenOnlyWhenItChanges) {
  auto node = [](const std::string& name, const std::string& ready, json spec) {
    return json{{"apiVersion", "v1"},
                {"kind", "Node"},
                {"metadata", {{"name", name}}},
                {"spec", spec},
                {"status", {{"conditions", {{{"type", "Ready"}, {"status", ready}}}}}}};
  };
  server_->Seed(node("cordoned", "True", {{"unschedulable", true}}));
  server_->Seed(node("down", "False", json::object()));
  server_->Seed(node("tainted", "True",
                     {{"taints", {{{"key", "gpu-maintenance"}, {"effect", "NoSchedule"}}}}}));
  for (const std::string name : {"cordoned", "down", "tainted", "no-node"}) {
    server_->Seed(testing::GpuNodeObject(name, 1));
  }
  auto condition = [&](const std::string& name) {
    const json object = client_->Get("/apis/gpu.cozystack.io/v1alpha1/gpunodes/" + name);
    for (const json& c : object["status"].value("conditions", json::array())) {
      if (c["type"] == "TakesBinds") return c;
    }
    return json();
  };
  Binder binder(*client_, leading_);
  const auto now = std::chrono::system_clock::now();
  EXPECT_EQ(binder.WriteNodeConditions(Read(), now), 5);
  EXPECT_EQ(condition("n1")["status"], "True");
  EXPECT_EQ(condition("n1")["reason"], "Eligible");
  const std::map<std::string, std::string> reasons = {{"cordoned", "Cordoned"},
                                                      {"down", "NotReady"},
                                                      {"tainted", "Tainted"},
                                                      {"no-node", "NodeMissing"}};
  for (const auto& [name, reason] : reasons) {
    const json c = condition(name);
    EXPECT_EQ(c["status"], "False") << name;
    EXPECT_EQ(c["reason"], reason) << name;
    EXPECT_FALSE(c.value("message", "").empty()) << name;
  }
  EXPECT_NE(condition("tainted")["message"].get<std::string>().find("gpu-maintenance"),
            std::string::npos)
      << condition("tainted");
  // Unchanged: nothing written. The cordon lifted: only that node, its transition time moved.
  EXPECT_EQ(binder.WriteNodeConditions(Read(), now + std::chrono::seconds(5)), 0);
  const json before = condition("cordoned");
  client_->MergePatch("/api/v1/nodes/cordoned", {{"spec", {{"unschedulable", false}}}});
  EXPECT_EQ(binder.WriteNodeConditions(Read(), now + std::chrono::seconds(10)), 1);
  const json after = condition("cordoned");
  EXPECT_EQ(after["status"], "True");
  EXPECT_NE(after["lastTransitionTime"], before["lastTransitionTime"]);
  // C7: a class that tolerates the taint takes binds there, so the node does, and
  // says for which class.
  json pool = testing::GpuClassObject("pool");
  pool["spec"]["tolerations"] = {{{"key", "gpu-maintenance"}, {"operator", "Exists"}}};
  server_->Seed(pool);
  EXPECT_EQ(binder.WriteNodeConditions(Read(), now + std::chrono::seconds(15)), 1);
  EXPECT_EQ(condition("tainted")["status"], "True") << condition("tainted");
  EXPECT_NE(condition("tainted")["message"].get<std::string>().find("class pool"),
            std::string::npos)
      << condition("tainted");
  EXPECT_EQ(condition("down")["reason"], "NotReady") << "a toleration does not make it Ready";
}

// Why an order waits (docs/controller.md): an order the pass cannot place stays Pending and says
// why in its status, as condition Bound False with the model's reason; the same reason is not
// written again however often the passes run (d2 was told before the test); placed, the condition
// turns True with a new transition time.
TEST_F(BinderTest, APendingOrderSaysWhyInItsStatusOnceAndBoundOnceItIsPlaced) {
  auto bound = [&](const std::string& name) {
    const json object = client_->Get(kDevices + name);
    for (const json& c :
         object.value("status", json::object()).value("conditions", json::array())) {
      if (c["type"] == "Bound") return c;
    }
    return json();
  };
  server_->Seed(Device("d3", "a100"));
  Binder binder(*client_, leading_);
  const auto now = std::chrono::system_clock::now();
  BinderResult pass = binder.Pass(Read(), false, true, now);
  EXPECT_EQ(pass.writes, 2) << "d1 bound to n1's one unit; d3 refused and told why; d2 told before";
  EXPECT_EQ(bound("d1")["status"], "True") << bound("d1");
  EXPECT_EQ(bound("d1")["reason"], "Bound");
  EXPECT_EQ(bound("d1")["message"], "bound to node n1");
  const json refused = bound("d3");
  EXPECT_EQ(refused["status"], "False") << refused;
  EXPECT_EQ(refused["reason"], "Refused");
  EXPECT_EQ(refused["message"], kNoRoom);
  EXPECT_FALSE(refused.value("lastTransitionTime", "").empty()) << refused;
  EXPECT_EQ(client_->Get(kDevices + "d3")["status"].value("phase", "Pending"), "Pending");

  server_->ClearRequests();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(binder.Pass(Read(), false, true, now).writes, 0);
  EXPECT_TRUE(Patches().empty()) << "an unchanged reason is written once";

  client_->Delete(kDevices + "d1");
  pass = binder.Pass(Read(), false, true, now + std::chrono::seconds(5));
  EXPECT_EQ(pass.writes, 1) << "d2 bound, the oldest; d3's reason stands";
  const json placed = bound("d2");
  EXPECT_EQ(placed["status"], "True") << placed;
  EXPECT_EQ(placed["reason"], "Bound");
  EXPECT_NE(placed["lastTransitionTime"], "2026-01-01T00:00:00Z");
  EXPECT_EQ(bound("d3"), refused);
}

// C17: a class whose resource name no entry of KubeVirt's permittedHostDevices names
// gets a Warning Event, once per repeat window; a permitted one (a PCI or a mediated entry)
// none. Without a table (KubeVirt not read) nothing is checked.
TEST_F(BinderTest, C17_AClassKubeVirtDoesNotPermitGetsAWarningEvent) {
  server_->Seed(testing::GpuClassObject("mdev-ok", "nvidia.com/Y"));
  server_->Seed(testing::GpuClassObject("orphan", "nvidia.com/GH100"));
  auto events = [&] {
    return client_->List("/apis/events.k8s.io/v1/namespaces/default/events")["items"];
  };
  Binder binder(*client_, leading_);
  const auto now = std::chrono::system_clock::now();
  model::Snapshot snapshot = Read();
  BinderResult none;
  binder.ReportUnpermittedClasses(snapshot, now, none);  // no table: KubeVirt not read
  EXPECT_EQ(none.events, 0);
  EXPECT_TRUE(events().empty());

  snapshot.permittedHostDevices.pciHostDevices = {{"10de:20b5", "nvidia.com/GA100"}};
  snapshot.permittedHostDevices.mediatedDevices = {{"GRID A100-40C", "nvidia.com/Y"}};
  BinderResult first;
  binder.ReportUnpermittedClasses(snapshot, now, first);
  EXPECT_EQ(first.events, 1);
  ASSERT_TRUE(binder.WaitForEvents(std::chrono::seconds(10)));
  EXPECT_EQ(binder.EventsWritten(), 1);
  const json written = events();
  ASSERT_EQ(written.size(), 1u) << written.dump(2);
  const json& event = written[0];
  EXPECT_EQ(event["reason"], "ResourceNameNotPermitted");
  EXPECT_EQ(event["type"], "Warning");
  EXPECT_EQ(event["regarding"]["kind"], "GPUClass");
  EXPECT_EQ(event["regarding"]["name"], "orphan");
  EXPECT_NE(event["note"].get<std::string>().find("nvidia.com/GH100"), std::string::npos)
      << event.dump(2);
  // Again within the repeat window: held back.
  BinderResult again;
  binder.ReportUnpermittedClasses(snapshot, now + std::chrono::minutes(1), again);
  EXPECT_EQ(again.events, 0);
  EXPECT_EQ(again.eventsSuppressed, 1);
  ASSERT_TRUE(binder.WaitForEvents(std::chrono::seconds(10)));
  EXPECT_EQ(events().size(), 1u);
}

TEST_F(BinderTest, NothingIsWrittenAfterSteppingDown) {
  leading_.Set(false);
  Binder binder(*client_, leading_);
  BinderResult result = binder.Pass(Read(), false, true, std::chrono::system_clock::now());
  EXPECT_EQ(result.writes, 0);
  EXPECT_EQ(Bound(), 0);
  EXPECT_TRUE(testing::Writes(*server_).empty());
}

// docs/security.md, "Hardening done": leadership is read again before every attempt of a placement
// write, retries included, not once before the write: a replica that stops leading while the server
// has it wait (Retry-After) sends nothing more.
TEST_F(BinderTest, LeadershipIsReadAgainBeforeEachRetryOfAPlacementWrite) {
  fake::Fault busy = fake::Fault::Answer(503, -1, "PATCH", 1);
  busy.pathPrefix = "/apis/gpu.cozystack.io/v1alpha1/namespaces/t1/gpudevices/";
  server_->AddFault(busy);
  const model::Snapshot snapshot = Read();
  server_->ClearRequests();
  Binder binder(*client_, leading_);
  std::thread stepDown([this] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    leading_.Set(false);  // while the first attempt's Retry-After runs
  });
  const BinderResult result = binder.Pass(snapshot, false, true, std::chrono::system_clock::now());
  stepDown.join();
  EXPECT_EQ(result.writes, 0);
  EXPECT_EQ(result.failures, 1);
  EXPECT_TRUE(result.incomplete);
  EXPECT_EQ(Patches().size(), 1u);  // the first attempt, never a retry
  EXPECT_EQ(Bound(), 0);
}

// docs/security.md, "Hardening done": with the lease's instant (LeaderElector::LeadingUntil), no
// attempt of a placement write starts or runs past it, however often the server asks to be tried
// again; the pass stops there and the TakesBinds conditions are not written either.
TEST_F(BinderTest, NoPlacementWriteIsAttemptedPastTheInstantTheLeaseLeadsUntil) {
  fake::Fault busy = fake::Fault::Answer(429, -1, "PATCH", 1);
  busy.pathPrefix = "/apis/gpu.cozystack.io/v1alpha1/";
  server_->AddFault(busy);
  const model::Snapshot snapshot = Read();
  server_->ClearRequests();
  const kube::TimePoint until = kube::Clock::now() + std::chrono::milliseconds(1500);
  kube::Leadership leadingUntil{true, [until] { return std::optional<kube::TimePoint>(until); }};
  Binder binder(*client_, leadingUntil);
  const BinderResult result = binder.Pass(snapshot, false, true, std::chrono::system_clock::now());
  EXPECT_LE(kube::Clock::now(), until + std::chrono::milliseconds(50));
  EXPECT_EQ(result.writes, 0);
  EXPECT_EQ(result.failures, 1);
  EXPECT_TRUE(result.incomplete);
  // At 0 s and 1 s; the retry at 2 s would be past the instant and is not made.
  const auto attempts = Patches();
  EXPECT_EQ(attempts.size(), 2u);
  for (const auto& attempt : attempts) EXPECT_LT(attempt.received, until) << attempt.path;
  // Past the instant: nothing is sent at all.
  std::this_thread::sleep_for(until - kube::Clock::now());
  server_->ClearRequests();
  EXPECT_EQ(binder.WriteNodeConditions(snapshot, std::chrono::system_clock::now()), 0);
  EXPECT_TRUE(testing::Writes(*server_).empty());

  // An attempt the server holds longer than the time left ends at the instant.
  server_->ClearFaults();
  fake::Fault slow;
  slow.method = "PATCH";
  slow.pathPrefix = "/apis/gpu.cozystack.io/v1alpha1/namespaces/t1/gpudevices/";
  slow.latencyMs = 3000;
  server_->AddFault(slow);
  const kube::TimePoint soon = kube::Clock::now() + std::chrono::milliseconds(500);
  kube::Leadership leadingUntilSoon{true, [soon] { return std::optional<kube::TimePoint>(soon); }};
  Binder bounded(*client_, leadingUntilSoon);
  const BinderResult cut = bounded.Pass(snapshot, false, true, std::chrono::system_clock::now());
  EXPECT_LT(kube::Clock::now(), soon + std::chrono::milliseconds(300));
  EXPECT_EQ(cut.writes, 0);
  EXPECT_TRUE(cut.incomplete);
}

}  // namespace
}  // namespace cozy::controller
