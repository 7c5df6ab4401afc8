// The pod webhook's pure part: pin a virt-launcher pod to the node its VMI's devices sit on by
// required node affinity on the pod itself (E13), since LiveUpdate rewrites the VMI's affinity
// from the VM template; and find which VMI a launcher pod says it belongs to.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace cozy::admission {

inline constexpr std::string_view kHostnameLabel = "kubernetes.io/hostname";
// What KubeVirt writes on a virt-launcher pod.
inline constexpr std::string_view kVmiNameLabel = "vm.kubevirt.io/name";
inline constexpr std::string_view kVmiKind = "VirtualMachineInstance";

// JSONPatch ops pinning the pod to `node`: a `kubernetes.io/hostname In [node]` expression in
// every term of spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution
// .nodeSelectorTerms (terms are ORed, a term's expressions ANDed, so every term must carry it),
// or one term holding only it where there is none. Missing parents are added. A term already
// carrying exactly that expression is left alone, so a patched pod gets no ops.
nlohmann::json PodAffinityPatch(const nlohmann::json& pod, const std::string& node);

// The name of the VMI the pod says it launches: its controller ownerReference of kind
// VirtualMachineInstance (apiVersion kubevirt.io/...), which kubevirt-controller writes and the
// raw-name policy already relies on; else its vm.kubevirt.io/name label. Nullopt when neither
// names one, or when the two disagree. Neither proves anything (whoever creates a pod writes
// both; the proof is the VMI's status.activePods, model::LauncherIndex), and the pod webhook
// needs no proof: it only pins, and a pod that lies about its VMI pins only itself.
std::optional<std::string> LauncherVmiName(const nlohmann::json& pod);

}  // namespace cozy::admission
