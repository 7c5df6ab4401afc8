// gpu-agent as kubelet's plugin for the DRA driver gpu.cozystack.io (docs/dra.md, "The kubelet
// plugin"): the registration service kubelet's plugin watcher finds in
// <kubelet dir>/plugins_registry, and the DRAPlugin v1 service it then calls to prepare and
// unprepare the claims of the pods it admits. Prepare reads the claim (its UID checked) and
// prepares only the binder's: a claim gpu-controller wrote for a GPUDevice Bound to this node
// (read from the API server). It takes the devices allocated from this node's pool, refuses one
// that is no vfio-bound GPU of the node now (the agent provisions nothing), and writes a CDI spec
// naming /dev/vfio/vfio and the function's IOMMU group node; unprepare removes it. Both are
// idempotent, and what is prepared is the CDI specs on disk, so a restart of the agent or of
// kubelet loses nothing.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/sources/source.h"
#include "kube/client.h"

namespace cozy::agent {

struct KubeletPluginOptions {
  std::string nodeName;
  // kubelet's --root-dir: its plugin watcher reads plugins_registry/ there.
  std::filesystem::path kubeletDir = "/var/lib/kubelet";
  // Where the container runtime reads CDI specs.
  std::filesystem::path cdiDir = "/var/run/cdi";
};

// A device of the node's slice the plugin may prepare (SliceDevices: a vfio-bound GPU).
struct PreparableDevice {
  std::optional<int64_t> iommuGroup;
  nlohmann::json attributes;  // the slice's, for the device metadata file (KEP-5304)
};

// A claim as kubelet names it.
struct ClaimRef {
  std::string ns;
  std::string uid;
  std::string name;
};

// One prepared device, as the DRAPlugin answer carries it.
struct PreparedDevice {
  std::string request;
  std::string pool;
  std::string device;
  std::string cdiId;          // gpu.cozystack.io/vfio=<claim uid>-<device>
  std::string metadataCdiId;  // gpu.cozystack.io/metadata=<claim uid>_<request>
};

struct PreparedClaim {
  std::vector<PreparedDevice> devices;
  nlohmann::json cdiSpec;  // null when the claim has none of this node's devices
  // KEP-5304's device metadata: one file per request (host path -> its JSON stream) and the CDI
  // spec that bind-mounts each read-only where the container looks for it; null without devices.
  std::map<std::filesystem::path, std::string> metadataFiles;
  nlohmann::json metadataSpec;
  std::string error;  // set: nothing prepared
};

// The devices of `claim` (as read from the API server) that kubelet may hand the pod: this
// driver's results from `nodeName`'s pool, each a device of `devices` now; the CDI spec that
// gives a container their VFIO nodes; and, under `metadataDir`, the device metadata files that
// tell virt-launcher each device's PCI address, with the CDI spec that mounts them. Each device
// answers both CDI ids. Pure: PrepareClaim's rules, tested without gRPC.
PreparedClaim PrepareClaim(const nlohmann::json& claim, const ClaimRef& ref,
                           const std::string& nodeName,
                           const std::map<std::string, PreparableDevice>& devices,
                           const std::filesystem::path& metadataDir = "/metadata");

// The GPUDevice a claim is the binder's claim for (docs/dra.md, "Only the binder's claims are
// prepared"; A13): its controller owner reference, when that is a GPUDevice; nullopt for any other
// claim.
struct ClaimOwner {
  std::string name;
  std::string uid;
};
std::optional<ClaimOwner> ClaimOwnerDevice(const nlohmann::json& claim);

// Why kubelet may not hand `nodeName`'s pod the devices of `claim`, or "" when it may: the claim
// must be one gpu-controller wrote for a GPUDevice (its controller owner) that is Bound to this
// node now; `device` is that GPUDevice as read from the API server, or null where it is gone.
// Pure: the agent reads the device, this decides.
std::string BinderClaimError(const nlohmann::json& claim, const ClaimRef& ref,
                             const std::string& nodeName, const nlohmann::json& device);

// The devices of a slice (SliceDevices) by name.
std::map<std::string, PreparableDevice> PreparableDevices(const nlohmann::json& sliceDevices);

struct KubeletPluginCounters {
  std::atomic<int64_t> prepared{0};
  std::atomic<int64_t> prepareFailures{0};
  std::atomic<int64_t> unprepared{0};
  std::atomic<int64_t> unprepareFailures{0};
};

// The two gRPC services on their unix sockets, as a source of the daemon (it asks for no pass):
// started with the other sources, so the plugin is registered before kubelet admits a pod that
// needs it (kubelet retries such a pod only at its periodic resync).
class KubeletPlugin : public Source {
 public:
  KubeletPlugin(kube::Client& client, KubeletPluginOptions options);
  ~KubeletPlugin() override;
  std::string_view Name() const override { return "kubelet plugin"; }
  // Serves both sockets; a socket that cannot be served is logged and leaves the daemon running.
  void Start(runtime::Loop& loop, Changed changed) override;
  void Stop();
  // Any thread: the node's devices as of the last pass.
  void SetDevices(std::map<std::string, PreparableDevice> devices);

  std::filesystem::path RegistrationSocket() const;
  std::filesystem::path ServiceSocket() const;
  std::filesystem::path CdiSpecPath(const std::string& claimUid) const;
  std::filesystem::path MetadataSpecPath(const std::string& claimUid) const;
  // Where the claim's device metadata files are kept on the host (in the plugin's directory).
  std::filesystem::path MetadataDir(const std::string& claimUid) const;
  const KubeletPluginCounters& counters() const { return counters_; }

  // The services' work, on gRPC's threads.
  PreparedClaim Prepare(const ClaimRef& ref);
  std::string Unprepare(const ClaimRef& ref);  // the error, or ""

 private:
  struct Services;
  kube::Client& client_;
  KubeletPluginOptions options_;
  mutable std::mutex mutex_;
  std::map<std::string, PreparableDevice> devices_;
  KubeletPluginCounters counters_;
  std::unique_ptr<Services> services_;
};

}  // namespace cozy::agent
