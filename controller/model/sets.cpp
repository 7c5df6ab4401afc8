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

// Appends an attached set's key after its "ns/": "vmi <name> <uid>". Returns where the name
// starts.
size_t AppendAttachedKey(std::string& key, const api::Attachment& attachment) {
  key += "vmi ";
  const size_t nameAt = key.size();
  key += attachment.vmiName;
  key += ' ';
  key += attachment.vmiUid;
  return nameAt;
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
// device alone; built in the order of their keys. `only` (ascending device indices) limits
// them to those devices, whose sets must then be whole (Unsettled); null: every device.
//
// The device records are read once, in their own order; everything after works on numbers and
// buffers a few bytes per device, so the sets are written in the order they are taken and no
// step reaches into a large array at random (each such step missed the cache once the cluster
// outgrew it, and made the pass grow faster than the cluster).
void PassPlanner::GroupSets(const std::vector<size_t>* only) {
  Grouping g;
  g.only = only;
  g.count = only ? only->size() : ix_.snapshot.devices.size();
  ReadRecords(g);
  std::vector<size_t> start;
  const std::vector<size_t> members = MembersBySet(g, start);
  MakeSets(g, start, members);
}

// Each position's set, each set's key in one buffer, and each position's creation time in
// another (and each device's name, for the decisions of a pass over every device). Attached
// sets are found by key in a table that owns its keys (one entry per VMI, small enough to stay
// in cache); every other device starts its own set.
void PassPlanner::ReadRecords(Grouping& g) {
  const SharedVector<api::GpuDevice>& devices = ix_.snapshot.devices;
  const size_t count = g.count;
  g.setOf.resize(count);
  g.createdAt.resize(count + 1);
  g.deleting.resize(count);
  g.leaders.reserve(count);
  g.keys.reserve(count);
  if (!g.only) {
    nameAt_.reserve(count + 1);
  }
  std::unordered_map<std::string, size_t> attachedSets;
  std::string key;
  for (size_t i = 0; i < count; ++i) {
    const size_t d = g.Device(i);
    const api::GpuDevice& record = devices[d];
    if (!g.only) {
      nameAt_.push_back(names_.size());
      names_ += record.metadata.name;
    }
    g.createdAt[i] = created_.size();
    created_ += record.metadata.creationTimestamp;
    g.deleting[i] = record.metadata.deletionTimestamp.has_value() ? 1 : 0;
    const std::string& ns = record.metadata.namespaceName;
    key.assign(ns);
    key += '/';
    SetKey at{
        Offset(keys_.size()), 0, Offset(ns.size()), 0, 0, record.status.attachment.has_value()};
    if (record.status.attachment) {
      const api::Attachment& attachment = *record.status.attachment;
      at.nameAt = Offset(AppendAttachedKey(key, attachment));
      at.nameSize = Offset(attachment.vmiName.size());
      const auto [it, added] = attachedSets.try_emplace(key, g.leaders.size());
      g.setOf[i] = it->second;
      if (!added) {
        continue;
      }
    } else {
      at.nameAt = Offset(key.size());
      at.nameSize = Offset(record.metadata.name.size());
      key += record.metadata.name;
      g.setOf[i] = g.leaders.size();
    }
    at.size = Offset(key.size());
    keys_ += key;
    g.leaders.push_back(d);
    g.keys.push_back(at);
  }
  if (!g.only) {
    nameAt_.push_back(names_.size());
  }
  g.createdAt[count] = created_.size();
}

// Members as ranges of one array of positions, in device order: set s has the positions from
// start[s] to start[s + 1].
std::vector<size_t> PassPlanner::MembersBySet(const Grouping& g, std::vector<size_t>& start) {
  start.assign(g.leaders.size() + 1, 0);
  for (const size_t set : g.setOf) {
    ++start[set + 1];
  }
  for (size_t s = 0; s < g.leaders.size(); ++s) {
    start[s + 1] += start[s];
  }
  std::vector<size_t> members(g.count);  // by set in their first devices' order
  std::vector<size_t> next(start.begin(), start.end() - 1);
  for (size_t i = 0; i < g.count; ++i) {
    members[next[g.setOf[i]]++] = i;
  }
  return members;
}

// The sets in key order, each from its members' numbers, and sorted into the steps that take
// them as they are made. Counts go to one array per kind, sized for the worst case (a count per
// device) so the views into them stay put; sets_ too, for the pointers.
void PassPlanner::MakeSets(const Grouping& g, const std::vector<size_t>& start,
                           const std::vector<size_t>& members) {
  // The buffers are complete: views into them stay put from here on.
  const std::vector<SetKey>& keys = g.keys;
  auto keyOf = [this, &keys](size_t s) {
    return std::string_view(keys_).substr(keys[s].at, keys[s].size);
  };
  auto createdOf = [this, &g](size_t i) {
    return std::string_view(created_).substr(g.createdAt[i], g.createdAt[i + 1] - g.createdAt[i]);
  };
  const std::vector<size_t> order = OrderByKey(g.leaders, keys, keyOf);
  sets_.reserve(order.size());
  classCounts_.reserve(g.count);
  resourceCounts_.reserve(g.count);
  keyMembers_.reserve(g.count);
  std::vector<std::pair<size_t, int64_t>> byClass, byResource;
  for (const size_t s : order) {
    DeviceSet set;
    set.key = keyOf(s);
    set.namespaceName = set.key.substr(0, keys[s].nsSize);
    set.name = set.key.substr(keys[s].nameAt, keys[s].nameSize);
    set.attached = keys[s].attached;
    set.vmi = ix_.AttachedVmi(g.leaders[s]);
    // The members again, in the sets' order, so every later step reads them in sequence.
    const size_t first = keyMembers_.size();
    for (size_t m = start[s]; m < start[s + 1]; ++m) {
      keyMembers_.push_back(g.Device(members[m]));
    }
    set.members = std::span<const size_t>(keyMembers_.data() + first, keyMembers_.size() - first);
    set.node = ix_.placedOn[set.members.front()];
    set.created = createdOf(members[start[s]]);  // the leader's
    byClass.clear();
    byResource.clear();
    for (size_t m = start[s]; m < start[s + 1]; ++m) {
      CountMember(set, g.Device(members[m]), createdOf(members[m]), g.deleting[members[m]] != 0,
                  byClass, byResource);
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

bool PassPlanner::Settled(size_t d) const {
  const size_t n = ix_.placedOn[d];
  const size_t c = ix_.deviceClass[d];
  return ix_.IsNode(n) && ix_.takesBinds[n] && !overfull_[n] && c != kNone &&
         ix_.classes[c].servesNode[n] && !ix_.requestWaits[d];
}

std::vector<size_t> PassPlanner::Unsettled() {
  std::vector<size_t> unsettled;
  // Attached devices by their set's key (AppendAttachedKey, as GroupSets makes it): the set's node
  // while every member so far is settled on it, kNone once one is not.
  std::unordered_map<std::string, size_t> setNode;
  std::vector<std::pair<size_t, const size_t*>> attached;  // device, its set's entry
  std::string key;
  for (size_t d = 0; d < ix_.attached.size(); ++d) {
    if (!ix_.attached[d]) {
      if (!Settled(d)) {
        unsettled.push_back(d);
      }
      continue;
    }
    const api::GpuDevice& device = ix_.Device(d);
    const api::Attachment& attachment = *device.status.attachment;
    key.assign(device.metadata.namespaceName);
    key += '/';
    attachedTo_.insert(key + attachment.vmiName);
    AppendAttachedKey(key, attachment);
    const size_t node = Settled(d) ? ix_.placedOn[d] : kNone;
    const auto [it, added] = setNode.try_emplace(key, node);
    if (!added && it->second != node) {
      it->second = kNone;
    }
    attached.emplace_back(d, &it->second);  // entries of an unordered_map stay put
  }
  const size_t alone = unsettled.size();
  for (const auto& [d, node] : attached) {
    if (*node == kNone) {
      unsettled.push_back(d);
    }
  }
  std::inplace_merge(unsettled.begin(), unsettled.begin() + static_cast<std::ptrdiff_t>(alone),
                     unsettled.end());
  return unsettled;
}

void PassPlanner::CountMember(DeviceSet& set, size_t d, std::string_view created, bool deleting,
                              std::vector<std::pair<size_t, int64_t>>& byClass,
                              std::vector<std::pair<size_t, int64_t>>& byResource) const {
  set.created = std::min(set.created, created);
  set.memberDeleting = set.memberDeleting || deleting;
  const size_t c = ClassOf(d);
  const int64_t ordered = Ordered(d);
  set.needs.total = api::AddUnits(set.needs.total, ordered);
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
