// The catalog metrics' own rules (docs/controller.md, "Catalog metrics"): the model's reasons
// for a node that takes no binds as the fixed label set, the per-tenant series capped with the
// rest summed under "_other", the oldest Pending order's age, and the figures of one snapshot.
// That the figures are what `kubectl gpu` prints for the same cluster is controller_e2e_test's
// (ControllerEndToEnd.TheLeadersCatalogMetricsAreWhatKubectlGpuPrints).
#include "controller/binder/catalog.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "api/time.h"
#include "controller/model/readers.h"
#include "test/support/snapshot_fixture.h"

namespace cozy::controller {
namespace {

using namespace std::chrono_literals;
using model::testing::Bound;
using model::testing::kA100;
using model::testing::MakeDevice;
using model::testing::MakeGpuNode;
using model::testing::MakeNode;
using model::testing::Pending;

std::set<std::string_view> Labels(const std::vector<std::string>& reasons) {
  std::set<std::string_view> labels;
  for (const std::string& reason : reasons) labels.insert(NotTakingBindsReason(reason));
  return labels;
}

// Each reason the model gives maps to its own label: the texts are the model's own, so a
// reason it rewords shows here as "other".
TEST(CatalogMetrics, EachReasonOfTheModelHasItsFixedLabel) {
  model::Node cordoned = MakeNode("n1");
  cordoned.unschedulable = true;
  EXPECT_EQ(Labels(model::CheckNodeEligibility(cordoned, {}).reasons),
            (std::set<std::string_view>{"cordoned"}));
  model::Node notReady = MakeNode("n2");
  notReady.ready = false;
  EXPECT_EQ(Labels(model::CheckNodeEligibility(notReady, {}).reasons),
            (std::set<std::string_view>{"not_ready"}));
  model::Node tainted = MakeNode("n3");
  tainted.taints = {{"gpu", "reserved", "NoSchedule"}, {"maintenance", "", "NoExecute"}};
  EXPECT_EQ(Labels(model::CheckNodeEligibility(tainted, {}).reasons),
            (std::set<std::string_view>{"tainted"}));
  model::Node all = tainted;
  all.unschedulable = true;
  all.ready = false;
  EXPECT_EQ(Labels(model::CheckNodeEligibility(all, {}).reasons),
            (std::set<std::string_view>{"cordoned", "not_ready", "tainted"}));
  EXPECT_EQ(NotTakingBindsReason("no Node named gpu-9"), "no_node");
  EXPECT_EQ(NotTakingBindsReason("a reason the model does not give today"), "other");
  // The set is fixed and snake_case: what a dashboard or an alert may name.
  for (const std::string_view label : kNotTakingBindsReasons) {
    EXPECT_TRUE(std::all_of(label.begin(), label.end(), [](char c) {
      return std::islower(c) != 0 || c == '_';
    })) << label;
  }
}

TEST(CatalogMetrics, TenantsPastTheCapAreSummedUnderOther) {
  const std::map<std::string, std::map<std::string, int64_t>> held = {
      {"a", {{"a100", 3}}},
      {"b", {{"a100", 1}, {"t4", 2}}},
      {"c", {{"a100", 3}}},
      {"d", {{"t4", 1}}},
      {"e", {{"t4", 5}}}};
  // e holds 5; a, b and c 3 each (a and b first by name); c and d are summed.
  EXPECT_EQ(CapTenants(held, 3), (std::vector<TenantSeries>{{"a", "a100", 3},
                                                            {"b", "a100", 1},
                                                            {"b", "t4", 2},
                                                            {"e", "t4", 5},
                                                            {"_other", "a100", 3},
                                                            {"_other", "t4", 1}}));
  // Room for every namespace: no "_other".
  const auto all = CapTenants(held, 5);
  EXPECT_EQ(all.size(), 6u);
  EXPECT_TRUE(std::none_of(all.begin(), all.end(),
                           [](const TenantSeries& s) { return s.namespaceName == "_other"; }));
  // One: everything but e is summed.
  EXPECT_EQ(CapTenants(held, 1), (std::vector<TenantSeries>{
                                     {"e", "t4", 5}, {"_other", "a100", 7}, {"_other", "t4", 3}}));
  EXPECT_TRUE(CapTenants(held, 0).empty());
}

TEST(CatalogMetrics, OldestPendingAgeIsFromTheEarliestCreationTimestamp) {
  const auto now = std::chrono::system_clock::now();
  CatalogClass none;
  EXPECT_EQ(OldestPendingSeconds(none, now), 0);
  CatalogClass waiting;
  waiting.oldestPending = now - 90s;
  EXPECT_DOUBLE_EQ(OldestPendingSeconds(waiting, now), 90);
  CatalogClass future;  // a clock ahead of ours: not a negative age
  future.oldestPending = now + 5s;
  EXPECT_EQ(OldestPendingSeconds(future, now), 0);
}

// n1 takes binds; n2 is cordoned, n3 tainted; the GPUNode ghost has no Node.
// Pending orders of a100 created 120 s and 30 s before `now` (as the API server writes the time)
// and `offsetAge` before it (with an offset, not "Z").
model::Snapshot FourNodes(std::chrono::system_clock::time_point now,
                          std::chrono::seconds offsetAge = 200s) {
  model::Snapshot snapshot = testing::BaseSnapshot();
  testing::AddNode(snapshot, "n1", 2);
  testing::AddNode(snapshot, "n2", 2);
  snapshot.nodes.MutableAt(1).unschedulable = true;
  testing::AddNode(snapshot, "n3", 1);
  snapshot.nodes.MutableAt(2).taints = {{"gpu", "reserved", "NoSchedule"}};
  snapshot.gpuNodes.push_back(MakeGpuNode("ghost", kA100, 2));
  snapshot.devices = {Bound("tenant-a", "b1", "a100", 1, "n1"),
                      Bound("tenant-b", "b2", "a100", 1, "n2"),
                      Pending("tenant-a", "p1", "a100", 1),
                      Pending("tenant-a", "p2", "a100", 2),
                      Pending("tenant-a", "p3", "no-such-class", 1),
                      MakeDevice("tenant-b", "l1", "a100", 1, api::DevicePhase::kLost)};
  snapshot.devices.MutableAt(2).metadata.creationTimestamp = api::FormatTime(now - 120s);
  snapshot.devices.MutableAt(3).metadata.creationTimestamp = api::FormatTime(now - 30s);
  // The oldest, in a form other than the API server's own (an offset, not "Z").
  std::string offset = api::FormatTime(now - offsetAge);
  offset.replace(offset.size() - 1, 1, "+00:00");
  snapshot.devices.push_back(Pending("tenant-b", "p4", "a100", 1));
  snapshot.devices.MutableAt(6).metadata.creationTimestamp = offset;
  return snapshot;
}

TEST(CatalogMetrics, FiguresOfOneSnapshot) {
  const auto now = std::chrono::system_clock::now();
  const model::Snapshot snapshot = FourNodes(now);
  const model::Model model(snapshot);
  const CatalogFigures figures = CatalogOf(snapshot, model.CapacityView());
  ASSERT_EQ(figures.classes.size(), 1u);
  const CatalogClass& a100 = figures.classes.at("a100");
  EXPECT_EQ(a100.units, 5);  // n1, n2, n3: the GPUNode without a Node serves nothing
  EXPECT_EQ(a100.held, 2);
  EXPECT_EQ(a100.free, 1);           // n1's one left: n2 and n3 take no binds
  EXPECT_EQ(a100.ordersPending, 3);  // an order of a class that does not exist is left out
  EXPECT_NEAR(OldestPendingSeconds(a100, now), 200, 1);
  ASSERT_EQ(figures.nodes.size(), 4u);
  EXPECT_TRUE(figures.nodes.at("n1").takesBinds);
  EXPECT_TRUE(figures.nodes.at("n1").notTaking.empty());
  EXPECT_EQ(figures.nodes.at("n2").notTaking, (std::set<std::string_view>{"cordoned"}));
  EXPECT_EQ(figures.nodes.at("n3").notTaking, (std::set<std::string_view>{"tainted"}));
  EXPECT_EQ(figures.nodes.at("ghost").notTaking, (std::set<std::string_view>{"no_node"}));
  EXPECT_FALSE(figures.nodes.at("ghost").takesBinds);
  EXPECT_EQ(figures.nodes.at("n1").ordersBound, 1);
  EXPECT_EQ(figures.nodes.at("n2").ordersBound, 1);
  EXPECT_EQ(figures.nodes.at("n3").ordersBound, 0);
  EXPECT_EQ(figures.tenantHeld, (std::map<std::string, std::map<std::string, int64_t>>{
                                    {"tenant-a", {{"a100", 1}}}, {"tenant-b", {{"a100", 1}}}}));
  // The oldest by either form: the 120 s of the API server's form when the other is newer.
  const model::Snapshot newer = FourNodes(now, 60s);
  const model::Model newerModel(newer);
  EXPECT_NEAR(
      OldestPendingSeconds(CatalogOf(newer, newerModel.CapacityView()).classes.at("a100"), now),
      120, 1);
  // The classes' figures are the whole view's (what `kubectl gpu catalog` prints).
  const model::ClusterView view = model.View();
  EXPECT_EQ(view.classes[0].units, a100.units);
  EXPECT_EQ(view.classes[0].used, a100.held);
  EXPECT_EQ(view.classes[0].free, a100.free);
}

TEST(CatalogMetrics, TheFamiliesWritten) {
  const auto now = std::chrono::system_clock::now();
  const model::Snapshot snapshot = FourNodes(now);
  const model::Model model(snapshot);
  const CatalogFigures figures = CatalogOf(snapshot, model.CapacityView());
  // The families as the binder declares them, filled as a scrape fills them.
  const auto render = [&](size_t tenantSeries) {
    runtime::MetricsRegistry registry;
    DeclareCatalogMetrics(registry);
    registry.AddCollector(
        [&](runtime::MetricsScrape& out) { WriteCatalogMetrics(out, figures, tenantSeries, now); });
    return registry.Render();
  };
  const std::string page = render(1);
  for (const char* line : {
           "\ngpu_catalog_class_units{class=\"a100\"} 5\n",
           "\ngpu_catalog_class_units_held{class=\"a100\"} 2\n",
           "\ngpu_catalog_class_units_free{class=\"a100\"} 1\n",
           "\ngpu_catalog_class_orders_pending{class=\"a100\"} 3\n",
           "\ngpu_catalog_node_takes_binds{node=\"n1\"} 1\n",
           "\ngpu_catalog_node_takes_binds{node=\"ghost\"} 0\n",
           "\ngpu_catalog_node_not_taking_binds{node=\"n2\",reason=\"cordoned\"} 1\n",
           "\ngpu_catalog_node_not_taking_binds{node=\"ghost\",reason=\"no_node\"} 1\n",
           "\ngpu_catalog_node_orders_bound{node=\"n1\"} 1\n",
           // One series of its own (tenant-a, first by name of the two holding 1), the rest
           // summed.
           "\ngpu_catalog_tenant_units_held{namespace=\"tenant-a\",class=\"a100\"} 1\n",
           "\ngpu_catalog_tenant_units_held{namespace=\"_other\",class=\"a100\"} 1\n",
       }) {
    EXPECT_NE(page.find(line), std::string::npos) << line << page;
  }
  EXPECT_EQ(page.find("not_taking_binds{node=\"n1\""), std::string::npos) << page;
  EXPECT_NE(page.find("\ngpu_catalog_class_oldest_pending_seconds{class=\"a100\"} 20"),
            std::string::npos)
      << page;  // 200 s and the fraction this test took
  EXPECT_EQ(render(0).find("gpu_catalog_tenant_units_held"), std::string::npos);
}

}  // namespace
}  // namespace cozy::controller
