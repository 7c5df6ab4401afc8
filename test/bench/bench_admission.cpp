// Admission latency at scale (issue 15's figures): the three webhooks' handlers, as a replica
// runs them, over a cluster of N nodes x 8 GPUs (all but 2 units per node held by orders of 100
// tenants under GPU budgets), without the binder's wait: the GPUDevice webhook on a new order,
// the VMI webhook on a dry-run start (every check and the placement trial, no write), and the
// pod webhook on a launcher. The snapshot and model are built once per state of the caches, as
// the daemon does; the peer measured in the same run is that build, which the first request
// after any cache change pays.
//
//   bench_admission [nodes=5000] [requests=2000]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/gpuclass.h"
#include "api/gpudevice.h"
#include "api/gpunode_types.h"
#include "controller/model/readers.h"
#include "controller/snapshot_json.h"
#include "controller/webhook/webhooks.h"
#include "kube/client.h"
#include "test/support/gpu_objects.h"

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace cozy;
constexpr int kGpusPerNode = 8;
constexpr int kHeldPerNode = 6;
constexpr int kTenants = 100;

std::string Tenant(int i) { return "tenant-" + std::to_string(i % kTenants); }

model::Snapshot MakeCluster(int nodes) {
  model::Snapshot snapshot;
  snapshot.classes.push_back(api::GpuClassFromJson(testing::GpuClassObject("a100")));
  snapshot.namespaces.push_back(controller::NamespaceFromJson(
      {{"metadata",
        {{"name", "tenant-root"}, {"labels", {{"tenant.cozystack.io/tenant-root", ""}}}}}}));
  for (int t = 0; t < kTenants; ++t) {
    snapshot.namespaces.push_back(
        controller::NamespaceFromJson({{"metadata",
                                        {{"name", Tenant(t)},
                                         {"labels",
                                          {{"tenant.cozystack.io/tenant-root", ""},
                                           {"tenant.cozystack.io/" + Tenant(t), ""}}}}}}));
    snapshot.quotas.push_back(controller::QuotaFromJson(
        {{"metadata", {{"name", "gpu"}, {"namespace", Tenant(t)}}},
         {"spec", {{"hard", {{"requests.gpu.cozystack.io/a100", "100000"}}}}}}));
  }
  int device = 0;
  for (int n = 0; n < nodes; ++n) {
    const std::string node = "node-" + std::to_string(n);
    snapshot.nodes.push_back(controller::NodeFromJson(testing::ReadyNode(node)));
    snapshot.gpuNodes.push_back(
        api::GpuNodeInventoryFromJson(testing::GpuNodeObject(node, kGpusPerNode)));
    for (int g = 0; g < kHeldPerNode; ++g, ++device) {
      json status = {{"phase", "Bound"}, {"nodeName", node}};
      if (device % 7 == 0) {
        status["attachment"] = {{"vmiName", "vm-" + std::to_string(device)},
                                {"attachedAt", "2026-12-01T00:00:00Z"}};
      }
      snapshot.devices.push_back(api::GpuDeviceFromJson(
          {{"apiVersion", "gpu.cozystack.io/v1alpha1"},
           {"kind", "GPUDevice"},
           {"metadata", {{"name", "d" + std::to_string(device)}, {"namespace", Tenant(device)}}},
           {"spec", {{"className", "a100"}, {"count", 1}}},
           {"status", status}}));
    }
  }
  return snapshot;
}

// The replica's caches as plain values, with the model built once (as Controller::Prepare).
class Cluster final : public controller::webhook::ClusterSource {
 public:
  explicit Cluster(int nodes) : snapshot_(MakeCluster(nodes)) {
    for (const auto& device : snapshot_.devices) {
      auto shared = std::make_shared<const api::GpuDevice>(device);
      const std::string key = device.metadata.namespaceName + "/" + device.metadata.name;
      devices_[key] = shared;
      if (device.status.attachment) {
        attached_[device.metadata.namespaceName + "/" + device.status.attachment->vmiName]
            .push_back(shared);
      }
    }
    Rebuild();
  }
  double Rebuild() {
    const auto started = Clock::now();
    auto prepared = std::make_shared<controller::webhook::Prepared>();
    prepared->snapshot = snapshot_;
    prepared->gpuResourceNames = model::EffectiveGpuResourceNames(
        prepared->snapshot.settings, prepared->snapshot.gpuNodes,
        prepared->snapshot.permittedHostDevices, prepared->snapshot.classes);
    prepared->model = std::make_unique<model::Model>(prepared->snapshot);
    prepared_ = prepared;
    return std::chrono::duration<double>(Clock::now() - started).count();
  }
  bool Synced() const override { return true; }
  std::shared_ptr<const controller::webhook::Prepared> Prepare() override { return prepared_; }
  std::shared_ptr<const api::GpuDevice> Device(const std::string& ns,
                                               const std::string& name) const override {
    auto it = devices_.find(ns + "/" + name);
    return it == devices_.end() ? nullptr : it->second;
  }
  std::vector<std::shared_ptr<const api::GpuDevice>> AttachedTo(
      const std::string& ns, const std::string& vmiName) const override {
    auto it = attached_.find(ns + "/" + vmiName);
    return it == attached_.end() ? std::vector<std::shared_ptr<const api::GpuDevice>>{}
                                 : it->second;
  }

 private:
  model::Snapshot snapshot_;
  std::shared_ptr<const controller::webhook::Prepared> prepared_;
  std::map<std::string, std::shared_ptr<const api::GpuDevice>> devices_;
  std::map<std::string, std::vector<std::shared_ptr<const api::GpuDevice>>> attached_;
};

json Review(const std::string& uid, const json& kind, const json& resource, const std::string& ns,
            const std::string& name, const json& object, bool dryRun) {
  return {{"apiVersion", "admission.k8s.io/v1"},
          {"kind", "AdmissionReview"},
          {"request",
           {{"uid", uid},
            {"kind", kind},
            {"resource", resource},
            {"requestKind", kind},
            {"requestResource", resource},
            {"name", name},
            {"namespace", ns},
            {"operation", "CREATE"},
            {"userInfo", {{"username", "tenant"}, {"groups", {"system:authenticated"}}}},
            {"object", object},
            {"oldObject", nullptr},
            {"dryRun", dryRun},
            {"options", {{"apiVersion", "meta.k8s.io/v1"}, {"kind", "CreateOptions"}}}}}};
}

struct Figures {
  double p50 = 0, p99 = 0, max = 0;
  int allowed = 0;
};

template <class Call>
Figures Measure(int requests, Call call) {
  std::vector<double> seconds;
  Figures figures;
  for (int i = 0; i < requests; ++i) {
    const auto started = Clock::now();
    const json answer = call(i);
    seconds.push_back(std::chrono::duration<double>(Clock::now() - started).count());
    if (answer["response"].value("allowed", false)) ++figures.allowed;
  }
  std::sort(seconds.begin(), seconds.end());
  figures.p50 = seconds[seconds.size() / 2];
  figures.p99 = seconds[std::min(seconds.size() - 1, seconds.size() * 99 / 100)];
  figures.max = seconds.back();
  return figures;
}

}  // namespace

int main(int argc, char** argv) {
  const int nodes = argc > 1 ? std::atoi(argv[1]) : 5000;
  const int requests = argc > 2 ? std::atoi(argv[2]) : 2000;
  Cluster cluster(nodes);
  double rebuild = 0;
  for (int i = 0; i < 3; ++i) rebuild = std::min(rebuild == 0 ? 1e9 : rebuild, cluster.Rebuild());
  kube::ClientConfig config;
  config.server = "http://127.0.0.1:1";  // never called: no write happens below
  kube::Client client(config);
  controller::webhook::Webhooks webhooks(client, cluster);
  const controller::webhook::RequestContext context{Clock::now() + std::chrono::hours(1)};

  const json deviceKind = {
      {"group", "gpu.cozystack.io"}, {"version", "v1alpha1"}, {"kind", "GPUDevice"}};
  const json deviceResource = {
      {"group", "gpu.cozystack.io"}, {"version", "v1alpha1"}, {"resource", "gpudevices"}};
  const Figures orders = Measure(requests, [&](int i) {
    const std::string ns = Tenant(i);
    const json order = {{"apiVersion", "gpu.cozystack.io/v1alpha1"},
                        {"kind", "GPUDevice"},
                        {"metadata", {{"name", "new-" + std::to_string(i)}, {"namespace", ns}}},
                        {"spec", {{"className", "a100"}, {"count", 1 + i % 2}}}};
    return webhooks.ValidateGpuDevice(Review("o" + std::to_string(i), deviceKind, deviceResource,
                                             ns, "new-" + std::to_string(i), order, false),
                                      context);
  });

  const json vmiKind = {
      {"group", "kubevirt.io"}, {"version", "v1"}, {"kind", "VirtualMachineInstance"}};
  const json vmiResource = {
      {"group", "kubevirt.io"}, {"version", "v1"}, {"resource", "virtualmachineinstances"}};
  const int vmRequests = std::max(1, requests / 20);  // each runs a placement trial
  const Figures vms = Measure(vmRequests, [&](int i) {
    // A held device that no VMI has, and one template.
    int held = (i * 7 + 1) % (nodes * kHeldPerNode);
    const std::string ns = Tenant(held);
    const json references = {
        {"devices", {"d" + std::to_string(held)}},
        {"templates", {{{"name", "scratch"}, {"className", "a100"}, {"count", 1}}}}};
    const json vmi = {
        {"apiVersion", "kubevirt.io/v1"},
        {"kind", "VirtualMachineInstance"},
        {"metadata",
         {{"name", "vm-new-" + std::to_string(i)},
          {"namespace", ns},
          {"labels", {{"gpu.cozystack.io/device-references", "true"}}},
          {"annotations", {{"gpu.cozystack.io/device-references", references.dump()}}}}},
        {"spec", {{"domain", {{"devices", json::object()}}}}}};
    return webhooks.MutateVmi(Review("v" + std::to_string(i), vmiKind, vmiResource, ns,
                                     "vm-new-" + std::to_string(i), vmi, true),
                              context);
  });

  const json podKind = {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}};
  const json podResource = {{"group", ""}, {"version", "v1"}, {"resource", "pods"}};
  const Figures pods = Measure(requests, [&](int i) {
    const int device = (i * 7) % (nodes * kHeldPerNode);  // attached: device % 7 == 0
    const std::string vmi = "vm-" + std::to_string(device);
    const std::string ns = Tenant(device);
    const json pod = {
        {"apiVersion", "v1"},
        {"kind", "Pod"},
        {"metadata",
         {{"name", "virt-launcher-" + vmi},
          {"namespace", ns},
          {"labels",
           {{"gpu.cozystack.io/device-references", "true"},
            {"kubevirt.io", "virt-launcher"},
            {"vm.kubevirt.io/name", vmi}}}}},
        {"spec", {{"containers", {{{"name", "compute"}, {"image", "virt-launcher"}}}}}}};
    return webhooks.MutatePod(Review("p" + std::to_string(i), podKind, podResource, ns,
                                     pod["metadata"]["name"], pod, false),
                              context);
  });

  auto line = [&](const char* name, int count, const Figures& f) {
    std::printf(
        "%-26s %6d requests  allowed %6d  p50 %8.3f ms  p99 %8.3f ms  max %8.3f ms  "
        "p99/rebuild %.4f\n",
        name, count, f.allowed, f.p50 * 1e3, f.p99 * 1e3, f.max * 1e3, f.p99 / rebuild);
  };
  std::printf("%d nodes x %d GPUs, %d held devices, %d tenants\n", nodes, kGpusPerNode,
              nodes * kHeldPerNode, kTenants);
  std::printf("peer: snapshot and model built once per cache state: %.3f ms\n", rebuild * 1e3);
  line("/validate/gpudevices", requests, orders);
  line("/mutate/vmis (dry run)", vmRequests, vms);
  line("/mutate/pods", requests, pods);
  return orders.allowed > 0 && vms.allowed > 0 && pods.allowed > 0 ? 0 : 1;
}
