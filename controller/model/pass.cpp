// The binder pass: the decisions of one pass over every set, in the order the binder takes
// them (gather split sets, move held sets off nodes that cannot keep them, rebind Lost sets,
// bind new orders), and the free units placement books as it goes.
#include "controller/model/pass_planner.h"

#include <algorithm>
#include <utility>

#include "api/keys.h"
#include "api/time.h"

namespace cozy::model {
namespace {

// A new order its class refuses (ClassOrderRefusal), named as the binder's answer names it:
// "d1 orders 3 GPUs; class a100 allows at most 2 GPUs per order". "" when the class takes it.
std::string OrderRefusal(const api::GpuDevice& device, const ClassInfo& info) {
  const std::string why = ClassOrderRefusal(*info.gpuClass, info.maxCount, device.spec.count);
  if (why.empty()) return why;
  return device.metadata.name + " orders " + std::to_string(device.spec.count) +
         (device.spec.count == 1 ? " GPU; " : " GPUs; ") + why;
}

std::string DescribeNeeds(const Needs& needs, const std::vector<std::string>& resources) {
  std::string text;
  for (const auto& [resource, count] : needs.byResource) {
    text += (text.empty() ? "" : " and ") + std::to_string(count) + " unit" +
            (count == 1 ? "" : "s") + " of " + resources[resource];
  }
  return text;
}

}  // namespace

std::string_view ToString(Action action) {
  switch (action) {
    case Action::kBind:
      return "bind";
    case Action::kMove:
      return "move";
    case Action::kLost:
      return "lost";
    case Action::kRefuse:
      return "refuse";
    case Action::kKeep:
      break;
  }
  return "keep";
}

PassPlanner::PassPlanner(const Model::Index& ix, PassScope scope) : ix_(ix) {
  free_.resize(ix.units.size());
  for (size_t i = 0; i < free_.size(); ++i) {
    free_[i] = ix.units[i] - ix.bound[i] - ix.raw[i];
  }
  // Budgets of new orders are checked against what exists besides new orders, plus the
  // orders this pass accepts, in order.
  passUsage_ = ix.usage;
  for (const auto& [ns, pending] : ix.pendingUsage) {
    passUsage_[ns].Add(pending, -1);
  }
  classesByResource_.resize(ix.resources.size());
  byFree_.resize(ix.classes.size());
  for (size_t c = 0; c < ix.classes.size(); ++c) {
    classesByResource_[ix.classes[c].resource].push_back(c);
    for (size_t node : ix.classes[c].nodes) {
      if (ix.classes[c].takes[node]) {
        byFree_[c].emplace(FreeAt(node, ix.classes[c].resource), node);
      }
    }
  }
  // Nodes that hold more than they serve; none becomes so during the pass (sets are placed
  // only where they fit).
  overfull_.assign(ix.nodes.size(), 0);
  for (size_t n = 0; n < ix.nodes.size(); ++n) {
    for (size_t r = 0; r < ix.resources.size(); ++r) {
      overfull_[n] = static_cast<char>(overfull_[n] || FreeAt(n, r) < 0);
    }
  }
  if (scope == PassScope::kUnsettled) {
    const std::vector<size_t> unsettled = Unsettled();
    GroupSets(&unsettled);
    return;
  }
  // One decision per device: sized once, not regrown (each regrowth touches fresh pages).
  decisions_.reserve(ix.snapshot.devices.size());
  GroupSets(nullptr);
}

std::vector<Decision> PassPlanner::Run() {
  // Each kind of set in the order it is taken: by key (the sets' own order), new orders
  // oldest first, then by key.
  const std::vector<DeviceSet*>& mixed = steps_[static_cast<size_t>(State::kMixed)];
  const std::vector<DeviceSet*>& held = steps_[static_cast<size_t>(State::kHeld)];
  const std::vector<DeviceSet*>& lost = steps_[static_cast<size_t>(State::kLost)];
  std::vector<DeviceSet*>& fresh = steps_[static_cast<size_t>(State::kNew)];
  std::stable_sort(fresh.begin(), fresh.end(),
                   [](const DeviceSet* a, const DeviceSet* b) { return a->created < b->created; });
  for (const DeviceSet* set : mixed) {
    Gather(*set);
  }
  MoveHeld(held);
  for (const DeviceSet* set : lost) {
    Rebind(*set);
  }
  for (const DeviceSet* set : fresh) {
    BindNew(*set);
  }
  return std::move(decisions_);
}

void PassPlanner::Decide(const DeviceSet& set, Action action, std::string_view node,
                         const std::string& reason) {
  for (const size_t d : set.members) {
    Decide(d, action, node, reason);
  }
}

// The namespace comes from the index's table of namespaces and the name from the pass's own
// copy of the names: the decisions go out in set order, and reaching into the device records
// (hundreds of bytes each) in that order missed the cache once they outgrew it.
void PassPlanner::Decide(size_t d, Action action, std::string_view node,
                         const std::string& reason) {
  if (nameAt_.empty()) {  // a trial's planner: a handful of members, read where they are
    const api::ObjectMeta& meta = Device(d).metadata;
    decisions_.push_back(
        Decision{meta.namespaceName, meta.name, action, std::string(node), reason});
    return;
  }
  decisions_.push_back(Decision{*ix_.nsNames[ix_.nsOf[d]],
                                names_.substr(nameAt_[d], nameAt_[d + 1] - nameAt_[d]), action,
                                std::string(node), reason});
}

// Every change of free units goes through here, keeping byFree_ in step. The tree's node is
// moved to its new place, not freed and allocated again.
void PassPlanner::AdjustFree(size_t node, size_t resource, int64_t delta) {
  int64_t& free = free_[ix_.At(node, resource)];
  for (const size_t c : classesByResource_[resource]) {
    if (ix_.classes[c].takes[node]) {
      auto entry = byFree_[c].extract({free, node});
      entry.value().first = api::AddUnits(free, delta);
      byFree_[c].insert(std::move(entry));
    }
  }
  free = api::AddUnits(free, delta);
}

void PassPlanner::Take(size_t node, const Needs& needs, int64_t sign) {
  for (const auto& [resource, count] : needs.byResource) {
    AdjustFree(node, resource, -sign * count);
  }
}

// Gives back what the set's Bound members hold on their nodes.
void PassPlanner::ReleasePlaced(const DeviceSet& set) {
  for (const size_t d : set.members) {
    if (ix_.IsNode(PlacedOn(d)) && ClassOf(d) != kNone) {
      AdjustFree(PlacedOn(d), ix_.classes[ClassOf(d)].resource, Ordered(d));
    }
  }
}

std::vector<Toleration> PassPlanner::Tolerations(const DeviceSet& set) const {
  std::vector<Toleration> all;
  if (set.vmi) {
    all = set.vmi->tolerations;
  }
  for (const auto& [classId, count] : set.needs.byClass) {
    const std::vector<Toleration>& own = ix_.classes[classId].gpuClass->spec.tolerations;
    all.insert(all.end(), own.begin(), own.end());
  }
  return all;
}

// A node takes the set when it takes binds with the tolerations the set's launcher will carry:
// its VMI's and its classes' (C7). One class and no VMI tolerations, the common
// shape, is the class's own answer.
bool PassPlanner::Eligible(const DeviceSet& set, size_t node) const {
  if (set.needs.byClass.size() == 1 && (!set.vmi || set.vmi->tolerations.empty())) {
    return ix_.classes[set.needs.byClass.front().first].takes[node] != 0;
  }
  const std::vector<Toleration> tolerations = Tolerations(set);
  if (tolerations.empty()) {
    return ix_.takesBinds[node] != 0;
  }
  return CheckNodeEligibility(*ix_.nodes[node], tolerations).eligible;
}

bool PassPlanner::Running(const DeviceSet& set) const {
  if (set.vmi == nullptr || !ix_.IsNode(set.node)) {
    return false;
  }
  const VirtualMachineInstance& vmi = *set.vmi;
  if (vmi.RunsOn(ix_.NodeName(set.node))) {
    return true;
  }
  // Starting: a launcher is alive and KubeVirt has not written where the VM runs. The pod
  // webhook pinned that launcher to the set's node (E13); moved away, the GPUs would leave a pod
  // that kubelet admits on that node all the same, with GPUs the catalog holds for others.
  return vmi.nodeName.empty() && !vmi.Ended() && ix_.launching[ix_.vmiIndex.at(set.vmi)] != 0;
}

std::optional<int64_t> PassPlanner::GraceLeft(const std::string& since) const {
  nowRead_ = true;
  if (!ix_.now || since.empty()) {
    return std::nullopt;
  }
  const auto start = api::ParseTime(since);
  if (!start) {
    return std::nullopt;
  }
  const int64_t stood = std::chrono::duration_cast<std::chrono::seconds>(*ix_.now - *start).count();
  const int64_t left = ix_.snapshot.settings.notReadyGraceSeconds - std::max<int64_t>(0, stood);
  return left > 0 ? std::optional<int64_t>(left) : std::nullopt;
}

// How many units would be left free on the node after placing the set, or nullopt when it
// does not fit: the smaller, the fuller the node.
std::optional<int64_t> PassPlanner::Slack(const DeviceSet& set, size_t node) {
  if (!Eligible(set, node)) {
    return std::nullopt;
  }
  for (const auto& [classId, count] : set.needs.byClass) {
    if (!ix_.classes[classId].servesNode[node]) {
      return std::nullopt;
    }
  }
  int64_t slack = 0;
  for (const auto& [resource, count] : set.needs.byResource) {
    const int64_t left = FreeAt(node, resource) - count;
    if (left < 0) {
      return std::nullopt;
    }
    slack = api::AddUnits(slack, left);
  }
  return slack;
}

// The fullest eligible node with room for the whole set; ties go to the first by name.
size_t PassPlanner::FindTarget(const DeviceSet& set, size_t exclude) {
  if (set.needs.byClass.empty()) {
    return kNone;
  }
  // The common shape, one class and no VMI tolerations: the first node of the class's
  // free-units order (the nodes it takes) with enough room. Other sets look at every node of
  // their first class.
  if (set.needs.byClass.size() == 1 && (!set.vmi || set.vmi->tolerations.empty())) {
    const std::set<std::pair<int64_t, size_t>>& order = byFree_[set.needs.byClass.front().first];
    auto it = order.lower_bound({set.needs.byResource.front().second, 0});
    while (it != order.end() && it->second == exclude) {
      ++it;
    }
    return it == order.end() ? kNone : it->second;
  }
  size_t best = kNone;
  int64_t bestSlack = 0;
  for (const size_t node : ix_.classes[set.needs.byClass.front().first].nodes) {
    if (node == exclude) {
      continue;
    }
    const std::optional<int64_t> slack = Slack(set, node);
    if (slack && (best == kNone || *slack < bestSlack)) {
      best = node;
      bestSlack = *slack;
    }
  }
  return best;
}

std::string PassPlanner::NoRoom(const DeviceSet& set) const {
  std::string why = "no eligible node has room for " + DescribeNeeds(set.needs, ix_.resources);
  // A dra class's units no node can show now are not "no room" (docs/dra.md, "When the slices
  // cannot be read").
  if (!ix_.snapshot.draUnknown.empty() &&
      std::any_of(set.needs.byClass.begin(), set.needs.byClass.end(), [this](const auto& entry) {
        return ix_.classes[entry.first].gpuClass->IsDra();
      })) {
    why += " while the DRA units cannot be read (" + ix_.snapshot.draUnknown + ")";
  }
  return why;
}

std::string PassPlanner::ClassMissing(const DeviceSet& set) const {
  return "class " + std::string(set.needs.unknownClass) + " does not exist";
}

// Step 1: a set left partly Lost or split over nodes is gathered onto one node, preferring
// the node that already holds most of it, or sent whole to Lost.
void PassPlanner::Gather(const DeviceSet& set) {
  if (!set.needs.unknownClass.empty()) {
    Decide(set, Action::kKeep, "", ClassMissing(set));
    return;
  }
  // Members never bound (Pending: the template devices a VM start created beside held ones)
  // are new binds like an order's: checked as BindNew checks one, against the budgets with
  // what this pass already booked, and booked in turn (C3; docs/controller.md, "Placement",
  // step 1). A refusal refuses them and leaves the rest as they are; the VM start that asked is
  // refused with it.
  std::vector<std::pair<size_t, int64_t>> newByClass;
  std::vector<std::pair<size_t, int64_t>> newByResource;
  int64_t newTotal = 0;
  std::string refusal;
  for (const size_t d : set.members) {
    if (IsPlaced(d) || Phase(d) != api::DevicePhase::kPending) {
      continue;
    }
    const api::GpuDevice& device = Device(d);
    const ClassInfo& info = ix_.classes[ClassOf(d)];
    if (refusal.empty()) refusal = OrderRefusal(device, info);
    if (refusal.empty() && device.metadata.deletionTimestamp) {
      refusal = device.metadata.name + " is being deleted";
    }
    AddCount(newByClass, ClassOf(d), Ordered(d));
    AddCount(newByResource, info.resource, Ordered(d));
    newTotal = api::AddUnits(newTotal, Ordered(d));
  }
  const Needs newNeeds{newByResource, newByClass, newTotal, {}};
  if (refusal.empty() && newTotal > 0) {
    if (std::optional<std::string> over =
            ix_.CheckBudgets(set.namespaceName, newNeeds, passUsage_, chain_)) {
      refusal = *over;
    }
  }
  if (!refusal.empty()) {
    for (const size_t d : set.members) {
      if (!IsPlaced(d) && Phase(d) == api::DevicePhase::kPending) {
        Decide(d, Action::kRefuse, "", refusal);
      } else {
        Decide(d, Action::kKeep, IsPlaced(d) ? ix_.NodeName(PlacedOn(d)) : "",
               "a new member of " + set.Description() + " is refused: " + refusal);
      }
    }
    return;
  }
  ReleasePlaced(set);
  // (node, members it holds) for the members' nodes that exist; node indices follow names.
  std::vector<std::pair<size_t, int64_t>> holding;
  for (const size_t d : set.members) {
    if (ix_.IsNode(PlacedOn(d))) {
      AddCount(holding, PlacedOn(d), 1);
    }
  }
  std::stable_sort(holding.begin(), holding.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  size_t target = kNone;
  for (const auto& [node, count] : holding) {
    if (Slack(set, node)) {
      target = node;
      break;
    }
  }
  if (target == kNone) {
    target = FindTarget(set, kNone);
  }
  if (target == kNone) {
    // The members that were bound go Lost together (D8); the never-bound ones are refused, not
    // sent to Lost, where they would hold budget no check allowed them (C3; docs/controller.md,
    // "Placement", step 1).
    const std::string reason =
        set.Description() + " cannot be gathered onto one node: " + NoRoom(set);
    for (const size_t d : set.members) {
      const bool fresh = !IsPlaced(d) && Phase(d) == api::DevicePhase::kPending;
      Decide(d, fresh ? Action::kRefuse : Action::kLost, "", reason);
    }
    return;
  }
  Take(target, set.needs, 1);
  if (newTotal > 0) {
    Book(set.namespaceName, newNeeds);
  }
  const std::string& name = ix_.nodes[target]->name;
  const std::string reason = "gathering " + set.Description() + " onto " + name;
  for (const size_t d : set.members) {
    Action action = Action::kBind;
    if (IsPlaced(d)) {
      action = PlacedOn(d) == target ? Action::kKeep : Action::kMove;
    }
    Decide(d, action, name, reason);
  }
}

PassPlanner::HeldProblem PassPlanner::ProblemOf(const DeviceSet& set, size_t n) const {
  const Node& node = *ix_.nodes[n];
  // What no grace waits out first: the class left the node, or a taint not from a condition.
  for (const auto& [classId, count] : set.needs.byClass) {
    if (!ix_.classes[classId].servesNode[n]) {
      return {"node " + node.name + " no longer matches the nodeSelector of class " +
                  ix_.classes[classId].gpuClass->metadata.name,
              ""};
    }
  }
  // Taints the set does not tolerate; the cordon is judged on its own.
  std::optional<UntoleratedTaintInfo> taint = HeldSetTaint(node, Tolerations(set));
  if (taint && taint->condition.empty()) {
    return {"node " + node.name + ": " + taint->description, ""};
  }
  auto since = [&node](std::string_view condition) {
    const auto it = node.conditionsSince.find(std::string(condition));
    return it == node.conditionsSince.end() ? std::string() : it->second;
  };
  if (!node.ready) {
    return {"node " + node.name + " is not Ready", since("Ready")};
  }
  if (taint) {
    return {"node " + node.name + ": " + taint->description, since(taint->condition)};
  }
  return {};
}

bool PassPlanner::StartPending(const DeviceSet& set) const {
  return std::any_of(set.members.begin(), set.members.end(),
                     [this](size_t d) { return Device(d).RequestPending(); });
}

// Step 2: held sets stay unless their node cannot keep them. A set whose VM runs on its node,
// or starts there (a launcher of it is alive), never moves (docs/controller.md, "Placement",
// step 2): its GPUs are in use there, whatever the node's state. A node that is not Ready, or under
// a condition taint, keeps the sets of VMs that are off for the grace
// (Settings::notReadyGraceSeconds) before they move, as kube-controller-manager keeps a NotReady
// node's pods for their not-ready toleration; a VM start in the meantime moves its set to a node
// that takes it, or is refused while none has room.
void PassPlanner::MoveHeld(const std::vector<DeviceSet*>& held) {
  std::vector<Leaving> mustLeave;
  std::vector<Leaving> cordoned;
  std::vector<Leaving> waiting;  // within the grace
  // Held sets that StaysPut kept were put here as the sets were made; a set this loop keeps
  // sits on a node that does not take binds, so never on the same node as those.
  std::vector<Staying>& staying = staying_;
  for (DeviceSet* set : held) {
    const size_t n = set->node;
    const std::string nodeName(ix_.NodeName(n));
    if (!set->needs.unknownClass.empty()) {
      // Nothing can be placed for a class that is gone, and no VM starts on it (docs/controller.md,
      // "Placement", step 2); the devices stay where they are.
      for (const size_t d : set->members) {
        Decide(d, Action::kKeep, nodeName, ClassMissing(*set) + "; left in place");
        decisions_.back().startRefused = true;
      }
      continue;
    }
    if (!ix_.IsNode(n)) {
      mustLeave.push_back({set, kNone, "node " + nodeName + " is gone"});
      continue;
    }
    const HeldProblem problem = ProblemOf(*set, n);
    const bool isCordoned = ix_.nodes[n]->unschedulable;
    if ((!problem.text.empty() || isCordoned) && Running(*set)) {
      const std::string why =
          problem.text.empty() ? "node " + nodeName + " is cordoned" : problem.text;
      Decide(*set, Action::kKeep, nodeName,
             why + "; the VM of " + set->Description() +
                 (set->vmi->nodeName.empty() ? " starts there (its launcher is alive)"
                                             : " runs there") +
                 ", so its GPUs stay");
      continue;
    }
    if (!problem.text.empty()) {
      if (const std::optional<int64_t> left = GraceLeft(problem.since)) {
        waiting.push_back({set, n,
                           problem.text + "; its GPUs wait there " + std::to_string(*left) +
                               "s more before they move"});
      } else {
        mustLeave.push_back({set, n, problem.text});
      }
    } else if (isCordoned) {
      cordoned.push_back({set, n, ""});
    } else {
      staying.push_back({n, set, set->members});
    }
  }
  // By node, keeping the key order on each node: a counting sort, linear in the sets.
  {
    std::vector<size_t> at(ix_.nodes.size() + 1, 0);
    for (const Staying& entry : staying) {
      ++at[entry.node + 1];
    }
    for (size_t n = 0; n < ix_.nodes.size(); ++n) {
      at[n + 1] += at[n];
    }
    std::vector<Staying> byNode(staying.size());
    for (const Staying& entry : staying) {
      byNode[at[entry.node]++] = entry;
    }
    staying = std::move(byNode);
  }
  for (const Leaving& leaving : mustLeave) {
    ReleasePlaced(*leaving.set);
  }
  EvictOverCapacity(staying, cordoned, mustLeave);

  for (const Leaving& leaving : mustLeave) {
    const size_t target = FindTarget(*leaving.set, leaving.node);
    if (target == kNone) {
      Decide(*leaving.set, Action::kLost, "", leaving.reason + "; " + NoRoom(*leaving.set));
      continue;
    }
    Take(target, leaving.set->needs, 1);
    Decide(*leaving.set, Action::kMove, ix_.nodes[target]->name, leaving.reason);
  }
  DecideCordoned(cordoned);
  DecideWaiting(waiting);
  static const std::string kHeld(kHeldReason);
  for (const Staying& entry : staying) {
    for (const size_t d : entry.members) {
      Decide(d, Action::kKeep, ix_.nodes[entry.node]->name, kHeld);
    }
  }
}

// Sets on a cordoned node (D10): kept for a class with onCordon Stay, else moved where another
// node has room, else kept.
void PassPlanner::DecideCordoned(const std::vector<Leaving>& cordoned) {
  for (const Leaving& leaving : cordoned) {
    DeviceSet& set = *leaving.set;
    const std::string& nodeName = ix_.nodes[leaving.node]->name;
    std::string stayingClass;
    for (const auto& [classId, count] : set.needs.byClass) {
      if (ix_.classes[classId].gpuClass->spec.onCordon == api::OnCordon::kStay) {
        stayingClass = ix_.classes[classId].gpuClass->metadata.name;
      }
    }
    if (!stayingClass.empty()) {
      Decide(set, Action::kKeep, nodeName,
             "node " + nodeName + " is cordoned; class " + stayingClass + " has onCordon Stay");
      continue;
    }
    Take(leaving.node, set.needs, -1);
    const size_t target = FindTarget(set, leaving.node);
    if (target == kNone) {
      Take(leaving.node, set.needs, 1);
      Decide(set, Action::kKeep, nodeName,
             "node " + nodeName + " is cordoned, but no other eligible node has room");
      continue;
    }
    Take(target, set.needs, 1);
    Decide(set, Action::kMove, ix_.nodes[target]->name, "node " + nodeName + " is cordoned");
  }
}

// Sets within the grace of their node's NotReady or condition taint (docs/controller.md,
// "Placement", step 2): kept and not startable there, unless a VM start is waiting and another node
// takes the set.
void PassPlanner::DecideWaiting(const std::vector<Leaving>& waiting) {
  for (const Leaving& leaving : waiting) {
    DeviceSet& set = *leaving.set;
    if (StartPending(set)) {
      Take(leaving.node, set.needs, -1);
      const size_t target = FindTarget(set, leaving.node);
      if (target != kNone) {
        Take(target, set.needs, 1);
        Decide(set, Action::kMove, ix_.nodes[target]->name,
               leaving.reason.substr(0, leaving.reason.find(';')) +
                   "; a VM start moves its GPUs to a node that takes them");
        continue;
      }
      Take(leaving.node, set.needs, 1);
    }
    for (const size_t d : set.members) {
      Decide(d, Action::kKeep, ix_.nodes[leaving.node]->name,
             leaving.reason + "; no VM starts on them there now");
      decisions_.back().startRefused = true;
    }
  }
}

// A node that serves fewer units than its bound devices hold (a function failed, an mdev parent
// lost slots) cannot keep every set: sets leave, last by name first, until the rest fit. Which
// function a device sits on is not recorded, so no set is preferred.
//
// Pods never evict a held set (docs/controller.md, "Placement", step 2): what they hold keeps
// new orders off the node (C6), but a pod on a node full of orders is, nearly always, a VM's
// launcher that its VMI does not list in status.activePods yet (KubeVirt lists it on its next
// sync; until then it reads as raw usage, C12), and evicting on it sent another tenant's order
// Lost at every VM start on a full node (found by the chaos test, docs/reliability.md). A held
// set such a node keeps is kept for its VM's start too.
void PassPlanner::EvictOverCapacity(std::vector<Staying>& staying, std::vector<Leaving>& cordoned,
                                    std::vector<Leaving>& mustLeave) {
  // What the node's units less its bound devices leave: free, with the pods' units given back.
  auto ordersLeave = [this](size_t node, size_t r) {
    return api::AddUnits(FreeAt(node, r), ix_.raw[ix_.At(node, r)]);
  };
  // Only nodes whose orders hold more than they serve are looked at; the others keep every set.
  std::map<size_t, std::vector<std::pair<DeviceSet*, bool>>> onNode;  // set, is cordoned
  for (size_t node = 0; node < ix_.nodes.size(); ++node) {
    for (size_t r = 0; r < ix_.resources.size(); ++r) {
      if (ordersLeave(node, r) < 0) {
        onNode[node];  // also for a node holding only cordoned sets
        break;
      }
    }
  }
  if (onNode.empty()) {
    return;
  }
  for (auto& [node, sets] : onNode) {
    const auto range =
        std::equal_range(staying.begin(), staying.end(), Staying{node, nullptr, {}},
                         [](const Staying& a, const Staying& b) { return a.node < b.node; });
    for (auto it = range.first; it != range.second; ++it) {
      sets.emplace_back(it->set, false);
    }
  }
  for (const Leaving& leaving : cordoned) {
    if (const auto it = onNode.find(leaving.node); it != onNode.end()) {
      it->second.emplace_back(leaving.set, true);
    }
  }
  std::set<const DeviceSet*> evicted;
  for (auto& [node, sets] : onNode) {
    std::sort(sets.begin(), sets.end(),
              [](const auto& a, const auto& b) { return a.first->key > b.first->key; });
    for (size_t r = 0; r < ix_.resources.size(); ++r) {
      if (ordersLeave(node, r) >= 0) {
        continue;
      }
      const size_t at = ix_.At(node, r);
      const std::string reason = "node " + ix_.nodes[node]->name + " serves " +
                                 std::to_string(ix_.units[at]) + " units of " + ix_.resources[r] +
                                 " but its orders hold " + std::to_string(ix_.bound[at]);
      for (const auto& [set, isCordoned] : sets) {
        if (ordersLeave(node, r) >= 0) {
          break;
        }
        // A running or starting VM's set stays (docs/controller.md, "Placement", step 2): the
        // others leave first.
        if (evicted.contains(set) || CountOf(set->needs.byResource, r) == 0 || Running(*set)) {
          continue;
        }
        evicted.insert(set);
        ReleasePlaced(*set);
        mustLeave.push_back({set, node, reason});
      }
    }
  }
  std::erase_if(staying, [&evicted](const Staying& entry) { return evicted.contains(entry.set); });
  std::erase_if(cordoned,
                [&evicted](const Leaving& leaving) { return evicted.contains(leaving.set); });
}

// Step 3: Lost sets are rebound before new orders take the room.
void PassPlanner::Rebind(const DeviceSet& set) {
  if (!set.needs.unknownClass.empty()) {
    Decide(set, Action::kLost, "", ClassMissing(set));
    return;
  }
  const size_t target = FindTarget(set, kNone);
  if (target == kNone) {
    Decide(set, Action::kLost, "", NoRoom(set));
    return;
  }
  Take(target, set.needs, 1);
  Decide(set, Action::kBind, ix_.nodes[target]->name,
         "rebinding " + set.Description() + " onto the fullest node with room");
}

// Step 4: new orders, oldest first, onto the fullest node with room.
void PassPlanner::BindNew(const DeviceSet& set) {
  if (!set.needs.unknownClass.empty()) {
    Decide(set, Action::kRefuse, "", ClassMissing(set));
    return;
  }
  for (size_t i = 0; set.checkMembers && i < set.members.size(); ++i) {
    const api::GpuDevice& device = Device(set.members[i]);
    const ClassInfo& info = ix_.classes[ClassOf(set.members[i])];
    if (std::string why = OrderRefusal(device, info); !why.empty()) {
      Decide(set, Action::kRefuse, "", why);
      return;
    }
    if (device.metadata.deletionTimestamp) {
      Decide(set, Action::kRefuse, "", device.metadata.name + " is being deleted");
      return;
    }
  }
  if (std::optional<std::string> refusal =
          ix_.CheckBudgets(set.namespaceName, set.needs, passUsage_, chain_)) {
    Decide(set, Action::kRefuse, "", *refusal);
    return;
  }
  const size_t target = FindTarget(set, kNone);
  if (target == kNone) {
    Decide(set, Action::kRefuse, "", NoRoom(set));
    return;
  }
  Take(target, set.needs, 1);
  Book(set.namespaceName, set.needs);
  static const std::string kFullest = "the fullest eligible node with room";
  Decide(set, Action::kBind, ix_.nodes[target]->name, kFullest);
}

// New binds count against the budgets of every order after them in the pass.
void PassPlanner::Book(std::string_view tenant, const Needs& needs) {
  Usage booked;
  for (const auto& [classId, count] : needs.byClass) {
    AddAt(booked.byClass, classId, count);
  }
  for (const auto& [resource, count] : needs.byResource) {
    AddAt(booked.devicesByResource, resource, count);
  }
  booked.total = needs.total;
  ix_.tenants.BudgetChain(tenant, chain_);
  for (const std::string_view ns : chain_) {
    passUsage_[ns].Add(booked, 1);
  }
}

std::vector<Decision> Model::PlanPass(PassScope scope) const {
  return PassPlanner(*index_, scope).Run();
}

// Here, where the trial's base (pass_planner.h) is a complete type.
Model::Model(const Snapshot& snapshot, const Model* previous)
    : index_(std::make_unique<Index>(snapshot)) {
  index_->Build(previous ? previous->index_.get() : nullptr);
}
size_t Model::DevicesRead() const { return index_->devicesRead; }
const std::vector<InputProblem>& Model::Problems() const { return index_->problems; }
Model::~Model() = default;

}  // namespace cozy::model
