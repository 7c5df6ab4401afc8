#include "controller/daemon/vmi_lookup.h"

#include <map>
#include <memory>

#include "controller/kinds.h"
#include "controller/snapshot_json.h"

namespace cozy::controller {

VmiLookup VmiLookupFromCache(kube::ResourceState state,
                             std::shared_ptr<kube::Cache<model::VirtualMachineInstance>> cache) {
  return [state, cache](const std::string& ns, const std::string& name) {
    VmiState vmi;
    if (state.served != kube::Served::kServed) {
      vmi.why = "VirtualMachineInstance is " + std::string(kube::ServedName(state.served));
      return vmi;
    }
    if (!cache || !cache->Synced()) {
      vmi.why = "the VMI cache has not synced";
      return vmi;
    }
    auto found = cache->Get(ns + "/" + name);
    if (!found) {
      vmi.presence = VmiState::Presence::kAbsent;
      return vmi;
    }
    vmi.presence = VmiState::Presence::kPresent;
    vmi.uid = found->uid;
    vmi.creationTimestamp = found->creationTimestamp;
    vmi.object = found;
    return vmi;
  };
}

VmiLookup VmiLookupByReading(kube::Client& client, kube::Served served) {
  auto seen = std::make_shared<std::map<std::string, VmiState>>();
  return [&client, seen, served](const std::string& ns, const std::string& name) {
    const std::string key = ns + "/" + name;
    if (auto it = seen->find(key); it != seen->end()) return it->second;
    VmiState vmi;
    if (served == kube::Served::kNotServed) {
      vmi.why = "VirtualMachineInstance is " + std::string(kube::ServedName(served));
      (*seen)[key] = vmi;
      return vmi;
    }
    try {
      const nlohmann::json object = client.Get(kVmis.Path(ns, name));
      auto decoded = std::make_shared<const model::VirtualMachineInstance>(VmiFromJson(object));
      vmi.presence = VmiState::Presence::kPresent;
      vmi.uid = decoded->uid;
      vmi.creationTimestamp = decoded->creationTimestamp;
      vmi.object = std::move(decoded);
    } catch (const kube::ApiError& error) {
      if (error.kind() == kube::ErrorKind::kNotFound) {
        vmi.presence = VmiState::Presence::kAbsent;
      } else if (error.kind() == kube::ErrorKind::kResourceNotServed) {
        vmi.why = "VirtualMachineInstance is not served (VMI " + key + ")";
      } else {
        vmi.why = error.what();
      }
    } catch (const std::exception& error) {
      vmi.why = std::string("VMI ") + key + ": " + error.what();
    }
    (*seen)[key] = vmi;
    return vmi;
  };
}

}  // namespace cozy::controller
