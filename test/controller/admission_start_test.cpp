// The VMI webhook's decisions between its plan and its answer, without a cluster
// (controller/admission/start.h; docs/controller.md, "Admission webhooks"): the members of a start,
// in use by a running VMI (E5), a reinvocation's own answered set (E9), a leftover template device
// reused or refused (E6), when a device may be attached and what the attachment writes (E7), where
// the binder's answers stand (E8), and what a refusal rolls back. The webhook's I/O over these is
// tested against the fake and the real API server in test/e2e/admission_e2e_test.cpp.
#include <gtest/gtest.h>

#include <map>

#include "api/keys.h"
#include "api/time.h"
#include "controller/admission/start.h"
#include "controller/model/readers.h"
#include "test/controller/model_fixtures.h"

namespace cozy::admission {
namespace {

using namespace cozy::model::testing;
using std::chrono::system_clock;

// The devices a reader sees, by name.
struct Devices {
  std::map<std::string, api::GpuDevice> byName;
  void Put(const api::GpuDevice& device) { byName[device.metadata.name] = device; }
  DeviceReader Reader() const {
    return [this](const std::string& name) -> std::shared_ptr<const api::GpuDevice> {
      auto it = byName.find(name);
      if (it == byName.end()) return nullptr;
      return std::make_shared<const api::GpuDevice>(it->second);
    };
  }
};

const system_clock::time_point kNow = system_clock::time_point(std::chrono::seconds(1'800'000'000));
const std::chrono::seconds kRecent(120);

// A device the webhook attached to `vmi` (no uid yet) and asked for under `request`, answered
// as `result` on `node` (Bound there when it succeeded).
api::GpuDevice Requested(const std::string& name, const std::string& vmi,
                         const std::string& request, std::optional<api::BindResult> result,
                         const std::string& node = "", std::chrono::seconds age = {}) {
  api::GpuDevice device = Pending("tenant-a", name, "a100", 1);
  device.status.attachment = api::Attachment{vmi, "", api::FormatTime(kNow - age)};
  device.status.bindRequest = api::BindRequest{request, api::FormatTime(kNow - age)};
  if (result) {
    device.status.bindResponse = api::BindResponse{request, *result, "", ""};
    if (*result == api::BindResult::kSucceeded) {
      device.status.phase = api::DevicePhase::kBound;
      device.status.nodeName = node;
    } else {
      device.status.bindResponse->message = "no node has 1 free a100";
    }
  }
  return device;
}

TEST(StartMembers, HeldDevicesThenOneDevicePerTemplate) {
  api::DeviceReferences references;
  references.devices = {"gpu-b", "gpu-a"};
  references.templates = {{"train", "a100", 2}, {"infer", "l4", 1}};
  EXPECT_EQ(StartMembers(references, "vm1"),
            (std::vector<std::string>{"gpu-b", "gpu-a", model::TemplateDeviceName("vm1", "train"),
                                      model::TemplateDeviceName("vm1", "infer")}));
}

TEST(AnswerFor, OnlyTheAnswerToThisRequestCounts) {
  api::GpuDevice device = Requested("gpu-a", "vm1", "req-1", api::BindResult::kSucceeded, "n1");
  const BindAnswer mine = AnswerFor(device, "req-1");
  EXPECT_TRUE(mine.answered);
  EXPECT_TRUE(mine.succeeded);
  EXPECT_EQ(mine.node, "n1");
  // An answer to an earlier request is no answer to this one.
  EXPECT_FALSE(AnswerFor(device, "req-2").answered);
  // Succeeded but not Bound (an answer read before the phase): no node to start on.
  device.status.phase = api::DevicePhase::kPending;
  EXPECT_EQ(AnswerFor(device, "req-1").node, "");
  const BindAnswer failed =
      AnswerFor(Requested("gpu-a", "vm1", "req-1", api::BindResult::kFailed), "req-1");
  EXPECT_TRUE(failed.answered);
  EXPECT_FALSE(failed.succeeded);
  EXPECT_EQ(failed.message, "no node has 1 free a100");
}

TEST(InUseByRunningVmi, E5_RefusesADeviceOfARunningVmiOnlyByNameAndUid) {
  Devices devices;
  devices.Put(Bound("tenant-a", "gpu-a", "a100", 1, "n1", "vm1"));  // attached to vm1, vm1-uid
  devices.Put(Pending("tenant-a", "gpu-b", "a100", 1));
  model::VirtualMachineInstance running;
  running.namespaceName = "tenant-a";
  running.name = "vm1";
  running.uid = "vm1-uid";
  running.nodeName = "n1";
  running.phase = "Running";

  const auto refusal =
      InUseByRunningVmi({"gpu-b", "gpu-a"}, "tenant-a", devices.Reader(), {running});
  ASSERT_TRUE(refusal);
  EXPECT_EQ(*refusal, "GPUDevice gpu-a is in use by the running VirtualMachineInstance vm1");

  // Another uid (the VMI of that name was recreated), another namespace, no VMI at all: free.
  model::VirtualMachineInstance recreated = running;
  recreated.uid = "other-uid";
  EXPECT_FALSE(InUseByRunningVmi({"gpu-a"}, "tenant-a", devices.Reader(), {recreated}));
  model::VirtualMachineInstance elsewhere = running;
  elsewhere.namespaceName = "tenant-b";
  EXPECT_FALSE(InUseByRunningVmi({"gpu-a"}, "tenant-a", devices.Reader(), {elsewhere}));
  EXPECT_FALSE(InUseByRunningVmi({"gpu-a"}, "tenant-a", devices.Reader(), {}));
  // An attachment the controller has not matched to a VMI yet (no uid) is a start in flight,
  // not a running VM; a device that is not there is the plan's to refuse.
  devices.Put(Requested("gpu-a", "vm1", "req-1", std::nullopt));
  EXPECT_FALSE(InUseByRunningVmi({"gpu-a", "gone"}, "tenant-a", devices.Reader(), {running}));
}

TEST(AnsweredOwnSet, E9_AReinvocationFindsItsSetPlacedOnOneNode) {
  Devices devices;
  devices.Put(Requested("gpu-a", "vm1", "req-1", api::BindResult::kSucceeded, "n1"));
  devices.Put(Requested("gpu-b", "vm1", "req-1", api::BindResult::kSucceeded, "n1"));
  EXPECT_TRUE(AnsweredOwnSet({"gpu-a", "gpu-b"}, "vm1", devices.Reader(), kNow, kRecent));
  // Another VM's name, or no members at all: not this call's own.
  EXPECT_FALSE(AnsweredOwnSet({"gpu-a", "gpu-b"}, "vm2", devices.Reader(), kNow, kRecent));
  EXPECT_FALSE(AnsweredOwnSet({}, "vm1", devices.Reader(), kNow, kRecent));
  // A member missing (or unreadable) breaks the set.
  EXPECT_FALSE(AnsweredOwnSet({"gpu-a", "gone"}, "vm1", devices.Reader(), kNow, kRecent));
}

TEST(AnsweredOwnSet, E9_NotOwnWhenSplitRefusedUnansweredStaleOrMatched) {
  auto own = [](const api::GpuDevice& b) {
    Devices devices;
    devices.Put(Requested("gpu-a", "vm1", "req-1", api::BindResult::kSucceeded, "n1"));
    devices.Put(b);
    return AnsweredOwnSet({"gpu-a", "gpu-b"}, "vm1", devices.Reader(), kNow, kRecent);
  };
  EXPECT_TRUE(own(Requested("gpu-b", "vm1", "req-1", api::BindResult::kSucceeded, "n1")));
  EXPECT_FALSE(own(Requested("gpu-b", "vm1", "req-1", api::BindResult::kSucceeded, "n2")))
      << "two nodes: the set is not placed yet";
  EXPECT_FALSE(own(Requested("gpu-b", "vm1", "req-1", api::BindResult::kFailed)));
  EXPECT_FALSE(own(Requested("gpu-b", "vm1", "req-1", std::nullopt)));
  EXPECT_FALSE(own(Requested("gpu-b", "vm1", "req-1", api::BindResult::kSucceeded, "n1",
                             kRecent + std::chrono::seconds(1))))
      << "an answer older than the recent window belongs to a start long gone";
  EXPECT_TRUE(own(Requested("gpu-b", "vm1", "req-1", api::BindResult::kSucceeded, "n1", kRecent)));
  api::GpuDevice matched = Requested("gpu-b", "vm1", "req-1", api::BindResult::kSucceeded, "n1");
  matched.status.attachment->vmiUid = "vm1-uid";
  EXPECT_FALSE(own(matched)) << "a matched attachment is a VMI that was created: not a retry";
  api::GpuDevice unrequested = matched;
  unrequested.status.attachment->vmiUid.clear();
  unrequested.status.bindRequest.reset();
  EXPECT_FALSE(own(unrequested));
  api::GpuDevice badTime = Requested("gpu-b", "vm1", "req-1", api::BindResult::kSucceeded, "n1");
  badTime.status.bindRequest->requestedAt = "yesterday";
  EXPECT_FALSE(own(badTime));
}

api::GpuDevice Leftover(const std::string& vmi, const std::string& className) {
  api::GpuDevice device =
      Pending("tenant-a", model::TemplateDeviceName(vmi, "train"), className, 1, "");
  device.metadata.labels[std::string(api::kTemplateDeviceLabel)] =
      std::string(api::kTemplateDeviceLabelValue);
  return device;
}

TEST(LeftoverTemplateRefusal, E6_AnEarlierTrysTemplateIsReusedOnlyWhenItIsThisVmsToTake) {
  const std::string name = model::TemplateDeviceName("vm1", "train");
  EXPECT_FALSE(LeftoverTemplateRefusal(Leftover("vm1", "a100"), "vm1", "a100"));
  api::GpuDevice attachedHere = Leftover("vm1", "a100");
  attachedHere.status.attachment = api::Attachment{"vm1", "", ""};
  EXPECT_FALSE(LeftoverTemplateRefusal(attachedHere, "vm1", "a100"));

  const std::string refusal =
      "GPUDevice " + name + " already exists and is not a template device of this VM";
  api::GpuDevice unmarked = Leftover("vm1", "a100");
  unmarked.metadata.labels.clear();
  EXPECT_EQ(LeftoverTemplateRefusal(unmarked, "vm1", "a100"), refusal) << "a tenant's own order";
  api::GpuDevice markedFalse = Leftover("vm1", "a100");
  markedFalse.metadata.labels[std::string(api::kTemplateDeviceLabel)] = "false";
  EXPECT_EQ(LeftoverTemplateRefusal(markedFalse, "vm1", "a100"), refusal);
  api::GpuDevice attachedElsewhere = Leftover("vm1", "a100");
  attachedElsewhere.status.attachment = api::Attachment{"vm2", "", ""};
  EXPECT_EQ(LeftoverTemplateRefusal(attachedElsewhere, "vm1", "a100"), refusal);
  api::GpuDevice deleting = Leftover("vm1", "a100");
  deleting.metadata.deletionTimestamp = "2026-12-02T10:00:00Z";
  EXPECT_EQ(LeftoverTemplateRefusal(deleting, "vm1", "a100"), refusal);
  EXPECT_EQ(LeftoverTemplateRefusal(Leftover("vm1", "l4"), "vm1", "a100"), refusal)
      << "the template now asks for another class";
}

TEST(AttachRefusal, E7_ADeviceBeingDeletedOrAttachedToAnotherVmIsRefused) {
  api::GpuDevice device = Pending("tenant-a", "gpu-a", "a100", 1);
  EXPECT_FALSE(AttachRefusal(device, "vm1"));
  device.status.attachment = api::Attachment{"vm1", "", ""};
  EXPECT_FALSE(AttachRefusal(device, "vm1")) << "this VM's own: a retry";
  device.status.attachment = api::Attachment{"vm2", "vm2-uid", ""};
  EXPECT_EQ(AttachRefusal(device, "vm1"),
            "GPUDevice gpu-a is attached to VirtualMachineInstance vm2");
  device.metadata.deletionTimestamp = "2026-12-02T10:00:00Z";
  EXPECT_EQ(AttachRefusal(device, "vm1"), "GPUDevice gpu-a is being deleted");
}

TEST(AttachmentStatus, E7_AttachesTheNameWithoutAUidAndAsksUnderTheRequest) {
  EXPECT_EQ(AttachmentStatus("vm1", "req-1", "2026-12-02T10:00:00Z"), nlohmann::json::parse(R"({
              "attachment": {"vmiName": "vm1", "vmiUID": null,
                             "attachedAt": "2026-12-02T10:00:00Z"},
              "bindRequest": {"id": "req-1", "requestedAt": "2026-12-02T10:00:00Z"}})"));
}

TEST(ReadPlacement, E8_PlacedOnlyWhenEveryMemberIsAnsweredOnOneNode) {
  Devices devices;
  devices.Put(Requested("gpu-a", "vm1", "req-1", api::BindResult::kSucceeded, "n1"));
  devices.Put(Requested("gpu-b", "vm1", "req-1", std::nullopt));
  const std::vector<std::string> members = {"gpu-a", "gpu-b"};
  EXPECT_EQ(ReadPlacement(members, devices.Reader(), "req-1").state, Placement::State::kWaiting);

  // Answered apart for a moment (attached one after the other): still waiting.
  devices.Put(Requested("gpu-b", "vm1", "req-1", api::BindResult::kSucceeded, "n2"));
  EXPECT_EQ(ReadPlacement(members, devices.Reader(), "req-1").state, Placement::State::kWaiting);

  devices.Put(Requested("gpu-b", "vm1", "req-1", api::BindResult::kSucceeded, "n1"));
  const Placement placed = ReadPlacement(members, devices.Reader(), "req-1");
  EXPECT_EQ(placed.state, Placement::State::kPlaced);
  EXPECT_EQ(placed.node, "n1");
  // The answers belong to another request: this one waits.
  EXPECT_EQ(ReadPlacement(members, devices.Reader(), "req-2").state, Placement::State::kWaiting);
  // A member the cache no longer shows has no answer yet.
  EXPECT_EQ(ReadPlacement({"gpu-a", "gone"}, devices.Reader(), "req-1").state,
            Placement::State::kWaiting);
}

TEST(ReadPlacement, E8_OneRefusedMemberRefusesTheStartWithTheBindersReason) {
  Devices devices;
  devices.Put(Requested("gpu-a", "vm1", "req-1", std::nullopt));
  devices.Put(Requested("gpu-b", "vm1", "req-1", api::BindResult::kFailed));
  const Placement refused = ReadPlacement({"gpu-a", "gpu-b"}, devices.Reader(), "req-1");
  EXPECT_EQ(refused.state, Placement::State::kRefused);
  EXPECT_EQ(refused.refusal, "GPUDevice gpu-b cannot be placed: no node has 1 free a100");
  // Succeeded without a node to start on is no placement either.
  api::GpuDevice unbound = Requested("gpu-a", "vm1", "req-1", api::BindResult::kSucceeded, "n1");
  unbound.status.phase = api::DevicePhase::kPending;
  devices.Put(unbound);
  EXPECT_EQ(ReadPlacement({"gpu-a"}, devices.Reader(), "req-1").state, Placement::State::kRefused);
}

TEST(StartUndoE5, TemplatesThisStartCreatedAreDeletedNotDetachedAndTheNewestGoesFirst) {
  using Kind = StartUndo::Step::Kind;
  StartUndo undo;
  EXPECT_TRUE(undo.Empty());
  undo.Created("vm1-train", "uid-1");
  undo.Attached("gpu-a");
  undo.Attached("vm1-train");  // its delete clears it
  undo.Attached("gpu-b");
  EXPECT_FALSE(undo.Empty());
  EXPECT_EQ(undo.Steps(), (std::vector<StartUndo::Step>{{Kind::kDetach, "gpu-b", ""},
                                                        {Kind::kDetach, "gpu-a", ""},
                                                        {Kind::kDelete, "vm1-train", "uid-1"}}));
  StartUndo attachedOnly;
  attachedOnly.Attached("gpu-a");
  EXPECT_EQ(attachedOnly.Steps(), (std::vector<StartUndo::Step>{{Kind::kDetach, "gpu-a", ""}}));
}

}  // namespace
}  // namespace cozy::admission
