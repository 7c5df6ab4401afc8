#include "api/gpuclass.h"

#include "api/keys.h"
#include "api/quantity.h"
#include "api/validation.h"

namespace cozy::api {

std::string_view ToString(GpuMode mode) { return mode == GpuMode::kVgpu ? "vgpu" : "passthrough"; }

std::string_view ToString(OnCordon onCordon) {
  return onCordon == OnCordon::kStay ? "Stay" : "Move";
}

GpuClass GpuClassFromJson(const nlohmann::json& object) {
  const JsonField root(object, "");
  GpuClass gpuClass;
  gpuClass.metadata = ObjectMetaFromJson(root.Require("metadata"));
  if (std::string why = CheckClassName(gpuClass.metadata.name); !why.empty()) {
    throw DecodeError("metadata.name", why);
  }
  const JsonField spec = root.Require("spec");
  GpuClassSpec& out = gpuClass.spec;
  out.vendor = spec.Require("vendor").AsString();
  out.model = spec.Require("model").AsString();

  const JsonField mode = spec.Require("mode");
  const std::string modeText = mode.AsString();
  if (modeText == "passthrough") {
    out.mode = GpuMode::kPassthrough;
  } else if (modeText == "vgpu") {
    out.mode = GpuMode::kVgpu;
  } else {
    mode.Fail("\"" + modeText + "\" is not one of passthrough, vgpu");
  }
  out.profile = spec.OptionalString("profile");
  if (std::optional<JsonField> memory = spec.Find("memory")) {
    out.memory = memory->AsQuantityText();
    if (QuantityResult parsed = ParseWholeQuantity(*out.memory); !parsed.value) {
      memory->Fail(parsed.error);
    }
  }
  if (std::optional<JsonField> maxCount = spec.Find("maxCount")) {
    out.maxCount = maxCount->AsInt();
    if (*out.maxCount < 1) {
      maxCount->Fail("must be at least 1");
    }
  }

  const JsonField source = spec.Require("source");
  if (source.Find("dra")) {
    throw DecodeError(source.path() + ".dra", "is reserved for a later version");
  }
  for (const auto& [member, value] : source.AsObjectMembers()) {
    if (member != "devicePlugin") {
      value.Fail("is not a source this version knows (devicePlugin)");
    }
  }
  const JsonField resourceName = source.Require("devicePlugin").Require("resourceName");
  out.source.devicePlugin.resourceName = resourceName.AsString();
  if (std::string why = CheckClassResourceName(out.source.devicePlugin.resourceName);
      !why.empty()) {
    resourceName.Fail(why);
  }

  if (std::optional<JsonField> selector = spec.Find("nodeSelector")) {
    out.nodeSelector = LabelSelectorFromJson(*selector);
  }
  if (std::optional<JsonField> onCordon = spec.Find("onCordon")) {
    const std::string text = onCordon->AsString();
    if (text == "Move") {
      out.onCordon = OnCordon::kMove;
    } else if (text == "Stay") {
      out.onCordon = OnCordon::kStay;
    } else {
      onCordon->Fail("\"" + text + "\" is not one of Move, Stay");
    }
  }
  if (std::optional<JsonField> tolerations = spec.Find("tolerations")) {
    out.tolerations = TolerationsFromJson(*tolerations);
  }
  return gpuClass;
}

nlohmann::json ToJson(const GpuClass& gpuClass) {
  const GpuClassSpec& spec = gpuClass.spec;
  nlohmann::json specJson = {
      {"vendor", spec.vendor},
      {"model", spec.model},
      {"mode", ToString(spec.mode)},
      {"source", {{"devicePlugin", {{"resourceName", spec.source.devicePlugin.resourceName}}}}},
      {"onCordon", ToString(spec.onCordon)},
  };
  if (spec.profile) {
    specJson["profile"] = *spec.profile;
  }
  if (spec.memory) {
    specJson["memory"] = *spec.memory;
  }
  if (spec.maxCount) {
    specJson["maxCount"] = *spec.maxCount;
  }
  if (spec.nodeSelector) {
    specJson["nodeSelector"] = ToJson(*spec.nodeSelector);
  }
  if (!spec.tolerations.empty()) {
    nlohmann::json tolerations = nlohmann::json::array();
    for (const Toleration& toleration : spec.tolerations) {
      tolerations.push_back(ToJson(toleration));
    }
    specJson["tolerations"] = std::move(tolerations);
  }
  return {{"apiVersion", kApiVersion},
          {"kind", kGpuClassKind},
          {"metadata", ToJson(gpuClass.metadata)},
          {"spec", std::move(specJson)}};
}

}  // namespace cozy::api
