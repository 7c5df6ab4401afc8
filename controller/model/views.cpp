// What the model shows callers: the whole cluster's view (classes, nodes, tenants) and one
// node's units of one class.
#include "controller/model/model_internal.h"

#include <algorithm>

namespace cozy::model {

std::optional<NodeClassView> Model::NodeClass(std::string_view node,
                                              std::string_view className) const {
  const Index& ix = *index_;
  const auto n = ix.nodeIds.find(node);
  const auto c = ix.classIds.find(className);
  if (n == ix.nodeIds.end() || c == ix.classIds.end() ||
      !ix.classes[c->second].servesNode[n->second]) {
    return std::nullopt;
  }
  const size_t at = ix.At(n->second, ix.classes[c->second].resource);
  const int64_t used = ix.bound[at] + ix.raw[at];
  return NodeClassView{ix.units[at], used, std::max<int64_t>(0, ix.units[at] - used)};
}

std::optional<ClassRoom> Model::Room(std::string_view className) const {
  const Index& ix = *index_;
  const auto c = ix.classIds.find(className);
  if (c == ix.classIds.end()) {
    return std::nullopt;
  }
  const ClassInfo& info = ix.classes[c->second];
  ClassRoom room{info.gpuClass, info.maxCount, 0, 0, "", 0, "", "", false};
  size_t presumed = 0;
  for (const size_t n : info.nodes) {  // by name
    if (info.gpuClass->IsDra() && !ix.draPresumed.empty() && ix.draPresumed[n] && presumed++ == 0) {
      room.unread = "node " + ix.nodes[n]->name;
    }
    if (!info.takes[n]) {
      const int64_t free = std::max<int64_t>(0, ix.Free(n, info.resource));
      room.freeElsewhere = api::AddUnits(room.freeElsewhere, free);
      if (free > 0 && room.firstBlocked.empty()) {
        const NodeEligibility why =
            CheckNodeEligibility(*ix.nodes[n], info.gpuClass->spec.tolerations);
        room.firstBlocked = "node " + ix.nodes[n]->name + ": ";
        for (size_t i = 0; i < why.reasons.size(); ++i) {
          room.firstBlocked += (i == 0 ? "" : ", ") + why.reasons[i];
        }
      }
      continue;
    }
    const int64_t free = std::max<int64_t>(0, ix.Free(n, info.resource));
    room.free = api::AddUnits(room.free, free);
    if (room.largestNode.empty() || free > room.largestNodeFree) {
      room.largestNodeFree = free;
      room.largestNode = ix.nodes[n]->name;
    }
  }
  if (info.gpuClass->IsDra() && !ix.snapshot.draUnknown.empty()) {
    room.unread = ix.snapshot.draUnknown;
    room.unreadEverywhere = true;
  } else if (presumed > 0) {
    room.unread +=
        (presumed > 1 ? " and " + std::to_string(presumed - 1) + " more publish" : " publishes") +
        std::string(" no ResourceSlice of gpu-agent now");
  }
  return room;
}

ClusterView Model::CapacityView() const {
  const Index& ix = *index_;
  ClusterView view;
  for (const ClassInfo& info : ix.classes) {
    const api::GpuClass& gpuClass = *info.gpuClass;
    ClassView classView{gpuClass.metadata.name,
                        info.maxCount,
                        gpuClass.IsDra() ? "dra " + gpuClass.spec.source.dra->pciVendorSelector
                                         : "devicePlugin " + gpuClass.ResourceName(),
                        0,
                        0,
                        0};
    for (size_t n : info.nodes) {
      const size_t at = ix.At(n, info.resource);
      classView.units = api::AddUnits(classView.units, ix.units[at]);
      // As the node's NodeClassView below counts it, where the node has one.
      const int64_t used = ix.bound[at] + ix.raw[at];
      if (ix.hasGpuNode[n] && (ix.units[at] > 0 || used > 0)) {
        classView.used = api::AddUnits(classView.used, used);
      }
      if (info.takes[n]) {
        classView.free =
            api::AddUnits(classView.free, std::max<int64_t>(0, ix.Free(n, info.resource)));
      }
    }
    view.classes.push_back(std::move(classView));
  }
  for (size_t n = 0; n < ix.nodes.size(); ++n) {
    if (!ix.hasGpuNode[n]) {
      continue;
    }
    NodeView nodeView{ix.nodes[n]->name, ix.eligibility[n].eligible, ix.eligibility[n].reasons, {}};
    // A tainted GPU pool takes the binds of the classes that tolerate its taints (docs/install.md,
    // "GPU nodes behind a taint"), as the binder's TakesBinds condition says.
    for (const ClassInfo& info : ix.classes) {
      if (!nodeView.eligible && info.takes[n]) {
        nodeView.eligible = true;
        nodeView.reasons.clear();
      }
    }
    for (const ClassInfo& info : ix.classes) {
      const size_t at = ix.At(n, info.resource);
      const int64_t used = ix.bound[at] + ix.raw[at];
      if (info.servesNode[n] && (ix.units[at] > 0 || used > 0)) {
        nodeView.classes[info.gpuClass->metadata.name] =
            NodeClassView{ix.units[at], used, std::max<int64_t>(0, ix.units[at] - used)};
      }
    }
    view.nodes.push_back(std::move(nodeView));
  }
  return view;
}

ClusterView Model::View() const {
  const Index& ix = *index_;
  ClusterView view = CapacityView();
  view.gpuResourceNames =
      EffectiveGpuResourceNames(ix.snapshot.settings, ix.snapshot.gpuNodes,
                                ix.snapshot.permittedHostDevices, ix.snapshot.classes);
  for (const std::string& tenant : ix.tenants.Tenants()) {
    TenantView tenantView{tenant, {}};
    const Usage& used = UsageOf(ix.usage, tenant);
    for (size_t c = 0; c < ix.classes.size(); ++c) {
      tenantView.classes[ix.classes[c].gpuClass->metadata.name] =
          TenantClassView{Get(used.byClass, c), ix.Remaining(tenant, c, ix.usage)};
    }
    view.tenants.push_back(std::move(tenantView));
  }
  return view;
}

FreeUnits Model::Free() const {
  const Index& ix = *index_;
  FreeUnits room;
  room.resources.insert(ix.resources.begin(), ix.resources.end());
  room.byNode.reserve(ix.nodes.size());
  for (size_t n = 0; n < ix.nodes.size(); ++n) {
    auto& free = room.byNode[ix.nodes[n]->name];
    for (size_t r = 0; r < ix.resources.size(); ++r) {
      free[ix.resources[r]] = ix.Free(n, r);
    }
  }
  return room;
}

namespace {

// Gives back what the room took for the pod of `key`.
void GiveBack(FreeUnits& room, const std::string& key) {
  const auto taken = room.taken.find(key);
  if (taken == room.taken.end()) return;
  for (const FreeUnits::Taken& part : taken->second) {
    int64_t& free = room.byNode[part.node][part.resource];
    free = api::AddUnits(free, part.units);
  }
  room.taken.erase(taken);
}

}  // namespace

bool AbsorbPodChange(FreeUnits& room, const Pod* before, const Pod* after) {
  const Pod& pod = after != nullptr ? *after : *before;
  const std::string key = pod.namespaceName + "/" + pod.name;
  if (after == nullptr || !PodHoldsDevices(*after) || after->nodeName.empty()) {
    GiveBack(room, key);
    return true;  // it frees units, or holds none on a node
  }
  const std::map<std::string, int64_t> requests = PodResourceRequests(*after, room.resources);
  if (requests.empty()) {
    GiveBack(room, key);
    return true;
  }
  if (before != nullptr && PodHoldsDevices(*before) && before->nodeName == after->nodeName &&
      PodResourceRequests(*before, room.resources) == requests) {
    return true;  // counted already
  }
  const auto node = room.byNode.find(after->nodeName);
  if (node == room.byNode.end()) {
    return false;
  }
  for (const auto& [resource, count] : requests) {
    const auto free = node->second.find(resource);
    if (free == node->second.end() || free->second < count) {
      return false;
    }
  }
  std::vector<FreeUnits::Taken>& taken = room.taken[key];
  for (const auto& [resource, count] : requests) {
    node->second.find(resource)->second -= count;
    taken.push_back({after->nodeName, resource, count});
  }
  return true;
}

std::optional<size_t> Model::FindDevice(std::string_view ns, std::string_view name) const {
  const auto id = index_->nsIds.find(std::string(ns));
  if (id == index_->nsIds.end()) {
    return std::nullopt;
  }
  const std::vector<size_t>& nsOf = index_->nsOf;
  for (size_t d = 0; d < nsOf.size(); ++d) {
    if (nsOf[d] == id->second && index_->Device(d).metadata.name == name) {
      return d;
    }
  }
  return std::nullopt;
}

}  // namespace cozy::model
