#include "controller/simulate.h"

#include <algorithm>
#include <fstream>
#include <ostream>
#include <sstream>

#include "controller/model/errors.h"
#include "controller/snapshot_json.h"

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

// Columns padded to their widest cell.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void Print(std::ostream& out) const {
    std::vector<size_t> widths(rows_.front().size(), 0);
    for (const auto& row : rows_) {
      for (size_t i = 0; i < row.size(); ++i) {
        widths[i] = std::max(widths[i], row[i].size());
      }
    }
    for (const auto& row : rows_) {
      std::string line;
      for (size_t i = 0; i < row.size(); ++i) {
        line += row[i];
        if (i + 1 < row.size()) {
          line += std::string(widths[i] - row[i].size() + 2, ' ');
        }
      }
      line.erase(line.find_last_not_of(' ') + 1);
      out << line << "\n";
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

std::string Join(const std::vector<std::string>& items, const char* separator) {
  std::string text;
  for (const std::string& item : items) {
    text += (text.empty() ? "" : separator) + item;
  }
  return text;
}

}  // namespace

json SimulationToJson(const model::ClusterView& view,
                      const std::vector<model::Decision>& decisions) {
  json classes = json::object();
  for (const model::ClassView& c : view.classes) {
    classes[c.name] = {
        {"maxCount", OptionalNumber(c.maxCount)}, {"units", c.units}, {"free", c.free}};
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
  Table classes({"CLASS", "MAXCOUNT", "UNITS", "FREE"});
  for (const model::ClassView& c : view.classes) {
    classes.Add({c.name, Number(c.maxCount, "-"), std::to_string(c.units), std::to_string(c.free)});
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

int RunSimulate(const std::string& snapshotPath, OutputFormat format, std::ostream& out,
                std::ostream& err) {
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
    const model::ClusterView view = model.View();
    const std::vector<model::Decision> decisions = model.PlanPass();
    if (format == OutputFormat::kTable) {
      out << SimulationToTable(view, decisions);
    } else {
      out << SimulationToJson(view, decisions).dump(2) << "\n";
    }
  } catch (const SnapshotError& error) {
    err << "simulate: " << snapshotPath << ": " << error.what() << "\n";
    return 2;
  } catch (const model::InvalidSnapshot& error) {
    err << "simulate: " << snapshotPath << ": " << error.what() << "\n";
    return 2;
  }
  return 0;
}

}  // namespace cozy::controller
