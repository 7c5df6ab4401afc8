#include "controller/snapshot_json.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "api/dra.h"
#include "api/json_field.h"
#include "api/keys.h"
#include "controller/watched.h"

namespace cozy::controller {
namespace {

using api::JsonField;

model::ResourceList QuantityMap(const JsonField& object, std::string_view key) {
  model::ResourceList list;
  if (std::optional<JsonField> map = object.Find(key)) {
    for (const auto& [name, value] : map->AsObjectMembers()) {
      list[name] = value.AsQuantityText();
    }
  }
  return list;
}

api::ObjectMeta Meta(const JsonField& item) {
  return api::ObjectMetaFromJson(item.Require("metadata"));
}

model::Namespace DecodeNamespace(const JsonField& item) {
  api::ObjectMeta meta = Meta(item);
  return model::Namespace{meta.name, std::move(meta.labels)};
}

model::ResourceQuota DecodeQuota(const JsonField& item) {
  const api::ObjectMeta meta = Meta(item);
  model::ResourceQuota quota{meta.namespaceName, meta.name, {}};
  if (std::optional<JsonField> spec = item.Find("spec")) {
    quota.hard = QuantityMap(*spec, "hard");
  }
  return quota;
}

model::Node DecodeNode(const JsonField& item) {
  api::ObjectMeta meta = Meta(item);
  model::Node node;
  node.name = meta.name;
  node.labels = std::move(meta.labels);
  if (std::optional<JsonField> spec = item.Find("spec")) {
    node.unschedulable = spec->BoolOr("unschedulable", false);
    if (std::optional<JsonField> taints = spec->Find("taints")) {
      for (const JsonField& taint : taints->AsArray()) {
        node.taints.push_back(model::Taint{taint.Require("key").AsString(),
                                           taint.StringOr("value", ""),
                                           taint.Require("effect").AsString()});
      }
    }
  }
  if (std::optional<JsonField> status = item.Find("status")) {
    if (std::optional<JsonField> conditions = status->Find("conditions")) {
      for (const JsonField& condition : conditions->AsArray()) {
        const std::string type = condition.Require("type").AsString();
        if (type == "Ready") {
          node.ready = condition.Require("status").AsString() == "True";
        }
        node.conditionsSince[type] = condition.StringOr("lastTransitionTime", "");
      }
    }
  }
  return node;
}

std::vector<model::Container> DecodeContainers(const JsonField& spec, std::string_view key) {
  std::vector<model::Container> containers;
  if (std::optional<JsonField> list = spec.Find(key)) {
    for (const JsonField& item : list->AsArray()) {
      model::Container container;
      container.name = item.StringOr("name", "");
      if (std::optional<JsonField> resources = item.Find("resources")) {
        container.requests = QuantityMap(*resources, "requests");
        container.limits = QuantityMap(*resources, "limits");
      }
      container.restartAlways = item.StringOr("restartPolicy", "") == "Always";
      containers.push_back(std::move(container));
    }
  }
  return containers;
}

model::Pod DecodePod(const JsonField& item) {
  const api::ObjectMeta meta = Meta(item);
  model::Pod pod;
  pod.namespaceName = meta.namespaceName;
  pod.name = meta.name;
  pod.uid = meta.uid;
  if (std::optional<JsonField> metadata = item.Find("metadata")) {
    if (std::optional<JsonField> owners = metadata->Find("ownerReferences")) {
      for (const JsonField& owner : owners->AsArray()) {
        if (owner.StringOr("kind", "") == "VirtualMachineInstance" &&
            owner.StringOr("apiVersion", "").starts_with("kubevirt.io/") &&
            owner.BoolOr("controller", false)) {
          pod.claimedVmi = owner.StringOr("name", "");
        }
      }
    }
  }
  if (std::optional<JsonField> spec = item.Find("spec")) {
    pod.nodeName = spec->StringOr("nodeName", "");
    pod.containers = DecodeContainers(*spec, "containers");
    pod.initContainers = DecodeContainers(*spec, "initContainers");
    pod.overhead = QuantityMap(*spec, "overhead");
  }
  if (std::optional<JsonField> status = item.Find("status")) {
    pod.phase = status->StringOr("phase", "");
  }
  return pod;
}

model::VirtualMachineInstance DecodeVmi(const JsonField& item) {
  const api::ObjectMeta meta = Meta(item);
  model::VirtualMachineInstance vmi;
  vmi.namespaceName = meta.namespaceName;
  vmi.name = meta.name;
  vmi.uid = meta.uid;
  vmi.creationTimestamp = meta.creationTimestamp;
  if (std::optional<JsonField> spec = item.Find("spec")) {
    if (std::optional<JsonField> tolerations = spec->Find("tolerations")) {
      for (const JsonField& toleration : tolerations->AsArray()) {
        // As written: the API server validated them, and Gt and Lt tolerate nothing (C9).
        vmi.tolerations.push_back(
            model::Toleration{toleration.StringOr("key", ""), toleration.StringOr("operator", ""),
                              toleration.StringOr("value", ""), toleration.StringOr("effect", ""),
                              toleration.OptionalInt("tolerationSeconds")});
      }
    }
  }
  if (std::optional<JsonField> status = item.Find("status")) {
    vmi.nodeName = status->StringOr("nodeName", "");
    vmi.phase = status->StringOr("phase", "");
    // activePods maps each active pod's UID to its node.
    if (std::optional<JsonField> activePods = status->Find("activePods")) {
      for (const auto& [uid, node] : activePods->AsObjectMembers()) {
        node.AsString();
        vmi.activePodUids.push_back(uid);
      }
    }
  }
  return vmi;
}

model::PermittedHostDevices DecodeKubeVirt(const JsonField& item) {
  model::PermittedHostDevices permitted;
  const std::optional<JsonField> spec = item.Find("spec");
  const std::optional<JsonField> configuration = spec ? spec->Find("configuration") : std::nullopt;
  const std::optional<JsonField> table =
      configuration ? configuration->Find("permittedHostDevices") : std::nullopt;
  if (!table) {
    return permitted;
  }
  if (std::optional<JsonField> pci = table->Find("pciHostDevices")) {
    for (const JsonField& entry : pci->AsArray()) {
      permitted.pciHostDevices.push_back(model::PciHostDevice{
          entry.Require("pciVendorSelector").AsString(), entry.Require("resourceName").AsString()});
    }
  }
  if (std::optional<JsonField> mediated = table->Find("mediatedDevices")) {
    for (const JsonField& entry : mediated->AsArray()) {
      permitted.mediatedDevices.push_back(model::MediatedHostDevice{
          entry.Require("mdevNameSelector").AsString(), entry.Require("resourceName").AsString()});
    }
  }
  return permitted;
}

// "GPUClass a100", "Pod tenant-a/p": how a message names the item, as far as it can be read.
std::string Describe(const nlohmann::json& item, const std::string& kind) {
  std::string name;
  if (item.is_object() && item.contains("metadata") && item["metadata"].is_object()) {
    const nlohmann::json& meta = item["metadata"];
    if (meta.contains("namespace") && meta["namespace"].is_string()) {
      name = meta["namespace"].get<std::string>() + "/";
    }
    if (meta.contains("name") && meta["name"].is_string()) {
      name += meta["name"].get<std::string>();
    }
  }
  return name.empty() ? kind : kind + " " + name;
}

}  // namespace

model::VirtualMachineInstance VmiFromJson(const nlohmann::json& object) {
  return DecodeVmi(JsonField(object, ""));
}
model::Namespace NamespaceFromJson(const nlohmann::json& object) {
  return DecodeNamespace(JsonField(object, ""));
}
model::ResourceQuota QuotaFromJson(const nlohmann::json& object) {
  return DecodeQuota(JsonField(object, ""));
}
model::Node NodeFromJson(const nlohmann::json& object) { return DecodeNode(JsonField(object, "")); }
model::Pod PodFromJson(const nlohmann::json& object) { return DecodePod(JsonField(object, "")); }
model::PermittedHostDevices KubeVirtFromJson(const nlohmann::json& object) {
  return DecodeKubeVirt(JsonField(object, ""));
}

namespace {

// A string attribute of a slice device ("" when absent or of another type), lower case.
std::string StringAttribute(const JsonField& device, std::string_view name) {
  const std::optional<JsonField> attributes = device.Find("attributes");
  const std::optional<JsonField> attribute = attributes ? attributes->Find(name) : std::nullopt;
  std::string value = attribute ? attribute->StringOr("string", "") : std::string();
  std::transform(value.begin(), value.end(), value.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return value;
}

}  // namespace

// Another driver's slice reads as one without devices; a device without the attributes as one
// no class selects (an input fails closed for what it bears on alone).
model::ResourceSlice ResourceSliceFromJson(const nlohmann::json& object) {
  const JsonField item(object, "");
  model::ResourceSlice slice;
  slice.name = Meta(item).name;
  const JsonField spec = item.Require("spec");
  slice.driver = spec.StringOr("driver", "");
  slice.nodeName = spec.StringOr("nodeName", "");
  if (std::optional<JsonField> pool = spec.Find("pool")) slice.pool = pool->StringOr("name", "");
  if (slice.driver != api::kDraDriver) return slice;
  if (std::optional<JsonField> devices = spec.Find("devices")) {
    for (const JsonField& device : devices->AsArray()) {
      slice.devices.push_back(model::SliceDevice{device.Require("name").AsString(),
                                                 StringAttribute(device, api::kPciBusIdAttribute),
                                                 StringAttribute(device, api::kVendorIdAttribute),
                                                 StringAttribute(device, api::kDeviceIdAttribute)});
    }
  }
  return slice;
}

model::ResourceClaim ResourceClaimFromJson(const nlohmann::json& object) {
  const JsonField item(object, "");
  const api::ObjectMeta meta = Meta(item);
  model::ResourceClaim claim{meta.namespaceName, meta.name, {}, ""};
  if (const auto label = meta.labels.find(std::string(api::kDraClaimLabel));
      label != meta.labels.end() && label->second == api::kDraClaimLabelValue) {
    const std::optional<JsonField> owners = item.Require("metadata").Find("ownerReferences");
    for (const JsonField& owner : owners ? owners->AsArray() : std::vector<JsonField>{}) {
      const std::optional<JsonField> controller = owner.Find("controller");
      if (owner.StringOr("kind", "") == api::kGpuDeviceKind && controller && controller->AsBool()) {
        claim.forDevice = owner.Require("name").AsString();
      }
    }
  }
  const std::optional<JsonField> status = item.Find("status");
  const std::optional<JsonField> allocation = status ? status->Find("allocation") : std::nullopt;
  const std::optional<JsonField> devices = allocation ? allocation->Find("devices") : std::nullopt;
  const std::optional<JsonField> results = devices ? devices->Find("results") : std::nullopt;
  if (!results) return claim;
  for (const JsonField& result : results->AsArray()) {
    if (result.StringOr("driver", "") != api::kDraDriver) continue;
    claim.devices.push_back(
        model::ClaimDevice{result.Require("pool").AsString(), result.Require("device").AsString()});
  }
  return claim;
}

model::Snapshot DecodeSnapshotList(const nlohmann::json& list) {
  model::Snapshot snapshot;
  const JsonField root(list, "");
  std::vector<JsonField> items;
  try {
    const std::string kind = root.Require("kind").AsString();
    if (!kind.ends_with("List")) {
      root.Require("kind").Fail("\"" + kind + "\" is not a List");
    }
    items = root.Require("items").AsArray();
  } catch (const api::DecodeError& error) {
    throw SnapshotError(std::string("the snapshot is no Kubernetes List: ") + error.what());
  }
  for (size_t index = 0; index < items.size(); ++index) {
    // Fields are named from the item's own root, as `kubectl explain` names them.
    const JsonField item(items[index].json(), "");
    std::string kind = "item";
    try {
      kind = item.Require("kind").AsString();
      // Each kind the model reads (the table of watched kinds, controller/watched.h) into its
      // snapshot member; the settings ConfigMap into the settings the daemon takes from flags.
      bool read = false;
      ForEachWatched([&](const auto& watched) {
        if (read || watched.objectKind != kind || !InSnapshot(watched)) return;
        AddToSnapshot(snapshot, watched, watched.decode(item.json()));
        read = true;
      });
      if (!read && kind == "ConfigMap") {
        const api::ObjectMeta meta = Meta(item);
        if (meta.name == api::kSettingsConfigMapName) {
          const std::map<std::string, std::string> data = item.StringMapOr("data");
          if (const auto it = data.find(std::string(api::kSettingsResourceNamesKey));
              it != data.end()) {
            snapshot.settings.resourceNames = SplitResourceNames(it->second);
          }
        }
      }
    } catch (const api::DecodeError& error) {
      throw SnapshotError("items[" + std::to_string(index) + "] (" + Describe(item.json(), kind) +
                          "): " + error.what());
    }
  }
  return snapshot;
}

std::vector<std::string> SplitResourceNames(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    const size_t start = item.find_first_not_of(" \n\t");
    const size_t end = item.find_last_not_of(" \n\t");
    if (start != std::string::npos) {
      items.push_back(item.substr(start, end - start + 1));
    }
  }
  return items;
}

}  // namespace cozy::controller
