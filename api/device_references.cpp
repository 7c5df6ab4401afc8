#include "api/device_references.h"

#include <nlohmann/json.hpp>
#include <set>

#include "api/json_field.h"
#include "api/validation.h"

namespace cozy::api {
namespace {

void OnlyKeys(const JsonField& field, std::initializer_list<std::string_view> known) {
  for (const auto& [key, member] : field.AsObjectMembers()) {
    bool found = false;
    for (const std::string_view k : known) {
      found = found || k == key;
    }
    if (!found) {
      member.Fail("unknown key");
    }
  }
}

}  // namespace

DeviceReferences ParseDeviceReferences(std::string_view value) {
  const nlohmann::json json = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) {
    throw DecodeError("", "device references are not JSON");
  }
  if (!json.is_object()) {
    throw DecodeError(
        "", "device references must be a JSON object, not " + std::string(JsonTypeName(json)));
  }
  const JsonField root(json, "");
  OnlyKeys(root, {"devices", "templates"});
  DeviceReferences references;
  std::set<std::string> seen;
  if (const auto devices = root.Find("devices")) {
    for (const JsonField& device : devices->AsArray()) {
      std::string name = device.AsString();
      if (const std::string problem = CheckDnsSubdomain(name); !problem.empty()) {
        device.Fail("device name " + problem);
      }
      if (!seen.insert(name).second) {
        device.Fail("device \"" + name + "\" is named twice");
      }
      references.devices.push_back(std::move(name));
    }
  }
  seen.clear();
  if (const auto templates = root.Find("templates")) {
    for (const JsonField& entry : templates->AsArray()) {
      OnlyKeys(entry, {"name", "className", "count"});
      DeviceReferences::Template item;
      const JsonField name = entry.Require("name");
      item.name = name.AsString();
      if (const std::string problem = CheckDnsLabel(item.name); !problem.empty()) {
        name.Fail("template name " + problem);
      }
      if (!seen.insert(item.name).second) {
        name.Fail("template \"" + item.name + "\" is named twice");
      }
      const JsonField className = entry.Require("className");
      item.className = className.AsString();
      if (const std::string problem = CheckDnsLabel(item.className); !problem.empty()) {
        className.Fail("className " + problem);
      }
      const JsonField count = entry.Require("count");
      if (!count.json().is_number_integer() || count.AsInt() < 1) {
        count.Fail("must be an integer of at least 1");
      }
      item.count = count.AsInt();
      references.templates.push_back(std::move(item));
    }
  }
  if (references.devices.empty() && references.templates.empty()) {
    throw DecodeError("", "device references name no device and no template");
  }
  return references;
}

std::string ToAnnotation(const DeviceReferences& references) {
  // nlohmann's object sorts its keys; ordered_json keeps them as written.
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  if (!references.devices.empty()) {
    json["devices"] = references.devices;
  }
  if (!references.templates.empty()) {
    nlohmann::ordered_json templates = nlohmann::ordered_json::array();
    for (const DeviceReferences::Template& item : references.templates) {
      nlohmann::ordered_json entry = nlohmann::ordered_json::object();
      entry["name"] = item.name;
      entry["className"] = item.className;
      entry["count"] = item.count;
      templates.push_back(std::move(entry));
    }
    json["templates"] = std::move(templates);
  }
  return json.dump();
}

}  // namespace cozy::api
