// The GPU reconciler's decisions, as a pure function: the cluster as the caches see it goes in,
// the writes that bring it to what the design asks come out. It runs on every cluster, GPUs on
// or off (G1): finalizers of classes and devices, attachments whose VMI ended or never came,
// template devices, usage records and the settings ConfigMap. Placement is the binder's.
//
// The reconciler is level-based: each pass plans from scratch, and a write that changes what
// another step needs (a record deleted before the finalizer that waits for it goes, a monitor
// created before its records) is planned in the pass after the cache shows it.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/gpuclass.h"
#include "api/gpudevice.h"
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
  // The settings ConfigMap: planned only when `settings` is set (the leader, its cache synced).
  struct Settings {
    std::optional<nlohmann::json> stored;  // nullopt: absent
    std::map<std::string, std::string> data;
    std::string namespaceName;
    std::string name;
  };
  std::optional<Settings> settings;
  std::chrono::system_clock::time_point now;
  std::chrono::seconds attachmentGrace{120};
};

enum class ActionKind {
  kAddClassFinalizer,
  kRemoveClassFinalizer,
  kAddDeviceFinalizer,
  kRemoveDeviceFinalizer,
  kStampAttachment,  // an attachment without attachedAt: the grace counts from now
  kMatchAttachment,  // the VMI appeared: record its UID
  kClearAttachment,  // the VMI ended, or never came within the grace
  // D19: a deleting device no VMI uses, kept by a finalizer not ours: its units are released
  // (status back to Pending, no node) before its usage record and our finalizer go.
  kReleaseDevice,
  kDeleteTemplateDevice,
  kApplyMonitor,
  kDeleteMonitor,
  kApplyRecord,
  kDeleteRecord,
  kApplySettings,
};
std::string_view ToString(ActionKind kind);
// The kind of object an action writes: GPUClass, GPUDevice, WorkloadMonitor, Workload, ConfigMap.
std::string_view TargetKind(ActionKind kind);

struct Action {
  ActionKind kind;
  std::string namespaceName;
  std::string name;
  // Preconditions: the write applies only to the object as the plan saw it (409 otherwise).
  // Empty for a create.
  std::string resourceVersion;
  std::string uid;
  // A merge patch (finalizers, attachments) or the desired object (monitors, records,
  // settings; merged into `stored` when it exists).
  nlohmann::json body;
  std::optional<nlohmann::json> stored;
  std::string reason;  // for the log
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

Plan PlanReconcile(const ReconcileInput& input);

}  // namespace cozy::controller
