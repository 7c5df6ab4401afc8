#include "controller/binder/binder.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "api/keys.h"
#include "api/time.h"
#include "controller/binder/device_key.h"
#include "controller/kinds.h"
#include "controller/model/readers.h"
#include "kube/errors.h"
#include "kube/leader_election.h"
#include "runtime/log.h"
#include "runtime/thread_name.h"

namespace cozy::controller {
namespace {

using runtime::LogFields;

std::string DevicePath(const api::GpuDevice& device, bool status) {
  return kGpuDevices.Path(device.metadata.namespaceName, device.metadata.name,
                          status ? "status" : "");
}

// Whether the server refused a write for what the device is, not for its own state: the device
// is held off and the others go on (Binder's header).
bool RefusedForTheDevice(kube::ErrorKind kind) {
  switch (kind) {
    case kube::ErrorKind::kBadRequest:
    case kube::ErrorKind::kForbidden:
    case kube::ErrorKind::kNotFound:
    case kube::ErrorKind::kInvalid:
    case kube::ErrorKind::kUnsupportedMediaType:
      return true;
    default:
      return false;
  }
}

// Whether writing `decision` takes `device` off a node it is bound on now.
bool FreesUnits(const api::GpuDevice& device, const model::Decision& decision) {
  const std::optional<std::string>& node = device.status.nodeName;
  if (!node || device.Phase() != api::DevicePhase::kBound) return false;
  return decision.action == model::Action::kLost ||
         (decision.action == model::Action::kMove && decision.node != *node);
}

}  // namespace

Binder::Binder(kube::Client& client, const kube::Leadership& leadership, std::string identity,
               kube::TimeSource* time)
    : client_(client),
      leadership_(leadership),
      write_{false, kFieldManager, {leadership.Deadline()}},
      time_(time != nullptr ? *time : kube::DefaultTimeSource()),
      events_(client, write_, std::move(identity)) {}

std::optional<EventRecorder::Pending> Binder::PrepareDeviceEvent(
    const api::GpuDevice& device, const model::Decision& decision,
    std::chrono::system_clock::time_point now, BinderResult& result) {
  std::string reason, type = "Normal", action;
  switch (decision.action) {
    case model::Action::kBind:
      reason = "Bound", action = "Bind";
      break;
    case model::Action::kMove:
      reason = "Moved", action = "Move";
      break;
    case model::Action::kLost:
      reason = "Lost", action = "Place", type = "Warning";
      break;
    case model::Action::kRefuse:
      reason = "Refused", action = "Place", type = "Warning";
      break;
    case model::Action::kKeep:
      return std::nullopt;
  }
  std::string note =
      decision.node.empty() ? decision.reason : "node " + decision.node + ": " + decision.reason;
  const nlohmann::json regarding = {{"apiVersion", api::kApiVersion},
                                    {"kind", api::kGpuDeviceKind},
                                    {"namespace", device.metadata.namespaceName},
                                    {"name", device.metadata.name},
                                    {"uid", device.metadata.uid}};
  return events_.Make(regarding, device.metadata.namespaceName, device.metadata.uid, action, reason,
                      type, std::move(note), now, result.eventsSuppressed);
}

bool Binder::WaitForEvents(std::chrono::milliseconds limit) { return events_.WaitForQueued(limit); }

void Binder::ReportUnpermittedClasses(const model::Snapshot& snapshot,
                                      std::chrono::system_clock::time_point now,
                                      BinderResult& result) {
  const model::PermittedHostDevices& table = snapshot.permittedHostDevices;
  if (table.pciHostDevices.empty() && table.mediatedDevices.empty()) {
    return;  // KubeVirt not read (not served, not synced, no KubeVirt object) or no table
  }
  for (const api::GpuClass& gpuClass : snapshot.classes) {
    if (gpuClass.metadata.deletionTimestamp || !leadership_.Leading()) continue;
    // A dra class's VMs get their GPUs through claims, which the table does not gate.
    if (gpuClass.IsDra() || model::IsPermittedHostDevice(table, gpuClass.ResourceName())) continue;
    const nlohmann::json regarding = {{"apiVersion", api::kApiVersion},
                                      {"kind", api::kGpuClassKind},
                                      {"name", gpuClass.metadata.name},
                                      {"uid", gpuClass.metadata.uid}};
    events_.Record(regarding, EventRecorder::kClusterNamespace, gpuClass.metadata.uid, "Check",
                   "ResourceNameNotPermitted", "Warning",
                   "resource name " + gpuClass.ResourceName() +
                       " is in no pciHostDevices or mediatedDevices entry of KubeVirt's "
                       "permittedHostDevices: VMs cannot be given this class's GPUs until the "
                       "hoster adds it",
                   now, result.events, result.eventsSuppressed);
  }
}

void Binder::ReportInputProblems(std::chrono::system_clock::time_point now, BinderResult& result) {
  if (!lastModel_) return;
  result.inputProblems = lastModel_->Problems();
  for (const model::InputProblem& problem : result.inputProblems) {
    if (!leadership_.Leading()) return;
    nlohmann::json regarding = {{"kind", problem.kind}, {"name", problem.name}};
    std::string eventNamespace =
        problem.namespaceName.empty() ? EventRecorder::kClusterNamespace : problem.namespaceName;
    if (problem.kind == "Pod" || problem.kind == "ResourceQuota") {
      regarding["apiVersion"] = "v1";
      regarding["namespace"] = problem.namespaceName;
    } else if (problem.kind == "Namespace") {
      regarding["apiVersion"] = "v1";
      eventNamespace = problem.name;  // as client-go records a Namespace's Events
    } else {
      regarding["apiVersion"] = api::kApiVersion;
    }
    // The key holds the object's name: the problem carries no UID, and the name is unique.
    events_.Record(regarding, eventNamespace,
                   problem.kind + "/" + eventNamespace + "/" + problem.name, "Read",
                   "InputOutOfRange", "Warning",
                   problem.field + ": " + problem.problem +
                       " (the catalog reads it so that only its own node or tenant is held back; "
                       "docs/controller.md, \"Inputs out of range\")",
                   now, result.events, result.eventsSuppressed);
  }
}

void Binder::Send(PlacementWrite& write, std::atomic<bool>& halt) {
  if (halt.load()) {
    write.skipped = true;
  } else {
    try {
      const nlohmann::json answer =
          client_.MergePatchAt(DevicePath(*write.device, true), write.body,
                               write.device->metadata.resourceVersion, write_);
      write.written = true;
      write.answer = std::make_shared<const nlohmann::json>(std::move(answer));
    } catch (const kube::ApiError& error) {
      write.failure = error.kind();
      write.error = error.what();
    } catch (...) {
      write.thrown = std::current_exception();
    }
    // A failure that stops the pass (TakeWrite) stops the writers at once: no write is sent
    // after it, beyond those already in flight.
    if (write.thrown || (write.failure && (!RefusedForTheDevice(*write.failure) || write.frees))) {
      halt = true;
    }
  }
  write.done.store(true);
}

bool Binder::TakeWrite(PlacementWrite& write, kube::TimePoint steadyNow,
                       std::chrono::system_clock::time_point now, BinderResult& result,
                       std::optional<EventRecorder::Pending>& event) {
  if (write.thrown) std::rethrow_exception(write.thrown);
  if (write.skipped) return false;  // the pass stopped before it was sent
  const api::GpuDevice& device = *write.device;
  const model::Decision& decision = *write.decision;
  if (write.written) {
    writeBackoff_.Succeeded(write.key);
    readPast_.Wrote(write.key, device.metadata.resourceVersion, std::move(write.answer));
    ++result.writes;
    event = PrepareDeviceEvent(device, decision, now, result);
    const nlohmann::json& status = write.body["status"];
    runtime::LogInfo(
        "placed",
        LogFields{
            {"device", write.key},
            {"action", std::string(model::ToString(decision.action))},
            {"node", decision.node},
            {"answer", write.pending ? status["bindResponse"]["result"].get<std::string>() : ""},
            {"reason", decision.reason}});
    return true;
  }
  const kube::ErrorKind kind = *write.failure;
  if (kind == kube::ErrorKind::kConflict) {
    ++result.conflicts;
  } else {
    ++result.failures;
    runtime::LogWarning("placement write failed",
                        LogFields{{"device", write.key},
                                  {"error", write.error},
                                  {"heldOff", RefusedForTheDevice(kind) ? "yes" : "no"}});
  }
  if (RefusedForTheDevice(kind)) {
    // Refused for what the device is: it waits on its own, until its backoff ends or it
    // changes. A bind or an answer is no later decision's ground: the pass goes on.
    writeBackoff_.Failed(write.key, steadyNow, device.metadata.resourceVersion);
    if (!write.frees) return true;
    result.stoppedAtHeldOff = true;
    return false;
  }
  // The decisions after this one may have assumed it was written (a move frees the room a later
  // bind takes): none after it is sent, and the next pass decides from what was. (The writes in
  // flight beside it took units only.)
  result.incomplete = true;
  return false;
}

namespace {

// G7: a kind that is not served (or not synced) is a gap in discovery, not an ended VMI: while
// VirtualMachineInstances cannot be read, a device attached to one stops the pass.
std::optional<std::string> UnreadVmisError(const model::Snapshot& snapshot, bool vmisKnown) {
  if (vmisKnown) return std::nullopt;
  for (const api::GpuDevice& device : snapshot.devices) {
    if (device.status.attachment && !device.status.attachment->vmiName.empty()) {
      return "VirtualMachineInstances cannot be read while " + DeviceKey(device.metadata) +
             " is attached to " + device.status.attachment->vmiName +
             ": nothing is placed or detached until they can";
    }
  }
  return std::nullopt;
}

// The bind response a pending request gets from its decision.
nlohmann::json BindResponse(const api::GpuDevice& device, const model::Decision& decision) {
  const bool placed = decision.StartsOnNode();
  nlohmann::json response = {{"id", device.status.bindRequest->id},
                             {"result", placed ? "Succeeded" : "Failed"}};
  if (placed) {
    response["reason"] = "Bound";
    response["message"] = "bound to node " + decision.node;
  } else {
    response["reason"] = decision.action == model::Action::kLost ? "Lost" : "Refused";
    response["message"] = decision.reason;
  }
  return response;
}

// The condition `Bound` a decision gives its device (docs/controller.md, "Why an order waits"):
// True where it is placed, False with the model's reason where it is lost or refused; none for a
// keep, which leaves the status as it stands.
std::optional<api::Condition> BoundCondition(const model::Decision& decision, bool place, bool lose,
                                             bool refuse) {
  if (place) {
    api::Condition bound;
    bound.type = api::kBoundCondition;
    bound.status = "True";
    bound.reason = decision.action == model::Action::kMove ? "Moved" : "Bound";
    bound.message = "bound to node " + decision.node;
    return bound;
  }
  if (!lose && !refuse) return std::nullopt;
  api::Condition waiting;
  waiting.type = api::kBoundCondition;
  waiting.status = "False";
  waiting.reason = lose ? "Lost" : "Refused";
  waiting.message = decision.reason;
  return waiting;
}

// The device's conditions with `wanted` in place of its own of that type, or nothing where it
// says so already (type, status, reason and message): an unchanged reason is never written again.
// The transition time moves only with the status, as the API conventions ask.
std::optional<nlohmann::json> ConditionsWith(const api::GpuDevice& device, api::Condition wanted,
                                             std::chrono::system_clock::time_point now) {
  nlohmann::json conditions = nlohmann::json::array();
  bool found = false;
  for (const api::Condition& condition : device.status.conditions) {
    if (condition.type != wanted.type) {
      conditions.push_back(api::ToJson(condition));
      continue;
    }
    if (condition.status == wanted.status && condition.reason == wanted.reason &&
        condition.message == wanted.message) {
      return std::nullopt;
    }
    found = true;
    if (condition.status == wanted.status) wanted.lastTransitionTime = condition.lastTransitionTime;
  }
  if (!found || wanted.lastTransitionTime.empty()) wanted.lastTransitionTime = api::FormatTime(now);
  conditions.push_back(api::ToJson(wanted));
  return conditions;
}

}  // namespace

BinderResult Binder::Pass(const model::Snapshot& snapshot, bool answersOnly, bool vmisKnown,
                          std::chrono::system_clock::time_point now) {
  BinderResult result;
  if (auto error = UnreadVmisError(snapshot, vmisKnown)) {
    result.error = std::move(*error);
    return result;
  }
  const auto planning = std::chrono::steady_clock::now();
  std::optional<std::vector<model::Decision>> decisions = Plan(snapshot, answersOnly, result);
  if (!decisions) return result;
  const auto writing = std::chrono::steady_clock::now();
  result.planSeconds = std::chrono::duration<double>(writing - planning).count();
  const DeviceMatch match = MatchDevices(snapshot, *decisions, answersOnly, result);
  const kube::TimePoint steadyNow = time_.Now();
  Write(*decisions, match, answersOnly, now, steadyNow, result);
  result.writeSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - writing).count();
  writeBackoff_.Prune(steadyNow);
  result.backingOff = writeBackoff_.HeldCount(steadyNow);
  result.retryAt = writeBackoff_.NextRetry(steadyNow);
  return result;
}

std::optional<std::vector<model::Decision>> Binder::Plan(const model::Snapshot& snapshot,
                                                         bool answersOnly, BinderResult& result) {
  try {
    // The model of the pass before lends this one what both snapshots share (the nodes' tables,
    // the numbers of every device object both hold: Model(snapshot, previous)); so it is kept,
    // over a copy of its snapshot (the lists shared, not copied), until the next pass.
    auto kept = std::make_unique<const model::Snapshot>(snapshot);
    auto built = std::make_unique<const model::Model>(*kept, lastModel_.get());
    lastModel_ = std::move(built);  // the model before goes, then the snapshot it viewed
    lastSnapshot_ = std::move(kept);
    const model::Model& model = *lastModel_;
    std::vector<model::Decision> decisions =
        model.PlanPass(answersOnly ? model::PassScope::kUnsettled : model::PassScope::kEvery);
    if (!answersOnly && std::all_of(decisions.begin(), decisions.end(), [](const auto& d) {
          return d.action == model::Action::kKeep && !d.startRefused &&
                 d.reason == model::kHeldReason;
        })) {
      result.quietRoom = model.Free();
    }
    if (!answersOnly) {
      // The catalog metrics from the model the pass built anyway: its classes and nodes (no
      // tenant budgets) and one walk over the devices.
      result.catalog =
          std::make_shared<const CatalogFigures>(CatalogOf(*lastSnapshot_, model.CapacityView()));
    }
    return decisions;
  } catch (const std::exception& error) {
    result.error = std::string("the model cannot read the cluster: ") + error.what();
    lastModel_.reset();
    lastSnapshot_.reset();
    return std::nullopt;
  }
}

// Each decision's device, found once, and the decisions counted by action. An answers-only pass
// looks up only what it may write: the devices with a request, and those of the decisions that
// may free units (a move, a loss); a full pass, every device.
Binder::DeviceMatch Binder::MatchDevices(const model::Snapshot& snapshot,
                                         const std::vector<model::Decision>& decisions,
                                         bool answersOnly, BinderResult& result) {
  using ByName = std::unordered_map<DeviceName, const api::GpuDevice*, DeviceNameHash>;
  auto name = [](const model::Decision& d) { return DeviceName{d.deviceNamespace, d.deviceName}; };
  ByName byName;
  ByName pendingByName;
  auto indexDevices = [&](ByName& into, bool pendingOnly) {
    for (const api::GpuDevice& device : snapshot.devices) {
      if (pendingOnly && !device.RequestPending()) continue;
      into.emplace(DeviceName{device.metadata.namespaceName, device.metadata.name}, &device);
    }
  };
  if (answersOnly) {
    indexDevices(pendingByName, true);
  } else {
    byName.reserve(snapshot.devices.size());
    indexDevices(byName, false);
  }
  DeviceMatch match;
  match.deviceOf.assign(decisions.size(), nullptr);
  std::array<int64_t, 5> byAction{};  // decisions by model::Action
  for (size_t i = 0; i < decisions.size(); ++i) {
    const model::Decision& decision = decisions[i];
    ++byAction[static_cast<size_t>(decision.action)];
    if (answersOnly) {
      auto found = pendingByName.find(name(decision));
      if (found != pendingByName.end()) {
        match.deviceOf[i] = found->second;
        match.lastPending = i + 1;
        continue;
      }
      if (decision.action != model::Action::kMove && decision.action != model::Action::kLost) {
        continue;  // neither answers nor frees units
      }
      if (byName.empty()) indexDevices(byName, false);
    }
    auto found = byName.find(name(decision));
    if (found != byName.end()) match.deviceOf[i] = found->second;
  }
  for (size_t a = 0; a < byAction.size(); ++a) {
    if (byAction[a] > 0) {
      result.decisions[std::string(model::ToString(static_cast<model::Action>(a)))] += byAction[a];
    }
  }
  return match;
}

// What a decision's device status must become: placed on the decision's node, or lost, and the
// answer to its pending request; nothing where it stands already (the most of a cluster's
// decisions are keeps of what stands, which build nothing).
std::optional<nlohmann::json> Binder::StatusPatch(const api::GpuDevice& device,
                                                  const model::Decision& decision,
                                                  std::chrono::system_clock::time_point now,
                                                  BinderResult& result) {
  const std::optional<std::string>& nodeName = device.status.nodeName;
  const bool pending = device.RequestPending();
  const bool place =
      (decision.action == model::Action::kBind || decision.action == model::Action::kMove) &&
      (device.Phase() != api::DevicePhase::kBound || !nodeName || *nodeName != decision.node);
  const bool lose = decision.action == model::Action::kLost &&
                    (device.Phase() != api::DevicePhase::kLost || nodeName);
  // A new order the pass cannot place stays Pending, and says why in its status.
  const bool refuse =
      decision.action == model::Action::kRefuse && device.Phase() == api::DevicePhase::kPending;
  std::optional<nlohmann::json> conditions;
  if (auto wanted = BoundCondition(decision, place, lose, refuse)) {
    conditions = ConditionsWith(device, std::move(*wanted), now);
  }
  if (!place && !lose && !pending && !conditions) return std::nullopt;
  nlohmann::json status = nlohmann::json::object();
  if (conditions) status["conditions"] = std::move(*conditions);
  if (place) {
    status["phase"] = api::ToString(api::DevicePhase::kBound);
    status["nodeName"] = decision.node;
  } else if (lose) {
    status["phase"] = api::ToString(api::DevicePhase::kLost);
    status["nodeName"] = nullptr;
  }
  if (pending) {
    status["bindResponse"] = BindResponse(device, decision);
    if (auto requested = api::ParseTime(device.status.bindRequest->requestedAt)) {
      result.answerLatencies.push_back(std::chrono::duration<double>(now - *requested).count());
    }
  }
  return status;
}

void Binder::Write(const std::vector<model::Decision>& decisions, const DeviceMatch& match,
                   bool answersOnly, std::chrono::system_clock::time_point now,
                   kube::TimePoint steadyNow, BinderResult& result) {
  events_.BeginPass();
  // The writes go to the writers as the pass reaches them (the header's pipeline), and what
  // came of each is taken in the plan's order; its Event goes to the event sender.
  std::deque<PlacementWrite> writes;  // handed over; those before `taken` are taken
  size_t taken = 0;
  std::atomic<bool> halt{false};  // the pass stopped: writes not sent yet are not sent
  bool stopped = false;
  // Every write handed over ends before what it refers to goes, thrown on or not.
  struct Drain {
    runtime::WorkerPool& pool;
    ~Drain() { pool.WaitIdle(); }
  } drain{writers_};
  auto post = [&](std::optional<EventRecorder::Pending> event) {
    if (event) events_.Post(std::move(*event), now, result.events);
  };
  // Takes the writes that are in, in order; with `all`, waits for each.
  auto take = [&](bool all) {
    while (taken < writes.size()) {
      PlacementWrite& write = writes[taken];
      if (!write.done.load()) {
        if (!all) return;
        writers_.WaitUntil([&write] { return write.done.load(); });
      }
      ++taken;
      std::optional<EventRecorder::Pending> event;
      bool goOn = false;
      try {
        goOn = TakeWrite(write, steadyNow, now, result, event);
      } catch (...) {
        halt = true;  // thrown on: the writes still queued are not sent
        throw;
      }
      post(std::move(event));
      if (!goOn && !write.skipped) {
        stopped = true;
        halt = true;
      }
    }
  };
  for (size_t index = 0; index < decisions.size() && !stopped; ++index) {
    const model::Decision& decision = decisions[index];
    if (match.deviceOf[index] == nullptr) continue;
    const api::GpuDevice& device = *match.deviceOf[index];
    const bool pending = device.RequestPending();
    const bool frees = FreesUnits(device, decision);
    if (answersOnly && !pending && !(index < match.lastPending && frees)) continue;
    std::optional<nlohmann::json> status = StatusPatch(device, decision, now, result);
    if (!status) {
      if (decision.action == model::Action::kRefuse && leadership_.Leading()) {
        post(PrepareDeviceEvent(device, decision, now, result));  // the tenant learns why
      }
      continue;
    }
    if (!leadership_.Leading()) {
      ++result.failures;
      continue;  // stepped down mid-pass: the new leader decides afresh
    }
    std::string key = DeviceKey(device.metadata);
    if (writeBackoff_.HeldOff(key, steadyNow, device.metadata.resourceVersion)) {
      ++result.heldOff;
      if (frees) {
        result.stoppedAtHeldOff = true;  // the decisions after it may stand on the units it frees
        break;
      }
      continue;  // no later decision stands on a unit this one takes
    }
    if (frees) take(true);  // alone: every write before it is in first
    if (stopped) break;
    PlacementWrite& write = writes.emplace_back();
    write.device = &device;
    write.decision = &decision;
    write.body = {{"status", std::move(*status)}};
    write.key = std::move(key);
    write.pending = pending;
    write.frees = frees;
    writers_.Submit([this, &write, &halt] { Send(write, halt); });
    take(frees);  // a write that frees units is in before any after it is sent
  }
  take(true);
}

}  // namespace cozy::controller
