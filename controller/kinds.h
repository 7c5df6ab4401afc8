// The kinds the controller reads and writes, each spelled once (docs/controller.md, "Keys"): group,
// version and plural, the API paths under them, and the resource discovery asks about.
#pragma once

#include <string>
#include <string_view>

#include "api/dra.h"
#include "api/gpunode.h"
#include "api/keys.h"
#include "api/usage_record.h"
#include "kube/client.h"
#include "kube/discovery.h"

namespace cozy::controller {

struct Kind {
  std::string_view group;  // "" for the core group
  std::string_view version;
  std::string_view plural;

  // The collection's path (in `ns`, or cluster-wide), an object's with `name`, or one of its
  // subresources.
  std::string Path(std::string_view ns = "", std::string_view name = "",
                   std::string_view subresource = "") const {
    return kube::ResourcePath(group, version, plural, ns, name, subresource);
  }
  // "v1", "kubevirt.io/v1": an object's apiVersion.
  std::string ApiVersion() const {
    return group.empty() ? std::string(version) : std::string(group) + "/" + std::string(version);
  }
  kube::GroupVersionResource Resource() const {
    return {std::string(group), std::string(version), std::string(plural)};
  }
};

inline constexpr Kind kGpuClasses{api::kGroup, api::kVersion, "gpuclasses"};
inline constexpr Kind kGpuDevices{api::kGroup, api::kVersion, "gpudevices"};
inline constexpr Kind kGpuNodes{api::kGroup, api::kVersion, api::kGpuNodePlural};
inline constexpr Kind kVmis{"kubevirt.io", "v1", "virtualmachineinstances"};
inline constexpr Kind kKubeVirts{"kubevirt.io", "v1", "kubevirts"};
inline constexpr Kind kWorkloads{api::kWorkloadGroup, api::kWorkloadVersion, "workloads"};
inline constexpr Kind kWorkloadMonitors{api::kWorkloadGroup, api::kWorkloadVersion,
                                        "workloadmonitors"};
inline constexpr Kind kNamespaces{"", "v1", "namespaces"};
inline constexpr Kind kResourceQuotas{"", "v1", "resourcequotas"};
inline constexpr Kind kNodes{"", "v1", "nodes"};
inline constexpr Kind kPods{"", "v1", "pods"};
inline constexpr Kind kConfigMaps{"", "v1", "configmaps"};
inline constexpr Kind kEvents{"events.k8s.io", "v1", "events"};
inline constexpr Kind kResourceSlices{api::kResourceGroup, api::kResourceVersion,
                                      api::kResourceSlicePlural};
inline constexpr Kind kResourceClaims{api::kResourceGroup, api::kResourceVersion,
                                      api::kResourceClaimPlural};
inline constexpr Kind kDeviceClasses{api::kResourceGroup, api::kResourceVersion,
                                     api::kDeviceClassPlural};

}  // namespace cozy::controller
