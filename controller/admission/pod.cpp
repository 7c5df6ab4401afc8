#include "controller/admission/pod.h"

#include <algorithm>
#include <array>
#include <set>

#include "api/keys.h"

namespace cozy::admission {
namespace {

// A matchFields requirement on the Node's name: exact, and needing no label (a
// `kubernetes.io/hostname` label may differ from the name). kube-scheduler takes one value for
// In on a field.
nlohmann::json NameIn(const std::string& node) {
  return {{"key", kNodeNameField}, {"operator", "In"}, {"values", nlohmann::json::array({node})}};
}

bool Pins(const nlohmann::json& term, const std::string& node) {
  const auto fields = term.find("matchFields");
  if (fields == term.end() || !fields->is_array()) {
    return false;
  }
  for (const nlohmann::json& field : *fields) {
    if (field.is_object() && field.value("key", "") == kNodeNameField &&
        field.value("operator", "") == "In" && field.contains("values") &&
        field["values"] == nlohmann::json::array({node})) {
      return true;
    }
  }
  return false;
}

nlohmann::json CordonToleration() {
  return {{"key", kUnschedulableTaint}, {"operator", "Exists"}, {"effect", "NoSchedule"}};
}

// Whether a toleration tolerates the cordon's taint (key node.kubernetes.io/unschedulable, no
// value, effect NoSchedule), as kube-scheduler matches them.
bool ToleratesCordon(const nlohmann::json& toleration) {
  if (!toleration.is_object()) {
    return false;
  }
  const auto text = [&](const char* key) {
    const auto it = toleration.find(key);
    return it != toleration.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  const std::string effect = text("effect");
  if (!effect.empty() && effect != "NoSchedule") {
    return false;
  }
  const std::string key = text("key");
  const std::string op = text("operator");
  if (key.empty()) {
    return op == "Exists";  // an empty key with Exists tolerates every taint
  }
  if (key != kUnschedulableTaint) {
    return false;
  }
  return op == "Exists" || ((op.empty() || op == "Equal") && text("value").empty());
}

// The toleration ops: the cordon's, if the pod does not tolerate it yet, and each class
// toleration the pod does not carry. Runs after the affinity ops, which add spec where it is
// missing.
void AddTolerations(const nlohmann::json& pod, const std::vector<api::Toleration>& classTolerations,
                    nlohmann::json& ops) {
  const nlohmann::json* tolerations = nullptr;
  if (const auto spec = pod.find("spec"); spec != pod.end() && spec->is_object()) {
    if (const auto it = spec->find("tolerations"); it != spec->end() && it->is_array()) {
      tolerations = &*it;
    }
  }
  std::vector<nlohmann::json> wanted;
  const bool cordonTolerated =
      tolerations != nullptr &&
      std::any_of(tolerations->begin(), tolerations->end(), ToleratesCordon);
  if (!cordonTolerated) {
    wanted.push_back(CordonToleration());
  }
  for (const api::Toleration& toleration : classTolerations) {
    const nlohmann::json value = api::ToJson(toleration);
    const bool carried =
        (tolerations != nullptr &&
         std::find(tolerations->begin(), tolerations->end(), value) != tolerations->end()) ||
        std::find(wanted.begin(), wanted.end(), value) != wanted.end();
    if (!carried) {
      wanted.push_back(value);
    }
  }
  if (wanted.empty()) {
    return;
  }
  if (tolerations == nullptr) {
    ops.push_back({{"op", "add"}, {"path", "/spec/tolerations"}, {"value", wanted}});
    return;
  }
  for (nlohmann::json& value : wanted) {
    ops.push_back({{"op", "add"}, {"path", "/spec/tolerations/-"}, {"value", std::move(value)}});
  }
}

nlohmann::json AffinityPatch(const nlohmann::json& pod, const std::string& node) {
  nlohmann::json ops = nlohmann::json::array();
  const nlohmann::json term = {{"matchFields", nlohmann::json::array({NameIn(node)})}};
  // From the innermost wanted member outwards: add at the first level that exists.
  const std::array<const char*, 5> keys = {"spec", "affinity", "nodeAffinity",
                                           "requiredDuringSchedulingIgnoredDuringExecution",
                                           "nodeSelectorTerms"};
  const nlohmann::json* at = &pod;
  std::string path;
  size_t depth = 0;
  for (; depth < keys.size(); ++depth) {
    if (!at->is_object()) {
      break;
    }
    const auto it = at->find(keys[depth]);
    if (it == at->end() || it->is_null()) {
      break;
    }
    at = &*it;
    path += "/";
    path += keys[depth];
  }
  if (depth < keys.size() || !at->is_array() || at->empty()) {
    // Build what lacks below the last level that exists (an empty or odd terms list is
    // replaced: it selects nothing).
    nlohmann::json value = nlohmann::json::array({term});
    const size_t from = depth < keys.size() ? depth : keys.size() - 1;
    for (size_t k = keys.size() - 1; k > from; --k) {
      value = nlohmann::json{{keys[k], std::move(value)}};
    }
    if (depth == keys.size()) {
      // nodeSelectorTerms exists but holds no term: path already points at it.
      ops.push_back({{"op", "replace"}, {"path", path}, {"value", std::move(value)}});
    } else {
      ops.push_back(
          {{"op", "add"}, {"path", path + "/" + keys[depth]}, {"value", std::move(value)}});
    }
    return ops;
  }
  for (size_t i = 0; i < at->size(); ++i) {
    const nlohmann::json& existing = (*at)[i];
    if (Pins(existing, node)) {
      continue;
    }
    const std::string termPath = path + "/" + std::to_string(i);
    const auto fields =
        existing.is_object() ? existing.find("matchFields") : nlohmann::json::const_iterator();
    if (!existing.is_object() || fields == existing.end() || !fields->is_array()) {
      ops.push_back({{"op", "add"},
                     {"path", termPath + "/matchFields"},
                     {"value", nlohmann::json::array({NameIn(node)})}});
    } else {
      ops.push_back(
          {{"op", "add"}, {"path", termPath + "/matchFields/-"}, {"value", NameIn(node)}});
    }
  }
  return ops;
}

}  // namespace

nlohmann::json PodPinPatch(const nlohmann::json& pod, const std::string& node,
                           const std::vector<api::Toleration>& classTolerations) {
  nlohmann::json ops = AffinityPatch(pod, node);
  AddTolerations(pod, classTolerations, ops);
  return ops;
}

std::optional<std::string> LauncherVmiName(const nlohmann::json& pod) {
  std::optional<std::string> owner;
  std::optional<std::string> label;
  const auto metadata = pod.find("metadata");
  if (metadata != pod.end() && metadata->is_object()) {
    if (const auto refs = metadata->find("ownerReferences");
        refs != metadata->end() && refs->is_array()) {
      for (const nlohmann::json& ref : *refs) {
        if (ref.is_object() && ref.value("kind", "") == kVmiKind &&
            ref.value("apiVersion", "").starts_with("kubevirt.io/") &&
            ref.value("controller", false) && ref.value("name", "") != "") {
          owner = ref.value("name", "");
        }
      }
    }
    if (const auto labels = metadata->find("labels");
        labels != metadata->end() && labels->is_object()) {
      const auto value = labels->find(std::string(kVmiNameLabel));
      if (value != labels->end() && value->is_string() && !value->get<std::string>().empty()) {
        label = value->get<std::string>();
      }
    }
  }
  if (!owner || (label && *owner != *label)) {
    return std::nullopt;
  }
  return owner;
}

std::optional<std::string> WhyNotALauncher(const AdmissionRequest& request,
                                           std::string_view kubevirtControllerUser) {
  const std::string label(api::kDeviceReferenceLabel);
  if (request.userInfo.username != kubevirtControllerUser) {
    return "only KubeVirt's controller (" + std::string(kubevirtControllerUser) +
           ") creates a virt-launcher pod carrying the " + label + " label; " +
           (request.userInfo.username.empty() ? std::string("this request names no user")
                                              : "this one comes from " + request.userInfo.username);
  }
  if (!LauncherVmiName(request.object)) {
    return "the pod carries the " + label +
           " label but names no VirtualMachineInstance by a controller owner reference (with a "
           "vm.kubevirt.io/name label that agrees): only a virt-launcher pod may carry it";
  }
  return std::nullopt;
}

bool AllPlaced(const std::vector<api::GpuDevice>& devices) {
  return !devices.empty() && std::all_of(devices.begin(), devices.end(), [](const auto& d) {
    return d.Phase() == api::DevicePhase::kBound && d.status.nodeName;
  });
}

LauncherPin PlanLauncherPin(const std::string& ns, const std::string& vmiName,
                            const std::vector<api::GpuDevice>& devices,
                            const std::vector<api::GpuClass>& classes) {
  LauncherPin pin;
  std::set<std::string> nodes;
  std::string notPlaced;
  for (const api::GpuDevice& device : devices) {
    if (device.Phase() == api::DevicePhase::kBound && device.status.nodeName) {
      nodes.insert(*device.status.nodeName);
    } else if (notPlaced.empty()) {
      notPlaced = "GPUDevice " + device.metadata.name + " is " +
                  std::string(api::ToString(device.Phase())) + ", not bound to a node";
    }
  }
  if (devices.empty()) {
    pin.refusal = "no GPUDevice in namespace " + ns + " is attached to VirtualMachineInstance " +
                  vmiName + ": its GPUs were not attached";
  } else if (!notPlaced.empty()) {
    pin.refusal = notPlaced + "; the launcher of " + vmiName + " would start without it";
  } else if (nodes.size() != 1) {
    pin.refusal = "the GPUDevices of " + vmiName + " are bound to different nodes";
  } else {
    // The tolerations of the devices' classes (docs/install.md, "GPU nodes behind a taint"): the
    // binder placed the set where they let it go, so the launcher carries them, and the pin keeps
    // it there.
    pin.node = *nodes.begin();
    for (const api::GpuDevice& device : devices) {
      for (const api::GpuClass& gpuClass : classes) {
        if (gpuClass.metadata.name == device.spec.className) {
          pin.tolerations.insert(pin.tolerations.end(), gpuClass.spec.tolerations.begin(),
                                 gpuClass.spec.tolerations.end());
        }
      }
    }
  }
  return pin;
}

}  // namespace cozy::admission
