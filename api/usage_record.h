// GPU usage records: one Cozystack Workload (cozystack.io/v1alpha1) per held device, and one per
// pod whose GPUs no device covers (its raw-name usage, C11), under one WorkloadMonitor per tenant
// namespace. What Cozystack bills and shows a tenant as its GPU
// usage is read from these, so their shape is a contract, defined here once.
//
// The monitor's selector is the reserved key api::kUsageMonitorLabel, which the chart's policy
// keeps off every tenant object: Cozystack's monitor controller makes Workloads of the pods and
// volumes its selector matches, so a selector a tenant could match would let tenant labels shape
// (or forge) GPU usage records. This one matches nothing; only gpu-controller writes records.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "api/gpudevice.h"

namespace cozy::api {

inline constexpr std::string_view kWorkloadGroup = "cozystack.io";
inline constexpr std::string_view kWorkloadVersion = "v1alpha1";
inline constexpr std::string_view kWorkloadApiVersion = "cozystack.io/v1alpha1";
inline constexpr std::string_view kWorkloadKind = "Workload";
inline constexpr std::string_view kWorkloadMonitorKind = "WorkloadMonitor";
// Cozystack's own label: the monitor a Workload belongs to. Its Workload controller deletes a
// Workload whose monitor is missing, so the monitor is written before its records.
inline constexpr std::string_view kWorkloadMonitorNameLabel = "workloads.cozystack.io/monitor";
// The monitor gpu-controller keeps in each namespace that holds devices.
inline constexpr std::string_view kUsageMonitorName = "cozy-gpu-usage";
// The monitor's and each record's kind and type ("gpu"); a record's type is its class.
inline constexpr std::string_view kUsageKind = "gpu";
// The value the monitor's selector asks of the reserved key.
inline constexpr std::string_view kUsageMonitorLabelValue = "true";

// "gpudevice-<device>", shortened with a hash where that leaves a DNS subdomain.
std::string UsageRecordName(std::string_view deviceName);
// `gpu.cozystack.io/<class>`: the key of a record's status.resources, the count its value.
std::string UsageResourceKey(std::string_view className);

// Whether a device has a usage record: it holds GPUs of its class, as a Bound device does and
// a Lost one still does (it keeps counting against the tenant's budgets until rebound).
bool HoldsUsage(const GpuDevice& device);

// The monitor of `namespaceName` as gpu-controller writes it.
nlohmann::json UsageMonitor(std::string_view namespaceName);
// Whether a stored monitor or record already says what `desired` says (labels, owner,
// selector, spec and status), so an unchanged object is not written again.
bool UsageObjectCurrent(const nlohmann::json& stored, const nlohmann::json& desired);

// What a record says, the one description both its object (UsageRecord) and the check of a
// stored one (UsageRecordCurrent) are made from. A reconcile pass checks every record it keeps,
// so the check reads the stored object in place and builds no JSON.
struct UsageRecordParts {
  std::string namespaceName;
  std::string name;
  // Its owner, whose deletion takes the record with it (the garbage collector's, should the
  // controller not delete it first).
  std::string_view ownerApiVersion;
  std::string_view ownerKind;
  std::string ownerName;
  std::string ownerUid;
  std::string type;                          // status.type
  std::map<std::string, int64_t> resources;  // status.resources, counts as decimal strings
  bool operational = false;                  // status.operational
};
nlohmann::json UsageRecord(const UsageRecordParts& parts);
// Whether a stored record says what `parts` say: our labels (others' are left alone), the
// owner among its owner references, and the status.
bool UsageRecordCurrent(const nlohmann::json& stored, const UsageRecordParts& parts);

// A device's record: owned by the device, its type the class, its resource the class's key with
// the count, operational while the device is Bound.
UsageRecordParts DeviceUsage(const GpuDevice& device);
nlohmann::json UsageRecord(const GpuDevice& device);

// A pod's record (C11): the GPUs a pod holds that no device covers, by their raw resource names.
inline constexpr std::string_view kRawUsageType = "raw";
// "gpupod-<pod>", shortened with a hash where that leaves a DNS subdomain.
std::string PodUsageRecordName(std::string_view podName);
// Owned by the pod, its type "raw", each raw resource name with its units, operational while
// the pod runs.
UsageRecordParts PodUsage(std::string_view namespaceName, std::string_view podName,
                          std::string_view podUid, std::map<std::string, int64_t> units,
                          bool running);
nlohmann::json PodUsageRecord(std::string_view namespaceName, std::string_view podName,
                              std::string_view podUid, const std::map<std::string, int64_t>& units,
                              bool running);
// Whose a stored record is, for people: "GPUDevice <name>", "Pod <name>", or "no owner".
std::string UsageRecordOwner(const nlohmann::json& record);

}  // namespace cozy::api
