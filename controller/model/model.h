// The shared model: capacity, budgets and placement computed one way for every caller (the
// binder, the webhooks, what shows a tenant its remaining budget, `simulate`). A snapshot value
// goes in, plain values come out; no I/O and no clock.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "controller/model/readers.h"
#include "controller/model/snapshot.h"

namespace cozy::model {

struct ClassView {
  std::string name;
  std::optional<int64_t> maxCount;  // nullopt: no limit
  // Where its GPUs come from: "devicePlugin <resource name>" or "dra <PCI vendor:device>".
  std::string source;
  int64_t units = 0;  // served by the nodes its nodeSelector selects
  // Of those, held on the nodes with a GPUNode (NodeClassView::used, summed over
  // ClusterView::nodes): `kubectl gpu catalog`'s USED.
  int64_t used = 0;
  int64_t free = 0;  // of those, free on nodes that take its binds now
};

struct NodeClassView {
  int64_t units = 0;  // served for the class's resource name
  int64_t used = 0;   // held by bound devices and by pods no bound device covers
  int64_t free = 0;
};

struct NodeView {
  std::string name;
  bool eligible = false;  // takes binds, for at least one class (a tainted pool: the tolerating)
  std::vector<std::string> reasons;  // why not eligible
  std::map<std::string, NodeClassView> classes;
};

// One class's room now, for a check per order without the whole View(): its free units on the
// nodes it selects that take binds with the class's tolerations, and the node with the most.
struct ClassRoom {
  const api::GpuClass* gpuClass = nullptr;  // the snapshot's
  std::optional<int64_t> maxCount;          // resolved (ResolveMaxCount)
  int64_t free = 0;                         // as ClassView::free
  int64_t largestNodeFree = 0;              // the most free units on one such node
  std::string largestNode;                  // that node (the first by name on a tie); "" if none
  // Free units on nodes the class selects that take no binds for it, and why the first such
  // node does not ("node n1: taint gpu=a:NoSchedule not tolerated"), for a refusal's reason.
  int64_t freeElsewhere = 0;
  std::string firstBlocked;
  // A dra class whose units cannot be counted now, and why: the replica cannot read the slices
  // and claims (Snapshot::draUnknown), or a node it selects has no slice now ("node n1 and 2
  // more publish no ResourceSlice of gpu-agent now"); empty otherwise. Such a node offers no
  // free unit (D22).
  std::string unread;
  bool unreadEverywhere = false;  // the former: no node's units are known
};

// What a later order of a class in a tenant is checked against.
struct RemainingBudget {
  std::optional<int64_t> remaining;  // nullopt: no budget applies
  std::string limitedBy;             // the namespace whose budget leaves the least
  std::string key;                   // its quota key
  bool blockedByRawKey = false;      // a raw key without a GPU key in limitedBy
};

struct TenantClassView {
  int64_t used = 0;  // GPUs of the class ordered in the tenant and its sub-tenants
  RemainingBudget budget;
};

struct TenantView {
  std::string name;
  std::map<std::string, TenantClassView> classes;
};

struct ClusterView {
  std::set<std::string> gpuResourceNames;  // the effective set
  std::vector<ClassView> classes;          // by name
  std::vector<NodeView> nodes;             // nodes with a GPUNode, by name
  std::vector<TenantView> tenants;         // by name
};

enum class Action { kBind, kMove, kLost, kKeep, kRefuse };

// The reason of a keep whose set stays on a node that keeps it, whatever room the others have:
// no problem on the node, nothing over its units.
inline constexpr std::string_view kHeldReason = "held";
std::string_view ToString(Action action);

// One device's outcome in a binder pass.
struct Decision {
  std::string deviceNamespace;
  std::string deviceName;
  Action action = Action::kKeep;
  std::string node;    // bind, move, keep: the node; lost, refuse: empty
  std::string reason;  // for a person
  // keep: the devices stay on `node`, but a VM cannot start on them there now (its node is not
  // Ready within the grace, or the class is gone); a bind request is answered Failed with the
  // reason (docs/controller.md, "Placement", step 2).
  bool startRefused = false;

  // Whether a VM start on this device goes ahead on `node`: bound, moved or kept there.
  bool StartsOnNode() const {
    return (action == Action::kBind || action == Action::kMove || action == Action::kKeep) &&
           !node.empty() && !startRefused;
  }
};

// Which sets a pass decides. kEvery: all. kUnsettled: all but the held sets it keeps where they
// are with kHeldReason and no bind request waiting on them (a set on one node that takes binds,
// serves its classes and holds no more than it serves), which are most of a settled cluster
// (docs/controller.md, "Unsettled sets"). Its decisions are those of a kEvery pass over the same
// snapshot, in the same order, less the keeps of the sets left out: a set kept where it is changes
// nothing in the room or the budgets the other decisions are made on. What an answers-only binder
// pass writes (the answers to requests, the moves and losses that free units) is all among them.
enum class PassScope { kEvery, kUnsettled };

// A VM start as the VMI webhook tries it before admitting it (admission::PlanVmiStart): the
// set its VMI will hold, made of held devices of the snapshot and of templates to create, all
// attached to a new VMI of the name and asking to be bound.
struct StartTrial {
  std::string namespaceName;
  std::string vmiName;
  std::string now;                        // RFC 3339: the templates' creation time
  std::vector<size_t> held;               // the snapshot's own devices, by index
  std::vector<api::GpuDevice> templates;  // as they will be created
};

// Free units by node and resource name as a pass counts them (served, less what Bound devices
// and the pods no device covers hold), for the classes' resource names.
struct FreeUnits {
  std::set<std::string> resources;
  std::unordered_map<std::string, std::map<std::string, int64_t, std::less<>>> byNode;
  // What AbsorbPodChange itself took from byNode for each pod (namespace/name): node, resource,
  // units. It gives exactly that back when the pod stops holding units, never more, so the
  // room never counts as free a unit a pass counted held.
  struct Taken {
    std::string node;
    std::string resource;
    int64_t units = 0;
  };
  std::unordered_map<std::string, std::vector<Taken>> taken;
};

// Whether a pod's change (before, after: null for none) cannot change a decision of a pass that
// decided only held keeps (kHeldReason) and left `room` free (docs/controller.md, "Who wakes for a
// change"). Such a pass looked at no room but to find the nodes holding more than they serve, whose
// sets then leave; so a pod that frees units, holds none, asks for no class's resource, is on no
// node, or held the same there before, changes nothing, and a pod that now holds units changes
// nothing when they fit in its node's room, which it then takes (so the pods after it are weighed
// against what is left). A pod that stops holding units gives back what this function took for it
// (FreeUnits::taken), and nothing a pass counted: a churn of pods that start and end on a node
// does not use its room up. False for anything else: a pass must decide.
bool AbsorbPodChange(FreeUnits& room, const Pod* before, const Pod* after);

class Model {
 public:
  // Reads and indexes the snapshot, which must outlive the model. It is total: an input out of
  // range or unreadable is read the way that fails closed for its own owner alone and listed in
  // Problems() (InputProblem); nothing in a snapshot makes it throw.
  // With `previous` (a model of an earlier snapshot; null: none), the same model, built with what
  // that one read where this snapshot shares it: the same Node objects and equal classes, the
  // same GPUNode objects, the very same device objects (Snapshot's SharedVectors, as
  // ClusterCaches fills them).
  // After one pod's or one device's change, the devices are not read again (docs/controller.md,
  // "The model before lends the next one what did not change"). `previous` and its snapshot need to
  // live only during the call.
  explicit Model(const Snapshot& snapshot, const Model* previous = nullptr);
  // The index views the snapshot's strings: a temporary snapshot would leave it dangling.
  explicit Model(const Snapshot&& snapshot, const Model* previous = nullptr) = delete;
  // How many of the snapshot's devices were read from their objects; the others' numbers were
  // copied from the previous model.
  size_t DevicesRead() const;
  // The inputs read that way: GPUNode reports, pods' requests, budgets (in that order), then
  // the namespaces of the tenant tree that lack the tenant-namespace label (F18).
  const std::vector<InputProblem>& Problems() const;
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  ClusterView View() const;
  // View() without the tenants (each one's budgets walked per class) or the effective GPU
  // resource names: the classes and nodes alone, what the leader exports as its catalog metrics
  // after each full binder pass (docs/controller.md, "Catalog metrics").
  ClusterView CapacityView() const;
  RemainingBudget Remaining(std::string_view tenant, std::string_view className) const;
  // Free units of a class on one node, or nullopt when the node does not serve the class.
  std::optional<NodeClassView> NodeClass(std::string_view node, std::string_view className) const;
  // The class's room, or nullopt when no class has the name.
  std::optional<ClassRoom> Room(std::string_view className) const;
  // Why a new order of these GPUs (class name -> count, all in `ns`) would exceed a budget of
  // `ns` or of an ancestor, counted on top of every existing order, or nullopt; as the binder
  // checks a new order (raw keys blocking included). Unknown classes are left out.
  std::optional<std::string> CheckNewOrder(std::string_view ns,
                                           const std::map<std::string, int64_t>& counts) const;
  // The index in the snapshot's devices of the device `ns`/`name`, or nullopt. It compares
  // the names of that namespace's devices alone.
  std::optional<size_t> FindDevice(std::string_view ns, std::string_view name) const;
  // Whether `ns` or an ancestor tenant namespace carries api::kVgpuEntitledLabel "true".
  bool VgpuEntitled(std::string_view ns) const;
  // The decisions of one binder pass, in the order the binder takes them: restore the set
  // invariant, move held sets off nodes that cannot keep them, rebind Lost sets, bind new orders.
  std::vector<Decision> PlanPass(PassScope scope = PassScope::kEvery) const;
  // Every node's free units (FreeUnits), before any decision of a pass.
  FreeUnits Free() const;
  // The decisions for the members of a VM start's set that PlanPass would make on a copy of the
  // snapshot with the start applied (its set attached to a new VMI of the name, with no
  // tolerations of its own, each member asking to be bound; the time the start's), found
  // without that copy: from one pass over the snapshot's unsettled sets, made on the first call and
  // kept, and the set's own step. Nullopt where the set's turn cannot be told that way (a VMI
  // of the name exists, devices are attached to its name, the set would be rebound from Lost or
  // would wait behind sets it changes, ...): the caller then runs the whole pass. Thread-safe.
  std::optional<std::vector<Decision>> PlanStart(const StartTrial& trial) const;

 private:
  friend class PassPlanner;
  struct Index;
  std::unique_ptr<Index> index_;
  struct TrialBase;
  mutable std::once_flag trialOnce_;
  mutable std::unique_ptr<TrialBase> trialBase_;
};

}  // namespace cozy::model
