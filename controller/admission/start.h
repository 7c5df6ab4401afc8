// The VMI webhook's decisions between the plan and the answer, as pure functions over devices as
// read (docs/controller.md, "Admission webhooks"): which devices a start attaches, when a device is
// in use by a running VMI, when a call finds its own answered request (a reinvocation, E9), when a
// template device left by an earlier try is this VM's to reuse (E6), when a device may be attached
// (E7), where the binder's answers stand (E8) and what a refusal rolls back. webhook::Webhooks only
// reads, writes and waits; what it decides is here, and unit-tested without a cluster.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "api/device_references.h"
#include "api/gpudevice.h"
#include "controller/model/snapshot.h"

namespace cozy::admission {

// Reads one GPUDevice of the VMI's namespace by name: the cache's copy, or the API server's.
// nullptr: absent, or unreadable (neither can be a set this request calls its own).
using DeviceReader = std::function<std::shared_ptr<const api::GpuDevice>(const std::string& name)>;

// The devices a start attaches, in reference order: the held ones, then one per template
// (model::TemplateDeviceName).
std::vector<std::string> StartMembers(const api::DeviceReferences& references,
                                      const std::string& vmiName);

// A device's answer to the bind request `requestId`; `answered` false while it has none (or an
// answer to another request). `node`: where a Succeeded answer bound it.
struct BindAnswer {
  bool answered = false;
  bool succeeded = false;
  std::string node;
  std::string message;
};
BindAnswer AnswerFor(const api::GpuDevice& device, const std::string& requestId);

// E5: a member attached to a VMI that runs now (its name and uid among `vmis` of `ns`) is that
// VMI's: a second create of the name would fail after admission, but only after its attachment
// had been taken over. Returns the refusal, or nothing.
std::optional<std::string> InUseByRunningVmi(
    const std::vector<std::string>& members, const std::string& ns, const DeviceReader& read,
    const model::SharedVector<model::VirtualMachineInstance>& vmis);

// E9: whether the members are a set an earlier call for this VMI attached and the binder placed:
// each attached to `vmiName` (no uid yet: the VMI was never created), each answered Succeeded to
// its own request made no longer than `recent` before `now`, all on one node. Such a call (a
// reinvocation or a retry) writes nothing again.
bool AnsweredOwnSet(const std::vector<std::string>& members, const std::string& vmiName,
                    const DeviceReader& read, std::chrono::system_clock::time_point now,
                    std::chrono::seconds recent);

// E6: a template device that already exists, left by an earlier try for this VMI, is reused when
// it is marked as a template device, is not being deleted, is attached to nothing or to this VMI,
// and asks for the same class. Returns the refusal, or nothing (reuse it).
std::optional<std::string> LeftoverTemplateRefusal(const api::GpuDevice& existing,
                                                   const std::string& vmiName,
                                                   const std::string& className);

// E7: a member as read just before its attachment is written: refused when it is being deleted
// or attached to another VMI name. Returns the refusal, or nothing (attach it).
std::optional<std::string> AttachRefusal(const api::GpuDevice& current, const std::string& vmiName);

// E7: the status a member's attachment writes (a merge patch's "status"): attached to the VMI's
// name (its uid unknown until it is created) and asking the binder under `requestId`.
nlohmann::json AttachmentStatus(const std::string& vmiName, const std::string& requestId,
                                const std::string& now);

// E8: where the binder's answers to `requestId` stand over the members.
struct Placement {
  enum class State { kWaiting, kPlaced, kRefused };
  State state = State::kWaiting;
  std::string node;     // kPlaced: the one node of the whole set
  std::string refusal;  // kRefused: the tenant's reason
};
// Placed once every member is answered Succeeded on one node; refused as soon as one member is
// answered otherwise; waiting while one has no answer yet, or while members answered one after
// the other are bound apart for a moment (until a pass gathers the set).
Placement ReadPlacement(const std::vector<std::string>& members, const DeviceReader& read,
                        const std::string& requestId);

// What a VM start wrote, and so what undoing it takes (E5-E7: a refused start leaves no trace):
// one list, in the order of the writes. A template device the start created is deleted (that
// object only: its uid is the delete's precondition); an attachment it made is cleared, unless
// the device is one it created, whose delete clears it.
class StartUndo {
 public:
  struct Step {
    enum class Kind { kDetach, kDelete };
    Kind kind;
    std::string device;
    std::string uid;  // kDelete: the created object's uid
    bool operator==(const Step&) const = default;
  };
  void Created(std::string device, std::string uid);
  void Attached(const std::string& device);
  bool Empty() const { return done_.empty(); }
  // The steps, newest first: every attachment is cleared before the devices it may stand on go.
  std::vector<Step> Steps() const;

 private:
  std::vector<Step> done_;
};

}  // namespace cozy::admission
