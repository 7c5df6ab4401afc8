// The DRA driver's kubelet plugin (docs/dra.md, "The kubelet plugin", A12, A13): the rules that
// decide what a claim prepares, then the registration and DRAPlugin v1 services over their real
// unix sockets as kubelet calls them, claims and their GPUDevices read from the fake API server
// (the chart's CRDs), CDI specs in a temporary directory.
#include "agent/dra/kubelet_plugin.h"

#include <fstream>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "agent/dra/dra.grpc.pb.h"
#include "agent/dra/registration.grpc.pb.h"
#include "agent/status/resource_slice.h"
#include "test/kube/kube_test_support.h"
#include "test/support/fixture_host.h"

namespace cozy::agent {
namespace {
using nlohmann::json;
namespace dra = k8s::io::kubelet::pkg::apis::dra::v1;

// node-a's a100-vfio devices: pci-0000-3b-00-0 (group 40) and pci-0000-af-00-0 (group 90).
std::map<std::string, PreparableDevice> Devices() {
  return PreparableDevices(SliceDevices(testing::FixtureHost("a100-vfio").Scan(), "node-a"));
}

// A claim allocated `results` ({pool, device} of driver gpu.cozystack.io unless a third is given).
json Claim(const std::string& uid, const std::vector<std::vector<std::string>>& results) {
  json out = json::array();
  for (const auto& result : results) {
    out.push_back({{"request", "gpu"},
                   {"driver", result.size() > 2 ? result[2] : "gpu.cozystack.io"},
                   {"pool", result[0]},
                   {"device", result[1]}});
  }
  return {{"apiVersion", "resource.k8s.io/v1"},
          {"kind", "ResourceClaim"},
          {"metadata", {{"name", "vm-gpu"}, {"namespace", "tenant"}, {"uid", uid}}},
          {"spec", json::object()},
          {"status", {{"allocation", {{"devices", {{"results", out}}}}}}}};
}

const ClaimRef kRef{"tenant", "uid-1", "vm-gpu"};

// GPUDevice tenant/vm-gpu in `phase` on `node`, as the binder leaves it.
json Device(const std::string& uid, const std::string& phase, const std::string& node) {
  json status = {{"phase", phase}};
  if (!node.empty()) status["nodeName"] = node;
  return {{"apiVersion", "gpu.cozystack.io/v1alpha1"},
          {"kind", "GPUDevice"},
          {"metadata", {{"name", "vm-gpu"}, {"namespace", "tenant"}, {"uid", uid}}},
          {"spec", {{"className", "a100-dra"}, {"count", 1}}},
          {"status", status}};
}

// `claim` as gpu-controller writes it for GPUDevice tenant/vm-gpu of `deviceUid`.
json OwnedBy(json claim, const std::string& deviceUid) {
  claim["metadata"]["ownerReferences"] = {{{"apiVersion", "gpu.cozystack.io/v1alpha1"},
                                           {"kind", "GPUDevice"},
                                           {"name", "vm-gpu"},
                                           {"uid", deviceUid},
                                           {"controller", true}}};
  return claim;
}

TEST(PrepareClaimA12, TheNodesVfioDevicesBecomeOneCdiSpecWithTheirGroupNodes) {
  const PreparedClaim prepared =
      PrepareClaim(Claim("uid-1", {{"node-a", "pci-0000-3b-00-0"}, {"node-a", "pci-0000-af-00-0"}}),
                   kRef, "node-a", Devices());
  ASSERT_EQ(prepared.error, "");
  ASSERT_EQ(prepared.devices.size(), 2U);
  EXPECT_EQ(prepared.devices[0].cdiId, "gpu.cozystack.io/vfio=uid-1-pci-0000-3b-00-0");
  EXPECT_EQ(prepared.devices[0].request, "gpu");
  EXPECT_EQ(prepared.devices[0].pool, "node-a");
  EXPECT_EQ(prepared.cdiSpec["kind"], "gpu.cozystack.io/vfio");
  EXPECT_EQ(prepared.cdiSpec["containerEdits"]["deviceNodes"],
            json::parse(R"([{"path": "/dev/vfio/vfio"}])"));
  EXPECT_EQ(prepared.cdiSpec["devices"][1]["name"], "uid-1-pci-0000-af-00-0");
  EXPECT_EQ(prepared.cdiSpec["devices"][1]["containerEdits"]["deviceNodes"],
            json::parse(R"([{"path": "/dev/vfio/90"}])"));
}

// KEP-5304: per request a DeviceMetadata file with each device's attributes, bind-mounted
// read-only where virt-launcher reads the PCI address; a claim made from a template is found by
// the name the pod gives it.
TEST(PrepareClaimA12, EachRequestGetsItsDeviceMetadataFileMountedWhereTheContainerLooks) {
  PreparedClaim prepared = PrepareClaim(Claim("uid-1", {{"node-a", "pci-0000-af-00-0"}}), kRef,
                                        "node-a", Devices(), "/plugin/metadata/uid-1");
  ASSERT_EQ(prepared.error, "");
  EXPECT_EQ(prepared.devices[0].metadataCdiId, "gpu.cozystack.io/metadata=uid-1_gpu");
  ASSERT_EQ(prepared.metadataFiles.size(), 1U);
  const auto& [hostPath, text] = *prepared.metadataFiles.begin();
  EXPECT_EQ(hostPath, "/plugin/metadata/uid-1/gpu.json");
  const json metadata = json::parse(text);
  EXPECT_EQ(metadata["apiVersion"], "metadata.resource.k8s.io/v1alpha1");
  EXPECT_EQ(metadata["kind"], "DeviceMetadata");
  EXPECT_EQ(metadata["metadata"]["uid"], "uid-1");
  EXPECT_EQ(metadata["requests"][0]["name"], "gpu");
  const json& device = metadata["requests"][0]["devices"][0];
  EXPECT_EQ(device["driver"], "gpu.cozystack.io");
  EXPECT_EQ(device["pool"], "node-a");
  EXPECT_EQ(device["name"], "pci-0000-af-00-0");
  EXPECT_EQ(device["attributes"]["resource.kubernetes.io/pciBusID"]["string"], "0000:af:00.0");
  EXPECT_EQ(prepared.metadataSpec["kind"], "gpu.cozystack.io/metadata");
  EXPECT_EQ(prepared.metadataSpec["devices"][0]["name"], "uid-1_gpu");
  EXPECT_EQ(prepared.metadataSpec["devices"][0]["containerEdits"]["mounts"],
            json::parse(R"([{"hostPath": "/plugin/metadata/uid-1/gpu.json",
              "containerPath": "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/vm-gpu/gpu/gpu.cozystack.io-metadata.json",
              "options": ["ro", "bind"]}])"));

  json fromTemplate = Claim("uid-1", {{"node-a", "pci-0000-af-00-0"}});
  fromTemplate["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] = "gpus";
  prepared = PrepareClaim(fromTemplate, kRef, "node-a", Devices(), "/m");
  EXPECT_EQ(prepared.metadataSpec["devices"][0]["containerEdits"]["mounts"][0]["containerPath"],
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpus/gpu/"
            "gpu.cozystack.io-metadata.json");
  EXPECT_EQ(json::parse(prepared.metadataFiles.begin()->second)["podClaimName"], "gpus");
}

TEST(PrepareClaimA12, WhatIsNotThisNodesToPrepareIsRefusedOrLeftToItsDriver) {
  const auto devices = Devices();
  // Another driver's result is that driver's: nothing to prepare here, and no spec.
  PreparedClaim other = PrepareClaim(Claim("uid-1", {{"node-a", "gpu-0", "gpu.nvidia.com"}}), kRef,
                                     "node-a", devices);
  EXPECT_EQ(other.error, "");
  EXPECT_TRUE(other.devices.empty());
  EXPECT_TRUE(other.cdiSpec.is_null());
  // A claim deleted and made again under the same name: not the one kubelet asked for.
  EXPECT_NE(PrepareClaim(Claim("uid-2", {{"node-a", "pci-0000-3b-00-0"}}), kRef, "node-a", devices)
                .error.find("has uid uid-2, not the uid-1"),
            std::string::npos);
  // Another node's pool, a device that left vfio-pci, a claim not allocated.
  EXPECT_NE(PrepareClaim(Claim("uid-1", {{"node-b", "pci-0000-3b-00-0"}}), kRef, "node-a", devices)
                .error.find("is not of node node-a's pool"),
            std::string::npos);
  EXPECT_NE(PrepareClaim(Claim("uid-1", {{"node-a", "pci-0000-5e-00-0"}}), kRef, "node-a", devices)
                .error.find("no vfio-bound GPU of node node-a now"),
            std::string::npos);
  json unallocated = Claim("uid-1", {});
  unallocated["status"].erase("allocation");
  EXPECT_NE(PrepareClaim(unallocated, kRef, "node-a", devices).error.find("is not allocated"),
            std::string::npos);
}

TEST(PrepareClaimA13, OnlyTheBindersClaimOfADeviceBoundToThisNodeIsTheAgentsToPrepare) {
  const json claim = OwnedBy(Claim("uid-1", {{"node-a", "pci-0000-af-00-0"}}), "dev-uid");
  EXPECT_EQ(BinderClaimError(claim, kRef, "node-a", Device("dev-uid", "Bound", "node-a")), "");
  auto error = [&](const json& c, const json& device) {
    return BinderClaimError(c, kRef, "node-a", device);
  };
  // An admin's claim, or one a template made: no GPUDevice is its controller owner.
  const json admins = Claim("uid-1", {{"node-a", "pci-0000-af-00-0"}});
  EXPECT_EQ(error(admins, Device("dev-uid", "Bound", "node-a")),
            "ResourceClaim tenant/vm-gpu is no claim of the GPU catalog's binder (its controller "
            "owner is no GPUDevice): only a GPUDevice's claim gets a catalog GPU");
  json notController = claim;
  notController["metadata"]["ownerReferences"][0]["controller"] = false;
  EXPECT_NE(error(notController, Device("dev-uid", "Bound", "node-a")).find("no claim of"),
            std::string::npos);
  json otherKind = claim;
  otherKind["metadata"]["ownerReferences"][0]["kind"] = "GPUClass";
  EXPECT_NE(error(otherKind, Device("dev-uid", "Bound", "node-a")).find("no claim of"),
            std::string::npos);
  // Its device gone, or replaced by another of the same name.
  EXPECT_EQ(error(claim, json()),
            "ResourceClaim tenant/vm-gpu is the claim of GPUDevice tenant/vm-gpu, which is gone");
  EXPECT_NE(error(claim, Device("other-uid", "Bound", "node-a"))
                .find("the device of that name now is another"),
            std::string::npos);
  // Moved to another node (a stale claim the reconciler has not deleted yet), lost, pending.
  EXPECT_EQ(error(claim, Device("dev-uid", "Bound", "node-b")),
            "ResourceClaim tenant/vm-gpu is the claim of GPUDevice tenant/vm-gpu, which is Bound "
            "on node node-b, not Bound to node node-a");
  EXPECT_EQ(error(claim, Device("dev-uid", "Lost", "")),
            "ResourceClaim tenant/vm-gpu is the claim of GPUDevice tenant/vm-gpu, which is Lost, "
            "not Bound to node node-a");
  json noStatus = Device("dev-uid", "Pending", "");
  noStatus.erase("status");
  EXPECT_NE(error(claim, noStatus).find("which is Pending, not Bound to node node-a"),
            std::string::npos);
}

class KubeletPluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = testing::StartChartApiServer();
    client_ = std::make_unique<kube::Client>(testing::ConfigFor(*server_));
    plugin_ = std::make_unique<KubeletPlugin>(
        *client_, KubeletPluginOptions{.nodeName = "node-a",
                                       .kubeletDir = directory_.path() / "kubelet",
                                       .cdiDir = directory_.path() / "cdi"});
    plugin_->SetDevices(Devices());
    plugin_->Start(loop_, {});
  }
  template <typename Service>
  std::unique_ptr<typename Service::Stub> Dial(const std::filesystem::path& socket) {
    return Service::NewStub(
        grpc::CreateChannel("unix:" + socket.string(), grpc::InsecureChannelCredentials()));
  }
  dra::NodePrepareResourcesResponse Prepare(const std::string& uid) {
    dra::NodePrepareResourcesRequest request;
    dra::Claim* claim = request.add_claims();
    claim->set_namespace_("tenant");
    claim->set_name("vm-gpu");
    claim->set_uid(uid);
    dra::NodePrepareResourcesResponse response;
    grpc::ClientContext context;
    const grpc::Status status = Dial<dra::DRAPlugin>(plugin_->ServiceSocket())
                                    ->NodePrepareResources(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }
  dra::NodeUnprepareResourcesResponse Unprepare(const std::string& uid) {
    dra::NodeUnprepareResourcesRequest request;
    dra::Claim* claim = request.add_claims();
    claim->set_namespace_("tenant");
    claim->set_name("vm-gpu");
    claim->set_uid(uid);
    dra::NodeUnprepareResourcesResponse response;
    grpc::ClientContext context;
    EXPECT_TRUE(Dial<dra::DRAPlugin>(plugin_->ServiceSocket())
                    ->NodeUnprepareResources(&context, request, &response)
                    .ok());
    return response;
  }

  // GPUDevice tenant/vm-gpu stored in `phase` on `node`: its uid.
  std::string SeedDevice(const std::string& phase, const std::string& node) {
    return server_->Seed(Device("", phase, node))["metadata"]["uid"];
  }

  testing::TempDir directory_;
  runtime::Loop loop_;
  std::unique_ptr<fake::FakeApiServer> server_;
  std::unique_ptr<kube::Client> client_;
  std::unique_ptr<KubeletPlugin> plugin_;
};

TEST_F(KubeletPluginTest, A12_KubeletsWatcherFindsTheDriverAndItsEndpoint) {
  EXPECT_EQ(plugin_->RegistrationSocket(),
            directory_.path() / "kubelet/plugins_registry/gpu.cozystack.io-reg.sock");
  pluginregistration::InfoRequest request;
  pluginregistration::PluginInfo info;
  grpc::ClientContext context;
  ASSERT_TRUE(Dial<pluginregistration::Registration>(plugin_->RegistrationSocket())
                  ->GetInfo(&context, request, &info)
                  .ok());
  EXPECT_EQ(info.type(), "DRAPlugin");
  EXPECT_EQ(info.name(), "gpu.cozystack.io");
  EXPECT_EQ(info.endpoint(),
            (directory_.path() / "kubelet/plugins/gpu.cozystack.io/dra.sock").string());
  ASSERT_EQ(info.supported_versions_size(), 1);
  EXPECT_EQ(info.supported_versions(0), "v1.DRAPlugin");
  // Stopped, the registration socket goes: kubelet's watcher deregisters the plugin.
  plugin_->Stop();
  EXPECT_FALSE(std::filesystem::exists(plugin_->RegistrationSocket()));
}

TEST_F(KubeletPluginTest, A12_PrepareWritesTheCdiSpecAndUnprepareRemovesItBothIdempotent) {
  // The API server gives the claim its uid.
  const std::string uid = server_->Seed(OwnedBy(Claim("", {{"node-a", "pci-0000-af-00-0"}}),
                                                SeedDevice("Bound", "node-a")))["metadata"]["uid"];
  for (int round = 0; round < 2; ++round) {  // kubelet may ask twice (a restart in between)
    const auto response = Prepare(uid);
    ASSERT_EQ(response.claims().count(uid), 1U);
    const auto& answer = response.claims().at(uid);
    EXPECT_EQ(answer.error(), "");
    ASSERT_EQ(answer.devices_size(), 1);
    EXPECT_EQ(answer.devices(0).pool_name(), "node-a");
    EXPECT_EQ(answer.devices(0).device_name(), "pci-0000-af-00-0");
    EXPECT_EQ(answer.devices(0).request_names(0), "gpu");
    EXPECT_EQ(answer.devices(0).cdi_device_ids(0),
              "gpu.cozystack.io/vfio=" + uid + "-pci-0000-af-00-0");
    ASSERT_EQ(answer.devices(0).cdi_device_ids_size(), 2);
    EXPECT_EQ(answer.devices(0).cdi_device_ids(1), "gpu.cozystack.io/metadata=" + uid + "_gpu");
  }
  const auto path = plugin_->CdiSpecPath(uid);
  ASSERT_TRUE(std::filesystem::exists(path));
  const json spec = json::parse(std::ifstream(path));
  EXPECT_EQ(spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"], "/dev/vfio/90");
  // The metadata file in the plugin's own directory, and the spec that mounts it.
  const json metadata = json::parse(std::ifstream(plugin_->MetadataDir(uid) / "gpu.json"));
  EXPECT_EQ(metadata["requests"][0]["devices"][0]["attributes"]["resource.kubernetes.io/pciBusID"]
                    ["string"],
            "0000:af:00.0");
  EXPECT_EQ(json::parse(std::ifstream(plugin_->MetadataSpecPath(uid)))["devices"][0]["name"],
            uid + "_gpu");
  for (int round = 0; round < 2; ++round) {
    const auto response = Unprepare(uid);
    ASSERT_EQ(response.claims().count(uid), 1U);
    EXPECT_EQ(response.claims().at(uid).error(), "");
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(plugin_->MetadataSpecPath(uid)));
  EXPECT_FALSE(std::filesystem::exists(plugin_->MetadataDir(uid)));
  EXPECT_EQ(plugin_->counters().prepared, 2);
}

TEST_F(KubeletPluginTest, A12_AClaimThatCannotBePreparedIsAnErrorForItAloneAndWritesNothing) {
  // Gone from the API server (a 404), or of a device that left vfio-pci: each claim answers
  // with its error, the call itself succeeds, and no spec is written.
  const std::string uid2 = server_->Seed(OwnedBy(Claim("", {{"node-a", "pci-0000-5e-00-0"}}),
                                                 SeedDevice("Bound", "node-a")))["metadata"]["uid"];
  dra::NodePrepareResourcesRequest request;
  for (const auto& [uid, name] :
       std::vector<std::pair<std::string, std::string>>{{"uid-1", "gone"}, {uid2, "vm-gpu"}}) {
    dra::Claim* claim = request.add_claims();
    claim->set_namespace_("tenant");
    claim->set_name(name);
    claim->set_uid(uid);
  }
  dra::NodePrepareResourcesResponse response;
  grpc::ClientContext context;
  ASSERT_TRUE(Dial<dra::DRAPlugin>(plugin_->ServiceSocket())
                  ->NodePrepareResources(&context, request, &response)
                  .ok());
  EXPECT_NE(response.claims().at("uid-1").error().find("tenant/gone"), std::string::npos);
  EXPECT_NE(response.claims().at(uid2).error().find("no vfio-bound GPU"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(plugin_->CdiSpecPath("uid-1")));
  EXPECT_FALSE(std::filesystem::exists(plugin_->CdiSpecPath(uid2)));
  EXPECT_EQ(plugin_->counters().prepareFailures, 2);
}

TEST_F(KubeletPluginTest, A13_AClaimNotTheBindersOrOfADeviceBoundElsewhereIsRefusedAtPrepare) {
  // The binder's claim is read with its GPUDevice from the API server, at each prepare: the
  // device moved to node-b since (a claim the reconciler has yet to delete) is refused here, and
  // an admin's own claim of a catalog GPU is never prepared.
  const std::string deviceUid = SeedDevice("Bound", "node-b");
  const std::string uid = server_->Seed(
      OwnedBy(Claim("", {{"node-a", "pci-0000-af-00-0"}}), deviceUid))["metadata"]["uid"];
  auto answer = Prepare(uid).claims().at(uid);
  EXPECT_EQ(answer.error(),
            "ResourceClaim tenant/vm-gpu is the claim of GPUDevice tenant/vm-gpu, which is Bound "
            "on node node-b, not Bound to node node-a");
  EXPECT_EQ(answer.devices_size(), 0);
  EXPECT_FALSE(std::filesystem::exists(plugin_->CdiSpecPath(uid)));
  // Bound here now: the same claim is prepared.
  client_->MergePatch(
      kube::ResourcePath("gpu.cozystack.io", "v1alpha1", "gpudevices", "tenant", "vm-gpu") +
          "/status",
      {{"status", {{"nodeName", "node-a"}}}});
  answer = Prepare(uid).claims().at(uid);
  EXPECT_EQ(answer.error(), "");
  EXPECT_TRUE(std::filesystem::exists(plugin_->CdiSpecPath(uid)));
  EXPECT_EQ(plugin_->counters().prepareFailures, 1);
  EXPECT_EQ(plugin_->counters().prepared, 1);
}

TEST_F(KubeletPluginTest, A13_AnAdminsOwnClaimOfACatalogGpuIsNeverPrepared) {
  const std::string uid =
      server_->Seed(Claim("", {{"node-a", "pci-0000-af-00-0"}}))["metadata"]["uid"];
  const auto answer = Prepare(uid).claims().at(uid);
  EXPECT_NE(answer.error().find("is no claim of the GPU catalog's binder"), std::string::npos)
      << answer.error();
  EXPECT_FALSE(std::filesystem::exists(plugin_->CdiSpecPath(uid)));
}

}  // namespace
}  // namespace cozy::agent
