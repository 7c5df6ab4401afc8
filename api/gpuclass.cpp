#include "api/gpuclass.h"

#include <algorithm>
#include <cctype>

#include "api/keys.h"
#include "api/quantity.h"
#include "api/validation.h"

namespace cozy::api {

std::string_view ToString(GpuMode mode) { return mode == GpuMode::kVgpu ? "vgpu" : "passthrough"; }

std::string_view ToString(OnCordon onCordon) {
  return onCordon == OnCordon::kStay ? "Stay" : "Move";
}

std::string DraUnitsName(std::string_view pciVendorSelector) {
  std::string selector(pciVendorSelector);
  std::transform(selector.begin(), selector.end(), selector.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return "DRA GPUs " + selector;
}

std::string GpuClass::UnitsName() const {
  return spec.source.dra ? DraUnitsName(spec.source.dra->pciVendorSelector)
                         : spec.source.devicePlugin.resourceName;
}

namespace {

// B5: exactly one member, devicePlugin or dra; dra sells passthrough functions only.
void DecodeSource(const JsonField& source, GpuClassSpec& out) {
  const auto members = source.AsObjectMembers();
  for (const auto& [member, value] : members) {
    if (member != "devicePlugin" && member != "dra") {
      value.Fail("is not a source this version knows (devicePlugin, dra)");
    }
  }
  if (members.size() > 1) {
    source.Fail("names more than one source; exactly one of devicePlugin, dra");
  }
  if (std::optional<JsonField> dra = source.Find("dra")) {
    const JsonField selector = dra->Require("pciVendorSelector");
    const std::string text = selector.AsString();
    if (std::string why = CheckPciVendorSelector(text); !why.empty()) {
      selector.Fail(why);
    }
    if (out.mode != GpuMode::kPassthrough) {
      dra->Fail("sells whole PCI functions: the class's mode must be passthrough");
    }
    out.source.dra = DraSource{text};
    return;
  }
  const JsonField resourceName = source.Require("devicePlugin").Require("resourceName");
  out.source.devicePlugin.resourceName = resourceName.AsString();
  if (std::string why = CheckClassResourceName(out.source.devicePlugin.resourceName);
      !why.empty()) {
    resourceName.Fail(why);
  }
}

}  // namespace

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

  DecodeSource(spec.Require("source"), out);

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
      {"source",
       spec.source.dra
           ? nlohmann::json{{"dra", {{"pciVendorSelector", spec.source.dra->pciVendorSelector}}}}
           : nlohmann::json{{"devicePlugin",
                             {{"resourceName", spec.source.devicePlugin.resourceName}}}}},
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
