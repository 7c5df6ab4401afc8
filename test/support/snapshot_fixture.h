// The controller model snapshot the model's and the admission webhooks' tests start from, written
// once: one passthrough class on one resource name, a small tenant tree, and GPU nodes added to
// it. A test then states only what its rule is about. The object builders it uses are
// test/controller/model_fixtures.h's.
#pragma once

#include <cstdint>
#include <string>

#include "controller/model/snapshot.h"
#include "test/controller/model_fixtures.h"

namespace cozy::testing {

// One passthrough class, a100 on kA100; tenants root > a > a-b, plus b under root.
inline model::Snapshot BaseSnapshot() {
  using namespace cozy::model::testing;
  model::Snapshot snapshot;
  snapshot.classes = {MakeClass("a100", kA100)};
  snapshot.namespaces = {MakeTenant("tenant-root", {}), MakeTenant("tenant-a", {"tenant-root"}),
                         MakeTenant("tenant-a-b", {"tenant-root", "tenant-a"}),
                         MakeTenant("tenant-b", {"tenant-root"})};
  return snapshot;
}

// BaseSnapshot without tenant-a-b: tenants root > a, plus b under root.
inline model::Snapshot FlatTenantsSnapshot() {
  using namespace cozy::model::testing;
  model::Snapshot snapshot;
  snapshot.classes = {MakeClass("a100", kA100)};
  snapshot.namespaces = {MakeTenant("tenant-root", {}), MakeTenant("tenant-a", {"tenant-root"}),
                         MakeTenant("tenant-b", {"tenant-root"})};
  return snapshot;
}

// A Ready Node `name` and its GPUNode: `gpus` functions, each serving `perFunction` units of
// `resource` (an mdev parent serves several; 0 is an unhealthy function).
inline void AddNode(model::Snapshot& snapshot, const std::string& name, int gpus,
                    const std::string& resource = model::testing::kA100, int64_t perFunction = 1) {
  snapshot.nodes.push_back(model::testing::MakeNode(name));
  snapshot.gpuNodes.push_back(model::testing::MakeGpuNode(name, resource, gpus, perFunction));
}

}  // namespace cozy::testing
