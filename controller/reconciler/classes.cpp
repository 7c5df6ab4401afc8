#include <set>

#include "api/keys.h"
#include "controller/reconciler/reconcilers.h"
#include "controller/reconciler/shared.h"

namespace cozy::controller {

using namespace reconciler;

controller::Plan ClassFinalizers::Plan(const ReconcileInput& input) const {
  controller::Plan plan;
  std::set<std::string> classesHeld;
  for (const auto& device : input.devices) {
    classesHeld.insert(device->spec.className);
  }
  for (const auto& gpuClass : input.classes) {
    const api::ObjectMeta& meta = gpuClass->metadata;
    const bool has = HasFinalizer(meta, api::kClassFinalizer);
    if (!meta.deletionTimestamp) {
      if (!has) {
        plan.actions.push_back(ObjectAction("add-class-finalizer", ClassTarget(meta),
                                            Verb::kMergePatch, meta,
                                            FinalizersPatch(meta, api::kClassFinalizer, true),
                                            "every class is protected while devices hold it"));
      }
    } else if (has) {
      if (classesHeld.count(meta.name) != 0) {
        ++plan.waiting.classesWithHolders;
      } else {
        plan.actions.push_back(ObjectAction(
            "remove-class-finalizer", ClassTarget(meta), Verb::kMergePatch, meta,
            FinalizersPatch(meta, api::kClassFinalizer, false), "deleting and no device holds it"));
      }
    }
  }
  return plan;
}

}  // namespace cozy::controller
