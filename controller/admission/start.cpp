#include "controller/admission/start.h"

#include <algorithm>
#include <set>

#include "api/keys.h"
#include "api/time.h"
#include "controller/model/readers.h"

namespace cozy::admission {

std::vector<std::string> StartMembers(const api::DeviceReferences& references,
                                      const std::string& vmiName) {
  std::vector<std::string> members(references.devices.begin(), references.devices.end());
  for (const auto& t : references.templates) {
    members.push_back(model::TemplateDeviceName(vmiName, t.name));
  }
  return members;
}

BindAnswer AnswerFor(const api::GpuDevice& device, const std::string& requestId) {
  BindAnswer answer;
  const auto& response = device.status.bindResponse;
  if (!response || response->id != requestId) return answer;
  answer.answered = true;
  answer.succeeded = response->result == api::BindResult::kSucceeded;
  answer.message = response->message;
  if (device.Phase() == api::DevicePhase::kBound && device.status.nodeName) {
    answer.node = *device.status.nodeName;
  }
  return answer;
}

std::optional<std::string> InUseByRunningVmi(
    const std::vector<std::string>& members, const std::string& ns, const DeviceReader& read,
    const model::SharedVector<model::VirtualMachineInstance>& vmis) {
  for (const std::string& member : members) {
    const auto device = read(member);
    if (!device || !device->status.attachment || device->status.attachment->vmiUid.empty()) {
      continue;
    }
    const api::Attachment& attachment = *device->status.attachment;
    for (const auto& running : vmis) {
      if (running.namespaceName == ns && running.name == attachment.vmiName &&
          running.uid == attachment.vmiUid) {
        return "GPUDevice " + member + " is in use by the running VirtualMachineInstance " +
               running.name;
      }
    }
  }
  return std::nullopt;
}

bool AnsweredOwnSet(const std::vector<std::string>& members, const std::string& vmiName,
                    const DeviceReader& read, std::chrono::system_clock::time_point now,
                    std::chrono::seconds recent) {
  std::set<std::string> nodes;
  for (const std::string& member : members) {
    const auto device = read(member);
    if (!device || !device->status.attachment || device->status.attachment->vmiName != vmiName ||
        !device->status.attachment->vmiUid.empty() || !device->status.bindRequest) {
      return false;
    }
    const BindAnswer answer = AnswerFor(*device, device->status.bindRequest->id);
    const auto requested = api::ParseTime(device->status.bindRequest->requestedAt);
    if (!answer.succeeded || answer.node.empty() || !requested || now - *requested > recent) {
      return false;
    }
    nodes.insert(answer.node);
  }
  return !members.empty() && nodes.size() == 1;
}

std::optional<std::string> LeftoverTemplateRefusal(const api::GpuDevice& existing,
                                                   const std::string& vmiName,
                                                   const std::string& className) {
  const auto mark = existing.metadata.labels.find(std::string(api::kTemplateDeviceLabel));
  const bool marked =
      mark != existing.metadata.labels.end() && mark->second == api::kTemplateDeviceLabelValue;
  const bool free = !existing.status.attachment || existing.status.attachment->vmiName == vmiName;
  if (!marked || !free || existing.metadata.deletionTimestamp ||
      existing.spec.className != className) {
    return "GPUDevice " + existing.metadata.name +
           " already exists and is not a template device of this VM";
  }
  return std::nullopt;
}

std::optional<std::string> AttachRefusal(const api::GpuDevice& current,
                                         const std::string& vmiName) {
  if (current.metadata.deletionTimestamp) {
    return "GPUDevice " + current.metadata.name + " is being deleted";
  }
  if (current.status.attachment && current.status.attachment->vmiName != vmiName) {
    return "GPUDevice " + current.metadata.name + " is attached to VirtualMachineInstance " +
           current.status.attachment->vmiName;
  }
  return std::nullopt;
}

nlohmann::json AttachmentStatus(const std::string& vmiName, const std::string& requestId,
                                const std::string& now) {
  return {{"attachment", {{"vmiName", vmiName}, {"vmiUID", nullptr}, {"attachedAt", now}}},
          {"bindRequest", {{"id", requestId}, {"requestedAt", now}}}};
}

Placement ReadPlacement(const std::vector<std::string>& members, const DeviceReader& read,
                        const std::string& requestId) {
  Placement placement;
  std::set<std::string> nodes;
  bool all = true;
  for (const std::string& member : members) {
    const auto device = read(member);
    const BindAnswer answer = device ? AnswerFor(*device, requestId) : BindAnswer{};
    if (!answer.answered) {
      all = false;
      continue;
    }
    if (!answer.succeeded || answer.node.empty()) {
      placement.state = Placement::State::kRefused;
      placement.refusal = "GPUDevice " + member + " cannot be placed: " + answer.message;
      return placement;
    }
    nodes.insert(answer.node);
  }
  if (all && nodes.size() == 1) {
    placement.state = Placement::State::kPlaced;
    placement.node = *nodes.begin();
  }
  return placement;
}

void StartUndo::Created(std::string device, std::string uid) {
  done_.push_back(Step{Step::Kind::kDelete, std::move(device), std::move(uid)});
}

void StartUndo::Attached(const std::string& device) {
  const bool created = std::any_of(done_.begin(), done_.end(), [&](const Step& step) {
    return step.kind == Step::Kind::kDelete && step.device == device;
  });
  if (!created) done_.push_back(Step{Step::Kind::kDetach, device, ""});
}

std::vector<StartUndo::Step> StartUndo::Steps() const { return {done_.rbegin(), done_.rend()}; }

}  // namespace cozy::admission
