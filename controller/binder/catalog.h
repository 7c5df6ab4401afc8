// The GPU catalog as the leader exports it on /metrics (docs/controller.md, "Catalog metrics"):
// the figures `kubectl gpu catalog` and `kubectl gpu nodes` print, and the orders behind them,
// taken from the model a full binder pass has built anyway (no second model, no model per
// scrape). The pass computes the figures (CatalogOf, on the binder's worker); the loop thread
// keeps the last pass's and writes them while the replica leads (WriteCatalogMetrics), so a
// follower exports none of the gpu_catalog_* families and a sum across replicas counts the
// catalog once.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "controller/model/model.h"
#include "controller/model/snapshot.h"
#include "runtime/metrics.h"

namespace cozy::controller {

// The fixed values of gpu_catalog_node_not_taking_binds's `reason` label, one for each kind of
// reason the model gives for a node that takes no binds (model::CheckNodeEligibility, and the
// GPUNode without a Node that `kubectl gpu nodes` reports): spec.unschedulable; the Ready
// condition not True; a NoSchedule or NoExecute taint no class tolerates; no Node of the
// GPUNode's name; and any reason not among those (none today: a new reason of the model shows
// as `other` until it is given a label of its own).
inline constexpr std::array<std::string_view, 5> kNotTakingBindsReasons = {
    "cordoned", "not_ready", "tainted", "no_node", "other"};

// One of the model's reasons for people ("cordoned", "not Ready", "taint k=v:NoSchedule not
// tolerated", "no Node named n1") as its label above.
std::string_view NotTakingBindsReason(std::string_view reason);

struct CatalogClass {
  int64_t units = 0;          // model::ClassView::units: `kubectl gpu catalog` UNITS
  int64_t held = 0;           // ::used: USED
  int64_t free = 0;           // ::free: FREE
  int64_t ordersPending = 0;  // GPUDevices of the class in phase Pending
  // The earliest creationTimestamp of those (those without a readable one left out).
  std::optional<std::chrono::system_clock::time_point> oldestPending;
};

struct CatalogNode {
  bool takesBinds = false;               // `kubectl gpu nodes` TAKES BINDS
  std::set<std::string_view> notTaking;  // kNotTakingBindsReasons, when it takes none
  int64_t ordersBound = 0;               // GPUDevices Bound with status.nodeName this node
};

struct CatalogFigures {
  std::map<std::string, CatalogClass> classes;  // every GPUClass, by name
  std::map<std::string, CatalogNode> nodes;     // every GPUNode (its node's name)
  // Units (spec.count) of the Bound GPUDevices, by namespace, then by spec.className.
  std::map<std::string, std::map<std::string, int64_t>> tenantHeld;
};

// The figures of one snapshot, from the classes and nodes of its model's view
// (model::Model::CapacityView) and one walk over its devices.
CatalogFigures CatalogOf(const model::Snapshot& snapshot, const model::ClusterView& view);

// gpu_catalog_tenant_units_held's series under a cap of `limit` namespaces (the flag
// --catalog-tenant-series): the `limit` namespaces holding the most units over all classes
// (the first by name on a tie) keep their own series; the rest are summed by class under the
// namespace kOtherTenants. Limit 0: no series at all.
inline constexpr std::string_view kOtherTenants = "_other";
struct TenantSeries {
  std::string namespaceName;
  std::string className;
  int64_t units = 0;
  bool operator==(const TenantSeries&) const = default;
};
std::vector<TenantSeries> CapTenants(
    const std::map<std::string, std::map<std::string, int64_t>>& held, size_t limit);

// How long the class's oldest Pending order has waited at `now`, in seconds: 0 when it has
// none (or one stamped after `now`).
double OldestPendingSeconds(const CatalogClass& figures, std::chrono::system_clock::time_point now);

// The gpu_catalog_* families, declared once; Write fills them from `figures`, the per-tenant
// series capped at `tenantSeries` (none, not even the family's HELP, at 0).
void DeclareCatalogMetrics(runtime::MetricsRegistry& registry);
void WriteCatalogMetrics(runtime::MetricsScrape& out, const CatalogFigures& figures,
                         size_t tenantSeries, std::chrono::system_clock::time_point now);

}  // namespace cozy::controller
