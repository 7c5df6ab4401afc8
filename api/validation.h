// Name rules the API server enforces through the CRDs, repeated here so that a snapshot or a
// hand-written object is judged the same way offline. Each returns an empty string when the
// name is valid, else why not.
#pragma once

#include <string>
#include <string_view>

namespace cozy::api {

// RFC 1123 label: at most 63 characters of [a-z0-9-], starting and ending alphanumeric.
std::string CheckDnsLabel(std::string_view name);
// RFC 1123 subdomain: at most 253 characters, dot-separated labels.
std::string CheckDnsSubdomain(std::string_view name);

// "<first>-<second>" when that is a DNS subdomain; else its prefix cut to fit and a hash of both
// names (so the result stays a valid subdomain, its last label within 63 characters). Stable
// and distinct per pair: names derived from other objects (template devices, usage records).
std::string JoinSubdomain(std::string_view first, std::string_view second);

// A GPUClass name becomes part of a quota key (`requests.gpu.cozystack.io/<class>`), so it is a
// DNS label and never `total`, the key of the budget over all classes.
std::string CheckClassName(std::string_view name);

// A class's device-plugin resource name: a valid extended resource name (`domain/name`, the
// domain a DNS subdomain outside kubernetes.io, the name a qualified-name part), and outside
// gpu.cozystack.io, where it would read as a GPU budget key.
std::string CheckClassResourceName(std::string_view resourceName);

// A dra class's pciVendorSelector: "VVVV:DDDD", four hex digits each (any case), as KubeVirt's
// permittedHostDevices write a PCI vendor and device ID.
std::string CheckPciVendorSelector(std::string_view selector);

// B11: a GPU resource name a GPUNode reports is held to the same rule: only an extended resource
// name may become a GPU name. cpu, memory, hugepages-*, ephemeral-storage and pods have no
// domain and fail it, so one node's report can never make the raw-name policies refuse every
// pod and VM of the cluster.
inline std::string CheckGpuResourceName(std::string_view resourceName) {
  return CheckClassResourceName(resourceName);
}

}  // namespace cozy::api
