// The VMI webhook's pure part: which GPU entries a VMI carries of its own, the plan of a start
// (every refusal check before anything is written: E5), and the patch that gives the VMI one
// `gpus` entry per GPU of its set (E9, E10). The writes (creating template devices, attaching
// with optimistic concurrency, waiting for the binder) are the caller's.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "api/device_references.h"
#include "controller/model/model.h"
#include "controller/model/snapshot.h"

namespace cozy::admission {

// The names of the `gpus` entries this webhook writes: "cozy-gpu-<device>-<i>", or when that is
// not a DNS label (too long, or a device name with dots) "cozy-gpu-<cut device>-<hash>-<i>".
inline constexpr std::string_view kGpuEntryPrefix = "cozy-gpu-";
// Entry `index` (0-based) of the device's GPUs: deterministic, a DNS label, distinct per
// (device, index).
std::string GpuEntryName(std::string_view deviceName, int64_t index);
// The spec.resourceClaims entry naming a dra device's claim (E15): "cozy-gpu-<device>", or cut
// and hashed as GpuEntryName does; distinct per device.
std::string ClaimEntryName(std::string_view deviceName);
bool IsWebhookGpuEntryName(std::string_view name);

struct GpuEntry {
  std::string field;         // where it sits, e.g. spec.domain.devices.gpus[0]
  std::string name;          // the entry's name; empty for a resources key
  std::string resourceName;  // its deviceName, or the resources key
  bool operator==(const GpuEntry&) const = default;
};

struct VmiGpuEntries {
  std::vector<GpuEntry> own;      // the VMI's own: what a tenant (or virt-api) wrote
  std::vector<GpuEntry> webhook;  // `gpus` entries named as this webhook names them
};

// The VMI's GPU entries: every spec.domain.devices.gpus entry, every hostDevices entry whose
// deviceName is in `gpuResourceNames`, every spec.domain.resources requests or limits key that
// is. Pass the effective set (model::EffectiveGpuResourceNames): a hostDevice on a name only
// KubeVirt's NVIDIA or mediated permittedHostDevices entries carry is a GPU entry, a ConnectX VF
// is not (E11). Throws api::DecodeError on a VMI whose fields have the wrong shape.
VmiGpuEntries OwnGpuEntries(const nlohmann::json& vmi,
                            const std::set<std::string>& gpuResourceNames);

struct VmiInput {
  std::string namespaceName;
  std::string vmiName;
  api::DeviceReferences references;
  VmiGpuEntries entries;           // OwnGpuEntries of the VMI
  bool rawNamesForbidden = false;  // the settings' raw-name policy
  std::string now;  // RFC 3339: attachedAt, requestedAt and creationTimestamp in the plan
  // Place the set with a whole pass on a copy of the snapshot, never Model::PlanStart's
  // shortcut: the peer the shortcut is held equal to (tests) and measured against (benches).
  bool wholePass = false;
};

struct PlacedDevice {
  std::string deviceName;
  std::string resourceName;  // its class's device-plugin resource name; empty for a dra class
  int64_t count = 1;
  // Its class sells through DRA: its GPUs are the requests of its claim (docs/dra.md, "The
  // claims"), named in KubeVirt's DRA form (E15).
  bool dra = false;
  bool operator==(const PlacedDevice&) const = default;
};

struct VmiStartPlan {
  std::optional<std::string> refusal;  // set: refuse the VMI, write nothing
  // Devices that exist and are to be attached: the held ones, and template devices an earlier
  // call for this VMI already created (a reinvocation or a retry).
  std::vector<std::string> heldDevices;
  // GPUDevices to create, ready to POST: name model::TemplateDeviceName(vmi, template),
  // the VMI's namespace, label api::kTemplateDeviceLabel, the template's class and count.
  std::vector<nlohmann::json> templateDevices;
  std::string node;                   // where the model places the whole set now
  std::vector<PlacedDevice> devices;  // every member, in reference order, for VmiGpuPatch
};

// Runs every refusal check of a VMI start, writing nothing:
//   each referenced device exists in the VMI's namespace, is not being deleted, is not attached
//   to another VMI name (this one's is a retry or a reinvocation);
//   each new template passes CheckClassOrder (E1, E4; room is the pass's) and all together the
//   budgets (E3, Model::CheckNewOrder); a template device that already exists is taken as held
//   when it carries the template mark, the template's spec and no other VMI's attachment;
//   with raw names forbidden, the VMI carries no GPU entry of its own (the webhook's are
//   replaced by the patch);
//   the whole set fits on one node now: a binder pass (Model::PlanPass) on a copy of the
//   snapshot with the template devices added and every member attached to the VMI with a
//   bind request must bind, move or keep every member onto one node. Model::PlanStart gives
//   that pass's decisions for the set without the copy where it can (docs/controller.md,
//   "VMI starts"), and the copy's pass runs where it cannot.
VmiStartPlan PlanVmiStart(const model::Snapshot& snapshot, const model::Model& model,
                          const VmiInput& input);

// JSONPatch ops giving the VMI one spec.domain.devices.gpus entry per GPU of `devices`
// ({"name": GpuEntryName(device, i), "deviceName": resourceName}) and never a resources key
// (E10); for a dra device, KubeVirt's DRA form (E15): a spec.resourceClaims entry
// {"name": ClaimEntryName(device), "resourceClaimName": device} and per GPU i a gpus entry
// {"name": GpuEntryName(device, i), "claimName": ClaimEntryName(device), "requestName":
// "gpu-<i>"}. Missing parents are added. Webhook entries not of this set are removed; the VMI's
// own entries are left alone. A VMI already carrying exactly these entries gets no ops (E9).
nlohmann::json VmiGpuPatch(const nlohmann::json& vmi, const std::vector<PlacedDevice>& devices);

}  // namespace cozy::admission
