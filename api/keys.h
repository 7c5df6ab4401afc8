// The names every component must spell the same way: API group, kinds, labels, annotations,
// finalizers, quota keys and the settings ConfigMap. Defined here once; the binder, the
// webhooks, the chart's policies and the tests read them from here.
#pragma once

#include <string>
#include <string_view>

namespace cozy::api {

inline constexpr std::string_view kGroup = "gpu.cozystack.io";
inline constexpr std::string_view kVersion = "v1alpha1";
inline constexpr std::string_view kApiVersion = "gpu.cozystack.io/v1alpha1";
inline constexpr std::string_view kGpuClassKind = "GPUClass";
inline constexpr std::string_view kGpuDeviceKind = "GPUDevice";
inline constexpr std::string_view kGpuNodeKind = "GPUNode";

// Finalizers. The device finalizer keeps a released device, its binding and its usage record
// until no VMI uses it; the class finalizer protects what a class sells while devices hold it.
inline constexpr std::string_view kDeviceFinalizer = "gpu.cozystack.io/device-protection";
inline constexpr std::string_view kClassFinalizer = "gpu.cozystack.io/class-protection";

// The mark the VMI webhook sets on devices it creates from a deviceTemplate; the controller
// deletes devices so marked together with their VMI. Its value is constant and never the VMI
// name, since a VMI name can exceed the 63 characters a label value allows.
inline constexpr std::string_view kTemplateDeviceLabel = "gpu.cozystack.io/template-device";
inline constexpr std::string_view kTemplateDeviceLabelValue = "true";

// A VMI (and the launcher pod KubeVirt renders from it) that references GPUDevices carries the
// label, which the webhooks select on, and the annotation, which lists the references.
inline constexpr std::string_view kDeviceReferenceLabel = "gpu.cozystack.io/device-references";
inline constexpr std::string_view kDeviceReferenceLabelValue = "true";
inline constexpr std::string_view kDeviceReferenceAnnotation = "gpu.cozystack.io/device-references";

// vGPU entitlement: the hoster sets this label, with value "true", on a tenant namespace or
// on any of its ancestor tenant namespaces; orders of a vgpu class (GPUDevice, or a VMI's device
// template) are refused in a namespace whose budget chain carries none. A namespace that is no
// tenant's is its own chain: the hoster labels it as well. Tenants cannot write namespace labels.
inline constexpr std::string_view kVgpuEntitledLabel = "gpu.cozystack.io/vgpu-entitled";
inline constexpr std::string_view kVgpuEntitledLabelValue = "true";

// The reserved key the GPU usage records' WorkloadMonitor selects on; no tenant object may
// carry it, so the monitor matches nothing and tenant labels cannot shape usage records.
inline constexpr std::string_view kUsageMonitorLabel = "gpu.cozystack.io/usage-monitor";

// A tenant namespace carries one `tenant.cozystack.io/<ancestor>` label per ancestor tenant
// namespace (tenant-root, tenant-a, ...); the key's suffix names the ancestor.
inline constexpr std::string_view kTenantLabelPrefix = "tenant.cozystack.io/";

// The one key that selects tenant namespaces: the platform sets it (any value) on every tenant
// namespace, tenant-root included, and tenants cannot write Namespace labels. The chart's
// raw-name and usage-monitor policy bindings select `Exists` on it (docs/policies.md, F16).
// Not under kTenantLabelPrefix, which would read it as an ancestor named "tenant-namespace".
inline constexpr std::string_view kTenantNamespaceLabel = "gpu.cozystack.io/tenant-namespace";

// GPU budgets, as they appear in a tenant's ResourceQuota `spec.hard`.
inline constexpr std::string_view kBudgetKeyPrefix = "requests.gpu.cozystack.io/";
// The class name reserved for the budget over all classes; no GPUClass may take it.
inline constexpr std::string_view kTotalBudgetName = "total";
inline constexpr std::string_view kTotalBudgetKey = "requests.gpu.cozystack.io/total";
// A raw key caps a GPU resource name directly: `requests.<resource name>`.
inline constexpr std::string_view kRawQuotaKeyPrefix = "requests.";

// `requests.gpu.cozystack.io/<class>`.
std::string ClassBudgetKey(std::string_view className);
// `requests.<resourceName>`, e.g. `requests.nvidia.com/GA100`.
std::string RawQuotaKey(std::string_view resourceName);

// Where the controller is installed when nobody says otherwise: the default of
// `gpu-controller run --namespace` and of `kubectl gpu --controller-namespace`. Only a default:
// the chart runs the controller with --namespace set to the release's namespace, which may be
// any, and the settings ConfigMap and the Lease live there (docs/install.md).
inline constexpr std::string_view kDefaultControllerNamespace = "cozy-system";

// The settings ConfigMap the controller publishes in its own namespace (--namespace) and the
// admission policies take as their parameter. `resourceNames` holds the effective GPU
// resource-name set, comma separated and sorted; `rawResourceNames` is the hoster's raw-name
// policy.
inline constexpr std::string_view kSettingsConfigMapName = "cozy-gpu-settings";
inline constexpr std::string_view kSettingsResourceNamesKey = "resourceNames";
inline constexpr std::string_view kSettingsRawNamePolicyKey = "rawResourceNames";
// With GPUs on: whether the webhooks serve only callers of --webhook-client-ca (authenticated)
// or any TLS client (unauthenticated, --webhook-allow-unauthenticated-callers).
inline constexpr std::string_view kSettingsWebhookCallersKey = "webhookCallers";
inline constexpr std::string_view kWebhookCallersAuthenticated = "authenticated";
inline constexpr std::string_view kWebhookCallersUnauthenticated = "unauthenticated";
inline constexpr std::string_view kRawNamePolicyAllowed = "allowed";
inline constexpr std::string_view kRawNamePolicyForbidden = "forbidden";

// The condition the binder keeps on each GPUNode: whether the node takes binds now (True; for a
// tainted node, of the classes that tolerate its taints) and, when not, why (reason Cordoned,
// NotReady, Tainted or NodeMissing; the message in words).
inline constexpr std::string_view kTakesBindsCondition = "TakesBinds";
// The condition the binder keeps on each GPUDevice it decides: True (reason Bound or Moved) once
// placed; False with the model's reason in words where it cannot place the order (reason Refused;
// the order stays Pending and every pass tries again) or loses it (reason Lost).
inline constexpr std::string_view kBoundCondition = "Bound";

// Kubernetes' own node taints for a cordon and for node health. The model leaves them to the
// node's `spec.unschedulable` and Ready condition, so a stale taint never decides alone.
inline constexpr std::string_view kTaintUnschedulable = "node.kubernetes.io/unschedulable";
inline constexpr std::string_view kTaintNotReady = "node.kubernetes.io/not-ready";
inline constexpr std::string_view kTaintUnreachable = "node.kubernetes.io/unreachable";
// The taints kube-controller-manager's node lifecycle controller writes from a node condition
// (TaintNodesByCondition): they come and go with the condition, so the model measures how long
// they have stood by that condition's lastTransitionTime (docs/controller.md, "Placement").
inline constexpr std::string_view kTaintMemoryPressure = "node.kubernetes.io/memory-pressure";
inline constexpr std::string_view kTaintDiskPressure = "node.kubernetes.io/disk-pressure";
inline constexpr std::string_view kTaintPidPressure = "node.kubernetes.io/pid-pressure";
inline constexpr std::string_view kTaintNetworkUnavailable =
    "node.kubernetes.io/network-unavailable";

}  // namespace cozy::api
