// The model's input: a snapshot of the cluster as plain values. Each caller builds it from its
// own cache (the binder's informers, a webhook's, `simulate`'s file), so the model itself does
// no I/O and every caller gets the same answers from the same objects. The cached kinds compare
// equal when the model reads nothing different in them: a cache change between two equal
// values (a status heartbeat, a field the model never reads) wakes no pass.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "api/gpuclass.h"
#include "api/gpudevice.h"
#include "api/gpunode_types.h"
#include "api/meta.h"
#include "controller/model/shared_vector.h"

namespace cozy::model {

using ResourceList = std::map<std::string, std::string>;  // resource name -> quantity text

struct Namespace {
  std::string name;
  api::Labels labels;
  bool operator==(const Namespace&) const = default;
};

struct ResourceQuota {
  std::string namespaceName;
  std::string name;
  ResourceList hard;  // spec.hard; quantities are read by the model, so a bad one is an error
  bool operator==(const ResourceQuota&) const = default;
};

struct Taint {
  std::string key;
  std::string value;
  std::string effect;  // NoSchedule | PreferNoSchedule | NoExecute
  bool operator==(const Taint&) const = default;
};

using Toleration = api::Toleration;

struct Node {
  std::string name;
  api::Labels labels;
  bool unschedulable = false;  // spec.unschedulable: the cordon
  bool ready = false;          // the Ready condition is True
  std::vector<Taint> taints;
  // Each condition's lastTransitionTime (RFC 3339) by type: how long the node has been not
  // Ready, or under the condition behind a condition taint (docs/controller.md, "Placement").
  std::map<std::string, std::string> conditionsSince;
  bool operator==(const Node&) const = default;
};

struct Container {
  std::string name;
  ResourceList requests;
  ResourceList limits;
  bool restartAlways = false;  // an init container with restartPolicy Always: a sidecar
  bool operator==(const Container&) const = default;
};

struct Pod {
  std::string namespaceName;
  std::string name;
  std::string uid;
  std::string nodeName;  // empty until scheduled
  std::string phase;     // Pending | Running | Succeeded | Failed | Unknown
  // The VMI its controller owner reference (kubevirt.io) names, "" for none: what the pod claims,
  // which proves nothing (C11). The usage records read that VMI by name for the proof (C12).
  std::string claimedVmi;
  std::vector<Container> initContainers;
  std::vector<Container> containers;
  ResourceList overhead;  // spec.overhead
  bool operator==(const Pod&) const = default;
};

struct VirtualMachineInstance {
  std::string namespaceName;
  std::string name;
  std::string uid;
  std::string nodeName;
  // status.activePods keys: the only proof that a pod is this VMI's launcher.
  std::vector<std::string> activePodUids;
  std::vector<Toleration> tolerations;  // spec.tolerations
  std::string creationTimestamp;        // RFC 3339, to the second
  std::string phase;  // status.phase: Pending, Scheduling, Scheduled, Running, ...
  bool operator==(const VirtualMachineInstance&) const = default;

  bool Ended() const { return phase == "Succeeded" || phase == "Failed"; }
  // On a node and not ended: a VM runs there (or is starting there), whose GPUs never move.
  bool RunsOn(std::string_view node) const {
    return !nodeName.empty() && nodeName == node && !Ended();
  }
};

// KubeVirt's spec.configuration.permittedHostDevices.
struct PciHostDevice {
  std::string pciVendorSelector;  // "VVVV:DDDD", hex
  std::string resourceName;
};
struct MediatedHostDevice {
  std::string mdevNameSelector;
  std::string resourceName;
};
struct PermittedHostDevices {
  std::vector<PciHostDevice> pciHostDevices;
  std::vector<MediatedHostDevice> mediatedDevices;
};

// A ResourceSlice of gpu-agent's DRA driver (api::kDraDriver; docs/dra.md): what a dra class
// sells on its node.
struct SliceDevice {
  std::string name;        // the device's name in its pool
  std::string pciAddress;  // resource.kubernetes.io/pciBusID; "" when absent
  std::string vendorId;    // the driver's vendorID and deviceID attributes, lower case
  std::string deviceId;
  bool operator==(const SliceDevice&) const = default;
};

struct ResourceSlice {
  std::string name;
  std::string driver;    // spec.driver: only api::kDraDriver's count
  std::string nodeName;  // spec.nodeName
  std::string pool;      // spec.pool.name
  std::vector<SliceDevice> devices;
  bool operator==(const ResourceSlice&) const = default;
};

// An allocated ResourceClaim, as far as it holds devices of gpu-agent's driver.
struct ClaimDevice {
  std::string pool;
  std::string device;
  bool operator==(const ClaimDevice&) const = default;
};

struct ResourceClaim {
  std::string namespaceName;
  std::string name;
  std::vector<ClaimDevice> devices;  // status.allocation.devices.results of api::kDraDriver
  // The GPUDevice (in the claim's namespace) whose claim the reconciler wrote it as (its label
  // api::kDraClaimLabel and its controller owner); "" for any other claim.
  std::string forDevice;
  bool operator==(const ResourceClaim&) const = default;
};

// What the hoster configured (flags, published in the settings ConfigMap).
struct Settings {
  std::vector<std::string> resourceNames;  // the hoster's GPU resource-name list
  // How long a held set whose VM is off waits on a node that is not Ready, or under a
  // condition taint, before it moves (--not-ready-grace; docs/controller.md, "Placement"). The
  // default is the 300 s kube-apiserver's DefaultTolerationSeconds gives every pod for the
  // not-ready and unreachable taints, after which kube-controller-manager evicts the pods
  // themselves.
  int64_t notReadyGraceSeconds = 300;
};

struct Snapshot {
  std::vector<Namespace> namespaces;
  std::vector<ResourceQuota> quotas;
  // The big lists are shared between copies of the snapshot, and with the caches they were
  // read from, until one changes them (SharedVector): a view or a pass made after one change
  // costs a pointer per object, not a deep copy of each.
  SharedVector<Node> nodes;
  SharedVector<Pod> pods;
  SharedVector<api::GpuNodeInventory> gpuNodes;
  std::vector<api::GpuClass> classes;
  SharedVector<api::GpuDevice> devices;
  SharedVector<VirtualMachineInstance> vmis;
  // DRA (docs/dra.md): the agent's slices, where a dra class's units are, and the claims
  // allocated devices of its driver, which hold them.
  SharedVector<ResourceSlice> resourceSlices;
  SharedVector<ResourceClaim> resourceClaims;
  // Why the replica cannot read the slices and claims now (resource.k8s.io not served, or their
  // caches not synced yet); empty while it can. While it is set, no node's dra units are known:
  // each node serves its dra classes exactly what their Bound devices hold there, so nothing
  // held moves and nothing new is placed (D22; docs/dra.md, "When the slices cannot be read").
  std::string draUnknown;
  PermittedHostDevices permittedHostDevices;
  Settings settings;
  // The caller's clock (RFC 3339) when it read the snapshot, against which the grace is
  // measured; empty: no clock, every grace has run out (the model itself reads no clock).
  std::string now;
};

}  // namespace cozy::model
