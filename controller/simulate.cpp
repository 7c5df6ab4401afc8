#include "controller/simulate.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <ostream>
#include <sstream>

#include "controller/snapshot_json.h"
#include "controller/table.h"

namespace cozy::controller {
namespace {

using nlohmann::json;

json OptionalNumber(const std::optional<int64_t>& value) {
  return value ? json(*value) : json(nullptr);
}

json OptionalText(const std::string& text) { return text.empty() ? json(nullptr) : json(text); }

std::string Number(const std::optional<int64_t>& value, const char* none) {
  return value ? std::to_string(*value) : none;
}

}  // namespace

json SimulationToJson(const model::ClusterView& view,
                      const std::vector<model::Decision>& decisions) {
  json classes = json::object();
  for (const model::ClassView& c : view.classes) {
    classes[c.name] = {{"source", c.source},
                       {"maxCount", OptionalNumber(c.maxCount)},
                       {"units", c.units},
                       {"free", c.free}};
  }
  json nodes = json::object();
  for (const model::NodeView& node : view.nodes) {
    json nodeClasses = json::object();
    for (const auto& [name, units] : node.classes) {
      nodeClasses[name] = {{"units", units.units}, {"used", units.used}, {"free", units.free}};
    }
    nodes[node.name] = {{"eligible", node.eligible},
                        {"reasons", node.reasons},
                        {"classes", std::move(nodeClasses)}};
  }
  json tenants = json::object();
  for (const model::TenantView& tenant : view.tenants) {
    json perClass = json::object();
    for (const auto& [name, budget] : tenant.classes) {
      perClass[name] = {{"used", budget.used},
                        {"remaining", OptionalNumber(budget.budget.remaining)},
                        {"limitedBy", OptionalText(budget.budget.limitedBy)},
                        {"key", OptionalText(budget.budget.key)}};
    }
    tenants[tenant.name] = std::move(perClass);
  }
  json decisionList = json::array();
  for (const model::Decision& decision : decisions) {
    decisionList.push_back({{"device", decision.deviceNamespace + "/" + decision.deviceName},
                            {"action", model::ToString(decision.action)},
                            {"node", OptionalText(decision.node)},
                            {"reason", decision.reason}});
  }
  return {{"resourceNames", view.gpuResourceNames},
          {"classes", std::move(classes)},
          {"nodes", std::move(nodes)},
          {"tenants", std::move(tenants)},
          {"decisions", std::move(decisionList)}};
}

std::string SimulationToTable(const model::ClusterView& view,
                              const std::vector<model::Decision>& decisions) {
  std::ostringstream out;
  out << "GPU RESOURCE NAMES: "
      << Join(std::vector<std::string>(view.gpuResourceNames.begin(), view.gpuResourceNames.end()),
              ", ")
      << "\n\n";
  Table classes({"CLASS", "MAXCOUNT", "UNITS", "FREE", "SOURCE"});
  for (const model::ClassView& c : view.classes) {
    classes.Add({c.name, Number(c.maxCount, "-"), std::to_string(c.units), std::to_string(c.free),
                 c.source});
  }
  classes.Print(out);
  out << "\n";
  Table nodes({"NODE", "ELIGIBLE", "CLASS", "UNITS", "USED", "FREE", "WHY NOT ELIGIBLE"});
  for (const model::NodeView& node : view.nodes) {
    const std::string eligible = node.eligible ? "yes" : "no";
    const std::string reasons = Join(node.reasons, "; ");
    if (node.classes.empty()) {
      nodes.Add({node.name, eligible, "-", "-", "-", "-", reasons});
    }
    for (const auto& [name, units] : node.classes) {
      nodes.Add({node.name, eligible, name, std::to_string(units.units), std::to_string(units.used),
                 std::to_string(units.free), reasons});
    }
  }
  nodes.Print(out);
  out << "\n";
  Table tenants({"TENANT", "CLASS", "USED", "REMAINING", "LIMITED BY"});
  for (const model::TenantView& tenant : view.tenants) {
    for (const auto& [name, budget] : tenant.classes) {
      const model::RemainingBudget& remaining = budget.budget;
      tenants.Add(
          {tenant.name, name, std::to_string(budget.used), Number(remaining.remaining, "unlimited"),
           remaining.limitedBy.empty()
               ? "-"
               : remaining.limitedBy + " (" + remaining.key +
                     (remaining.blockedByRawKey ? ", a raw key without a GPU key" : "") + ")"});
    }
  }
  tenants.Print(out);
  out << "\n";
  Table decisionTable({"DEVICE", "ACTION", "NODE", "REASON"});
  for (const model::Decision& decision : decisions) {
    decisionTable.Add({decision.deviceNamespace + "/" + decision.deviceName,
                       std::string(model::ToString(decision.action)),
                       decision.node.empty() ? "-" : decision.node, decision.reason});
  }
  decisionTable.Print(out);
  return out.str();
}

json ExplainDevice(const model::Snapshot& snapshot, const model::Model& model,
                   const model::ClusterView& view, const std::vector<model::Decision>& decisions,
                   const std::string& ns, const std::string& name) {
  const api::GpuDevice* device = nullptr;
  for (const api::GpuDevice& candidate : snapshot.devices) {
    if (candidate.metadata.namespaceName == ns && candidate.metadata.name == name) {
      device = &candidate;
    }
  }
  if (device == nullptr) {
    return nullptr;
  }
  const std::string& className = device->spec.className;
  json explanation = {{"device", ns + "/" + name},
                      {"class", className},
                      {"count", device->spec.count},
                      {"phase", std::string(api::ToString(device->Phase()))},
                      {"boundNode", OptionalText(device->status.nodeName.value_or(""))}};
  json decision = nullptr;
  for (const model::Decision& candidate : decisions) {
    if (candidate.deviceNamespace == ns && candidate.deviceName == name) {
      decision = {{"action", model::ToString(candidate.action)},
                  {"node", OptionalText(candidate.node)},
                  {"reason", candidate.reason}};
    }
  }
  explanation["decision"] = std::move(decision);
  // The GPUs of the class ordered in the tenant and its sub-tenants, budget or not. The view
  // lists the namespaces of the tenant tree; one outside it (a tenant namespace with no
  // tenant.cozystack.io/ label: no parent, no children) counts its own orders (docs/controller.md,
  // "GPUDevice orders").
  std::optional<int64_t> used;
  for (const model::TenantView& tenant : view.tenants) {
    if (tenant.name == ns) {
      const auto it = tenant.classes.find(className);
      used = it != tenant.classes.end() ? it->second.used : 0;
    }
  }
  if (!used) {
    used = 0;
    for (const api::GpuDevice& candidate : snapshot.devices) {
      if (candidate.metadata.namespaceName == ns && candidate.spec.className == className) {
        *used += candidate.spec.count;
      }
    }
  }
  const model::RemainingBudget budget = model.Remaining(ns, className);
  explanation["budget"] = {{"tenant", ns},
                           {"ordered", *used},
                           {"remaining", OptionalNumber(budget.remaining)},
                           {"limitedBy", OptionalText(budget.limitedBy)},
                           {"key", OptionalText(budget.key)},
                           {"blockedByRawKey", budget.blockedByRawKey}};
  json room = nullptr;
  if (const std::optional<model::ClassRoom> found = model.Room(className)) {
    room = {{"maxCount", OptionalNumber(found->maxCount)},
            {"free", found->free},
            {"largestNodeFree", found->largestNodeFree},
            {"largestNode", OptionalText(found->largestNode)}};
  }
  explanation["room"] = std::move(room);
  json nodes = json::array();
  for (const model::NodeView& node : view.nodes) {
    const auto it = node.classes.find(className);
    if (it == node.classes.end()) {
      continue;
    }
    nodes.push_back({{"name", node.name},
                     {"takesBinds", node.eligible},
                     {"reasons", node.reasons},
                     {"units", it->second.units},
                     {"used", it->second.used},
                     {"free", it->second.free}});
  }
  explanation["nodes"] = std::move(nodes);
  return explanation;
}

std::string ExplanationToTable(const json& explanation) {
  std::ostringstream out;
  const auto text = [](const json& value, const char* none) {
    return value.is_null() ? std::string(none)
                           : (value.is_string() ? value.get<std::string>() : value.dump());
  };
  out << "DEVICE:    " << explanation["device"].get<std::string>() << " ("
      << explanation["count"].dump() << " x " << explanation["class"].get<std::string>() << ", "
      << explanation["phase"].get<std::string>();
  if (!explanation["boundNode"].is_null()) {
    out << " on " << explanation["boundNode"].get<std::string>();
  }
  out << ")\n";
  const json& decision = explanation["decision"];
  if (decision.is_null()) {
    out << "DECISION:  none: the pass leaves this order alone\n";
  } else {
    out << "DECISION:  " << decision["action"].get<std::string>();
    if (!decision["node"].is_null()) {
      out << " on " << decision["node"].get<std::string>();
    }
    out << ": " << decision["reason"].get<std::string>() << "\n";
  }
  const json& budget = explanation["budget"];
  out << "BUDGET:    " << budget["ordered"].dump() << " ordered in "
      << budget["tenant"].get<std::string>() << " and its sub-tenants, "
      << text(budget["remaining"], "unlimited") << " remaining";
  if (!budget["limitedBy"].is_null()) {
    out << ", limited by " << budget["limitedBy"].get<std::string>() << " ("
        << text(budget["key"], "-")
        << (budget["blockedByRawKey"].get<bool>() ? ", a raw key without a GPU key" : "") << ")";
  }
  out << "\n";
  const json& room = explanation["room"];
  if (room.is_null()) {
    out << "CLASS:     no GPUClass " << explanation["class"].get<std::string>() << "\n";
  } else {
    out << "CLASS:     " << room["free"].dump() << " free on nodes that take binds, at most "
        << room["largestNodeFree"].dump() << " on one node";
    if (!room["largestNode"].is_null()) {
      out << " (" << room["largestNode"].get<std::string>() << ")";
    }
    out << ", max count " << text(room["maxCount"], "unlimited") << "\n";
  }
  out << "\n";
  Table nodes({"NODE", "TAKES BINDS", "UNITS", "USED", "FREE", "WHY NOT"});
  for (const json& node : explanation["nodes"]) {
    nodes.Add({node["name"].get<std::string>(), node["takesBinds"].get<bool>() ? "yes" : "no",
               node["units"].dump(), node["used"].dump(), node["free"].dump(),
               Join(node["reasons"].get<std::vector<std::string>>(), "; ")});
  }
  nodes.Print(out);
  return out.str();
}

int RunSimulate(const std::string& snapshotPath, OutputFormat format, std::ostream& out,
                std::ostream& err, const std::string& device) {
  std::ifstream file(snapshotPath);
  if (!file) {
    err << "simulate: cannot read " << snapshotPath << "\n";
    return 2;
  }
  json list;
  try {
    list = json::parse(file);
  } catch (const json::parse_error& error) {
    err << "simulate: " << snapshotPath << ": not JSON: " << error.what() << "\n";
    return 2;
  }
  try {
    const model::Snapshot snapshot = DecodeSnapshotList(list);
    const model::Model model(snapshot);
    for (const model::InputProblem& problem : model.Problems()) {
      err << "simulate: " << snapshotPath << ": warning: " << problem.Describe() << "\n";
    }
    const model::ClusterView view = model.View();
    const std::vector<model::Decision> decisions = model.PlanPass();
    if (!device.empty()) {
      const size_t slash = device.find('/');
      const json explanation =
          slash == std::string::npos
              ? json(nullptr)
              : ExplainDevice(snapshot, model, view, decisions, device.substr(0, slash),
                              device.substr(slash + 1));
      if (explanation.is_null()) {
        err << "simulate: " << snapshotPath << ": no GPUDevice " << device
            << " (give it as namespace/name)\n";
        return 2;
      }
      out << (format == OutputFormat::kTable ? ExplanationToTable(explanation)
                                             : explanation.dump(2) + "\n");
      return 0;
    }
    if (format == OutputFormat::kTable) {
      out << SimulationToTable(view, decisions);
    } else {
      out << SimulationToJson(view, decisions).dump(2) << "\n";
    }
  } catch (const SnapshotError& error) {
    err << "simulate: " << snapshotPath << ": " << error.what() << "\n";
    return 2;
  }
  return 0;
}

}  // namespace cozy::controller
