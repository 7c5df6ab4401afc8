#include "agent/dra/kubelet_plugin.h"

#include <fstream>
#include <system_error>

#include <grpcpp/grpcpp.h>

#include "agent/dra/dra.grpc.pb.h"
#include "agent/dra/registration.grpc.pb.h"
#include "api/dra.h"
#include "api/keys.h"
#include "runtime/log.h"

namespace cozy::agent {
using nlohmann::json;
namespace dra = k8s::io::kubelet::pkg::apis::dra::v1;

namespace {

// The CDI kinds of the specs the plugin writes: "<vendor>/<class>".
const std::string kCdiKind = std::string(api::kDraDriver) + "/vfio";
const std::string kMetadataCdiKind = std::string(api::kDraDriver) + "/metadata";

// KEP-5304: where a container finds a request's device metadata, and the one version of
// DeviceMetadata written (the stream may hold several, newest first).
const std::filesystem::path kMetadataRoot = "/var/run/kubernetes.io/dra-device-attributes";
constexpr std::string_view kPodClaimNameAnnotation = "resource.kubernetes.io/pod-claim-name";

// The container path of a request's metadata file: a claim made from a template is found by the
// name the pod gives it (`podClaimName`, the annotation the resource-claim controller sets), any
// other by its own.
std::filesystem::path MetadataContainerPath(const std::string& claimName,
                                            const std::string& podClaimName,
                                            const std::string& request) {
  const std::filesystem::path claimDir =
      podClaimName.empty() ? kMetadataRoot / "resourceclaims" / claimName
                           : kMetadataRoot / "resourceclaimtemplates" / podClaimName;
  return claimDir / request / (std::string(api::kDraDriver) + "-metadata.json");
}

// The metadata files and their CDI spec for the devices prepared, by request.
void AddMetadata(const json& claim, const ClaimRef& ref, const std::filesystem::path& metadataDir,
                 const std::map<std::string, PreparableDevice>& devices, PreparedClaim& prepared) {
  std::map<std::string, json> byRequest;  // request -> DeviceMetadata devices
  for (PreparedDevice& device : prepared.devices) {
    byRequest[device.request].push_back({{"driver", std::string(api::kDraDriver)},
                                         {"pool", device.pool},
                                         {"name", device.device},
                                         {"attributes", devices.at(device.device).attributes}});
    device.metadataCdiId = kMetadataCdiKind + "=" + ref.uid + "_" + device.request;
  }
  const json metadata = claim.value("metadata", json::object());
  const std::string name = metadata.value("name", "");
  const std::string podClaimName =
      metadata.value("annotations", json::object()).value(std::string(kPodClaimNameAnnotation), "");
  json specDevices = json::array();
  for (const auto& [request, requestDevices] : byRequest) {
    json object = {{"apiVersion", "metadata.resource.k8s.io/v1alpha1"},
                   {"kind", "DeviceMetadata"},
                   {"metadata",
                    {{"name", name},
                     {"namespace", metadata.value("namespace", "")},
                     {"uid", ref.uid},
                     {"generation", 1}}},
                   {"requests", json::array({{{"name", request}, {"devices", requestDevices}}})}};
    if (!podClaimName.empty()) object["podClaimName"] = podClaimName;
    const std::filesystem::path hostPath = metadataDir / (request + ".json");
    prepared.metadataFiles[hostPath] = object.dump() + "\n";
    json mount = {{"hostPath", hostPath.string()},
                  {"containerPath", MetadataContainerPath(name, podClaimName, request).string()},
                  {"options", json::array({"ro", "bind"})}};
    json device = {{"name", ref.uid + "_" + request}};
    device["containerEdits"]["mounts"] = json::array({std::move(mount)});
    specDevices.push_back(std::move(device));
  }
  prepared.metadataSpec = {
      {"cdiVersion", "0.6.0"}, {"kind", kMetadataCdiKind}, {"devices", std::move(specDevices)}};
}

std::string Describe(const ClaimRef& ref) { return "ResourceClaim " + ref.ns + "/" + ref.name; }

// Writes `text` to `path` through a temporary file and a rename, so a runtime reading the CDI
// directory never sees half a spec.
void WriteAtomically(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path temporary = path.string() + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << text;
    if (!out.flush()) throw std::runtime_error("cannot write " + temporary.string());
  }
  std::filesystem::rename(temporary, path);
}

}  // namespace

std::map<std::string, PreparableDevice> PreparableDevices(const json& sliceDevices) {
  std::map<std::string, PreparableDevice> devices;
  if (!sliceDevices.is_array()) return devices;
  for (const json& device : sliceDevices) {
    const json attributes = device.value("attributes", json::object());
    PreparableDevice preparable;
    const json group = attributes.value("iommuGroup", json::object());
    if (group.contains("int") && group["int"].is_number_integer()) {
      preparable.iommuGroup = group["int"].get<int64_t>();
    }
    preparable.attributes = attributes;
    devices[device.value("name", "")] = std::move(preparable);
  }
  return devices;
}

PreparedClaim PrepareClaim(const json& claim, const ClaimRef& ref, const std::string& nodeName,
                           const std::map<std::string, PreparableDevice>& devices,
                           const std::filesystem::path& metadataDir) {
  PreparedClaim prepared;
  const std::string uid = claim.value("metadata", json::object()).value("uid", "");
  if (uid != ref.uid) {
    prepared.error = Describe(ref) + " has uid " + uid + ", not the " + ref.uid +
                     " kubelet asked for: it was deleted and created again";
    return prepared;
  }
  const json allocation = claim.value("status", json::object()).value("allocation", json());
  if (!allocation.is_object()) {
    prepared.error = Describe(ref) + " is not allocated";
    return prepared;
  }
  json specDevices = json::array();
  for (const json& result :
       allocation.value("devices", json::object()).value("results", json::array())) {
    if (result.value("driver", "") != api::kDraDriver) continue;  // another driver's
    const std::string pool = result.value("pool", "");
    const std::string name = result.value("device", "");
    if (pool != nodeName) {
      prepared.error = Describe(ref) + ": device " + pool + "/" + name + " is not of node " +
                       nodeName + "'s pool";
      return prepared;
    }
    const auto found = devices.find(name);
    if (found == devices.end() || !found->second.iommuGroup) {
      prepared.error = Describe(ref) + ": device " + name + " is no vfio-bound GPU of node " +
                       nodeName + " now (the agent binds no driver)";
      return prepared;
    }
    const std::string cdiName = ref.uid + "-" + name;
    const json groupNode = {{"path", "/dev/vfio/" + std::to_string(*found->second.iommuGroup)}};
    json device = {{"name", cdiName}};
    device["containerEdits"]["deviceNodes"] = json::array({groupNode});
    specDevices.push_back(std::move(device));
    prepared.devices.push_back(
        {result.value("request", ""), pool, name, kCdiKind + "=" + cdiName, ""});
  }
  if (!specDevices.empty()) {
    // /dev/vfio/vfio once for the spec: the container edits of the spec itself apply whenever
    // any of its devices is given to a container.
    prepared.cdiSpec = {
        {"cdiVersion", "0.6.0"},
        {"kind", kCdiKind},
        {"containerEdits", {{"deviceNodes", json::array({{{"path", "/dev/vfio/vfio"}}})}}},
        {"devices", std::move(specDevices)}};
    AddMetadata(claim, ref, metadataDir, devices, prepared);
  }
  return prepared;
}

std::optional<ClaimOwner> ClaimOwnerDevice(const json& claim) {
  const json owners =
      claim.value("metadata", json::object()).value("ownerReferences", json::array());
  if (!owners.is_array()) return std::nullopt;
  for (const json& owner : owners) {
    if (!owner.is_object() || !owner.value("controller", false)) continue;
    if (owner.value("apiVersion", "") != api::kApiVersion ||
        owner.value("kind", "") != api::kGpuDeviceKind) {
      return std::nullopt;
    }
    ClaimOwner device{owner.value("name", ""), owner.value("uid", "")};
    if (device.name.empty() || device.uid.empty()) return std::nullopt;
    return device;
  }
  return std::nullopt;
}

std::string BinderClaimError(const json& claim, const ClaimRef& ref, const std::string& nodeName,
                             const json& device) {
  const std::optional<ClaimOwner> owner = ClaimOwnerDevice(claim);
  if (!owner) {
    return Describe(ref) +
           " is no claim of the GPU catalog's binder (its controller owner is no GPUDevice): "
           "only a GPUDevice's claim gets a catalog GPU";
  }
  const std::string deviceName = "GPUDevice " + ref.ns + "/" + owner->name;
  if (!device.is_object()) {
    return Describe(ref) + " is the claim of " + deviceName + ", which is gone";
  }
  const json metadata = device.value("metadata", json::object());
  if (metadata.value("uid", "") != owner->uid) {
    return Describe(ref) + " is the claim of " + deviceName + " uid " + owner->uid +
           ", which is gone (the device of that name now is another)";
  }
  const json status = device.value("status", json::object());
  const std::string phase = status.is_object() ? status.value("phase", "") : "";
  const std::string node = status.is_object() ? status.value("nodeName", "") : "";
  if (phase != "Bound" || node != nodeName) {
    return Describe(ref) + " is the claim of " + deviceName + ", which is " +
           (phase.empty() ? std::string("Pending") : phase) +
           (node.empty() ? std::string() : " on node " + node) + ", not Bound to node " + nodeName;
  }
  return "";
}

struct KubeletPlugin::Services {
  class Registration final : public pluginregistration::Registration::Service {
   public:
    explicit Registration(KubeletPlugin& plugin) : plugin_(plugin) {}
    grpc::Status GetInfo(grpc::ServerContext*, const pluginregistration::InfoRequest*,
                         pluginregistration::PluginInfo* info) override {
      info->set_type("DRAPlugin");
      info->set_name(std::string(api::kDraDriver));
      info->set_endpoint(plugin_.ServiceSocket().string());
      info->add_supported_versions("v1.DRAPlugin");
      return grpc::Status::OK;
    }
    grpc::Status NotifyRegistrationStatus(
        grpc::ServerContext*, const pluginregistration::RegistrationStatus* status,
        pluginregistration::RegistrationStatusResponse*) override {
      if (status->plugin_registered()) {
        runtime::LogInfo("kubelet registered the DRA plugin",
                         {{"driver", std::string(api::kDraDriver)}});
      } else {
        runtime::LogError("kubelet refused the DRA plugin", {{"reason", status->error()}});
      }
      return grpc::Status::OK;
    }

   private:
    KubeletPlugin& plugin_;
  };

  class Plugin final : public dra::DRAPlugin::Service {
   public:
    explicit Plugin(KubeletPlugin& plugin) : plugin_(plugin) {}
    grpc::Status NodePrepareResources(grpc::ServerContext*,
                                      const dra::NodePrepareResourcesRequest* request,
                                      dra::NodePrepareResourcesResponse* response) override {
      for (const dra::Claim& claim : request->claims()) {
        const PreparedClaim prepared =
            plugin_.Prepare({claim.namespace_(), claim.uid(), claim.name()});
        dra::NodePrepareResourceResponse& answer = (*response->mutable_claims())[claim.uid()];
        if (!prepared.error.empty()) {
          answer.set_error(prepared.error);
          continue;
        }
        for (const PreparedDevice& device : prepared.devices) {
          dra::Device* out = answer.add_devices();
          if (!device.request.empty()) out->add_request_names(device.request);
          out->set_pool_name(device.pool);
          out->set_device_name(device.device);
          out->add_cdi_device_ids(device.cdiId);
          out->add_cdi_device_ids(device.metadataCdiId);
        }
      }
      return grpc::Status::OK;
    }
    grpc::Status NodeUnprepareResources(grpc::ServerContext*,
                                        const dra::NodeUnprepareResourcesRequest* request,
                                        dra::NodeUnprepareResourcesResponse* response) override {
      for (const dra::Claim& claim : request->claims()) {
        const std::string error =
            plugin_.Unprepare({claim.namespace_(), claim.uid(), claim.name()});
        dra::NodeUnprepareResourceResponse& answer = (*response->mutable_claims())[claim.uid()];
        if (!error.empty()) answer.set_error(error);
      }
      return grpc::Status::OK;
    }

   private:
    KubeletPlugin& plugin_;
  };

  Services(KubeletPlugin& plugin) : registration(plugin), service(plugin) {}
  Registration registration;
  Plugin service;
  std::unique_ptr<grpc::Server> serviceServer;
  std::unique_ptr<grpc::Server> registrationServer;
};

KubeletPlugin::KubeletPlugin(kube::Client& client, KubeletPluginOptions options)
    : client_(client), options_(std::move(options)) {}

KubeletPlugin::~KubeletPlugin() { Stop(); }

std::filesystem::path KubeletPlugin::RegistrationSocket() const {
  return options_.kubeletDir / "plugins_registry" / (std::string(api::kDraDriver) + "-reg.sock");
}

std::filesystem::path KubeletPlugin::ServiceSocket() const {
  return options_.kubeletDir / "plugins" / std::string(api::kDraDriver) / "dra.sock";
}

std::filesystem::path KubeletPlugin::CdiSpecPath(const std::string& claimUid) const {
  return options_.cdiDir / (std::string(api::kDraDriver) + "-vfio_" + claimUid + ".json");
}

std::filesystem::path KubeletPlugin::MetadataSpecPath(const std::string& claimUid) const {
  return options_.cdiDir / (std::string(api::kDraDriver) + "-metadata_" + claimUid + ".json");
}

std::filesystem::path KubeletPlugin::MetadataDir(const std::string& claimUid) const {
  return ServiceSocket().parent_path() / "metadata" / claimUid;
}

void KubeletPlugin::SetDevices(std::map<std::string, PreparableDevice> devices) {
  std::lock_guard lock(mutex_);
  devices_ = std::move(devices);
}

namespace {

// One gRPC server on a unix socket, the stale socket of an earlier run removed first.
std::unique_ptr<grpc::Server> Serve(const std::filesystem::path& socket, grpc::Service& service) {
  std::error_code ignored;
  std::filesystem::create_directories(socket.parent_path(), ignored);
  std::filesystem::remove(socket, ignored);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("unix:" + socket.string(), grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) throw std::runtime_error("cannot serve unix:" + socket.string());
  return server;
}

}  // namespace

void KubeletPlugin::Start(runtime::Loop& /*loop*/, Changed /*changed*/) {
  services_ = std::make_unique<Services>(*this);
  try {
    std::filesystem::create_directories(options_.cdiDir);
    // The service first: kubelet dials the endpoint as soon as it has the registration's answer.
    services_->serviceServer = Serve(ServiceSocket(), services_->service);
    services_->registrationServer = Serve(RegistrationSocket(), services_->registration);
    runtime::LogInfo("serving kubelet's DRA plugin API",
                     {{"registration", RegistrationSocket().string()},
                      {"service", ServiceSocket().string()},
                      {"cdiDir", options_.cdiDir.string()}});
  } catch (const std::exception& error) {
    runtime::LogError(
        "cannot serve kubelet's DRA plugin API: pods with catalog claims stay "
        "ContainerCreating on this node",
        {{"reason", error.what()}});
    Stop();
  }
}

void KubeletPlugin::Stop() {
  if (!services_) return;
  std::error_code ignored;
  // The registration socket first: kubelet's watcher sees it go and deregisters the plugin.
  for (auto* server : {&services_->registrationServer, &services_->serviceServer}) {
    if (*server) {
      (*server)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
      (*server)->Wait();
      server->reset();
    }
  }
  std::filesystem::remove(RegistrationSocket(), ignored);
  std::filesystem::remove(ServiceSocket(), ignored);
  services_.reset();
}

PreparedClaim KubeletPlugin::Prepare(const ClaimRef& ref) {
  PreparedClaim prepared;
  try {
    const json claim = client_.Get(kube::ResourcePath(api::kResourceGroup, api::kResourceVersion,
                                                      "resourceclaims", ref.ns, ref.name));
    // Only the binder's claim of a device Bound here (A13): its GPUDevice read now, not trusted
    // from a cache, since the binder may have moved it a moment ago.
    json device;
    if (const std::optional<ClaimOwner> owner = ClaimOwnerDevice(claim)) {
      try {
        device = client_.Get(
            kube::ResourcePath(api::kGroup, api::kVersion, "gpudevices", ref.ns, owner->name));
      } catch (const kube::ApiError& error) {
        if (error.kind() != kube::ErrorKind::kNotFound) throw;
      }
    }
    std::map<std::string, PreparableDevice> devices;
    {
      std::lock_guard lock(mutex_);
      devices = devices_;
    }
    prepared.error = BinderClaimError(claim, ref, options_.nodeName, device);
    if (prepared.error.empty()) {
      prepared = PrepareClaim(claim, ref, options_.nodeName, devices, MetadataDir(ref.uid));
    }
    if (prepared.error.empty() && !prepared.cdiSpec.is_null()) {
      // The files first, then the specs that name them.
      std::filesystem::create_directories(MetadataDir(ref.uid));
      for (const auto& [path, text] : prepared.metadataFiles) WriteAtomically(path, text);
      WriteAtomically(MetadataSpecPath(ref.uid), prepared.metadataSpec.dump(2) + "\n");
      WriteAtomically(CdiSpecPath(ref.uid), prepared.cdiSpec.dump(2) + "\n");
    }
  } catch (const std::exception& error) {
    prepared = {};
    prepared.error = "preparing " + Describe(ref) + ": " + error.what();
  }
  if (prepared.error.empty()) {
    ++counters_.prepared;
    runtime::LogInfo("prepared a claim", {{"claim", ref.ns + "/" + ref.name},
                                          {"devices", std::to_string(prepared.devices.size())}});
  } else {
    ++counters_.prepareFailures;
    runtime::LogWarning("cannot prepare a claim", {{"reason", prepared.error}});
  }
  return prepared;
}

std::string KubeletPlugin::Unprepare(const ClaimRef& ref) {
  std::error_code error;
  // Absent: already unprepared. The specs first, then the files they name.
  std::filesystem::remove(CdiSpecPath(ref.uid), error);
  if (!error) std::filesystem::remove(MetadataSpecPath(ref.uid), error);
  if (!error) std::filesystem::remove_all(MetadataDir(ref.uid), error);
  if (error) {
    ++counters_.unprepareFailures;
    return "unpreparing " + Describe(ref) + ": " + error.message();
  }
  ++counters_.unprepared;
  runtime::LogInfo("unprepared a claim", {{"claim", ref.ns + "/" + ref.name}});
  return "";
}

}  // namespace cozy::agent
