// The binder pass's planner (pass.cpp, sets.cpp): its sets, steps and private state, kept out
// of model_internal.h so the model's other parts (index, budgets, views) do not carry it.
#pragma once

#include <unordered_set>

#include "controller/model/model_internal.h"

namespace cozy::model {

// ---- the binder pass ----
//
// The pass touches every device, so it works on numbers: the index's class and node of each
// device, sets as ranges of one member array, needs as ranges of one count array, and one
// buffer of sort keys. Apart from the decisions it returns it makes a handful of allocations
// per pass rather than several per device, which kept its time growing faster than the cluster.

// The devices one VM names (or one unattached order) move, go Lost and are rebound together.
struct DeviceSet {
  std::string_view key;  // "ns/vmi <name> <uid>" or "ns/<device>": sets are taken in its order
  std::string_view namespaceName;
  std::string_view name;  // the VMI's name for an attached set, the device's for an order
  bool attached = false;
  const VirtualMachineInstance* vmi = nullptr;
  std::span<const size_t> members;  // device indices, ascending
  size_t node = kNone;              // where the first member is placed, as Index::placedOn
  std::string_view created;         // the earliest member's creationTimestamp
  bool memberDeleting = false;      // a member has a deletionTimestamp
  // A member is being deleted, or its class is, or it orders more than its class allows: a new
  // order is refused (BindNew reads the members only then).
  bool checkMembers = false;
  Needs needs;

  // "the set of VMI vm1" or "order gpu-1", for messages.
  std::string Description() const {
    return (attached ? "the set of VMI " : "order ") + std::string(name);
  }
};

// What placement books as a pass goes: free units by node and resource, each class's nodes by
// free units, budgets booked, and the nodes holding more than they serve.
struct PassBooks {
  std::vector<int64_t> free;
  std::vector<std::set<std::pair<int64_t, size_t>>> byFree;
  UsageBy passUsage;
  std::vector<char> overfull;
};

// What a VM start's trial (Model::PlanStart, trial.cpp) reads of the pass over the snapshot as it
// stands, made once per model: the books before any step and after the last, and what tells
// whether the start's set would be decided on them.
struct Model::TrialBase {
  PassBooks initial;
  PassBooks final;
  bool nowRead = false;                   // a step measured a grace against the snapshot's time
  std::optional<std::string> newestNew;   // the latest creation time of a new order's set
  std::optional<std::string> firstMixed;  // the first key of a set gathered in step 1
  // "namespace/VMI name" of every attachment: a start's set would take such devices in.
  std::unordered_set<std::string> attachedTo;
};

// One binder pass over the index: Model::PlanPass makes one and runs it.
class PassPlanner {
 public:
  // With PassScope::kUnsettled, Run decides only the sets Unsettled finds, and changes the
  // books as a pass over every set would: a set kept where it is changes nothing in them.
  explicit PassPlanner(const Model::Index& ix, PassScope scope = PassScope::kEvery);
  std::vector<Decision> Run();

  // The pass over the snapshot as it stands, kept for the trials of VM starts (trial.cpp).
  static std::unique_ptr<Model::TrialBase> MakeTrialBase(const Model::Index& ix);
  // The decisions for a VM start's set as a pass over the snapshot with the start applied would
  // make them, from `base` alone, or nullopt where the set's turn in that pass is not known
  // without running it (trial.cpp says when).
  static std::optional<std::vector<Decision>> TryStart(const Model::Index& ix,
                                                       const Model::TrialBase& base,
                                                       const StartTrial& trial);

 private:
  enum class State { kHeld, kLost, kNew, kMixed };

  // A trial's planner: no sets of the snapshot's, the start's templates as devices numbered
  // after the snapshot's, and books to be taken from a TrialBase.
  PassPlanner(const Model::Index& ix, const std::vector<api::GpuDevice>& extra,
              std::vector<size_t> extraClass);
  PassBooks Books() const { return {free_, byFree_, passUsage_, overfull_}; }
  void UseBooks(const PassBooks& books);

  // Where a set's key, and its namespace and name within it, sit in keys_. Kept small: the
  // sort reads these at random.
  struct SetKey {
    uint32_t at;
    uint32_t size;
    uint32_t nsSize;
    uint32_t nameAt;  // within the key
    uint32_t nameSize;
    bool attached;
  };

  struct Leaving {
    DeviceSet* set;
    size_t node;  // kNone when the node is gone
    std::string reason;
  };

  // A held set that stays, with its members at hand: the keep decisions go out by node, and
  // reaching into the sets in that order missed the cache once they outgrew it.
  struct Staying {
    size_t node;
    DeviceSet* set;  // null for those StaysPut kept: never on a node EvictOverCapacity looks at
    std::span<const size_t> members;
  };

  // Per device: the snapshot's through the index, a trial's templates (past the snapshot's)
  // from the trial's own.
  bool IsExtra(size_t d) const { return d >= ix_.snapshot.devices.size(); }
  const api::GpuDevice& Device(size_t d) const {
    return IsExtra(d) ? (*extra_)[d - ix_.snapshot.devices.size()] : ix_.Device(d);
  }
  size_t PlacedOn(size_t d) const { return IsExtra(d) ? kNone : ix_.placedOn[d]; }
  api::DevicePhase Phase(size_t d) const {
    return IsExtra(d) ? api::DevicePhase::kPending : ix_.phase[d];
  }
  size_t ClassOf(size_t d) const {
    return IsExtra(d) ? extraClass_[d - ix_.snapshot.devices.size()] : ix_.deviceClass[d];
  }
  int64_t Ordered(size_t d) const {
    return IsExtra(d) ? api::ClampUnits(Device(d).spec.count) : ix_.ordered[d];
  }
  bool IsPlaced(size_t d) const { return PlacedOn(d) != kNone; }
  int64_t FreeAt(size_t node, size_t resource) const { return free_[ix_.At(node, resource)]; }

  // Grouping the devices into sets (sets.cpp): the device records are read once, in their own
  // order (ReadRecords); each set's members are gathered (MembersBySet); then the sets are made
  // in key order (MakeSets).
  void GroupSets(const std::vector<size_t>* only);
  // GroupSets' working state, by position: device d itself, or the d-th of `only`.
  struct Grouping {
    const std::vector<size_t>* only = nullptr;
    size_t count = 0;
    std::vector<size_t> setOf;      // each position's set
    std::vector<size_t> leaders;    // each set's first device
    std::vector<SetKey> keys;       // each set's key in keys_
    std::vector<size_t> createdAt;  // each position's creation time in created_ (and the end)
    std::vector<char> deleting;     // each position's deletion mark
    size_t Device(size_t i) const { return only ? (*only)[i] : i; }
  };
  void ReadRecords(Grouping& g);
  static std::vector<size_t> MembersBySet(const Grouping& g, std::vector<size_t>& start);
  void MakeSets(const Grouping& g, const std::vector<size_t>& start,
                const std::vector<size_t>& members);
  // Whether device d, alone or in a set with others on its node, is kept there by StaysPut
  // with nothing to answer: placed on a node that takes binds and holds no more than it
  // serves, which serves its class, and no bind request waits on it.
  bool Settled(size_t d) const;
  // The devices of every set but those StaysPut keeps where they are with no request waiting,
  // ascending: the sets of a pass with PassScope::kUnsettled. Also fills attachedTo_.
  std::vector<size_t> Unsettled();
  // Adds member `d` to the set's needs, creation time and flags; counts go to the buffers.
  void CountMember(DeviceSet& set, size_t d, std::string_view created, bool deleting,
                   std::vector<std::pair<size_t, int64_t>>& byClass,
                   std::vector<std::pair<size_t, int64_t>>& byResource) const;
  // Closes a set CountMember filled: its counts are copied where its views stay put.
  void SealCounts(DeviceSet& set, const std::vector<std::pair<size_t, int64_t>>& byClass,
                  const std::vector<std::pair<size_t, int64_t>>& byResource);
  template <typename KeyOf>
  std::vector<size_t> OrderByKey(const std::vector<size_t>& leaders,
                                 const std::vector<SetKey>& keys, const KeyOf& keyOf) const;
  State Classify(const DeviceSet& set) const;
  bool StaysPut(const DeviceSet& set) const;

  // Placement (pass.cpp).
  void Decide(const DeviceSet& set, Action action, std::string_view node,
              const std::string& reason);
  void Decide(size_t d, Action action, std::string_view node, const std::string& reason);
  void AdjustFree(size_t node, size_t resource, int64_t delta);
  void Take(size_t node, const Needs& needs, int64_t sign);
  void ReleasePlaced(const DeviceSet& set);
  void Book(std::string_view tenant, const Needs& needs);
  // The tolerations the set's launcher carries: its VMI's and every member class's (the pod
  // webhook adds those); empty when it carries none.
  std::vector<Toleration> Tolerations(const DeviceSet& set) const;
  bool Eligible(const DeviceSet& set, size_t node) const;
  // Whether the set's VM runs on the node its members sit on: such a set never moves.
  bool Running(const DeviceSet& set) const;
  // How long the problem at `since` (a condition's lastTransitionTime) may still stand before
  // a held set leaves for it, or nullopt when the grace has run out or cannot be measured.
  std::optional<int64_t> GraceLeft(const std::string& since) const;
  std::optional<int64_t> Slack(const DeviceSet& set, size_t node);
  size_t FindTarget(const DeviceSet& set, size_t exclude);
  std::string NoRoom(const DeviceSet& set) const;
  std::string ClassMissing(const DeviceSet& set) const;

  // The pass's steps, in the order Run takes them (pass.cpp).
  void Gather(const DeviceSet& set);
  void MoveHeld(const std::vector<DeviceSet*>& held);
  // A held set whose node has a problem: why it must leave, or why it may wait (within the
  // grace, or its VM running there), as MoveHeld files it.
  struct HeldProblem {
    std::string text;   // "node n1 is not Ready"; empty: none
    std::string since;  // for a transient problem (not Ready, a condition taint): its start
  };
  HeldProblem ProblemOf(const DeviceSet& set, size_t node) const;
  void DecideCordoned(const std::vector<Leaving>& cordoned);
  void DecideWaiting(const std::vector<Leaving>& waiting);
  // Whether a member carries a bind request not answered yet: a VM start is waiting on the set.
  bool StartPending(const DeviceSet& set) const;
  void EvictOverCapacity(std::vector<Staying>& staying, std::vector<Leaving>& cordoned,
                         std::vector<Leaving>& mustLeave);
  void Rebind(const DeviceSet& set);
  void BindNew(const DeviceSet& set);

  const Model::Index& ix_;
  std::vector<int64_t> free_;  // by node and resource, as Index::At
  // Per class, the nodes it selects that take binds, ordered by free units of its resource name
  // then by name: the fullest node with room is a lookup rather than a scan.
  std::vector<std::set<std::pair<int64_t, size_t>>> byFree_;
  std::vector<std::vector<size_t>> classesByResource_;
  UsageBy passUsage_;
  std::vector<std::string_view> chain_;  // BudgetChain's buffer
  mutable bool nowRead_ = false;         // GraceLeft was asked: the pass read the time
  const std::vector<api::GpuDevice>* extra_ = nullptr;  // a trial's templates
  std::vector<size_t> extraClass_;                      // their classes
  // What the sets view: members, needs and keys of every set, each in one array.
  std::vector<size_t> keyMembers_;  // each set's members, the sets in key order
  std::vector<std::pair<size_t, int64_t>> classCounts_;
  std::vector<std::pair<size_t, int64_t>> resourceCounts_;
  std::string keys_;
  std::string created_;
  std::vector<DeviceSet> sets_;                   // by key
  std::array<std::vector<DeviceSet*>, 4> steps_;  // by State: the sets each step takes, by key
  std::vector<Staying> staying_;  // held sets StaysPut kept, by key until MoveHeld orders them
  std::vector<char> overfull_;    // by node
  std::vector<Decision> decisions_;
  std::string names_;           // every device's name, in device order (PassScope::kEvery)
  std::vector<size_t> nameAt_;  // by device: where its name starts in names_, then the end
  // PassScope::kUnsettled: "namespace/VMI name" of every attachment (TrialBase::attachedTo).
  std::unordered_set<std::string> attachedTo_;
};

}  // namespace cozy::model
