// A GPUDevice's key in the binder's maps: "namespace/name", and the two as views, so that a
// pass's lookups do not build a key per decision.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "api/meta.h"

namespace cozy::controller {

inline std::string DeviceKey(const api::ObjectMeta& meta) {
  return meta.namespaceName + "/" + meta.name;
}

// A device by namespace and name, without building "ns/name" for each of a pass's decisions.
struct DeviceName {
  std::string_view ns;
  std::string_view name;
  bool operator==(const DeviceName&) const = default;
};
struct DeviceNameHash {
  size_t operator()(const DeviceName& device) const {
    const size_t ns = std::hash<std::string_view>()(device.ns);
    return ns ^ (std::hash<std::string_view>()(device.name) + 0x9e3779b97f4a7c15ULL + (ns << 6) +
                 (ns >> 2));
  }
};

// "ns/name" as views of its two parts.
inline DeviceName SplitKey(const std::string& key) {
  const size_t slash = key.find('/');
  return DeviceName{
      std::string_view(key).substr(0, slash),
      slash == std::string::npos ? std::string_view() : std::string_view(key).substr(slash + 1)};
}

}  // namespace cozy::controller
