// The pod webhook's pure part: pin a virt-launcher pod to the node its VMI's devices sit on by
// required node affinity on the pod itself (E13), since LiveUpdate rewrites the VMI's affinity
// from the VM template, tolerating that node's cordon (D10); and find which VMI
// a launcher pod says it belongs to.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/gpuclass.h"
#include "api/gpudevice.h"
#include "api/meta.h"
#include "controller/admission/review.h"

namespace cozy::admission {

// The node field a NodeSelectorTerm's matchFields selects on: the Node's name, exactly, whatever
// its labels say.
inline constexpr std::string_view kNodeNameField = "metadata.name";
// The taint a cordon (spec.unschedulable) puts on a node, which kube-scheduler's
// NodeUnschedulable filter checks whether or not the node lifecycle controller has written it.
inline constexpr std::string_view kUnschedulableTaint = "node.kubernetes.io/unschedulable";
// What KubeVirt writes on a virt-launcher pod.
inline constexpr std::string_view kVmiNameLabel = "vm.kubevirt.io/name";
inline constexpr std::string_view kVmiKind = "VirtualMachineInstance";

// JSONPatch ops pinning the pod to the Node named `node` (E13; docs/controller.md, "Launcher
// pods"):
//  - a `metadata.name In [node]` matchFields requirement in every term of
//    spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms
//    (terms are ORed, a term's requirements ANDed, so every term must carry it), or one term
//    holding only it where there is none. By the Node's name, not its kubernetes.io/hostname
//    label, which installers may set to something else.
//  - a `node.kubernetes.io/unschedulable` Exists NoSchedule toleration in spec.tolerations,
//    always: the binder answers Succeeded on a cordoned node (D10), and the pin already decides
//    the node, so the toleration lets the launcher onto that one node and no other.
// Missing parents are added. A term already carrying exactly that requirement is left alone, and
// a toleration already tolerating the cordon is kept, so a patched pod gets no ops.
//  - each of `classTolerations` (the GPUClass tolerations of the pod's devices; docs/install.md,
//    "GPU nodes behind a taint") the pod does not carry already, equal as written: the binder
//    placed the set on a node these tolerate, and the pin keeps them from letting the pod
//    anywhere else.
nlohmann::json PodPinPatch(const nlohmann::json& pod, const std::string& node,
                           const std::vector<api::Toleration>& classTolerations = {});

// The name of the VMI the pod says it launches: its controller ownerReference of kind
// VirtualMachineInstance (apiVersion kubevirt.io/...), which kubevirt-controller writes and the
// raw-name policy already relies on. A vm.kubevirt.io/name label must agree with it, and is no
// VMI name on its own (E14: whoever creates a pod writes its labels). Nullopt when no such
// owner reference names one, or when the label disagrees.
std::optional<std::string> LauncherVmiName(const nlohmann::json& pod);

// E14: the pod webhook pins, and tolerates onto the GPUs' node (its cordon, its class's taints),
// only a launcher KubeVirt's controller creates: the request's user is `kubevirtControllerUser`
// (the chart's policies.kubevirtControllerUser) and the pod names its VMI by a controller owner
// reference. Why a pod carrying the launcher labels is not one, for the refusal; nullopt for a
// launcher. Labels and owner references prove nothing alone: a tenant pod labelled as its own
// running VMI's launcher would get the cordon and class tolerations onto a GPU node.
std::optional<std::string> WhyNotALauncher(const AdmissionRequest& request,
                                           std::string_view kubevirtControllerUser);

// Where a launcher pod of VMI `vmiName` in `ns` goes (E13): its GPUDevices (those attached to the
// VMI) must all be Bound on one node, and the pod is pinned there carrying their classes'
// tolerations (as written, in the devices' order; `classes` the cluster's GPUClasses). A pod
// whose VMI has no device, a device not placed, or devices on different nodes is refused with
// the tenant's reason.
struct LauncherPin {
  std::optional<std::string> refusal;
  std::string node;
  std::vector<api::Toleration> tolerations;
};
LauncherPin PlanLauncherPin(const std::string& ns, const std::string& vmiName,
                            const std::vector<api::GpuDevice>& devices,
                            const std::vector<api::GpuClass>& classes);

// Whether every device of the set is placed (Bound, with a node): until then the pod webhook
// reads the devices past its cache, which may lag the VMI webhook's writes.
bool AllPlaced(const std::vector<api::GpuDevice>& devices);

}  // namespace cozy::admission
