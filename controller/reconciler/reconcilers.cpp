#include "controller/reconciler/reconcilers.h"

#include <memory>

namespace cozy::controller {

Reconcilers StandardReconcilers(const ReconcilerOptions& options) {
  Reconcilers reconcilers;
  reconcilers.push_back(std::make_unique<ClassFinalizers>());
  reconcilers.push_back(std::make_unique<DeviceLifecycle>());
  reconcilers.push_back(std::make_unique<UsageRecords>());
  reconcilers.push_back(std::make_unique<SettingsConfigMap>(options));
  reconcilers.push_back(std::make_unique<DraDeviceClasses>());
  reconcilers.push_back(std::make_unique<DraClaims>());
  return reconcilers;
}

}  // namespace cozy::controller
