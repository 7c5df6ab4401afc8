#include "controller/binder/catalog.h"

#include <algorithm>
#include <functional>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "api/quantity.h"
#include "api/time.h"

namespace cozy::controller {

std::string_view NotTakingBindsReason(std::string_view reason) {
  // The texts of model::CheckNodeEligibility, and NodesToJson's for a GPUNode without a Node.
  if (reason == "cordoned") return kNotTakingBindsReasons[0];
  if (reason == "not Ready") return kNotTakingBindsReasons[1];
  if (reason.starts_with("taint ")) return kNotTakingBindsReasons[2];
  if (reason.starts_with("no Node named ")) return kNotTakingBindsReasons[3];
  return kNotTakingBindsReasons[4];
}

namespace {

// Whether a timestamp is in the form the API server writes creationTimestamp in
// ("2026-12-01T10:00:00Z"), whose text sorts as its time does.
bool Canonical(std::string_view text) {
  return text.size() == 20 && text[4] == '-' && text[10] == 'T' && text[19] == 'Z';
}

// A class while the devices are counted: its figures, and the earliest canonical
// creationTimestamp of its Pending devices, compared as text (parsing each one cost more than
// the rest of the walk); any other form is parsed.
struct Counting {
  CatalogClass* figures = nullptr;
  std::string_view oldest;
};

void TakePending(const api::GpuDevice& device, Counting& counting) {
  ++counting.figures->ordersPending;
  const std::string& created = device.metadata.creationTimestamp;
  if (Canonical(created)) {
    if (counting.oldest.empty() || std::string_view(created) < counting.oldest) {
      counting.oldest = created;
    }
    return;
  }
  const auto time = api::ParseTime(created);
  std::optional<std::chrono::system_clock::time_point>& oldest = counting.figures->oldestPending;
  if (time && (!oldest || *time < *oldest)) oldest = time;
}

struct NamespaceClass {
  std::string_view ns;
  std::string_view className;
  bool operator==(const NamespaceClass&) const = default;
};
struct NamespaceClassHash {
  size_t operator()(const NamespaceClass& key) const {
    return std::hash<std::string_view>()(key.ns) * 31 +
           std::hash<std::string_view>()(key.className);
  }
};

// The devices' part: Pending orders by class, Bound ones by node and by namespace and class.
// Counted in hash tables keyed by the devices' own strings (a pass walks tens of thousands of
// devices), then moved into the figures' ordered maps once per name.
void CountOrders(const model::Snapshot& snapshot, CatalogFigures& figures) {
  std::unordered_map<std::string_view, CatalogNode*> nodes;
  nodes.reserve(figures.nodes.size());
  for (auto& [name, node] : figures.nodes) nodes.emplace(name, &node);
  std::unordered_map<std::string_view, Counting> classes;
  for (auto& [name, c] : figures.classes) classes.emplace(name, Counting{&c, {}});
  std::unordered_map<NamespaceClass, int64_t, NamespaceClassHash> held;
  for (const api::GpuDevice& device : snapshot.devices) {
    const api::DevicePhase phase = device.Phase();
    if (phase == api::DevicePhase::kPending) {
      const auto found = classes.find(device.spec.className);
      if (found != classes.end()) TakePending(device, found->second);  // else no series
    } else if (phase == api::DevicePhase::kBound) {
      int64_t& units = held[{device.metadata.namespaceName, device.spec.className}];
      units = api::AddUnits(units, std::max<int64_t>(0, device.spec.count));
      if (device.status.nodeName) {
        const auto node = nodes.find(*device.status.nodeName);
        if (node != nodes.end()) ++node->second->ordersBound;
      }
    }
  }
  for (const auto& [name, counting] : classes) {
    if (counting.oldest.empty()) continue;
    const auto time = api::ParseTime(std::string(counting.oldest));
    std::optional<std::chrono::system_clock::time_point>& oldest = counting.figures->oldestPending;
    if (time && (!oldest || *time < *oldest)) oldest = time;
  }
  for (const auto& [key, units] : held) {
    figures.tenantHeld[std::string(key.ns)][std::string(key.className)] = units;
  }
}

}  // namespace

CatalogFigures CatalogOf(const model::Snapshot& snapshot, const model::ClusterView& view) {
  CatalogFigures figures;
  for (const model::ClassView& c : view.classes) {
    CatalogClass& figuresOf = figures.classes[c.name];
    figuresOf.units = c.units;
    figuresOf.held = c.used;
    figuresOf.free = c.free;
  }
  // As `kubectl gpu nodes` lists them (NodesToJson): every GPUNode, with its node's view, or
  // no Node of its name.
  std::unordered_map<std::string_view, const model::NodeView*> views;
  views.reserve(view.nodes.size());
  for (const model::NodeView& node : view.nodes) views.emplace(node.name, &node);
  for (const api::GpuNodeInventory& gpuNode : snapshot.gpuNodes) {
    CatalogNode& node = figures.nodes[gpuNode.nodeName];
    const auto found = views.find(gpuNode.nodeName);
    if (found == views.end()) {
      node.takesBinds = false;
      node.notTaking = {NotTakingBindsReason("no Node named " + gpuNode.nodeName)};
      continue;
    }
    node.takesBinds = found->second->eligible;
    node.notTaking.clear();
    if (!node.takesBinds) {
      for (const std::string& reason : found->second->reasons) {
        node.notTaking.insert(NotTakingBindsReason(reason));
      }
    }
  }
  CountOrders(snapshot, figures);
  return figures;
}

std::vector<TenantSeries> CapTenants(
    const std::map<std::string, std::map<std::string, int64_t>>& held, size_t limit) {
  std::vector<TenantSeries> series;
  if (limit == 0) return series;
  std::vector<std::pair<int64_t, const std::string*>> ranked;  // units over all classes
  ranked.reserve(held.size());
  for (const auto& [ns, byClass] : held) {
    int64_t total = 0;
    for (const auto& [className, units] : byClass) total = api::AddUnits(total, units);
    ranked.emplace_back(total, &ns);
  }
  // The most units first; on a tie the first by name (`held` is by name, the sort stable).
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::map<std::string, int64_t> other;
  for (size_t i = 0; i < ranked.size(); ++i) {
    const std::string& ns = *ranked[i].second;
    for (const auto& [className, units] : held.at(ns)) {
      if (i < limit) {
        series.push_back({ns, className, units});
      } else {
        int64_t& sum = other[className];
        sum = api::AddUnits(sum, units);
      }
    }
  }
  std::sort(series.begin(), series.end(), [](const TenantSeries& a, const TenantSeries& b) {
    return std::tie(a.namespaceName, a.className) < std::tie(b.namespaceName, b.className);
  });
  for (const auto& [className, units] : other) {
    series.push_back({std::string(kOtherTenants), className, units});
  }
  return series;
}

double OldestPendingSeconds(const CatalogClass& figures,
                            std::chrono::system_clock::time_point now) {
  if (!figures.oldestPending || *figures.oldestPending > now) return 0;
  return std::chrono::duration<double>(now - *figures.oldestPending).count();
}

namespace {

struct ClassGauge {
  const char* name;
  const char* help;
  double (*value)(const CatalogClass&);
};

// The gauges by class that are one figure of CatalogClass each.
const std::vector<ClassGauge>& ClassGauges() {
  static const std::vector<ClassGauge> gauges = {
      {"gpu_catalog_class_units",
       "Units the nodes a GPUClass selects serve (kubectl gpu catalog UNITS).",
       [](const CatalogClass& c) { return static_cast<double>(c.units); }},
      {"gpu_catalog_class_units_held",
       "Of those, units held by Bound GPUDevices and by pods no device covers (kubectl gpu "
       "catalog USED).",
       [](const CatalogClass& c) { return static_cast<double>(c.held); }},
      {"gpu_catalog_class_units_free",
       "Units of the class free on nodes that take its binds now (kubectl gpu catalog FREE).",
       [](const CatalogClass& c) { return static_cast<double>(c.free); }},
      {"gpu_catalog_class_orders_pending", "GPUDevices of the class in phase Pending.",
       [](const CatalogClass& c) { return static_cast<double>(c.ordersPending); }},
  };
  return gauges;
}

void WriteClasses(runtime::MetricsScrape& out, const CatalogFigures& figures,
                  std::chrono::system_clock::time_point now) {
  for (const ClassGauge& gauge : ClassGauges()) {
    out.Show(gauge.name);
    for (const auto& [name, c] : figures.classes) {
      out.Set(gauge.name, {name}, gauge.value(c));
    }
  }
  out.Show("gpu_catalog_class_oldest_pending_seconds");
  for (const auto& [name, c] : figures.classes) {
    out.Set("gpu_catalog_class_oldest_pending_seconds", {name}, OldestPendingSeconds(c, now));
  }
}

void WriteNodes(runtime::MetricsScrape& out, const CatalogFigures& figures) {
  out.Show("gpu_catalog_node_takes_binds");
  for (const auto& [name, node] : figures.nodes) {
    out.Set("gpu_catalog_node_takes_binds", {name}, node.takesBinds ? 1 : 0);
  }
  out.Show("gpu_catalog_node_not_taking_binds");
  for (const auto& [name, node] : figures.nodes) {
    for (const std::string_view reason : node.notTaking) {
      out.Set("gpu_catalog_node_not_taking_binds", {name, std::string(reason)}, 1);
    }
  }
  out.Show("gpu_catalog_node_orders_bound");
  for (const auto& [name, node] : figures.nodes) {
    out.Set("gpu_catalog_node_orders_bound", {name}, static_cast<double>(node.ordersBound));
  }
}

}  // namespace

void DeclareCatalogMetrics(runtime::MetricsRegistry& registry) {
  for (const ClassGauge& gauge : ClassGauges()) registry.Gauge(gauge.name, gauge.help, {"class"});
  registry.Gauge("gpu_catalog_class_oldest_pending_seconds",
                 "How long the class's oldest Pending GPUDevice has waited since its "
                 "creationTimestamp; 0 when none is Pending.",
                 {"class"});
  registry.Gauge(
      "gpu_catalog_node_takes_binds",
      "1 when the node of a GPUNode takes binds, for at least one class (kubectl gpu nodes "
      "TAKES BINDS); 0 when not.",
      {"node"});
  registry.Gauge("gpu_catalog_node_not_taking_binds",
                 "1 for each reason a node takes no binds: cordoned, not_ready, tainted, no_node "
                 "(a GPUNode without a Node) or other.",
                 {"node", "reason"});
  registry.Gauge("gpu_catalog_node_orders_bound", "GPUDevices Bound on the node.", {"node"});
  registry.Gauge("gpu_catalog_tenant_units_held",
                 "Units held by the Bound GPUDevices of a namespace, by class; past the "
                 "--catalog-tenant-series namespaces holding the most, the rest summed under "
                 "namespace \"_other\".",
                 {"namespace", "class"});
}

void WriteCatalogMetrics(runtime::MetricsScrape& out, const CatalogFigures& figures,
                         size_t tenantSeries, std::chrono::system_clock::time_point now) {
  WriteClasses(out, figures, now);
  WriteNodes(out, figures);
  if (tenantSeries == 0) return;  // --catalog-tenant-series 0: no per-tenant family
  out.Show("gpu_catalog_tenant_units_held");
  for (const TenantSeries& series : CapTenants(figures.tenantHeld, tenantSeries)) {
    out.Set("gpu_catalog_tenant_units_held", {series.namespaceName, series.className},
            static_cast<double>(series.units));
  }
}

}  // namespace cozy::controller
