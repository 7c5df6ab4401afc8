// The VMI annotation `gpu.cozystack.io/device-references` (api/keys.h): the GPUDevices a VM
// holds and the device templates it orders at start. The vm-instance chart writes it and the
// VMI webhook reads it, in two packages with no shared code, so its shape is fixed here:
//
//   {"devices":["NAME",...],"templates":[{"name":"T","className":"C","count":N},...]}
//
// `devices` names held GPUDevices in the VMI's namespace; `templates` are GPUDevices the webhook
// creates for this VMI (named model::TemplateDeviceName(vmi, template name)). Either list may be
// omitted; not both may be empty.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cozy::api {

struct DeviceReferences {
  struct Template {
    std::string name;       // a DNS label, unique among the templates
    std::string className;  // a DNS label: a GPUClass name
    int64_t count = 1;      // >= 1
    bool operator==(const Template&) const = default;
  };
  std::vector<std::string> devices;  // DNS subdomains, unique
  std::vector<Template> templates;
  bool operator==(const DeviceReferences&) const = default;
};

// Reads the annotation's value. Throws DecodeError naming what is wrong and where
// ("templates[1].count: must be an integer of at least 1"): not JSON, an unknown key, a device
// name that is not a DNS subdomain, a duplicate device or template name, a template name or
// className that is not a DNS label, a count that is not an integer >= 1, or no reference at all.
DeviceReferences ParseDeviceReferences(std::string_view value);

// The annotation's value: compact JSON, keys in the order above, an empty list left out.
std::string ToAnnotation(const DeviceReferences& references);

}  // namespace cozy::api
