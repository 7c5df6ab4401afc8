#include "api/keys.h"
#include "controller/model/readers.h"
#include "controller/reconciler/reconcilers.h"
#include "controller/reconciler/shared.h"

namespace cozy::controller {

using namespace reconciler;

std::map<std::string, std::string> SettingsData(
    const std::vector<std::string>& hosterNames,
    const model::SharedVector<api::GpuNodeInventory>& gpuNodes,
    const model::PermittedHostDevices& permitted, const std::vector<api::GpuClass>& classes,
    bool rawNamesForbidden, std::string_view webhookCallers) {
  std::string joined;
  for (const auto& name : model::EffectiveGpuResourceNames(model::Settings{hosterNames}, gpuNodes,
                                                           permitted, classes)) {
    joined += (joined.empty() ? "" : ",") + name;
  }
  std::map<std::string, std::string> data = {
      {std::string(api::kSettingsResourceNamesKey), joined},
      {std::string(api::kSettingsRawNamePolicyKey),
       std::string(rawNamesForbidden ? api::kRawNamePolicyForbidden : api::kRawNamePolicyAllowed)}};
  if (!webhookCallers.empty()) {
    data[std::string(api::kSettingsWebhookCallersKey)] = std::string(webhookCallers);
  }
  return data;
}

controller::Plan SettingsConfigMap::Plan(const ReconcileInput& input) const {
  controller::Plan plan;
  const ReconcileInput::Settings& settings = *input.settings;
  std::vector<api::GpuClass> classes;
  for (const auto& gpuClass : input.classes) classes.push_back(*gpuClass);
  // With GPUs on, whether the webhooks authenticate their callers: `kubectl gpu` warns of an
  // install that does not.
  nlohmann::json data = nlohmann::json::object();
  for (const auto& [key, value] :
       SettingsData(options_.gpuResourceNames, settings.gpuNodes, settings.permitted, classes,
                    options_.rawNamesForbidden, options_.webhookCallers)) {
    data[key] = value;
  }
  if (settings.stored && settings.stored->value("data", nlohmann::json::object()) == data) {
    return plan;
  }
  const std::string name(api::kSettingsConfigMapName);
  const nlohmann::json desired = {
      {"apiVersion", "v1"},
      {"kind", "ConfigMap"},
      {"metadata",
       {{"name", name},
        {"namespace", options_.namespaceName},
        {"labels", {{"app.kubernetes.io/managed-by", "gpu-controller"}}}}},
      {"data", data}};
  plan.actions.push_back(ApplyAction(
      "apply-settings", InNamespace("ConfigMap", kConfigMaps, options_.namespaceName, name),
      desired, settings.stored ? &*settings.stored : nullptr,
      "the settings the admission policies read"));
  return plan;
}

}  // namespace cozy::controller
