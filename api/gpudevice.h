// GPUDevice (namespaced): a tenant's order of GPUs of one class. The spec is immutable; the
// status carries placement (written by the binder only) and the webhook-binder exchange, which
// lives in status because no tenant role can write it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "api/meta.h"

namespace cozy::api {

enum class DevicePhase { kPending, kBound, kLost };
enum class BindResult { kSucceeded, kFailed };

std::string_view ToString(DevicePhase phase);
std::string_view ToString(BindResult result);

struct GpuDeviceSpec {
  std::string className;
  int64_t count = 1;  // >= 1
  bool operator==(const GpuDeviceSpec&) const = default;
};

// The VMI a device is attached to; the UID tells a recreated VMI of the same name apart.
// The webhook attaches at the VMI's CREATE admission, before the VMI exists and so before it
// has a UID: it records the name and when (attachedAt). The controller then fills vmiUID from
// the first VMI of that name created at or after attachedAt (to the second, as
// creationTimestamp is), and clears an attachment whose VMI has not appeared within the
// attachment grace (--attachment-grace).
struct Attachment {
  std::string vmiName;
  std::string vmiUid;      // JSON: vmiUID; empty until the controller matched the VMI
  std::string attachedAt;  // RFC 3339; empty on an attachment written before the field existed
  bool operator==(const Attachment&) const = default;
};

struct BindRequest {
  std::string id;
  std::string requestedAt;  // RFC 3339
  bool operator==(const BindRequest&) const = default;
};

struct BindResponse {
  std::string id;  // the request it answers
  BindResult result = BindResult::kSucceeded;
  std::string reason;
  std::string message;
  bool operator==(const BindResponse&) const = default;
};

struct GpuDeviceStatus {
  std::optional<DevicePhase> phase;  // absent on a new order: read as Pending
  std::optional<std::string> nodeName;
  std::optional<Attachment> attachment;
  std::optional<BindRequest> bindRequest;
  std::optional<BindResponse> bindResponse;
  std::vector<Condition> conditions;
  bool operator==(const GpuDeviceStatus&) const = default;
};

struct GpuDevice {
  ObjectMeta metadata;
  GpuDeviceSpec spec;
  GpuDeviceStatus status;

  DevicePhase Phase() const { return status.phase.value_or(DevicePhase::kPending); }
  // A bind request the binder has not answered yet: a VM start waits on the device.
  bool RequestPending() const {
    return status.bindRequest && !status.bindRequest->id.empty() &&
           (!status.bindResponse || status.bindResponse->id != status.bindRequest->id);
  }
  bool operator==(const GpuDevice&) const = default;
};

// Decodes and checks what the CRD checks (count >= 1, the enums). Throws DecodeError.
GpuDevice GpuDeviceFromJson(const nlohmann::json& object);
nlohmann::json ToJson(const GpuDevice& device);

}  // namespace cozy::api
