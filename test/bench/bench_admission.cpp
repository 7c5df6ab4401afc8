// Admission latency at scale (docs/benchmarks.md, "Admission latency at 5,000 nodes"): the three
// webhooks' handlers, as a replica runs them, over a cluster of N nodes x 8 GPUs (all but 2 units
// per node held by orders of 100 tenants under GPU budgets), without the binder's wait: the
// GPUDevice webhook on a new order, the VMI webhook on a dry-run start (every check and the
// placement trial, no write), and the pod webhook on a launcher. The snapshot and model are built
// once per state of the caches, as the daemon does; the peer measured in the same run is that
// build, which the first request after any cache change pays.
//
//   bench_admission [nodes=5000] [requests=2000]
//
// With --real-cluster (a control plane of scripts/cluster.sh, up for the run) or --kubeconfig
// FILE (an existing, empty cluster, left filled): the webhooks through a real kube-apiserver
// (docs/benchmarks.md, "Through the API server"). The same cluster (no attachments) is seeded
// through the API server, `gpu-controller run --enable-gpu` serves the webhooks on 127.0.0.1, the
// chart's admission objects (GPUs on, gpu.webhook.url at that address) are applied, and server-side
// dry-run creates are timed end to end: orders through the GPUDevice webhook and VMI starts through
// the VMI webhook. The peer, interleaved in the same run, is the same dry-run create that no
// webhook sees (an order with the label bench.cozystack.io/peer, which the bench's objectSelector
// on the GPUDevice webhook leaves out; a VMI without the device-reference label), so the difference
// is the webhook's cost through the API server. Tenant requests are made as a tenant user (a client
// certificate of the cluster's CA, --real-cluster only), so the chart's policies see them as a
// tenant's.
//
//   bench_admission --real-cluster [nodes=2000] [requests=2000] [seed-threads=16]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "api/gpuclass.h"
#include "api/gpudevice.h"
#include "api/gpunode_types.h"
#include "controller/admission/vmi.h"
#include "controller/model/model.h"
#include "controller/model/readers.h"
#include "controller/snapshot_json.h"
#include "controller/webhook/webhooks.h"
#include "kube/client.h"
#include "kube/config.h"
#include "kube/errors.h"
#include "test/bench/real_cluster.h"
#include "test/support/fixture_host.h"
#include "test/support/gpu_objects.h"
#include "test/support/process.h"

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
  std::vector<api::GpuDevice> devices;
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
      devices.push_back(api::GpuDeviceFromJson(
          {{"apiVersion", "gpu.cozystack.io/v1alpha1"},
           {"kind", "GPUDevice"},
           {"metadata", {{"name", "d" + std::to_string(device)}, {"namespace", Tenant(device)}}},
           {"spec", {{"className", "a100"}, {"count", 1}}},
           {"status", status}}));
    }
  }
  // In the order the controller's cache lists them: by namespace, then name.
  std::sort(devices.begin(), devices.end(), [](const api::GpuDevice& a, const api::GpuDevice& b) {
    return std::tie(a.metadata.namespaceName, a.metadata.name) <
           std::tie(b.metadata.namespaceName, b.metadata.name);
  });
  snapshot.devices = std::move(devices);
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
    Rebuild(true);
  }
  // The webhooks' view of a new cache state, built as ClusterCaches::Prepared builds it: the
  // other caches' objects shared, in new lists; after a change of the devices, a new list of the
  // cache's own devices (a pointer each); after a change of anything else (a pod), the very list of
  // the state before (ClusterCaches::DevicesNow).
  double Rebuild(bool devicesChanged) {
    const auto started = Clock::now();
    // As the daemon's Prepare: the view replaced lends the new model what both share, and goes
    // once that is built.
    const std::shared_ptr<const controller::webhook::Prepared> previous = std::move(prepared_);
    auto prepared = std::make_shared<controller::webhook::Prepared>();
    prepared->snapshot = snapshot_;
    // The caches' objects in new lists, a pointer each, as ClusterCaches::FillSnapshot shares them.
    prepared->snapshot.nodes = model::SharedVector<model::Node>::Sharing(snapshot_.nodes.Items());
    prepared->snapshot.gpuNodes =
        model::SharedVector<api::GpuNodeInventory>::Sharing(snapshot_.gpuNodes.Items());
    if (devicesChanged) {
      // The cache's own devices, one of them a new object (ClusterCaches::DevicesNow).
      std::vector<std::shared_ptr<const api::GpuDevice>> cached = snapshot_.devices.Items();
      cached[cached.size() / 2] =
          std::make_shared<const api::GpuDevice>(*cached[cached.size() / 2]);
      prepared->snapshot.devices = model::SharedVector<api::GpuDevice>::Sharing(std::move(cached));
    }
    prepared->gpuResourceNames = model::EffectiveGpuResourceNames(
        prepared->snapshot.settings, prepared->snapshot.gpuNodes,
        prepared->snapshot.permittedHostDevices, prepared->snapshot.classes);
    prepared->model = std::make_unique<model::Model>(
        prepared->snapshot, previous != nullptr ? previous->model.get() : nullptr);
    devicesRead_ = prepared->model->DevicesRead();
    prepared_ = prepared;
    return std::chrono::duration<double>(Clock::now() - started).count();
  }
  // How many devices the last Rebuild's model read from their objects (Model::DevicesRead).
  size_t DevicesRead() const { return devicesRead_; }
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
  size_t devicesRead_ = 0;
  std::map<std::string, std::shared_ptr<const api::GpuDevice>> devices_;
  std::map<std::string, std::vector<std::shared_ptr<const api::GpuDevice>>> attached_;
};

json Review(const std::string& uid, const json& kind, const json& resource, const std::string& ns,
            const std::string& name, const json& object, bool dryRun,
            const std::string& user = "tenant") {
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
            {"userInfo", {{"username", user}, {"groups", {"system:authenticated"}}}},
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

int RunInProcess(int nodes, int requests) {
  Cluster cluster(nodes);
  double rebuild = 0;      // after a change of the devices
  double rebuildPods = 0;  // after a change of a pod
  // Each the fastest of three in a row, so each replaces a view built as itself (the one it
  // replaces is freed in its time, as the daemon's is).
  for (int i = 0; i < 3; ++i)
    rebuild = std::min(rebuild == 0 ? 1e9 : rebuild, cluster.Rebuild(true));
  const size_t readAfterDevice = cluster.DevicesRead();
  for (int i = 0; i < 3; ++i) {
    rebuildPods = std::min(rebuildPods == 0 ? 1e9 : rebuildPods, cluster.Rebuild(false));
  }
  const size_t readAfterPod = cluster.DevicesRead();
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
  // The first start on a cache state also makes the pass over the snapshot that the trials of
  // every later start on it read (Model::PlanStart): a cost per cache state, as the model's
  // build, timed on its own and left out of the figures of the starts.
  auto vmStart = [&](int i) {
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
  };
  const Figures firstVm = Measure(1, [&](int) { return vmStart(vmRequests); });
  const Figures vms = Measure(vmRequests, vmStart);
  // A start just after each change, its view built first, as the daemon's first start on a new
  // state of the caches: rebuilt and started in turn, the two timed together.
  auto afterChange = [&](bool devicesChanged) {
    std::vector<double> seconds;
    for (int i = 0; i < vmRequests; ++i) {
      const auto started = Clock::now();
      cluster.Rebuild(devicesChanged);
      vmStart(vmRequests + 1 + i);
      seconds.push_back(std::chrono::duration<double>(Clock::now() - started).count());
    }
    std::sort(seconds.begin(), seconds.end());
    return std::make_pair(seconds[seconds.size() / 2],
                          seconds[std::min(seconds.size() - 1, seconds.size() * 99 / 100)]);
  };
  const auto afterPod = afterChange(false);
  const auto afterDevice = afterChange(true);

  const json podKind = {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}};
  const json podResource = {{"group", ""}, {"version", "v1"}, {"resource", "pods"}};
  const Figures pods = Measure(requests, [&](int i) {
    // An attached device (those with device % 7 == 0): (i * 7) % total is not one once i * 7
    // wraps past a total that is not a multiple of 7 (small clusters).
    const int attachedDevices = (nodes * kHeldPerNode + 6) / 7;
    const int device = 7 * (i % attachedDevices);
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
            {"vm.kubevirt.io/name", vmi}}},
          // As KubeVirt's controller creates a launcher (E14): owned by its VMI.
          {"ownerReferences",
           {{{"apiVersion", "kubevirt.io/v1"},
             {"kind", "VirtualMachineInstance"},
             {"name", vmi},
             {"uid", vmi + "-uid"},
             {"controller", true}}}}}},
        {"spec", {{"containers", {{{"name", "compute"}, {"image", "virt-launcher"}}}}}}};
    return webhooks.MutatePod(
        Review("p" + std::to_string(i), podKind, podResource, ns, pod["metadata"]["name"], pod,
               false, controller::webhook::WebhookOptions{}.kubevirtControllerUser),
        context);
  });

  // The placement trial alone (docs/controller.md, "VMI starts"), on the same starts:
  // Model::PlanStart's shortcut against the peer, the whole pass on a copy of the snapshot; and the
  // shortcut's first call on a model, which makes the pass over the snapshot it keeps (once per
  // cache state).
  const std::shared_ptr<const controller::webhook::Prepared> prepared = cluster.Prepare();
  auto start = [&](int i, bool wholePass) {
    const int held = (i * 7 + 1) % (nodes * kHeldPerNode);
    admission::VmiInput input;
    input.namespaceName = Tenant(held);
    input.vmiName = "vm-new-" + std::to_string(i);
    input.references = {{"d" + std::to_string(held)}, {{"scratch", "a100", 1}}};
    input.now = "2026-12-03T00:00:00Z";
    input.wholePass = wholePass;
    return admission::PlanVmiStart(prepared->snapshot, *prepared->model, input);
  };
  auto trials = [&](bool wholePass) {
    std::vector<double> seconds;
    for (int i = 0; i < vmRequests; ++i) {
      const auto started = Clock::now();
      const admission::VmiStartPlan plan = start(i, wholePass);
      seconds.push_back(std::chrono::duration<double>(Clock::now() - started).count());
      if (plan.refusal) {
        std::fprintf(stderr, "start %d refused: %s\n", i, plan.refusal->c_str());
      }
    }
    std::sort(seconds.begin(), seconds.end());
    return std::make_pair(seconds[seconds.size() / 2],
                          seconds[std::min(seconds.size() - 1, seconds.size() * 99 / 100)]);
  };
  const auto shortcut = trials(false);
  const auto whole = trials(true);
  double firstCall = 0;
  for (int i = 0; i < 3; ++i) {
    const model::Model fresh(prepared->snapshot);
    const auto started = Clock::now();
    fresh.PlanStart({"tenant-0", "vm-first", "2026-12-03T00:00:00Z", {}, {}});
    const double took = std::chrono::duration<double>(Clock::now() - started).count();
    firstCall = i == 0 ? took : std::min(firstCall, took);
  }

  auto line = [&](const char* name, int count, const Figures& f) {
    std::printf(
        "%-26s %6d requests  allowed %6d  p50 %8.3f ms  p99 %8.3f ms  max %8.3f ms  "
        "p99/rebuild %.4f\n",
        name, count, f.allowed, f.p50 * 1e3, f.p99 * 1e3, f.max * 1e3, f.p99 / rebuild);
  };
  std::printf("%d nodes x %d GPUs, %d held devices, %d tenants\n", nodes, kGpusPerNode,
              nodes * kHeldPerNode, kTenants);
  std::printf(
      "peer: snapshot and model built once per cache state: %.3f ms after a change of the "
      "devices, %.3f ms after a change of a pod (the devices shared with the state before); "
      "devices read from their objects: %zu and %zu, the rest's numbers taken from the model "
      "before\n",
      rebuild * 1e3, rebuildPods * 1e3, readAfterDevice, readAfterPod);
  line("/validate/gpudevices", requests, orders);
  line("/mutate/vmis (dry run)", vmRequests, vms);
  std::printf("  the first start on the cache state (before those): %.3f ms\n", firstVm.max * 1e3);
  std::printf(
      "  a start just after a change, its view built first (%d of each): p50 / p99 %.3f / %.3f "
      "ms after a pod's, %.3f / %.3f ms after a device's\n",
      vmRequests, afterPod.first * 1e3, afterPod.second * 1e3, afterDevice.first * 1e3,
      afterDevice.second * 1e3);
  line("/mutate/pods", requests, pods);
  std::printf(
      "placement trial (%d starts): shortcut p50 %.3f ms p99 %.3f ms; peer, whole pass p50 "
      "%.3f ms p99 %.3f ms; shortcut / whole pass: p50 %.4f, p99 %.4f\n",
      vmRequests, shortcut.first * 1e3, shortcut.second * 1e3, whole.first * 1e3,
      whole.second * 1e3, shortcut.first / whole.first, shortcut.second / whole.second);
  std::printf("  the shortcut's first call on a model (its pass over the snapshot): %.3f ms\n",
              firstCall * 1e3);
  return orders.allowed > 0 && vms.allowed > 0 && pods.allowed > 0 ? 0 : 1;
}

// --- through a real API server -----------------------------------------------------------

constexpr const char* kPeerLabel = "bench.cozystack.io/peer";

struct Timings {
  std::vector<double> seconds;
  int allowed = 0;
  std::string firstRefusal;
  double Quantile(double q) const {
    std::vector<double> sorted = seconds;
    std::sort(sorted.begin(), sorted.end());
    return sorted.empty()
               ? 0
               : sorted[std::min(sorted.size() - 1,
                                 static_cast<size_t>(static_cast<double>(sorted.size()) * q))];
  }
  double Max() const {
    return seconds.empty() ? 0 : *std::max_element(seconds.begin(), seconds.end());
  }
};

// One dry-run create, timed end to end (the client's call: TLS request, the API server's
// handler chain, admission, the answer).
void TimeCreate(kube::Client& client, const std::string& collection, const json& object,
                Timings& timings) {
  kube::WriteOptions options;
  options.dryRun = true;
  const auto started = Clock::now();
  try {
    client.Create(collection, object, options);
    timings.seconds.push_back(std::chrono::duration<double>(Clock::now() - started).count());
    ++timings.allowed;
  } catch (const kube::ApiError& error) {
    timings.seconds.push_back(std::chrono::duration<double>(Clock::now() - started).count());
    if (timings.firstRefusal.empty()) timings.firstRefusal = error.what();
  }
}

json Order(int i, bool peer, const std::string& className = "a100") {
  json order = {{"apiVersion", "gpu.cozystack.io/v1alpha1"},
                {"kind", "GPUDevice"},
                {"metadata", {{"name", "new-" + std::to_string(i)}, {"namespace", Tenant(i)}}},
                {"spec", {{"className", className}, {"count", 1 + i % 2}}}};
  if (peer) order["metadata"]["labels"] = {{kPeerLabel, "true"}};
  return order;
}

// A VMI start referencing a held device that no VMI has, and one template; without the
// device-reference label (the peer) no webhook sees it.
json Vmi(int i, int heldDevices, bool webhooked, const std::string& references = "") {
  const int held = (i * 7 + 1) % heldDevices;
  const json refs = {{"devices", {"d" + std::to_string(held)}},
                     {"templates", {{{"name", "scratch"}, {"className", "a100"}, {"count", 1}}}}};
  json vmi = {
      {"apiVersion", "kubevirt.io/v1"},
      {"kind", "VirtualMachineInstance"},
      {"metadata",
       {{"name", "vm-new-" + std::to_string(i)},
        {"namespace", Tenant(held)},
        {"annotations",
         {{"gpu.cozystack.io/device-references", references.empty() ? refs.dump() : references}}}}},
      {"spec", {{"domain", {{"devices", json::object()}}}}}};
  if (webhooked) vmi["metadata"]["labels"] = {{"gpu.cozystack.io/device-references", "true"}};
  return vmi;
}

std::string DeviceCollection(const std::string& ns) {
  return kube::ResourcePath("gpu.cozystack.io", "v1alpha1", "gpudevices", ns);
}
std::string VmiCollection(const std::string& ns) {
  return kube::ResourcePath("kubevirt.io", "v1", "virtualmachineinstances", ns);
}

// A tenant's client: a certificate the cluster's CA signs (CN bench-tenant, O bench-tenants),
// allowed to create GPUDevices and VMIs by a ClusterRole of the bench's. Only where this run
// brought the cluster up (it has the CA's key); otherwise the kubeconfig's own user.
kube::ClientConfig TenantConfig(const bench::ControlPlane& cluster) {
  if (cluster.dir().empty()) return cluster.config();
  const std::filesystem::path pki = cluster.dir() / "pki";
  const std::filesystem::path out = cluster.work() / "tenant";
  std::filesystem::create_directories(out);
  const auto made = testing::RunCommand(
      "cd " + testing::ShellQuote(out.string()) +
      " && openssl req -new -newkey rsa:2048 -nodes -keyout tls.key -out tls.csr"
      " -subj /O=bench-tenants/CN=bench-tenant 2>/dev/null"
      " && printf 'extendedKeyUsage=clientAuth\\n' >ext"
      " && openssl x509 -req -in tls.csr -CA " +
      testing::ShellQuote((pki / "ca.crt").string()) + " -CAkey " +
      testing::ShellQuote((pki / "ca.key").string()) +
      " -CAcreateserial -CAserial serial -days 1 -extfile ext -out tls.crt 2>/dev/null");
  if (made.exitCode != 0)
    throw std::runtime_error("openssl: the tenant's certificate: " + made.err);
  std::ofstream(out / "rbac.yaml") << R"(apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: bench-tenant}
rules:
- apiGroups: [gpu.cozystack.io]
  resources: [gpudevices]
  verbs: [create, get, list]
- apiGroups: [kubevirt.io]
  resources: [virtualmachineinstances]
  verbs: [create, get, list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: bench-tenant}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: bench-tenant}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: Group, name: bench-tenants}
)";
  cluster.KubectlOrThrow("apply -f " + testing::ShellQuote((out / "rbac.yaml").string()));
  kube::ClientConfig config = cluster.config();
  config.token.clear();
  config.tokenFile.clear();
  config.clientCertData.clear();
  config.clientKeyData.clear();
  config.clientCertFile = (out / "tls.crt").string();
  config.clientKeyFile = (out / "tls.key").string();
  return config;
}

void Report(const char* name, const Timings& webhooked, const Timings& peer) {
  std::printf("%-34s %5zu creates  allowed %5d  p50 %7.3f ms  p99 %7.3f ms  max %7.3f ms\n", name,
              webhooked.seconds.size(), webhooked.allowed, webhooked.Quantile(0.5) * 1e3,
              webhooked.Quantile(0.99) * 1e3, webhooked.Max() * 1e3);
  std::printf("%-34s %5zu creates  allowed %5d  p50 %7.3f ms  p99 %7.3f ms  max %7.3f ms\n",
              "  peer: the same, no webhook sees it", peer.seconds.size(), peer.allowed,
              peer.Quantile(0.5) * 1e3, peer.Quantile(0.99) * 1e3, peer.Max() * 1e3);
  std::printf(
      "  the webhook's cost: p50 +%.3f ms, p99 +%.3f ms; webhooked / peer: p50 %.2fx, p99 %.2fx\n",
      (webhooked.Quantile(0.5) - peer.Quantile(0.5)) * 1e3,
      (webhooked.Quantile(0.99) - peer.Quantile(0.99)) * 1e3,
      webhooked.Quantile(0.5) / peer.Quantile(0.5), webhooked.Quantile(0.99) / peer.Quantile(0.99));
  if (!webhooked.firstRefusal.empty())
    std::printf("  first refusal: %s\n", webhooked.firstRefusal.c_str());
  if (!peer.firstRefusal.empty())
    std::printf("  peer's first refusal: %s\n", peer.firstRefusal.c_str());
}

// The API server's own timing of one webhook's calls (sum and count of
// apiserver_admission_webhook_admission_duration_seconds) between two scrapes: the mean.
void ApiServerView(const std::string& before, const std::string& after, const std::string& name) {
  auto of = [&](const std::string& text, const char* suffix) {
    return bench::Sum(
        text, std::string("apiserver_admission_webhook_admission_duration_seconds") + suffix,
        [&](const auto& labels) { return bench::Label(labels, "name") == name; });
  };
  const double count = of(after, "_count") - of(before, "_count");
  const double sum = of(after, "_sum") - of(before, "_sum");
  std::printf("  the API server's timing of the %s calls: %.0f calls, mean %.3f ms\n", name.c_str(),
              count, count > 0 ? sum / count * 1e3 : 0.0);
}

// The controller's own handler time (gpu_controller_admission_duration_seconds): the mean
// between two scrapes.
void HandlerView(const std::string& before, const std::string& after) {
  auto of = [&](const std::string& text, const char* suffix) {
    return bench::Sum(text, std::string("gpu_controller_admission_duration_seconds") + suffix,
                      [](const auto&) { return true; });
  };
  const double count = of(after, "_count") - of(before, "_count");
  const double sum = of(after, "_sum") - of(before, "_sum");
  std::printf("  the controller's handler time: %.0f calls, mean %.3f ms\n", count,
              count > 0 ? sum / count * 1e3 : 0.0);
}

int RunReal(const bench::Mode& mode, int nodes, int requests, int threads) {
  const std::filesystem::path source = COZY_SOURCE_DIR;
  bench::ControlPlane cluster(mode, source);
  const std::filesystem::path work = cluster.work();
  cluster.ApplyCrds(/*kubeVirt=*/true);
  const kube::ClientConfig& config = cluster.config();

  // The cluster of the in-process run, through the API server, without attachments (no VMI
  // would appear for them), with the finalizers the controller would otherwise add.
  const auto seeding = Clock::now();
  std::vector<json> objects;
  objects.push_back(
      {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "cozy-system"}}}});
  objects.push_back(
      {{"apiVersion", "v1"},
       {"kind", "Namespace"},
       {"metadata",
        {{"name", "tenant-root"}, {"labels", {{"tenant.cozystack.io/tenant-root", ""}}}}}});
  for (int t = 0; t < kTenants; ++t) {
    objects.push_back({{"apiVersion", "v1"},
                       {"kind", "Namespace"},
                       {"metadata",
                        {{"name", Tenant(t)},
                         {"labels",
                          {{"tenant.cozystack.io/tenant-root", ""},
                           {"tenant.cozystack.io/" + Tenant(t), ""}}}}}});
  }
  bench::Parallel(
      config, threads, static_cast<int>(objects.size()), [&](int i, kube::Client& client) {
        bench::CreateWithStatus(client, objects[static_cast<size_t>(i)], "namespaces", false);
      });
  bench::Parallel(config, threads, kTenants, [&](int t, kube::Client& client) {
    bench::CreateWithStatus(client,
                            {{"apiVersion", "v1"},
                             {"kind", "ResourceQuota"},
                             {"metadata", {{"name", "gpu"}, {"namespace", Tenant(t)}}},
                             {"spec", {{"hard", {{"requests.gpu.cozystack.io/a100", "100000"}}}}}},
                            "resourcequotas", false);
  });
  {
    kube::Client client(config, bench::BenchClientOptions());
    json gpuClass = testing::GpuClassObject("a100");
    gpuClass["metadata"]["finalizers"] = {"gpu.cozystack.io/class-protection"};
    bench::CreateWithStatus(client, gpuClass, "gpuclasses", true);
  }
  bench::Parallel(config, threads, nodes, [&](int n, kube::Client& client) {
    const std::string node = "node-" + std::to_string(n);
    bench::CreateWithStatus(client, testing::ReadyNode(node), "nodes", false);
    bench::CreateWithStatus(client, testing::GpuNodeObject(node, kGpusPerNode), "gpunodes", true);
  });
  const int heldDevices = nodes * kHeldPerNode;
  bench::Parallel(config, threads, heldDevices, [&](int device, kube::Client& client) {
    bench::CreateWithStatus(
        client,
        {{"apiVersion", "gpu.cozystack.io/v1alpha1"},
         {"kind", "GPUDevice"},
         {"metadata",
          {{"name", "d" + std::to_string(device)},
           {"namespace", Tenant(device)},
           {"finalizers", {"gpu.cozystack.io/device-protection"}}}},
         {"spec", {{"className", "a100"}, {"count", 1}}},
         {"status",
          {{"phase", "Bound"}, {"nodeName", "node-" + std::to_string(device / kHeldPerNode)}}}},
        "gpudevices", true);
  });
  std::printf(
      "seeded %d nodes x %d GPUs, %d held devices, %d tenants through the API server in %.1f s\n",
      nodes, kGpusPerNode, heldDevices, kTenants,
      std::chrono::duration<double>(Clock::now() - seeding).count());

  // The controller, its webhooks on 127.0.0.1 with a certificate for that address.
  bench::WebhookCertificates(work / "certs");
  const int healthPort = testing::FreePort();
  const int webhookPort = testing::FreePort();
  // Callers authenticated as in an install: by the CA of the webhook client certificate
  // scripts/cluster.sh gives kube-apiserver. A cluster of someone else's (--kubeconfig) may give
  // its API server none: then the webhooks answer any caller, as the opt-out says.
  const std::filesystem::path clientCa =
      cluster.dir().empty() ? std::filesystem::path() : cluster.dir() / "pki/webhook-client-ca.crt";
  std::vector<std::string> controllerArguments = {GPU_CONTROLLER,
                                                  "run",
                                                  "--kubeconfig",
                                                  cluster.kubeconfig().string(),
                                                  "--identity",
                                                  "bench",
                                                  "--enable-gpu",
                                                  "--health-addr",
                                                  "127.0.0.1:" + std::to_string(healthPort),
                                                  "--qps",
                                                  "0",
                                                  "--webhook-addr",
                                                  "127.0.0.1:" + std::to_string(webhookPort),
                                                  "--webhook-cert-dir",
                                                  (work / "certs").string()};
  // The bench creates the launcher pods as the cluster's admin: to the pod webhook that user is
  // KubeVirt's controller here (E14).
  const auto whoami = cluster.Kubectl("auth whoami -o jsonpath={.status.userInfo.username}");
  if (whoami.exitCode != 0 || whoami.out.empty()) {
    throw std::runtime_error("kubectl auth whoami: " + whoami.err);
  }
  controllerArguments.insert(controllerArguments.end(), {"--kubevirt-controller-user", whoami.out});
  if (clientCa.empty()) {
    controllerArguments.push_back("--webhook-allow-unauthenticated-callers");
  } else {
    controllerArguments.insert(controllerArguments.end(),
                               {"--webhook-client-ca", clientCa.string()});
  }
  bench::ControllerProcess controller(controllerArguments, work / "controller.log");
  auto failed = [&](const std::string& what) {
    const auto tail =
        testing::RunCommand("tail -n 20 " + testing::ShellQuote(controller.log().string()));
    std::fprintf(stderr, "%s\n--- controller log (last lines)\n%s", what.c_str(), tail.out.c_str());
    return 1;
  };
  const auto starting = Clock::now();
  if (!testing::WaitFor([&] { return bench::Ready(healthPort); }, std::chrono::minutes(5),
                        std::chrono::milliseconds(200))) {
    return failed("the controller did not get ready");
  }
  std::printf("controller ready (caches listed, webhooks serving) in %.1f s\n",
              std::chrono::duration<double>(Clock::now() - starting).count());
  // Its first pass over the cluster (each GPUNode's TakesBinds condition, one write each):
  // every write changes a cache, and the next admission request pays the model's rebuild, so
  // the measurement starts once the writes stand still.
  if (!testing::WaitFor(
          [&] {
            return bench::ControllerMetrics(healthPort)
                       .find("gpu_controller_binder_passes_total{kind=\"full\"}") !=
                   std::string::npos;
          },
          std::chrono::minutes(5), std::chrono::milliseconds(200))) {
    return failed("the binder made no pass");
  }
  std::printf("first full pass done %.1f s after start\n",
              std::chrono::duration<double>(Clock::now() - starting).count());
  bench::WaitForStillWrites(cluster, std::chrono::seconds(2), std::chrono::minutes(5));

  // The chart's admission objects with GPUs on and the webhooks at that address (its policies,
  // RBAC and inert workloads too: nothing here runs pods), as the real-cluster chart test does.
  bench::ApplyGpusOnChart(cluster, work / "certs", webhookPort, clientCa);
  // The peer's orders pass the GPUDevice webhook by: an objectSelector on the bench's label.
  cluster.KubectlOrThrow(
      "patch validatingwebhookconfiguration cozy-gpu --type=json -p '[{\"op\":\"add\","
      "\"path\":\"/webhooks/0/objectSelector\",\"value\":{\"matchExpressions\":[{\"key\":"
      "\"" +
      std::string(kPeerLabel) + "\",\"operator\":\"DoesNotExist\"}]}}]'");

  const kube::ClientConfig tenant = TenantConfig(cluster);
  kube::ClientOptions options = bench::BenchClientOptions();
  options.maxRetries = 0;  // every request timed is one request
  kube::Client client(tenant, options);
  // The API server has taken the configurations when the webhook refuses an order for a class
  // that does not exist, and lets the same order with the peer's label by.
  bool refused = false;
  bool peerPassed = false;
  const bool configured = testing::WaitFor(
      [&] {
        Timings probe;
        TimeCreate(client, DeviceCollection(Tenant(0)), Order(0, false, "no-such-class"), probe);
        refused = probe.allowed == 0 && probe.firstRefusal.find(
                                            "admission webhook \"gpudevices.gpu.cozystack.io\" "
                                            "denied the request") != std::string::npos;
        Timings peer;
        TimeCreate(client, DeviceCollection(Tenant(0)), Order(0, true, "no-such-class"), peer);
        peerPassed = peer.allowed == 1;
        Timings vmi;
        TimeCreate(client, VmiCollection(Tenant(1)), Vmi(0, heldDevices, true, "not json"), vmi);
        return refused && peerPassed &&
               vmi.firstRefusal.find(
                   "admission webhook \"virtualmachineinstances.gpu.cozystack.io\"") !=
                   std::string::npos;
      },
      std::chrono::seconds(60), std::chrono::milliseconds(500));
  if (!configured) {
    return failed("the API server did not call the webhooks as configured (webhook refused: " +
                  std::string(refused ? "yes" : "no") +
                  ", peer let by: " + std::string(peerPassed ? "yes" : "no") + ")");
  }
  std::printf(
      "webhooks registered at https://127.0.0.1:%d and called by the API server; %s\n", webhookPort,
      cluster.dir().empty() ? "requests as the kubeconfig's user"
                            : "requests as a tenant (client certificate, group bench-tenants)");

  // Warm-up, then the measured runs, each webhooked request followed by its peer.
  for (int i = 0; i < 50; ++i) {
    Timings ignored;
    TimeCreate(client, DeviceCollection(Tenant(i)), Order(i, false), ignored);
    TimeCreate(client, DeviceCollection(Tenant(i)), Order(i, true), ignored);
  }
  // The controller's metrics are refreshed once a second: scrapes a second and a half apart
  // from the requests.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  std::string apiBefore = cluster.Metrics();
  std::string handlerBefore = bench::ControllerMetrics(healthPort);
  Timings orders, orderPeers;
  for (int i = 0; i < requests; ++i) {
    TimeCreate(client, DeviceCollection(Tenant(i)), Order(i, false), orders);
    TimeCreate(client, DeviceCollection(Tenant(i)), Order(i, true), orderPeers);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  std::string apiAfter = cluster.Metrics();
  std::string handlerAfter = bench::ControllerMetrics(healthPort);
  std::printf("%d nodes x %d GPUs, %d held devices, %d tenants; dry-run creates through %s\n",
              nodes, kGpusPerNode, heldDevices, kTenants, config.server.c_str());
  Report("GPUDevice create (dry run)", orders, orderPeers);
  ApiServerView(apiBefore, apiAfter, "gpudevices.gpu.cozystack.io");
  HandlerView(handlerBefore, handlerAfter);

  const int vmRequests = std::max(1, requests / 20);  // each runs a placement trial
  for (int i = 0; i < 5; ++i) {
    Timings ignored;
    TimeCreate(client, VmiCollection(Tenant((i * 7 + 1) % heldDevices)), Vmi(i, heldDevices, true),
               ignored);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  apiBefore = cluster.Metrics();
  handlerBefore = bench::ControllerMetrics(healthPort);
  Timings vmis, vmiPeers;
  for (int i = 0; i < vmRequests; ++i) {
    const std::string ns = Tenant((i * 7 + 1) % heldDevices);
    TimeCreate(client, VmiCollection(ns), Vmi(i, heldDevices, true), vmis);
    TimeCreate(client, VmiCollection(ns), Vmi(i, heldDevices, false), vmiPeers);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  apiAfter = cluster.Metrics();
  handlerAfter = bench::ControllerMetrics(healthPort);
  Report("VMI create (dry run)", vmis, vmiPeers);
  ApiServerView(apiBefore, apiAfter, "virtualmachineinstances.gpu.cozystack.io");
  HandlerView(handlerBefore, handlerAfter);
  controller.Stop();
  return orders.allowed == requests && orderPeers.allowed == requests &&
                 vmis.allowed == vmRequests && vmiPeers.allowed == vmRequests
             ? 0
             : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines as they come, also into a file
  try {
    bench::Mode mode;
    const std::vector<std::string> words = bench::ParseMode(argc, argv, mode);
    const int nodes = bench::Positional(words, 0, mode.Real() ? 2000 : 5000);
    const int requests = bench::Positional(words, 1, 2000);
    if (nodes <= 0 || requests <= 0) {
      std::fprintf(stderr, "need nodes > 0 and requests > 0\n");
      return 2;
    }
    if (!mode.Real()) return RunInProcess(nodes, requests);
    return RunReal(mode, nodes, requests, bench::Positional(words, 2, 16));
  } catch (const std::exception& error) {
    std::fprintf(stderr, "bench_admission: %s\n", error.what());
    return 1;
  }
}
