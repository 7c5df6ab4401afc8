// The model's input: a snapshot of the cluster as plain values. Each caller builds it from its
// own cache (the binder's informers, a webhook's, `simulate`'s file), so the model itself does
// no I/O and every caller gets the same answers from the same objects.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "api/gpuclass.h"
#include "api/gpudevice.h"
#include "api/gpunode_types.h"
#include "api/meta.h"

namespace cozy::model {

using ResourceList = std::map<std::string, std::string>;  // resource name -> quantity text

struct Namespace {
  std::string name;
  api::Labels labels;
};

struct ResourceQuota {
  std::string namespaceName;
  std::string name;
  ResourceList hard;  // spec.hard; quantities are read by the model, so a bad one is an error
};

struct Taint {
  std::string key;
  std::string value;
  std::string effect;  // NoSchedule | PreferNoSchedule | NoExecute
};

struct Toleration {
  std::string key;  // empty with Exists: every key
  std::string op;   // Equal (the default when empty) | Exists | Gt | Lt
  std::string value;
  std::string effect;  // empty: every effect
};

struct Node {
  std::string name;
  api::Labels labels;
  bool unschedulable = false;  // spec.unschedulable: the cordon
  bool ready = false;          // the Ready condition is True
  std::vector<Taint> taints;
};

struct Container {
  std::string name;
  ResourceList requests;
  ResourceList limits;
  bool restartAlways = false;  // an init container with restartPolicy Always: a sidecar
};

struct Pod {
  std::string namespaceName;
  std::string name;
  std::string uid;
  std::string nodeName;  // empty until scheduled
  std::string phase;     // Pending | Running | Succeeded | Failed | Unknown
  std::vector<Container> initContainers;
  std::vector<Container> containers;
  ResourceList overhead;  // spec.overhead
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

// What the hoster configured (flags, published in the settings ConfigMap).
struct Settings {
  std::vector<std::string> resourceNames;  // the hoster's GPU resource-name list
};

struct Snapshot {
  std::vector<Namespace> namespaces;
  std::vector<ResourceQuota> quotas;
  std::vector<Node> nodes;
  std::vector<Pod> pods;
  std::vector<api::GpuNodeInventory> gpuNodes;
  std::vector<api::GpuClass> classes;
  std::vector<api::GpuDevice> devices;
  std::vector<VirtualMachineInstance> vmis;
  PermittedHostDevices permittedHostDevices;
  Settings settings;
};

}  // namespace cozy::model
