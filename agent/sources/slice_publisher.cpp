#include "agent/sources/slice_publisher.h"

#include "agent/status/resource_slice.h"
#include "api/dra.h"
#include "runtime/log.h"

namespace cozy::agent {
using nlohmann::json;

namespace {

constexpr std::string_view kFieldManager = "gpu-agent";

kube::WriteOptions Write(bool dryRun = false) {
  kube::WriteOptions options;
  options.dryRun = dryRun;
  options.fieldManager = std::string(kFieldManager);
  return options;
}

// Whether every device sent with a taint came back with it: a server without DRADeviceTaints (a
// gate on by default in Kubernetes 1.36, off in older releases) drops the field, and the devices
// would be free for any claim, not only the catalog's.
bool TaintsKept(const json& sent, const json& answer) {
  const json devices = answer.value("spec", json::object()).value("devices", json::array());
  for (const json& device : sent) {
    if (!device.contains("taints")) continue;
    const auto found = std::find_if(devices.begin(), devices.end(), [&](const json& d) {
      return d.is_object() && d.value("name", "") == device["name"];
    });
    if (found == devices.end() || !found->contains("taints") || !(*found)["taints"].is_array() ||
        (*found)["taints"].size() != device["taints"].size()) {
      return false;
    }
  }
  return true;
}

int64_t PoolGeneration(const json& slice) {
  const json pool = slice.value("spec", json::object()).value("pool", json::object());
  const auto it = pool.find("generation");
  return it != pool.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

// What of a slice the watch compares: the spec, taints' timeAdded aside.
json ComparableSpec(const json& slice) {
  json spec = slice.value("spec", json::object());
  if (spec.contains("devices")) spec["devices"] = ComparableDevices(spec["devices"]);
  return spec;
}

}  // namespace

SlicePublisher::SlicePublisher(kube::Client& client, std::string nodeName,
                               kube::BackoffPolicy backoff)
    : client_(client),
      nodeName_(std::move(nodeName)),
      sliceName_(SliceName(nodeName_)),
      collectionPath_(kube::ResourcePath(api::kResourceGroup, api::kResourceVersion,
                                         api::kResourceSlicePlural)),
      slicePath_(kube::ResourcePath(api::kResourceGroup, api::kResourceVersion,
                                    api::kResourceSlicePlural, "", sliceName_)),
      backoff_(backoff, kube::DefaultRandomSource()) {}

std::optional<std::chrono::milliseconds> SlicePublisher::ReadyIn() {
  return ClientReadyIn(client_);
}

void SlicePublisher::Invalidate() {
  std::lock_guard lock(mutex_);
  sent_.reset();
  echo_ = nullptr;
  echoVersion_.clear();
}

bool SlicePublisher::IsWhatWasWritten(const json& slice) const {
  std::lock_guard lock(mutex_);
  return !echo_.is_null() && ComparableSpec(slice) == echo_;
}

int64_t SlicePublisher::generation() const {
  std::lock_guard lock(mutex_);
  return generation_;
}

std::string SlicePublisher::NodeUid() {
  if (nodeUid_.empty()) {
    // The slice is owned by its Node, so the garbage collector removes it with the node; without
    // the Node there is nothing to own it, and the write waits as a transient failure.
    const json node = client_.Get(kube::ResourcePath("", "v1", "nodes", "", nodeName_));
    nodeUid_ = node.value("metadata", json::object()).value("uid", "");
  }
  return nodeUid_;
}

void SlicePublisher::Remember(const json& sent, const json& answer) {
  std::lock_guard lock(mutex_);
  sent_ = sent;
  echo_ = ComparableSpec(answer);
  echoVersion_ = answer.value("metadata", json::object()).value("resourceVersion", "");
  generation_ = std::max(generation_, PoolGeneration(answer));
}

bool SlicePublisher::WriteIfChanged(const json& devices) {
  std::optional<json> current;  // the server's slice, when read
  std::string resourceVersion;
  {
    std::lock_guard lock(mutex_);
    if (sent_ && *sent_ == devices) return false;
    if (sent_) resourceVersion = echoVersion_;
  }
  if (sliceName_.size() > 253) {
    throw std::runtime_error("ResourceSlice name " + sliceName_ +
                             " is longer than 253 characters: shorten the node name");
  }
  if (resourceVersion.empty()) {
    try {
      current = client_.Get(slicePath_);
    } catch (const kube::ApiError& error) {
      if (error.kind() != kube::ErrorKind::kNotFound) throw;
    }
    if (current) {
      resourceVersion = current->value("metadata", json::object()).value("resourceVersion", "");
      const json spec = current->value("spec", json::object());
      if (spec.value("nodeName", "") == nodeName_ && spec.value("driver", "") == api::kDraDriver &&
          ComparableDevices(spec.value("devices", json::array())) == ComparableDevices(devices)) {
        Remember(devices, *current);  // already on the server (an earlier run wrote it)
        return false;
      }
    }
  }
  int64_t generation = 0;
  {
    std::lock_guard lock(mutex_);
    generation = std::max(generation_, current ? PoolGeneration(*current) : 0) + 1;
  }
  json object = ResourceSliceObject(nodeName_, NodeUid(), devices, generation);
  if (!taintsChecked_ && !devices.empty()) {
    // Once per run, before any device is on offer: would the server keep the taints?
    json trial;
    if (resourceVersion.empty()) {
      trial = client_.Create(collectionPath_, object, Write(true));
    } else {
      json versioned = object;
      versioned["metadata"]["resourceVersion"] = resourceVersion;
      trial = client_.Update(slicePath_, versioned, Write(true));
    }
    taintsChecked_ = true;
    if (!TaintsKept(devices, trial)) {
      taintsDropped_ = true;
      runtime::LogError(
          "the API server drops ResourceSlice device taints (feature gate DRADeviceTaints off?): "
          "publishing no devices, so that nothing but the catalog's claims can take them; "
          "restart gpu-agent once the gate is on",
          {{"slice", sliceName_}});
      return WriteIfChanged(json::array());
    }
  }
  json answer;
  if (resourceVersion.empty()) {
    answer = client_.Create(collectionPath_, object, Write());
  } else {
    object["metadata"]["resourceVersion"] = resourceVersion;
    answer = client_.Update(slicePath_, object, Write());
  }
  Remember(devices, answer);
  return true;
}

PublishAttempt SlicePublisher::Publish(const json& offered) {
  const json devices = taintsDropped_ ? json::array() : offered;
  PublishAttempt attempt;
  try {
    // Twice at most: a write that finds the slice deleted, or changed since it was read,
    // reads it again once.
    for (int round = 0; round < 2; ++round) {
      try {
        attempt.writes += WriteIfChanged(devices) ? 1 : 0;
        break;
      } catch (const kube::ApiError& error) {
        const bool stale = error.kind() == kube::ErrorKind::kNotFound ||
                           error.kind() == kube::ErrorKind::kConflict ||
                           error.kind() == kube::ErrorKind::kAlreadyExists;
        if (!stale || round > 0) throw;
        Invalidate();
      }
    }
  } catch (const std::exception& error) {
    const kube::Duration wait = RetryWait(backoff_, error);
    const std::string reason = error.what();
    if (reason != lastError_) {
      // One line per kind of failure, not one per retry.
      runtime::LogWarning("cannot publish ResourceSlice; retrying with backoff",
                          {{"slice", sliceName_}, {"reason", reason}});
      lastError_ = reason;
    }
    attempt.outcome = PublishAttempt::Outcome::kFailed;
    attempt.retryIn = std::max(std::chrono::duration_cast<std::chrono::milliseconds>(wait),
                               std::chrono::milliseconds(10));
    return attempt;
  }
  backoff_.Reset();
  lastError_.clear();
  if (attempt.writes > 0) {
    runtime::LogInfo("published ResourceSlice", {{"slice", sliceName_},
                                                 {"devices", std::to_string(devices.size())},
                                                 {"generation", std::to_string(generation())}});
    attempt.outcome = PublishAttempt::Outcome::kWritten;
  } else {
    attempt.outcome = PublishAttempt::Outcome::kUnchanged;
  }
  return attempt;
}

SliceWatch::SliceWatch(kube::Client& client, const std::string& nodeName,
                       const SlicePublisher& publisher)
    : client_(client),
      sliceName_(SliceName(nodeName)),
      publisher_(publisher),
      informer_(
          client,
          kube::ResourcePath(api::kResourceGroup, api::kResourceVersion, api::kResourceSlicePlural),
          kube::InformerOptions{.labelSelector = "",
                                .fieldSelector = "spec.nodeName=" + nodeName,
                                .watchTimeoutSeconds = 0,
                                .backoff = {},
                                .random = {}},
          [this](const kube::WatchEvent& event) { OnEvent(event); }) {}

SliceWatch::~SliceWatch() {
  if (watching_) watching_->Remove(*this);
}

void SliceWatch::Start(runtime::Loop& loop, Changed /*changed*/) {
  loop_ = &loop;
  watching_ = std::make_unique<kube::InformerLoop>("slice-watch", client_.time());
  watching_->Add(*this);
}

kube::LoopMember::Next SliceWatch::Step(kube::TimePoint now, bool mayList) {
  const kube::TimePoint next = informer_.Step(now, mayList);  // never throws
  if (informer_.LastError() != lastError_) {
    if (!informer_.LastError().empty()) {
      runtime::LogWarning(
          "ResourceSlice watch failed; a slice deleted meanwhile is repaired at "
          "the next resync",
          {{"reason", informer_.LastError()}});
    }
    lastError_ = informer_.LastError();
  }
  return {next, informer_.Fds()};
}

void SliceWatch::OnEvent(const kube::WatchEvent& event) {
  const json metadata = event.object.value("metadata", json::object());
  if (metadata.value("name", "") != sliceName_) return;
  std::string why;
  if (event.type == "DELETED") {
    why = "ResourceSlice deleted";
  } else if (!publisher_.IsWhatWasWritten(event.object)) {
    why = "ResourceSlice changed by someone else";
  } else {
    return;  // the agent's own write coming back
  }
  if (repair_) loop_->Post([repair = repair_, why] { repair(why); });
}

}  // namespace cozy::agent
