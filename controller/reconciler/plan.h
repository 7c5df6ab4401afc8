// The GPU reconciler's decisions: the cluster as the caches see it goes in, the writes that bring
// it to what the design asks come out. It runs on every cluster, GPUs on or off (G1), as a list of
// units (controller/reconciler/reconcilers.h): each a `Reconciler` with a name, the parts of the
// pass's input it reads, and a pure `Plan` that returns actions. An action says which object it
// writes (its kind, resource, namespace, name, subresource) and how (a merge patch, a delete, a
// create or update), so one Applier (apply.h) writes any unit's actions and nothing routes them
// by unit (docs/controller.md, "The reconcilers").
//
// The reconcilers are level-based: each pass plans from scratch, and a write that changes what
// another step needs (a record deleted before the finalizer that waits for it goes, a monitor
// created before its records) is planned in the pass after the cache shows it.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/gpuclass.h"
#include "api/gpudevice.h"
#include "api/gpunode_types.h"
#include "controller/kinds.h"
#include "controller/model/snapshot.h"

namespace cozy::controller {

// What is known of a VMI named by an attachment.
struct VmiState {
  enum class Presence {
    kUnknown,  // not answerable now: the kind's cache has not synced, discovery fails, a
               // read fails, or the kind is not served, GPUs on or off (G7: a gap, never an
               // absent VMI)
    kAbsent,
    kPresent,
  };
  Presence presence = Presence::kUnknown;
  std::string uid;
  std::string creationTimestamp;  // RFC 3339
  std::string why;                // kUnknown: for the log
  // kPresent: the VMI as read, its status.activePods the proof of its launcher (C11, C12).
  std::shared_ptr<const model::VirtualMachineInstance> object;
};
using VmiLookup = std::function<VmiState(const std::string& ns, const std::string& name)>;
using JsonPtr = std::shared_ptr<const nlohmann::json>;

// One pass's input: what the caches hold now, each reconciler reading its parts (Part).
struct ReconcileInput {
  std::vector<std::shared_ptr<const api::GpuClass>> classes;
  std::vector<std::shared_ptr<const api::GpuDevice>> devices;
  VmiLookup vmis;
  // Usage records: only when Cozystack's Workload and WorkloadMonitor kinds are served and
  // their caches synced. Stored objects of ours, keyed "namespace/name" and by namespace.
  bool usageRecords = false;
  std::map<std::string, JsonPtr> records;   // "namespace/name"
  std::map<std::string, JsonPtr> monitors;  // by namespace
  // Raw-name usage records (C11): only when the pods cache has synced (GPUs on); else the pods'
  // stored records are left as they are. The pods that ask for extended resources.
  bool podRecords = false;
  std::vector<std::shared_ptr<const model::Pod>> pods;
  // What the settings ConfigMap is made of besides the classes (D17, G10), and the one stored:
  // present only when its cache was read (the daemon's passes: the leader, its cache synced).
  struct Settings {
    std::optional<nlohmann::json> stored;  // nullopt: absent
    model::SharedVector<api::GpuNodeInventory> gpuNodes;
    model::PermittedHostDevices permitted;
  };
  std::optional<Settings> settings;
  // The DeviceClasses the reconciler keeps (docs/dra.md, "The DeviceClass"): present only while
  // resource.k8s.io/v1 is served and their cache synced (GPUs on).
  std::optional<std::vector<JsonPtr>> deviceClasses;
  // The claims it writes for Bound devices of dra classes (docs/dra.md, "The claims"), by their
  // label: present under the same conditions.
  std::optional<std::vector<JsonPtr>> draClaims;
  std::chrono::system_clock::time_point now;
  std::chrono::seconds attachmentGrace{120};
  // The pass's own: each attached device's VMI as looked up, once a pass whichever reconciler
  // asks (keyed by the device's "namespace/name").
  mutable std::map<std::string, VmiState> attachedVmis;
};

// The parts of the input a reconciler reads. The classes, devices and VMIs are there in every
// pass; the usage objects while Cozystack's kinds are served and cached, the settings when read.
enum class Part {
  kClasses,
  kDevices,
  kVmiLookup,
  kUsageObjects,
  kSettings,
  kDraDeviceClasses,
  kDraClaims
};
bool Has(const ReconcileInput& input, Part part);

// The object an action writes.
struct Target {
  std::string_view kind;  // GPUClass, GPUDevice, Workload, ...: metrics' and the log's name
  Kind resource;          // its group, version and plural (controller/kinds.h)
  std::string namespaceName;
  std::string name;
  std::string subresource;  // "status", or "" for the object itself
  std::string Path() const { return resource.Path(namespaceName, name, subresource); }
  std::string CollectionPath() const { return resource.Path(namespaceName); }
};

// How an action writes its target. Every write is conditional on what the plan saw.
enum class Verb {
  kMergePatch,  // `body` as a merge patch, at `resourceVersion` (409 otherwise)
  kDelete,      // with `uid` and `resourceVersion` preconditions
  kApply,       // `body` is the desired object: created when `stored` is absent, else laid
                // over `stored` (labels, owner references, spec, status, data) and updated
};

struct Action {
  std::string what;  // "add-class-finalizer": the log's and the tests' name of the action
  Target target;
  Verb verb = Verb::kMergePatch;
  // Preconditions: the write applies only to the object as the plan saw it (409 otherwise).
  // Empty for a create.
  std::string resourceVersion;
  std::string uid;
  nlohmann::json body;
  std::optional<nlohmann::json> stored;  // kApply: the object as the cache holds it
  std::string reason;                    // for the log
  std::string reconciler;                // who planned it: set by the pass (PlanReconcile)
  // The object's key ("GPUDevice:ns/name"): one per object, whatever its subresource.
  std::string Key() const;
};

// Why an object waits rather than being written, counted for metrics and status.
struct Waiting {
  int devicesInUse = 0;        // deleting devices whose VMI still runs (D13)
  int classesWithHolders = 0;  // deleting classes with devices still naming them (D15)
  int attachmentsInGrace = 0;  // attachments whose VMI has not appeared yet (D18)
  int vmisUnknown = 0;         // attachments (and pods' claimed VMIs) that cannot be told now
  std::string vmisUnknownWhy;  // the first such VMI's reason, for the log
};

struct Plan {
  std::vector<Action> actions;
  Waiting waiting;
  // The earliest time a grace runs out: the pass to run then, even if nothing changes.
  std::optional<std::chrono::system_clock::time_point> wakeAt;
};

// One reconciler: a unit of the pass. `Plan` is pure (the input is all it reads; VMI lookups
// aside) and is called only when the input has every part `Reads` names.
class Reconciler {
 public:
  virtual ~Reconciler() = default;
  virtual std::string_view Name() const = 0;  // metrics' `reconciler` label
  virtual std::vector<Part> Reads() const = 0;
  virtual controller::Plan Plan(const ReconcileInput& input) const = 0;
};
using Reconcilers = std::vector<std::unique_ptr<const Reconciler>>;

// One pass: each reconciler whose parts the input has, in order, its actions labelled with its
// name and appended in that order; the waits summed, the earliest wake kept.
Plan PlanReconcile(const ReconcileInput& input, const Reconcilers& reconcilers);
// The same with StandardReconcilers() of default options (reconcilers.h).
Plan PlanReconcile(const ReconcileInput& input);

}  // namespace cozy::controller
