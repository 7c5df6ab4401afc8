// A VM start's trial without the whole pass (docs/controller.md, "VMI starts"): the VMI webhook
// asks what a binder pass would decide for the start's set on a copy of the snapshot with the start
// applied. That copy and its pass cost the whole cluster per start; but the set's decision depends
// only on the books (free units, budgets booked) as they stand when its turn comes, and on the set.
// One pass over the snapshot as it stands, made once per model, gives the books at the two
// turns a start's set can take without changing what comes before it. It takes only the sets
// that are not kept where they are (PassScope::kUnsettled), which leave the books as the
// whole pass would: in a settled cluster, next to none, so the first start on a new state of
// the caches does not pay a pass over every device.
//
//
// - A set of held devices only, on one node that keeps them: kept there ("held"), as step 2
//   keeps it while the sets are made, whatever else the pass does.
// - A set being gathered (held devices beside templates, or beside Pending or Lost ones) is
//   taken in step 1, in key order: first, on the books before any step, when no set of the
//   snapshot is gathered before its key.
// - A set of templates only is a new order, taken in step 4 oldest first: last, on the books
//   after the whole pass, when every other new order is older than the start. The rest of the
//   pass is the snapshot's own pass, which must not have read the time (a grace measured at
//   the snapshot's time might end otherwise at the start's).
//
// In each the members' own sets in the snapshot (each held device alone: none is attached)
// are decided in steps that leave the books as they were, or come after the start's turn.
// Anything else (devices attached to the VMI's name, a set that
// would be rebound from Lost, a held set that must move, a class that does not exist) is left
// to the whole pass. test/controller/start_trial_test.cpp holds the answers equal to it on
// random clusters.
#include <algorithm>

#include "controller/model/pass_planner.h"

namespace cozy::model {

std::unique_ptr<Model::TrialBase> PassPlanner::MakeTrialBase(const Model::Index& ix) {
  auto base = std::make_unique<Model::TrialBase>();
  // Only the sets a pass does more with than keep where they are: the others change nothing in
  // the books, and a settled cluster has none (docs/controller.md, "Unsettled sets").
  PassPlanner planner(ix, PassScope::kUnsettled);
  base->initial = planner.Books();
  for (const DeviceSet* set : planner.steps_[static_cast<size_t>(State::kMixed)]) {
    if (!base->firstMixed || set->key < *base->firstMixed) {
      base->firstMixed = std::string(set->key);
    }
  }
  for (const DeviceSet* set : planner.steps_[static_cast<size_t>(State::kNew)]) {
    if (!base->newestNew || *base->newestNew < set->created) {
      base->newestNew = std::string(set->created);
    }
  }
  planner.Run();
  base->final = planner.Books();
  base->nowRead = planner.nowRead_;
  base->attachedTo = std::move(planner.attachedTo_);
  return base;
}

PassPlanner::PassPlanner(const Model::Index& ix, const std::vector<api::GpuDevice>& extra,
                         std::vector<size_t> extraClass)
    : ix_(ix), extra_(&extra), extraClass_(std::move(extraClass)) {
  classesByResource_.resize(ix.resources.size());
  for (size_t c = 0; c < ix.classes.size(); ++c) {
    classesByResource_[ix.classes[c].resource].push_back(c);
  }
}

void PassPlanner::UseBooks(const PassBooks& books) {
  free_ = books.free;
  byFree_ = books.byFree;
  passUsage_ = books.passUsage;
  overfull_ = books.overfull;
}

std::optional<std::vector<Decision>> PassPlanner::TryStart(const Model::Index& ix,
                                                           const Model::TrialBase& base,
                                                           const StartTrial& trial) {
  const std::string& ns = trial.namespaceName;
  // Devices attached to the name already: they would join the set, or a VMI of the name being
  // replaced would leave them behind. (A VMI of the name with no device attached changes
  // nothing when it is replaced: its pods count as raw usage in both, since no device covers
  // them.)
  if (base.attachedTo.contains(ns + "/" + trial.vmiName)) {
    return std::nullopt;
  }
  // The members as the pass numbers them: held devices by index (ascending, as sets list
  // them), then the templates, which the copy would hold after every device of the snapshot.
  std::vector<size_t> members;
  for (const size_t d : trial.held) {
    if (d >= ix.snapshot.devices.size() || ix.Device(d).status.attachment ||
        ix.deviceClass[d] == kNone) {
      return std::nullopt;
    }
    members.push_back(d);
  }
  std::sort(members.begin(), members.end());
  std::vector<size_t> extraClass;
  for (const api::GpuDevice& device : trial.templates) {
    const auto c = ix.classIds.find(device.spec.className);
    if (c == ix.classIds.end()) {
      return std::nullopt;
    }
    extraClass.push_back(c->second);
    members.push_back(ix.snapshot.devices.size() + extraClass.size() - 1);
  }
  if (members.empty()) {
    return std::nullopt;
  }

  PassPlanner planner(ix, trial.templates, std::move(extraClass));
  VirtualMachineInstance vmi;
  vmi.namespaceName = ns;
  vmi.name = trial.vmiName;
  vmi.creationTimestamp = trial.now;
  const std::string key = ns + "/vmi " + trial.vmiName + " ";  // the attachment has no UID yet
  DeviceSet set;
  set.key = key;
  set.namespaceName = ns;
  set.name = trial.vmiName;
  set.attached = true;
  set.vmi = &vmi;
  set.members = members;
  set.node = planner.PlacedOn(members.front());
  set.created = planner.Device(members.front()).metadata.creationTimestamp;
  planner.classCounts_.reserve(members.size());
  planner.resourceCounts_.reserve(members.size());
  std::vector<std::pair<size_t, int64_t>> byClass, byResource;
  for (const size_t d : members) {
    const api::ObjectMeta& meta = planner.Device(d).metadata;
    planner.CountMember(set, d, meta.creationTimestamp, meta.deletionTimestamp.has_value(), byClass,
                        byResource);
  }
  planner.SealCounts(set, byClass, byResource);

  switch (planner.Classify(set)) {
    case State::kHeld:
      planner.overfull_ = base.initial.overfull;
      if (!planner.StaysPut(set)) {
        return std::nullopt;  // it would move or wait: MoveHeld weighs it against the others
      }
      planner.Decide(set, Action::kKeep, ix.nodes[set.node]->name, std::string(kHeldReason));
      break;
    case State::kMixed:
      if (base.firstMixed && *base.firstMixed < set.key) {
        return std::nullopt;
      }
      planner.UseBooks(base.initial);
      planner.Gather(set);
      break;
    case State::kNew:
      if (!trial.held.empty() || base.nowRead ||
          (base.newestNew && !(*base.newestNew < set.created))) {
        return std::nullopt;
      }
      planner.UseBooks(base.final);
      planner.BindNew(set);
      break;
    case State::kLost:
      return std::nullopt;
  }
  return std::move(planner.decisions_);
}

std::optional<std::vector<Decision>> Model::PlanStart(const StartTrial& trial) const {
  std::call_once(trialOnce_, [this] { trialBase_ = PassPlanner::MakeTrialBase(*index_); });
  return PassPlanner::TryStart(*index_, *trialBase_, trial);
}

}  // namespace cozy::model
