// The pass's sets: the devices one VMI holds, and every other device alone, grouped in the
// order of their keys and sorted into the steps that take them.
#include "controller/model/pass_planner.h"

#include <algorithm>
#include <stdexcept>

namespace cozy::model {
namespace {

// An offset into the pass's buffers, which hold a few bytes per device: 4 GiB of keys is
// beyond any snapshot this process could hold.
uint32_t Offset(size_t value) {
  if (value > std::numeric_limits<uint32_t>::max()) {
    throw std::length_error("placement pass: buffer offset past 4 GiB");
  }
  return static_cast<uint32_t>(value);
}

// a + "/" < b + "/", as bytes, without building either.
bool SlashedLess(std::string_view a, std::string_view b) {
  const size_t common = std::min(a.size(), b.size());
  if (const int c = a.substr(0, common).compare(b.substr(0, common)); c != 0) {
    return c < 0;
  }
  if (a.size() == b.size()) {
    return false;
  }
  const auto slash = static_cast<unsigned char>('/');
  return a.size() < b.size() ? slash < static_cast<unsigned char>(b[common])
                             : static_cast<unsigned char>(a[common]) < slash;
}

}  // namespace

// The sets by key, "ns/..." compared as bytes, without one big sort by strings: namespaces are
// ranked by "ns/" (different namespaces differ within that prefix, since a namespace holds no
// '/'), the sets are bucketed by that rank, and only the few sets of one namespace are sorted
// by the rest of their keys. A tenant's sets are a small group however large the cluster, so
// this grows with the cluster rather than by n log n over long shared prefixes.
template <typename KeyOf>
std::vector<size_t> PassPlanner::OrderByKey(const std::vector<size_t>& leaders,
                                            const std::vector<SetKey>& keys,
                                            const KeyOf& keyOf) const {
  const std::vector<const std::string*>& names = ix_.nsNames;
  std::vector<size_t> byName(names.size());
  for (size_t i = 0; i < byName.size(); ++i) {
    byName[i] = i;
  }
  std::sort(byName.begin(), byName.end(),
            [&names](size_t a, size_t b) { return SlashedLess(*names[a], *names[b]); });
  std::vector<size_t> rank(names.size());
  for (size_t i = 0; i < byName.size(); ++i) {
    rank[byName[i]] = i;
  }
  std::vector<size_t> bucketAt(names.size() + 1, 0);
  for (const size_t leader : leaders) {
    ++bucketAt[rank[ix_.nsOf[leader]] + 1];
  }
  for (size_t r = 0; r < names.size(); ++r) {
    bucketAt[r + 1] += bucketAt[r];
  }
  std::vector<size_t> order(leaders.size());
  std::vector<size_t> next(bucketAt.begin(), bucketAt.end() - 1);
  for (size_t s = 0; s < leaders.size(); ++s) {
    order[next[rank[ix_.nsOf[leaders[s]]]]++] = s;
  }
  for (size_t r = 0; r < names.size(); ++r) {
    const auto first = order.begin() + static_cast<std::ptrdiff_t>(bucketAt[r]);
    const auto last = order.begin() + static_cast<std::ptrdiff_t>(bucketAt[r + 1]);
    std::sort(first, last, [&keys, &keyOf](size_t a, size_t b) {
      return keyOf(a).substr(keys[a].nsSize) < keyOf(b).substr(keys[b].nsSize);
    });
  }
  return order;
}

// Sets: the devices attached to one VMI (same namespace, name and UID), and every other
// device alone; built in the order of their keys.
//
// The device records are read once, in their own order; everything after works on numbers and
// buffers a few bytes per device, so the sets are written in the order they are taken and no
// step reaches into a large array at random (each such step missed the cache once the cluster
// outgrew it, and made the pass grow faster than the cluster).
void PassPlanner::GroupSets() {
  const std::vector<api::GpuDevice>& devices = ix_.snapshot.devices;
  // Each device's set, each set's key in one buffer, and each device's name and creation time
  // in others. Attached sets are found by key in a table that owns its keys (one entry per
  // VMI, small enough to stay in cache); every other device starts its own set.
  std::vector<size_t> setOf(devices.size());
  std::vector<size_t> leaders;  // each set's first device
  std::vector<SetKey> keys;     // each set's key in keys_
  std::vector<size_t> createdAt(devices.size() + 1);
  std::vector<char> deleting(devices.size());
  leaders.reserve(devices.size());
  keys.reserve(devices.size());
  nameAt_.reserve(devices.size() + 1);
  std::unordered_map<std::string, size_t> attachedSets;
  std::string key;
  for (size_t d = 0; d < devices.size(); ++d) {
    const api::GpuDevice& device = devices[d];
    nameAt_.push_back(names_.size());
    names_ += device.metadata.name;
    createdAt[d] = created_.size();
    created_ += device.metadata.creationTimestamp;
    deleting[d] = device.metadata.deletionTimestamp.has_value() ? 1 : 0;
    const std::string& ns = device.metadata.namespaceName;
    key.assign(ns);
    key += '/';
    SetKey at{
        Offset(keys_.size()), 0, Offset(ns.size()), 0, 0, device.status.attachment.has_value()};
    if (device.status.attachment) {
      const api::Attachment& attachment = *device.status.attachment;
      key += "vmi ";
      at.nameAt = Offset(key.size());
      at.nameSize = Offset(attachment.vmiName.size());
      key += attachment.vmiName;
      key += ' ';
      key += attachment.vmiUid;
      const auto [it, added] = attachedSets.try_emplace(key, leaders.size());
      setOf[d] = it->second;
      if (!added) {
        continue;
      }
    } else {
      at.nameAt = Offset(key.size());
      at.nameSize = Offset(device.metadata.name.size());
      key += device.metadata.name;
      setOf[d] = leaders.size();
    }
    at.size = Offset(key.size());
    keys_ += key;
    leaders.push_back(d);
    keys.push_back(at);
  }
  nameAt_.push_back(names_.size());
  createdAt[devices.size()] = created_.size();
  // The buffers are complete: views into them stay put from here on.
  auto keyOf = [this, &keys](size_t s) {
    return std::string_view(keys_).substr(keys[s].at, keys[s].size);
  };
  auto createdOf = [this, &createdAt](size_t d) {
    return std::string_view(created_).substr(createdAt[d], createdAt[d + 1] - createdAt[d]);
  };

  // Members as ranges of one array, in device order.
  std::vector<size_t> start(leaders.size() + 1, 0);
  for (const size_t set : setOf) {
    ++start[set + 1];
  }
  for (size_t s = 0; s < leaders.size(); ++s) {
    start[s + 1] += start[s];
  }
  std::vector<size_t> members(devices.size());  // by set in their first devices' order
  {
    std::vector<size_t> next(start.begin(), start.end() - 1);
    for (size_t d = 0; d < devices.size(); ++d) {
      members[next[setOf[d]]++] = d;
    }
  }

  // The sets in key order, each from its members' numbers, and sorted into the steps that take
  // them as they are made. Counts go to one array per kind, sized for the worst case (a count
  // per device) so the views into them stay put; sets_ too, for the pointers.
  const std::vector<size_t> order = OrderByKey(leaders, keys, keyOf);
  sets_.reserve(order.size());
  classCounts_.reserve(devices.size());
  resourceCounts_.reserve(devices.size());
  keyMembers_.reserve(devices.size());
  std::vector<std::pair<size_t, int64_t>> byClass, byResource;
  for (const size_t s : order) {
    const size_t leader = leaders[s];
    DeviceSet set;
    set.key = keyOf(s);
    set.namespaceName = set.key.substr(0, keys[s].nsSize);
    set.name = set.key.substr(keys[s].nameAt, keys[s].nameSize);
    set.attached = keys[s].attached;
    set.vmi = ix_.AttachedVmi(leader);
    // The members again, in the sets' order, so every later step reads them in sequence.
    keyMembers_.insert(keyMembers_.end(), members.begin() + static_cast<std::ptrdiff_t>(start[s]),
                       members.begin() + static_cast<std::ptrdiff_t>(start[s + 1]));
    set.members =
        std::span<const size_t>(keyMembers_.data() + keyMembers_.size() - (start[s + 1] - start[s]),
                                start[s + 1] - start[s]);
    set.node = ix_.placedOn[set.members.front()];
    set.created = createdOf(leader);
    byClass.clear();
    byResource.clear();
    for (const size_t d : set.members) {
      CountMember(set, d, createdOf(d), deleting[d] != 0, byClass, byResource);
    }
    SealCounts(set, byClass, byResource);
    // A held set that stays is decided while at hand and not kept: its members are all its
    // keep decisions need. The other sets wait for their steps.
    const State state = Classify(set);
    if (state == State::kHeld && StaysPut(set)) {
      staying_.push_back({set.node, nullptr, set.members});
    } else {
      sets_.push_back(set);
      steps_[static_cast<size_t>(state)].push_back(&sets_.back());
    }
  }
}

void PassPlanner::CountMember(DeviceSet& set, size_t d, std::string_view created, bool deleting,
                              std::vector<std::pair<size_t, int64_t>>& byClass,
                              std::vector<std::pair<size_t, int64_t>>& byResource) const {
  set.created = std::min(set.created, created);
  set.memberDeleting = set.memberDeleting || deleting;
  const size_t c = ClassOf(d);
  const int64_t ordered = Ordered(d);
  set.needs.total += ordered;
  if (c == kNone) {
    set.needs.unknownClass = Device(d).spec.className;  // rare: read the record
    return;
  }
  const ClassInfo& info = ix_.classes[c];
  set.checkMembers = set.checkMembers || info.gpuClass->metadata.deletionTimestamp ||
                     (info.maxCount && ordered > *info.maxCount);
  AddCount(byClass, c, ordered);
  AddCount(byResource, info.resource, ordered);
}

void PassPlanner::SealCounts(DeviceSet& set, const std::vector<std::pair<size_t, int64_t>>& byClass,
                             const std::vector<std::pair<size_t, int64_t>>& byResource) {
  set.checkMembers = set.checkMembers || set.memberDeleting;
  set.needs.byClass = Counts(classCounts_.data() + classCounts_.size(), byClass.size());
  set.needs.byResource = Counts(resourceCounts_.data() + resourceCounts_.size(), byResource.size());
  classCounts_.insert(classCounts_.end(), byClass.begin(), byClass.end());
  resourceCounts_.insert(resourceCounts_.end(), byResource.begin(), byResource.end());
}

PassPlanner::State PassPlanner::Classify(const DeviceSet& set) const {
  size_t placed = 0, lostCount = 0, pending = 0;
  bool oneNode = true;
  const size_t firstNode = set.node;
  for (const size_t d : set.members) {
    if (IsPlaced(d)) {
      ++placed;
      oneNode = oneNode && PlacedOn(d) == firstNode;
    } else if (Phase(d) == api::DevicePhase::kPending) {
      ++pending;
    } else {
      ++lostCount;  // Lost, or Bound without a node
    }
  }
  const size_t size = set.members.size();
  if (placed == size && oneNode) {
    return State::kHeld;
  }
  if (lostCount == size) {
    return State::kLost;
  }
  if (pending == size) {
    return State::kNew;
  }
  return State::kMixed;
}

// The common case of a held set, decided from numbers: it stays on a node that takes binds (so
// no taint that its tolerations could matter for) and serves every class of the set.
// A node holding more than it serves (EvictOverCapacity) is left to MoveHeld, whole.
bool PassPlanner::StaysPut(const DeviceSet& set) const {
  const size_t n = set.node;
  return set.needs.unknownClass.empty() && ix_.IsNode(n) && ix_.takesBinds[n] && !overfull_[n] &&
         std::all_of(
             set.needs.byClass.begin(), set.needs.byClass.end(),
             [this, n](const auto& entry) { return ix_.classes[entry.first].servesNode[n] != 0; });
}

}  // namespace cozy::model
