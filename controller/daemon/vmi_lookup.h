// How a reconcile pass tells whether a VMI exists; the daemon picks one per pass. With GPUs on,
// from the VMI cache, which every replica keeps once the kind is served; a kind that is not
// served, or a cache not synced, answers "unknown", so nothing is detached (G7). With GPUs off
// there is no VMI watch: each VMI an attachment names is read by name, and the API server's own
// NotFound for that VMI means it has ended, so turning GPUs off never leaves a deletion hanging
// (D12). A kind that is not served (discovery says so, or the read answers the plain 404 of an
// unserved kind) is a gap in discovery, not an ended VMI: "unknown" there too (G7). A present
// VMI comes with its object, whose status.activePods is the launcher proof the pods' usage
// records ask for (C11, C12).
#pragma once

#include <memory>

#include "controller/model/snapshot.h"
#include "controller/reconciler/plan.h"
#include "kube/cache.h"
#include "kube/client.h"
#include "kube/discovery.h"

namespace cozy::controller {

// With GPUs on: from the VMI cache while the kind is served (`state`) and `cache` has synced.
VmiLookup VmiLookupFromCache(kube::ResourceState state,
                             std::shared_ptr<kube::Cache<model::VirtualMachineInstance>> cache);
// With GPUs off: each VMI read by name through `client` (which must outlive the lookup), once
// per pass; `served` is what discovery says of the kind.
VmiLookup VmiLookupByReading(kube::Client& client, kube::Served served);

}  // namespace cozy::controller
