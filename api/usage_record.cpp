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

UsageRecordParts DeviceUsage(const GpuDevice& device) {
  const ObjectMeta& meta = device.metadata;
  UsageRecordParts parts;
  parts.namespaceName = meta.namespaceName;
  parts.name = UsageRecordName(meta.name);
  parts.ownerApiVersion = kApiVersion;
  parts.ownerKind = kGpuDeviceKind;
  parts.ownerName = meta.name;
  parts.ownerUid = meta.uid;
  parts.type = device.spec.className;
  parts.resources[UsageResourceKey(device.spec.className)] = device.spec.count;
  parts.operational = device.Phase() == DevicePhase::kBound;
  return parts;
}

nlohmann::json UsageRecord(const GpuDevice& device) { return UsageRecord(DeviceUsage(device)); }

nlohmann::json UsageRecord(const UsageRecordParts& parts) {
  nlohmann::json resources = nlohmann::json::object();
  for (const auto& [name, count] : parts.resources) resources[name] = std::to_string(count);
  return {
      {"apiVersion", kWorkloadApiVersion},
      {"kind", kWorkloadKind},
      {"metadata",
       {{"name", parts.name},
        {"namespace", parts.namespaceName},
        {"labels",
         {{kWorkloadMonitorNameLabel, kUsageMonitorName},
          {"app.kubernetes.io/managed-by", "gpu-controller"}}},
        {"ownerReferences", nlohmann::json::array({{{"apiVersion", parts.ownerApiVersion},
                                                    {"kind", parts.ownerKind},
                                                    {"name", parts.ownerName},
                                                    {"uid", parts.ownerUid}}})}}},
      {"status",
       {{"kind", kUsageKind},
        {"type", parts.type},
        {"resources", resources},
        {"operational", parts.operational}}},
  };
}

namespace {

// The string at `key` of an object, or nullptr.
const std::string* StringAt(const nlohmann::json& object, std::string_view key) {
  if (!object.is_object()) return nullptr;
  const auto found = object.find(key);
  return found != object.end() && found->is_string() ? found->get_ptr<const std::string*>()
                                                     : nullptr;
}

bool StringIs(const nlohmann::json& object, std::string_view key, std::string_view value) {
  const std::string* found = StringAt(object, key);
  return found != nullptr && *found == value;
}

}  // namespace

bool UsageRecordCurrent(const nlohmann::json& stored, const UsageRecordParts& parts) {
  const auto metadata = stored.find("metadata");
  const auto status = stored.find("status");
  if (metadata == stored.end() || status == stored.end() || !status->is_object()) return false;
  const auto labels = metadata->find("labels");
  if (labels == metadata->end() ||
      !StringIs(*labels, kWorkloadMonitorNameLabel, kUsageMonitorName) ||
      !StringIs(*labels, "app.kubernetes.io/managed-by", "gpu-controller")) {
    return false;
  }
  bool owned = false;
  if (const auto owners = metadata->find("ownerReferences");
      owners != metadata->end() && owners->is_array()) {
    for (const nlohmann::json& owner : *owners) {
      owned = owned ||
              (StringIs(owner, "uid", parts.ownerUid) && StringIs(owner, "kind", parts.ownerKind) &&
               StringIs(owner, "name", parts.ownerName));
    }
  }
  if (!owned || status->size() != 4 || !StringIs(*status, "kind", kUsageKind) ||
      !StringIs(*status, "type", parts.type)) {
    return false;
  }
  const auto operational = status->find("operational");
  if (operational == status->end() || !operational->is_boolean() ||
      operational->get<bool>() != parts.operational) {
    return false;
  }
  const auto resources = status->find("resources");
  if (resources == status->end() || !resources->is_object() ||
      resources->size() != parts.resources.size()) {
    return false;
  }
  for (const auto& [name, count] : parts.resources) {
    if (!StringIs(*resources, name, std::to_string(count))) return false;
  }
  return true;
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

UsageRecordParts PodUsage(std::string_view namespaceName, std::string_view podName,
                          std::string_view podUid, std::map<std::string, int64_t> units,
                          bool running) {
  UsageRecordParts parts;
  parts.namespaceName = namespaceName;
  parts.name = PodUsageRecordName(podName);
  parts.ownerApiVersion = "v1";
  parts.ownerKind = "Pod";
  parts.ownerName = podName;
  parts.ownerUid = podUid;
  parts.type = kRawUsageType;
  parts.resources = std::move(units);
  parts.operational = running;
  return parts;
}

nlohmann::json PodUsageRecord(std::string_view namespaceName, std::string_view podName,
                              std::string_view podUid, const std::map<std::string, int64_t>& units,
                              bool running) {
  return UsageRecord(PodUsage(namespaceName, podName, podUid, units, running));
}

std::string UsageRecordOwner(const nlohmann::json& record) {
  const auto metadata = record.find("metadata");
  if (metadata == record.end() || !metadata->is_object()) return "no owner";
  const auto owners = metadata->find("ownerReferences");
  if (owners == metadata->end() || !owners->is_array()) return "no owner";
  for (const nlohmann::json& owner : *owners) {
    const std::string* kind = StringAt(owner, "kind");
    const std::string* apiVersion = StringAt(owner, "apiVersion");
    const std::string* name = StringAt(owner, "name");
    if (kind == nullptr || apiVersion == nullptr || name == nullptr) continue;
    if ((*kind == kGpuDeviceKind && *apiVersion == kApiVersion) ||
        (*kind == "Pod" && *apiVersion == "v1")) {
      return *kind + " " + *name;
    }
  }
  return "no owner";
}

}  // namespace cozy::api
