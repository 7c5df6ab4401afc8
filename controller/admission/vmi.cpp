#include "controller/admission/vmi.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <map>

#include "api/dra.h"
#include "api/json_field.h"
#include "api/keys.h"
#include "api/validation.h"
#include "controller/admission/orders.h"
#include "controller/model/readers.h"

namespace cozy::admission {
namespace {

using api::JsonField;

std::string Hash(std::string_view text) {
  uint64_t hash = 14695981039346656037ULL;  // FNV-1a
  for (const char c : text) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 1099511628211ULL;
  }
  std::array<char, 17> digits{};
  std::snprintf(digits.data(), digits.size(), "%016llx", static_cast<unsigned long long>(hash));
  return std::string(digits.data(), 10);
}

const nlohmann::json* At(const nlohmann::json& object, std::initializer_list<const char*> path) {
  const nlohmann::json* at = &object;
  for (const char* key : path) {
    if (!at->is_object()) {
      return nullptr;
    }
    const auto it = at->find(key);
    if (it == at->end() || it->is_null()) {
      return nullptr;
    }
    at = &*it;
  }
  return at;
}

struct Member {
  std::string name;
  std::optional<size_t> existing;  // its index in the snapshot; none: a template to create
  std::string className;
  int64_t count = 0;
};

}  // namespace

namespace {

// kGpuEntryPrefix, the device's name and `suffix`, a DNS label: when the name does not make one
// (too long, or dots), dots become dashes and the device's name is cut, and the hash of the
// whole name keeps it distinct.
std::string EntryName(std::string_view deviceName, const std::string& suffix) {
  std::string name = std::string(kGpuEntryPrefix) + std::string(deviceName) + suffix;
  if (api::CheckDnsLabel(name).empty()) {
    return name;
  }
  const std::string hash = "-" + Hash(deviceName);
  const size_t room = 63 - kGpuEntryPrefix.size() - hash.size() - suffix.size();
  std::string head(deviceName.substr(0, room));
  std::replace(head.begin(), head.end(), '.', '-');
  while (!head.empty() && head.back() == '-') {
    head.pop_back();
  }
  return std::string(kGpuEntryPrefix) + head + hash + suffix;
}

}  // namespace

std::string GpuEntryName(std::string_view deviceName, int64_t index) {
  return EntryName(deviceName, "-" + std::to_string(index));
}

std::string ClaimEntryName(std::string_view deviceName) { return EntryName(deviceName, ""); }

bool IsWebhookGpuEntryName(std::string_view name) { return name.starts_with(kGpuEntryPrefix); }

VmiGpuEntries OwnGpuEntries(const nlohmann::json& vmi,
                            const std::set<std::string>& gpuResourceNames) {
  VmiGpuEntries entries;
  const JsonField root(vmi, "");
  const std::optional<JsonField> spec = root.Find("spec");
  const std::optional<JsonField> domain = spec ? spec->Find("domain") : std::nullopt;
  if (!domain) {
    return entries;
  }
  if (const auto devices = domain->Find("devices")) {
    if (const auto gpus = devices->Find("gpus")) {
      for (const JsonField& gpu : gpus->AsArray()) {
        GpuEntry entry{gpu.path(), gpu.StringOr("name", ""), gpu.StringOr("deviceName", "")};
        (IsWebhookGpuEntryName(entry.name) ? entries.webhook : entries.own)
            .push_back(std::move(entry));
      }
    }
    if (const auto hostDevices = devices->Find("hostDevices")) {
      for (const JsonField& device : hostDevices->AsArray()) {
        std::string resource = device.StringOr("deviceName", "");
        if (gpuResourceNames.contains(resource)) {
          entries.own.push_back({device.path(), device.StringOr("name", ""), std::move(resource)});
        }
      }
    }
  }
  if (const auto resources = domain->Find("resources")) {
    for (const char* list : {"requests", "limits"}) {
      if (const auto values = resources->Find(list)) {
        for (const auto& [key, value] : values->AsObjectMembers()) {
          if (gpuResourceNames.contains(key)) {
            entries.own.push_back({value.path(), "", key});
          }
        }
      }
    }
  }
  return entries;
}

namespace {

// The start's set placed by a whole binder pass on a copy of the snapshot with the start
// applied: the templates added, every member attached to the VMI and asking to be bound. The
// copy's model is built on the snapshot's (`model`): only the members and the templates are read.
std::vector<model::Decision> WholePassTrial(const model::Snapshot& snapshot,
                                            const model::Model& model,
                                            const model::StartTrial& start) {
  model::Snapshot trial = snapshot;
  if (!start.now.empty()) {
    trial.now = start.now;  // the grace of a node that is not Ready, as of this start
  }
  const api::Attachment attachment{start.vmiName, "", start.now};
  const api::BindRequest request{"admission-plan", start.now};
  for (const size_t held : start.held) {
    api::GpuDevice& device = trial.devices.MutableAt(held);  // the trial's own copy
    device.status.attachment = attachment;
    device.status.bindRequest = request;
  }
  for (const api::GpuDevice& device : start.templates) {
    trial.devices.push_back(device);
  }
  // The VMI as the pass sees it. An older VMI of the name (being replaced) leaves the copy; its
  // pods then count as raw usage.
  trial.vmis.EraseIf([&](const model::VirtualMachineInstance& vmi) {
    return vmi.namespaceName == start.namespaceName && vmi.name == start.vmiName;
  });
  // No tolerations of its own: the binder answers the start before the VMI exists, so it places
  // the set by its classes' tolerations alone, and a trial with the VMI's would admit a start the
  // binder then refuses after the writes (E5; docs/controller.md, "VMI starts").
  model::VirtualMachineInstance vmi;
  vmi.namespaceName = start.namespaceName;
  vmi.name = start.vmiName;
  vmi.creationTimestamp = start.now;
  trial.vmis.push_back(std::move(vmi));
  return model::Model(trial, &model).PlanPass();
}

}  // namespace

namespace {

// One start's plan, step by step: the members it references or templates, then where a binder
// pass would place them together. Each step returns the tenant's reason when the start is refused.
class StartPlanner {
 public:
  StartPlanner(const model::Snapshot& snapshot, const model::Model& model, const VmiInput& input)
      : snapshot_(snapshot),
        model_(model),
        input_(input),
        vmiText_("VMI " + input.namespaceName + "/" + input.vmiName) {}

  std::optional<std::string> RawNames() const;
  std::optional<std::string> Held();
  std::optional<std::string> Templates();
  // Members of dra classes beside device-plugin GPUs (E15).
  std::optional<std::string> DraClasses() const;
  std::optional<std::string> Place(VmiStartPlan& plan) const;
  void Devices(VmiStartPlan& plan) const;

 private:
  // The device's index in the snapshot, or its size for none.
  size_t Find(std::string_view name) const {
    return model_.FindDevice(input_.namespaceName, name).value_or(snapshot_.devices.size());
  }
  std::optional<std::string> CheckExisting(const api::GpuDevice& device) const;
  model::StartTrial Trial(VmiStartPlan& plan) const;

  const model::Snapshot& snapshot_;
  const model::Model& model_;
  const VmiInput& input_;
  const std::string vmiText_;
  std::vector<Member> members_;
};

// With raw names forbidden a GPU reaches a VM only through a device reference.
std::optional<std::string> StartPlanner::RawNames() const {
  if (!input_.rawNamesForbidden || input_.entries.own.empty()) return std::nullopt;
  const GpuEntry& entry = input_.entries.own.front();
  return vmiText_ + " carries its own GPU entry " + entry.field +
         (entry.name.empty() ? "" : " (" + entry.name + ")") + " for " + entry.resourceName +
         "; raw GPU resource names are forbidden here: reference a GPUDevice instead";
}

// The checks every existing member takes: it may be attached to this VMI's name only.
std::optional<std::string> StartPlanner::CheckExisting(const api::GpuDevice& device) const {
  const std::string& name = device.metadata.name;
  if (device.metadata.deletionTimestamp) {
    return vmiText_ + " references GPUDevice " + name + ", which is being deleted";
  }
  if (device.status.attachment && device.status.attachment->vmiName != input_.vmiName) {
    return vmiText_ + " references GPUDevice " + name + ", which is attached to VMI " +
           device.status.attachment->vmiName;
  }
  return std::nullopt;
}

// The held devices the VMI references.
std::optional<std::string> StartPlanner::Held() {
  for (const std::string& name : input_.references.devices) {
    const size_t d = Find(name);
    if (d == snapshot_.devices.size()) {
      return vmiText_ + " references GPUDevice " + name + ", which does not exist in " +
             input_.namespaceName;
    }
    const api::GpuDevice& device = snapshot_.devices[d];
    if (std::optional<std::string> refusal = CheckExisting(device)) return refusal;
    members_.push_back({name, d, device.spec.className, device.spec.count});
  }
  return std::nullopt;
}

// The devices of its templates: created by an earlier call for this VMI, or to create, their
// class's order rules checked each and the budgets over all of them together.
std::optional<std::string> StartPlanner::Templates() {
  const std::string& ns = input_.namespaceName;
  std::map<std::string, int64_t> newCounts;  // by class: the templates to create, together
  for (const api::DeviceReferences::Template& item : input_.references.templates) {
    const std::string name = model::TemplateDeviceName(input_.vmiName, item.name);
    const std::string what = vmiText_ + " (device template " + item.name + ")";
    if (std::find(input_.references.devices.begin(), input_.references.devices.end(), name) !=
        input_.references.devices.end()) {
      return what + ": its device " + name + " is also referenced as a held device";
    }
    if (const size_t d = Find(name); d < snapshot_.devices.size()) {
      // Created by an earlier call for this VMI: held now, if it is that template's device.
      const api::GpuDevice& device = snapshot_.devices[d];
      const auto mark = device.metadata.labels.find(std::string(api::kTemplateDeviceLabel));
      if (mark == device.metadata.labels.end() || mark->second != api::kTemplateDeviceLabelValue ||
          device.spec.className != item.className || device.spec.count != item.count) {
        return what + ": GPUDevice " + name + " already exists and is not this template's device";
      }
      if (std::optional<std::string> refusal = CheckExisting(device)) return refusal;
      members_.push_back({name, d, item.className, item.count});
      continue;
    }
    if (std::optional<std::string> refusal =
            CheckClassOrder(model_, ns, item.className, item.count, what, /*checkRoom=*/false)) {
      return refusal;
    }
    newCounts[item.className] += item.count;
    members_.push_back({name, std::nullopt, item.className, item.count});
  }
  if (std::optional<std::string> budget = model_.CheckNewOrder(ns, newCounts)) {
    return vmiText_ + " orders device templates over a budget: " + *budget;
  }
  return std::nullopt;
}

// E15: KubeVirt refuses a VMI whose GPUs mix DRA and device-plugin entries, so a set of both
// kinds of class, or dra members beside the VMI's own device-plugin gpus entries, is refused
// here, before anything is written.
std::optional<std::string> StartPlanner::DraClasses() const {
  const Member* dra = nullptr;
  const Member* plugin = nullptr;
  for (const Member& member : members_) {
    const std::optional<model::ClassRoom> room = model_.Room(member.className);
    if (!room) continue;  // an unknown class is the placement's refusal
    (room->gpuClass->IsDra() ? dra : plugin) = &member;
  }
  if (dra == nullptr) return std::nullopt;
  if (plugin != nullptr) {
    return vmiText_ + " cannot start: its GPUDevice " + dra->name + " (GPUClass " + dra->className +
           ") is delivered through DRA and " + plugin->name + " (GPUClass " + plugin->className +
           ") through a device plugin; KubeVirt gives a VM GPUs of one kind";
  }
  for (const GpuEntry& entry : input_.entries.own) {
    if (entry.field.find(".gpus[") != std::string::npos && !entry.resourceName.empty()) {
      return vmiText_ + " cannot start: its GPUDevice " + dra->name + " (GPUClass " +
             dra->className + ") is delivered through DRA, and its own GPU entry " + entry.field +
             " through a device plugin; KubeVirt gives a VM GPUs of one kind";
    }
  }
  return std::nullopt;
}

// The start as a trial: the held members by index, the templates as the devices to create
// (their objects also go to the plan), each attached to the VMI and asking to be bound.
model::StartTrial StartPlanner::Trial(VmiStartPlan& plan) const {
  const std::string& ns = input_.namespaceName;
  const api::Attachment attachment{input_.vmiName, "", input_.now};
  const api::BindRequest request{"admission-plan", input_.now};
  model::StartTrial start{ns, input_.vmiName, input_.now, {}, {}};
  for (const Member& member : members_) {
    if (member.existing) {
      start.held.push_back(*member.existing);
      continue;
    }
    api::GpuDevice device;
    device.metadata.namespaceName = ns;
    device.metadata.name = member.name;
    device.metadata.creationTimestamp = input_.now;
    device.metadata.labels[std::string(api::kTemplateDeviceLabel)] =
        std::string(api::kTemplateDeviceLabelValue);
    device.spec.className = member.className;
    device.spec.count = member.count;
    plan.templateDevices.push_back(api::ToJson(device));
    plan.templateDevices.back().erase("status");
    device.status.attachment = attachment;
    device.status.bindRequest = request;
    start.templates.push_back(std::move(device));
  }
  return start;
}

// Placement: the decisions of one binder pass on a copy where the whole set asks to be bound
// for this VMI; Model::PlanStart's where it can tell them without the copy. All on one node.
std::optional<std::string> StartPlanner::Place(VmiStartPlan& plan) const {
  const model::StartTrial start = Trial(plan);
  std::optional<std::vector<model::Decision>> shortcut;
  if (!input_.wholePass) shortcut = model_.PlanStart(start);
  const std::vector<model::Decision> decisions =
      shortcut ? std::move(*shortcut) : WholePassTrial(snapshot_, model_, start);
  for (const Member& member : members_) {
    const auto decision = std::find_if(decisions.begin(), decisions.end(), [&](const auto& d) {
      return d.deviceNamespace == input_.namespaceName && d.deviceName == member.name;
    });
    if (decision == decisions.end()) {
      return vmiText_ + ": the model decided nothing for GPUDevice " + member.name;
    }
    if (!decision->StartsOnNode()) {
      return vmiText_ +
             " cannot start: its GPUs cannot be placed on one node now: " + decision->reason;
    }
    if (!plan.node.empty() && plan.node != decision->node) {
      return vmiText_ + " cannot start: its GPUs would be split over nodes " + plan.node + " and " +
             decision->node;
    }
    plan.node = decision->node;
  }
  return std::nullopt;
}

// What the VMI's gpus entries name: each member's class's resource, its count of times.
void StartPlanner::Devices(VmiStartPlan& plan) const {
  for (const Member& member : members_) {
    if (member.existing) plan.heldDevices.push_back(member.name);
    const std::optional<model::ClassRoom> room = model_.Room(member.className);
    plan.devices.push_back({member.name, room ? room->gpuClass->ResourceName() : std::string(),
                            member.count, room && room->gpuClass->IsDra()});
  }
}

}  // namespace

VmiStartPlan PlanVmiStart(const model::Snapshot& snapshot, const model::Model& model,
                          const VmiInput& input) {
  StartPlanner planner(snapshot, model, input);
  VmiStartPlan plan;
  std::optional<std::string> refusal = planner.RawNames();
  if (!refusal) refusal = planner.Held();
  if (!refusal) refusal = planner.Templates();
  if (!refusal) refusal = planner.DraClasses();
  if (!refusal) refusal = planner.Place(plan);
  if (refusal) {
    // A refusal carries nothing to write, whatever the plan had gathered.
    VmiStartPlan refused;
    refused.refusal = std::move(refusal);
    return refused;
  }
  planner.Devices(plan);
  return plan;
}

namespace {

// Whether a stored webhook entry is the desired one: the fields this webhook writes are equal;
// fields another mutator adds to the entry do not make it stale.
bool SameEntry(const nlohmann::json& entry, const nlohmann::json& desired) {
  if (!entry.is_object()) return false;
  for (const auto& [key, value] : desired.items()) {
    const auto it = entry.find(key);
    if (it == entry.end() || *it != value) return false;
  }
  return true;
}

// The ops that make the array at `keys` (its path in the VMI) hold exactly the `desired` webhook
// entries, leaving entries of other names alone.
void PatchEntries(const nlohmann::json& vmi, std::initializer_list<const char*> keys,
                  const nlohmann::json& desired, nlohmann::json& ops) {
  std::string path;
  for (const char* key : keys) path += "/" + std::string(key);
  const nlohmann::json* array = At(vmi, keys);
  if (array == nullptr || !array->is_array()) {
    if (desired.empty()) return;
    // Add at the first missing key of the path, carrying what lies below it.
    const std::vector<std::string> names(keys.begin(), keys.end());
    size_t missing = 0;
    for (const nlohmann::json* at = &vmi; missing + 1 < names.size(); ++missing) {
      const auto next = at->find(names[missing]);
      if (next == at->end() || !next->is_object()) break;
      at = &*next;
    }
    nlohmann::json value = desired;
    for (size_t k = names.size() - 1; k > missing; --k) {
      value = nlohmann::json{{names[k], std::move(value)}};
    }
    std::string at;
    for (size_t k = 0; k <= missing; ++k) at += "/" + names[k];
    ops.push_back({{"op", "add"}, {"path", at}, {"value", std::move(value)}});
    return;
  }
  // Keep the webhook entries that are wanted (first of each), remove the rest, add what lacks.
  std::vector<bool> present(desired.size(), false);
  std::vector<size_t> stale;
  for (size_t i = 0; i < array->size(); ++i) {
    const nlohmann::json& entry = (*array)[i];
    const std::string name = entry.is_object() ? entry.value("name", "") : "";
    if (!IsWebhookGpuEntryName(name)) continue;
    bool wanted = false;
    for (size_t d = 0; d < desired.size() && !wanted; ++d) {
      if (!present[d] && SameEntry(entry, desired[d])) {
        present[d] = true;
        wanted = true;
      }
    }
    if (!wanted) stale.push_back(i);
  }
  for (auto it = stale.rbegin(); it != stale.rend(); ++it) {
    ops.push_back({{"op", "remove"}, {"path", path + "/" + std::to_string(*it)}});
  }
  for (size_t d = 0; d < desired.size(); ++d) {
    if (!present[d]) {
      ops.push_back({{"op", "add"}, {"path", path + "/-"}, {"value", desired[d]}});
    }
  }
}

}  // namespace

nlohmann::json VmiGpuPatch(const nlohmann::json& vmi, const std::vector<PlacedDevice>& devices) {
  nlohmann::json gpus = nlohmann::json::array();
  nlohmann::json claims = nlohmann::json::array();
  for (const PlacedDevice& device : devices) {
    const std::string claim = ClaimEntryName(device.deviceName);
    if (device.dra) {
      claims.push_back({{"name", claim}, {"resourceClaimName", device.deviceName}});
    }
    for (int64_t i = 0; i < device.count; ++i) {
      gpus.push_back(device.dra ? nlohmann::json{{"name", GpuEntryName(device.deviceName, i)},
                                                 {"claimName", claim},
                                                 {"requestName", api::DraClaimRequestName(i)}}
                                : nlohmann::json{{"name", GpuEntryName(device.deviceName, i)},
                                                 {"deviceName", device.resourceName}});
    }
  }
  nlohmann::json ops = nlohmann::json::array();
  PatchEntries(vmi, {"spec", "domain", "devices", "gpus"}, gpus, ops);
  PatchEntries(vmi, {"spec", "resourceClaims"}, claims, ops);
  return ops;
}

}  // namespace cozy::admission
