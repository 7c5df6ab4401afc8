// Budgets: the GPU limits each namespace's ResourceQuotas declare, what is left of them for a
// tenant's next order, and whether an order fits them.
#include "controller/model/model_internal.h"

#include <algorithm>

#include "api/json_field.h"
#include "api/keys.h"
#include "api/quantity.h"

namespace cozy::model {
namespace {

void Lower(std::optional<Limit>& slot, Limit limit) {
  if (!slot || limit.value < slot->value) {
    slot = std::move(limit);
  }
}

void Lower(std::map<size_t, Limit>& slots, size_t index, Limit limit) {
  const auto it = slots.find(index);
  if (it == slots.end() || limit.value < it->second.value) {
    slots[index] = std::move(limit);
  }
}

// One budget that caps class `classId` in a namespace of the chain.
struct Constraint {
  enum class Kind { kClass, kTotal, kRaw };
  Kind kind;
  const Limit* limit;
  int64_t used;
  bool blocked;  // a raw key with no GPU key beside it: blocks the class outright
};

template <typename Visit>
void ForEachConstraint(const Budget& budget, const Usage& used, size_t classId, size_t resource,
                       Visit visit) {
  const auto classLimit = budget.byClass.find(classId);
  if (classLimit != budget.byClass.end()) {
    visit(Constraint{Constraint::Kind::kClass, &classLimit->second, Get(used.byClass, classId),
                     false});
  }
  if (budget.total) {
    visit(Constraint{Constraint::Kind::kTotal, &*budget.total, used.total, false});
  }
  // A raw key blocks a class until the same tenant also declares a GPU key covering it; then
  // it caps devices and raw-name pods together.
  if (const auto rawLimit = budget.raw.find(resource); rawLimit != budget.raw.end()) {
    const bool gpuKey = classLimit != budget.byClass.end() || budget.total.has_value();
    visit(Constraint{Constraint::Kind::kRaw, &rawLimit->second,
                     Get(used.devicesByResource, resource) + Get(used.rawPodsByResource, resource),
                     !gpuKey});
  }
}

}  // namespace

const Usage& UsageOf(const UsageBy& usageBy, std::string_view ns) {
  static const Usage kNoUsage;
  const auto it = usageBy.find(ns);
  return it == usageBy.end() ? kNoUsage : it->second;
}

void Model::Index::ReadBudgets() {
  budgetProblems.clear();
  for (const ResourceQuota& quota : snapshot.quotas) {
    for (const auto& [key, text] : quota.hard) {
      const bool gpuKey = key.starts_with(api::kBudgetKeyPrefix);
      std::optional<size_t> rawResource;
      if (!gpuKey && key.starts_with(api::kRawQuotaKeyPrefix)) {
        const auto r =
            resourceIds.find(std::string_view(key).substr(api::kRawQuotaKeyPrefix.size()));
        if (r != resourceIds.end()) {
          rawResource = r->second;
        }
      }
      if (!gpuKey && !rawResource) {
        continue;
      }
      // C2: a budget that cannot be read is never skipped: it refuses every order of its own
      // namespace's subtree, and no one else's. One past api::kMaxUnits ("10E") is a budget
      // larger than any cluster: it is read as api::kMaxUnits.
      const api::QuantityResult parsed = api::ParseWholeQuantity(text);
      Budget& budget = budgets[quota.namespaceName];
      const std::string field = api::JoinPath("spec.hard", key);
      if (!parsed.value && !parsed.tooLarge) {
        budgetProblems.push_back(InputProblem{"ResourceQuota", quota.namespaceName, quota.name,
                                              field,
                                              parsed.error + "; every GPU order in " +
                                                  quota.namespaceName + " and below is refused"});
        if (!budget.unreadable) {
          budget.unreadable = "ResourceQuota " + quota.namespaceName + "/" + quota.name + ": " +
                              field + ": " + parsed.error;
        }
        continue;
      }
      const int64_t value = parsed.value ? api::ClampUnits(*parsed.value) : api::kMaxUnits;
      if (!parsed.value || value != *parsed.value) {
        budgetProblems.push_back(InputProblem{"ResourceQuota", quota.namespaceName, quota.name,
                                              field, ReadAsCeiling(text, parsed, "cluster")});
      }
      Limit limit{value, key};
      if (rawResource) {
        Lower(budget.raw, *rawResource, std::move(limit));
        continue;
      }
      const std::string_view className = std::string_view(key).substr(api::kBudgetKeyPrefix.size());
      if (className == api::kTotalBudgetName) {
        Lower(budget.total, std::move(limit));
      } else if (const auto c = classIds.find(className); c != classIds.end()) {
        Lower(budget.byClass, c->second, std::move(limit));
      }
    }
  }
}

RemainingBudget Model::Index::Remaining(std::string_view tenant, size_t classId,
                                        const UsageBy& usageBy) const {
  RemainingBudget result;
  std::vector<std::string_view> chain;
  tenants.BudgetChain(tenant, chain);
  for (const std::string_view ns : chain) {
    const auto budget = budgets.find(ns);
    if (budget == budgets.end()) {
      continue;
    }
    if (budget->second.unreadable) {
      return RemainingBudget{0, std::string(ns), *budget->second.unreadable, false};
    }
    ForEachConstraint(budget->second, UsageOf(usageBy, ns), classId, classes[classId].resource,
                      [&](const Constraint& constraint) {
                        const int64_t left =
                            constraint.blocked
                                ? 0
                                : std::max<int64_t>(0, constraint.limit->value - constraint.used);
                        // (limit at most api::kMaxUnits, used at most api::kMaxUnitsSum)
                        if (!result.remaining || left < *result.remaining) {
                          result = RemainingBudget{left, std::string(ns), constraint.limit->key,
                                                   constraint.blocked};
                        }
                      });
  }
  return result;
}

std::optional<std::string> Model::Index::CheckBudgets(std::string_view tenant, const Needs& needs,
                                                      const UsageBy& usageBy,
                                                      std::vector<std::string_view>& chain) const {
  tenants.BudgetChain(tenant, chain);
  for (const std::string_view ns : chain) {
    const auto budget = budgets.find(ns);
    if (budget == budgets.end()) {
      continue;
    }
    if (budget->second.unreadable) {
      return "a GPU budget of " + std::string(ns) + " cannot be read (" +
             *budget->second.unreadable + "), so no GPU order in " + std::string(ns) +
             " or below can be checked against it";
    }
    std::optional<std::string> refusal;
    for (const auto& [classId, count] : needs.byClass) {
      const size_t resource = classes[classId].resource;
      const std::string& className = classes[classId].gpuClass->metadata.name;
      ForEachConstraint(
          budget->second, UsageOf(usageBy, ns), classId, resource,
          [&, count = count](const Constraint& constraint) {
            if (refusal) {
              return;
            }
            if (constraint.blocked) {
              const std::string name(ns);
              refusal = "the raw quota key " + constraint.limit->key + " of " + name +
                        " blocks class " + className + " until " + name + " also declares " +
                        api::ClassBudgetKey(className) + " or " + std::string(api::kTotalBudgetKey);
              return;
            }
            const std::string& key = constraint.limit->key;
            int64_t need = count;
            if (constraint.kind == Constraint::Kind::kTotal) {
              need = needs.total;
            } else if (constraint.kind == Constraint::Kind::kRaw) {
              need = CountOf(needs.byResource, resource);
            }
            // Written as a difference: each side stays inside int64 whatever
            // the inputs (api::kMaxUnitsSum).
            if (need > constraint.limit->value - constraint.used) {
              refusal = "the budget " + key + " of " + std::string(ns) + " is " +
                        std::to_string(constraint.limit->value) + " with " +
                        std::to_string(constraint.used) + " used; the order needs " +
                        std::to_string(need);
              if (const auto problem = problemIn.find(ns); problem != problemIn.end()) {
                *refusal += " (counted as holding all it asks for: " + problem->second + ")";
              }
            }
          });
      if (refusal) {
        return refusal;
      }
    }
  }
  return std::nullopt;
}

RemainingBudget Model::Remaining(std::string_view tenant, std::string_view className) const {
  const auto c = index_->classIds.find(className);
  if (c == index_->classIds.end()) {
    return {};
  }
  return index_->Remaining(tenant, c->second, index_->usage);
}

std::optional<std::string> Model::CheckNewOrder(
    std::string_view ns, const std::map<std::string, int64_t>& counts) const {
  const Index& ix = *index_;
  std::vector<std::pair<size_t, int64_t>> byClass;
  std::vector<std::pair<size_t, int64_t>> byResource;
  Needs needs;
  for (const auto& [className, count] : counts) {
    const auto c = ix.classIds.find(className);
    if (c == ix.classIds.end()) {
      continue;
    }
    const int64_t units = api::ClampUnits(count);
    AddCount(byClass, c->second, units);
    AddCount(byResource, ix.classes[c->second].resource, units);
    needs.total = api::AddUnits(needs.total, units);
  }
  needs.byClass = Counts(byClass);
  needs.byResource = Counts(byResource);
  std::vector<std::string_view> chain;
  return ix.CheckBudgets(ns, needs, ix.usage, chain);
}

bool Model::VgpuEntitled(std::string_view ns) const {
  const Index& ix = *index_;
  std::vector<std::string_view> chain;
  ix.tenants.BudgetChain(ns, chain);
  for (const Namespace& candidate : ix.snapshot.namespaces) {
    if (std::find(chain.begin(), chain.end(), candidate.name) == chain.end()) {
      continue;
    }
    const auto label = candidate.labels.find(std::string(api::kVgpuEntitledLabel));
    if (label != candidate.labels.end() && label->second == api::kVgpuEntitledLabelValue) {
      return true;
    }
  }
  return false;
}

}  // namespace cozy::model
