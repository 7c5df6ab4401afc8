// The GPUDevice webhook's decision: an order that cannot be met now is refused at CREATE, with
// a message naming the class, the number asked, what is free and where. Every rule is the
// shared model's (controller/model); this file only words the refusals.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "api/gpudevice.h"
#include "controller/model/model.h"
#include "controller/model/snapshot.h"

namespace cozy::admission {

// Why the order (a GPUDevice being created, not yet in the snapshot) is refused, or nullopt:
//   E1 the class does not exist or is being deleted; the count is over its resolved maxCount;
//   E4 the class is vgpu and neither the namespace nor an ancestor tenant namespace carries
//      api::kVgpuEntitledLabel "true";
//   E2 the count is over the class's free units on nodes that take binds, or over the most any
//      single node has free (a device is placed whole on one node);
//   E3 the count is over a budget of the namespace or an ancestor (raw keys blocking included).
// A template device (api::kTemplateDeviceLabel "true") skips E2: the VMI webhook that creates it
// placed the VM's whole set already, with the VMI's tolerations too (E5). A namespace that is no
// tenant's has no ancestors: only its own ResourceQuotas apply, so a hoster's namespace without GPU
// quotas orders without a budget.
std::optional<std::string> CheckOrder(const model::Model& model, const model::Snapshot& snapshot,
                                      const api::GpuDevice& order);

// E1, E4 and, with `checkRoom`, E2 for `count` GPUs of a class ordered in `ns`, worded for
// `what` ("GPUDevice tenant-a/g1"). The VMI webhook runs it per device template without E2:
// its placement pass decides room for the whole set, with the VMI's tolerations and the room
// its held devices leave when they move, which the room of nodes without tolerations cannot.
// The budget check of several orders together is model::Model::CheckNewOrder.
std::optional<std::string> CheckClassOrder(const model::Model& model, std::string_view ns,
                                           std::string_view className, int64_t count,
                                           std::string_view what, bool checkRoom = true);

}  // namespace cozy::admission
