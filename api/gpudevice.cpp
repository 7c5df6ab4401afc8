#include "api/gpudevice.h"

#include "api/keys.h"
#include "api/validation.h"

namespace cozy::api {

std::string_view ToString(DevicePhase phase) {
  switch (phase) {
    case DevicePhase::kBound:
      return "Bound";
    case DevicePhase::kLost:
      return "Lost";
    case DevicePhase::kPending:
      break;
  }
  return "Pending";
}

std::string_view ToString(BindResult result) {
  return result == BindResult::kFailed ? "Failed" : "Succeeded";
}

namespace {

DevicePhase PhaseFromJson(const JsonField& field) {
  const std::string text = field.AsString();
  if (text == "Pending") {
    return DevicePhase::kPending;
  }
  if (text == "Bound") {
    return DevicePhase::kBound;
  }
  if (text == "Lost") {
    return DevicePhase::kLost;
  }
  field.Fail("\"" + text + "\" is not one of Pending, Bound, Lost");
}

BindResult ResultFromJson(const JsonField& field) {
  const std::string text = field.AsString();
  if (text == "Succeeded") {
    return BindResult::kSucceeded;
  }
  if (text == "Failed") {
    return BindResult::kFailed;
  }
  field.Fail("\"" + text + "\" is not one of Succeeded, Failed");
}

}  // namespace

GpuDevice GpuDeviceFromJson(const nlohmann::json& object) {
  const JsonField root(object, "");
  GpuDevice device;
  device.metadata = ObjectMetaFromJson(root.Require("metadata"));
  const JsonField spec = root.Require("spec");
  const JsonField className = spec.Require("className");
  device.spec.className = className.AsString();
  if (std::string why = CheckClassName(device.spec.className); !why.empty()) {
    className.Fail(why);
  }
  const JsonField count = spec.Require("count");
  device.spec.count = count.AsInt();
  if (device.spec.count < 1) {
    count.Fail("must be at least 1");
  }

  const std::optional<JsonField> status = root.Find("status");
  if (!status) {
    return device;
  }
  GpuDeviceStatus& out = device.status;
  if (std::optional<JsonField> phase = status->Find("phase")) {
    out.phase = PhaseFromJson(*phase);
  }
  out.nodeName = status->OptionalString("nodeName");
  if (std::optional<JsonField> attachment = status->Find("attachment")) {
    out.attachment =
        Attachment{attachment->Require("vmiName").AsString(), attachment->StringOr("vmiUID", ""),
                   attachment->StringOr("attachedAt", "")};
  }
  if (std::optional<JsonField> request = status->Find("bindRequest")) {
    out.bindRequest =
        BindRequest{request->Require("id").AsString(), request->StringOr("requestedAt", "")};
  }
  if (std::optional<JsonField> response = status->Find("bindResponse")) {
    out.bindResponse = BindResponse{
        response->Require("id").AsString(), ResultFromJson(response->Require("result")),
        response->StringOr("reason", ""), response->StringOr("message", "")};
  }
  if (std::optional<JsonField> conditions = status->Find("conditions")) {
    out.conditions = ConditionsFromJson(*conditions);
  }
  return device;
}

nlohmann::json ToJson(const GpuDevice& device) {
  nlohmann::json json = {
      {"apiVersion", kApiVersion},
      {"kind", kGpuDeviceKind},
      {"metadata", ToJson(device.metadata)},
      {"spec", {{"className", device.spec.className}, {"count", device.spec.count}}},
  };
  const GpuDeviceStatus& status = device.status;
  nlohmann::json statusJson = nlohmann::json::object();
  if (status.phase) {
    statusJson["phase"] = ToString(*status.phase);
  }
  if (status.nodeName) {
    statusJson["nodeName"] = *status.nodeName;
  }
  if (status.attachment) {
    statusJson["attachment"] = {{"vmiName", status.attachment->vmiName},
                                {"vmiUID", status.attachment->vmiUid}};
    if (!status.attachment->attachedAt.empty()) {
      statusJson["attachment"]["attachedAt"] = status.attachment->attachedAt;
    }
  }
  if (status.bindRequest) {
    statusJson["bindRequest"] = {{"id", status.bindRequest->id},
                                 {"requestedAt", status.bindRequest->requestedAt}};
  }
  if (status.bindResponse) {
    statusJson["bindResponse"] = {{"id", status.bindResponse->id},
                                  {"result", ToString(status.bindResponse->result)},
                                  {"reason", status.bindResponse->reason},
                                  {"message", status.bindResponse->message}};
  }
  if (!status.conditions.empty()) {
    nlohmann::json conditions = nlohmann::json::array();
    for (const Condition& condition : status.conditions) {
      conditions.push_back(ToJson(condition));
    }
    statusJson["conditions"] = std::move(conditions);
  }
  if (!statusJson.empty()) {
    json["status"] = std::move(statusJson);
  }
  return json;
}

}  // namespace cozy::api
