#include "api/usage_record.h"

#include "api/keys.h"
#include "api/validation.h"

namespace cozy::api {

std::string UsageRecordName(std::string_view deviceName) {
  return JoinSubdomain("gpudevice", deviceName);
}

std::string UsageResourceKey(std::string_view className) {
  std::string key(kGroup);
  key += "/";
  key += className;
  return key;
}

bool HoldsUsage(const GpuDevice& device) {
  return device.Phase() == DevicePhase::kLost ||
         (device.Phase() == DevicePhase::kBound && device.status.nodeName &&
          !device.status.nodeName->empty());
}

nlohmann::json UsageMonitor(std::string_view namespaceName) {
  return {
      {"apiVersion", kWorkloadApiVersion},
      {"kind", kWorkloadMonitorKind},
      {"metadata",
       {{"name", kUsageMonitorName},
        {"namespace", namespaceName},
        {"labels", {{"app.kubernetes.io/managed-by", "gpu-controller"}}}}},
      {"spec",
       {{"selector", {{kUsageMonitorLabel, kUsageMonitorLabelValue}}},
        {"kind", kUsageKind},
        {"type", kUsageKind}}},
  };
}

nlohmann::json UsageRecord(const GpuDevice& device) {
  const ObjectMeta& meta = device.metadata;
  return {
      {"apiVersion", kWorkloadApiVersion},
      {"kind", kWorkloadKind},
      {"metadata",
       {{"name", UsageRecordName(meta.name)},
        {"namespace", meta.namespaceName},
        {"labels",
         {{kWorkloadMonitorNameLabel, kUsageMonitorName},
          {"app.kubernetes.io/managed-by", "gpu-controller"}}},
        {"ownerReferences", nlohmann::json::array({{{"apiVersion", kApiVersion},
                                                    {"kind", kGpuDeviceKind},
                                                    {"name", meta.name},
                                                    {"uid", meta.uid}}})}}},
      {"status",
       {{"kind", kUsageKind},
        {"type", device.spec.className},
        {"resources",
         {{UsageResourceKey(device.spec.className), std::to_string(device.spec.count)}}},
        {"operational", device.Phase() == DevicePhase::kBound}}},
  };
}

bool UsageObjectCurrent(const nlohmann::json& stored, const nlohmann::json& desired) {
  const nlohmann::json& want = desired.at("metadata");
  const nlohmann::json& have = stored.value("metadata", nlohmann::json::object());
  // Labels: ours must be there with our values; others (a hoster's) are left alone.
  const nlohmann::json haveLabels = have.value("labels", nlohmann::json::object());
  const nlohmann::json wantLabels = want.value("labels", nlohmann::json::object());
  for (const auto& [key, value] : wantLabels.items()) {
    if (!haveLabels.contains(key) || haveLabels.at(key) != value) {
      return false;
    }
  }
  if (want.contains("ownerReferences")) {
    const nlohmann::json owners = have.value("ownerReferences", nlohmann::json::array());
    for (const auto& owner : want.at("ownerReferences")) {
      bool found = false;
      for (const auto& item : owners) {
        found = found || (item.value("uid", "") == owner.at("uid") &&
                          item.value("kind", "") == owner.at("kind") &&
                          item.value("name", "") == owner.at("name"));
      }
      if (!found) {
        return false;
      }
    }
  }
  for (const char* part : {"spec", "status"}) {
    if (desired.contains(part) && stored.value(part, nlohmann::json()) != desired.at(part)) {
      return false;
    }
  }
  return true;
}

std::string PodUsageRecordName(std::string_view podName) {
  return JoinSubdomain("gpupod", podName);
}

nlohmann::json PodUsageRecord(std::string_view namespaceName, std::string_view podName,
                              std::string_view podUid, const std::map<std::string, int64_t>& units,
                              bool running) {
  nlohmann::json resources = nlohmann::json::object();
  for (const auto& [name, count] : units) resources[name] = std::to_string(count);
  return {
      {"apiVersion", kWorkloadApiVersion},
      {"kind", kWorkloadKind},
      {"metadata",
       {{"name", PodUsageRecordName(podName)},
        {"namespace", namespaceName},
        {"labels",
         {{kWorkloadMonitorNameLabel, kUsageMonitorName},
          {"app.kubernetes.io/managed-by", "gpu-controller"}}},
        {"ownerReferences",
         nlohmann::json::array(
             {{{"apiVersion", "v1"}, {"kind", "Pod"}, {"name", podName}, {"uid", podUid}}})}}},
      {"status",
       {{"kind", kUsageKind},
        {"type", kRawUsageType},
        {"resources", resources},
        {"operational", running}}},
  };
}

std::string UsageRecordOwner(const nlohmann::json& record) {
  const nlohmann::json& metadata = record.value("metadata", nlohmann::json::object());
  for (const auto& owner : metadata.value("ownerReferences", nlohmann::json::array())) {
    if (!owner.is_object()) continue;
    const std::string kind = owner.value("kind", "");
    if ((kind == kGpuDeviceKind && owner.value("apiVersion", "") == kApiVersion) ||
        (kind == "Pod" && owner.value("apiVersion", "") == "v1")) {
      return kind + " " + owner.value("name", "");
    }
  }
  return "no owner";
}

}  // namespace cozy::api
