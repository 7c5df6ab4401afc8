// The reconcilers a gpu-controller leader runs, each a unit (plan.h's `Reconciler`), and the one
// list that registers them (StandardReconcilers): a pass plans them in this order and the
// Applier writes whatever they plan (docs/controller.md, "The reconcilers", "Adding a
// reconciler").
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "api/keys.h"
#include "controller/reconciler/plan.h"

namespace cozy::controller {

// What the reconcilers take of the flags.
struct ReconcilerOptions {
  std::string namespaceName{api::kDefaultControllerNamespace};  // --namespace: the settings' home
  std::vector<std::string> gpuResourceNames;                    // the hoster's
  bool rawNamesForbidden = false;
  // The settings' webhookCallers (api::kWebhookCallers*): whether the webhooks authenticate their
  // callers; empty with GPUs off.
  std::string webhookCallers;
};

// D15: every class carries the protection finalizer; a deleting one loses it when no device
// names it any more. New orders of it are the policy's to refuse (F5).
class ClassFinalizers : public Reconciler {
 public:
  std::string_view Name() const override { return "class-finalizers"; }
  std::vector<Part> Reads() const override { return {Part::kClasses, Part::kDevices}; }
  controller::Plan Plan(const ReconcileInput& input) const override;
};

// Devices: attachments (D14 template devices, D18), the finalizer (D13) and the release of a
// device another finalizer keeps (D19). A deleting device's finalizer waits for its usage record
// while Cozystack's kinds are served (it reads them then).
class DeviceLifecycle : public Reconciler {
 public:
  std::string_view Name() const override { return "devices"; }
  std::vector<Part> Reads() const override { return {Part::kDevices, Part::kVmiLookup}; }
  controller::Plan Plan(const ReconcileInput& input) const override;
};

// Usage records (D16) of devices and of pods' raw-name GPUs (C11, C12, with the pods when they
// are read), and their namespaces' monitors.
class UsageRecords : public Reconciler {
 public:
  std::string_view Name() const override { return "usage-records"; }
  std::vector<Part> Reads() const override {
    return {Part::kClasses, Part::kDevices, Part::kVmiLookup, Part::kUsageObjects};
  }
  controller::Plan Plan(const ReconcileInput& input) const override;
};

// The settings ConfigMap (D17, G10): its desired data is this reconciler's (SettingsData).
class SettingsConfigMap : public Reconciler {
 public:
  explicit SettingsConfigMap(ReconcilerOptions options) : options_(std::move(options)) {}
  std::string_view Name() const override { return "settings"; }
  std::vector<Part> Reads() const override { return {Part::kClasses, Part::kSettings}; }
  controller::Plan Plan(const ReconcileInput& input) const override;

 private:
  ReconcilerOptions options_;
};

// The DeviceClass of each dra class (docs/dra.md, "The DeviceClass"): created, kept as the
// class says, and deleted once its class is gone or sells through a device plugin.
class DraDeviceClasses : public Reconciler {
 public:
  std::string_view Name() const override { return "device-classes"; }
  std::vector<Part> Reads() const override { return {Part::kClasses, Part::kDraDeviceClasses}; }
  controller::Plan Plan(const ReconcileInput& input) const override;
};

// The ResourceClaim of each Bound device of a dra class (docs/dra.md, "The claims"): created when
// the device is Bound, deleted (and written anew) when it moves or changes, deleted when it is
// no longer Bound; a claim a pod holds (reserved) is left until the pod is gone.
class DraClaims : public Reconciler {
 public:
  std::string_view Name() const override { return "device-claims"; }
  std::vector<Part> Reads() const override {
    return {Part::kClasses, Part::kDevices, Part::kDraClaims};
  }
  controller::Plan Plan(const ReconcileInput& input) const override;
};
// The claim the reconciler writes for a Bound device of a dra class.
nlohmann::json DraClaim(const api::GpuDevice& device);

// The DeviceClass a dra class is allocated through: its name, and the object as the reconciler
// writes it (driver and PCI ID selected in CEL, labelled with the class, owned by it).
std::string DraDeviceClassName(std::string_view className);
nlohmann::json DraDeviceClass(const api::GpuClass& gpuClass);

// The settings ConfigMap's data: the effective GPU resource-name set as the model computes it
// (the hoster's names, every GPUNode's resourceNames, every class's resource name, KubeVirt's
// NVIDIA and mediated permittedHostDevices), sorted and comma-joined, and the raw-name policy.
std::map<std::string, std::string> SettingsData(
    const std::vector<std::string>& hosterNames,
    const model::SharedVector<api::GpuNodeInventory>& gpuNodes,
    const model::PermittedHostDevices& permitted, const std::vector<api::GpuClass>& classes,
    bool rawNamesForbidden, std::string_view webhookCallers = "");

// Every reconciler a leader runs, in the order a pass plans them.
Reconcilers StandardReconcilers(const ReconcilerOptions& options = {});

}  // namespace cozy::controller
