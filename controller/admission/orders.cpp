#include "controller/admission/orders.h"

#include "api/keys.h"
#include "controller/model/readers.h"

namespace cozy::admission {
namespace {

std::string Gpus(int64_t count) { return std::to_string(count) + (count == 1 ? " GPU" : " GPUs"); }

}  // namespace

std::optional<std::string> CheckClassOrder(const model::Model& model, std::string_view ns,
                                           std::string_view className, int64_t count,
                                           std::string_view what, bool checkRoom) {
  const std::string head =
      std::string(what) + " orders " + Gpus(count) + " of class " + std::string(className);
  const std::optional<model::ClassRoom> room = model.Room(className);
  if (!room) {
    return head + ", but no GPUClass " + std::string(className) + " exists";
  }
  if (std::string why = model::ClassOrderRefusal(*room->gpuClass, room->maxCount, count);
      !why.empty()) {
    return head + ", but " + why;
  }
  if (room->gpuClass->spec.mode == api::GpuMode::kVgpu && !model.VgpuEntitled(ns)) {
    return head + ", a vGPU class, but namespace " + std::string(ns) +
           " is not entitled to vGPUs (ask the hoster to label it or a parent tenant " +
           std::string(api::kVgpuEntitledLabel) + "=" + std::string(api::kVgpuEntitledLabelValue) +
           ")";
  }
  if (!checkRoom) {
    return std::nullopt;
  }
  if (count > room->free && room->unreadEverywhere) {
    // Fails closed, with why: an empty catalog is not what the replica read (docs/dra.md, "When
    // the slices cannot be read").
    return head +
           ", but its GPUs are counted from gpu-agent's ResourceSlices and the "
           "cluster's ResourceClaims, which this replica cannot read now (" +
           room->unread + "); try again in a moment";
  }
  if (count > room->free) {
    std::string blocked;
    if (room->freeElsewhere > 0) {
      // Units the class cannot take are named with why, so a hoster's tainted pool without the
      // class's toleration reads as that, not as a full cluster (docs/install.md, "GPU nodes behind
      // a taint").
      blocked = " (" + std::to_string(room->freeElsewhere) +
                " more on nodes that take none of its orders now; " + room->firstBlocked +
                (room->gpuClass->spec.tolerations.empty() &&
                         room->firstBlocked.find("taint ") != std::string::npos
                     ? "; the class tolerates no taint"
                     : "") +
                ")";
    }
    if (!room->unread.empty())
      blocked += " (" + room->unread + ": its units there are not counted)";
    return head + ", but only " + std::to_string(room->free) +
           " are free on the nodes that take orders now" + blocked;
  }
  if (count > room->largestNodeFree) {
    return head + ", but no single node has that many free: " + std::to_string(room->free) +
           " are free in all, at most " + std::to_string(room->largestNodeFree) + " on node " +
           room->largestNode + ", and one order's GPUs must share a node";
  }
  return std::nullopt;
}

std::optional<std::string> CheckOrder(const model::Model& model, const model::Snapshot& snapshot,
                                      const api::GpuDevice& order) {
  (void)snapshot;  // every rule reads the model, which was built from it
  const std::string& ns = order.metadata.namespaceName;
  const std::string& className = order.spec.className;
  const std::string what = "GPUDevice " + ns + "/" + order.metadata.name;
  // A template device is created by the VMI webhook once it has placed the VM's whole set, with
  // the VMI's tolerations as well as the class's: a second room check here, without them, could
  // refuse it after the held devices were attached, breaking "every refusal before any write"
  // (E5). Only the platform may set the mark (gpu-device-platform-fields), and
  // the binder checks room again when it places the device.
  const auto mark = order.metadata.labels.find(std::string(api::kTemplateDeviceLabel));
  const bool templateDevice =
      mark != order.metadata.labels.end() && mark->second == api::kTemplateDeviceLabelValue;
  if (std::optional<std::string> refusal =
          CheckClassOrder(model, ns, className, order.spec.count, what, !templateDevice)) {
    return refusal;
  }
  if (std::optional<std::string> budget =
          model.CheckNewOrder(ns, {{className, order.spec.count}})) {
    const model::RemainingBudget remaining = model.Remaining(ns, className);
    std::string left;
    if (remaining.remaining) {
      left = "; " + std::to_string(*remaining.remaining) + " of class " + className +
             " remain to order in " + ns + " (limited by " + remaining.key + " of " +
             remaining.limitedBy + ")";
    }
    return what + " orders " + Gpus(order.spec.count) + " of class " + className + ", but " +
           *budget + left;
  }
  return std::nullopt;
}

}  // namespace cozy::admission
