// An order of a dra class to its allocated claim, through a real control plane (docs/benchmarks.md,
// "DRA: an order to its allocated claim"): `scripts/cluster.sh up` in a temporary directory (etcd,
// kube-apiserver, kube-controller-manager and kube-scheduler on 127.0.0.1), N nodes with two
// A100s each, seeded through the API server as their agents would publish them (a Ready Node,
// its GPUNode and its ResourceSlice, whose devices are gpu-agent's own, SliceDevices over the
// a100-vfio fixture), a dra class of their PCI ID and `gpu-controller run --enable-gpu`.
//
// Ours, per order: the order created; the binder's placement; the reconciler's claim for it; then
// (as virt-controller does once the VMI webhook has named the claim) a launcher-like pod using
// the claim, pinned to the order's node (as the pod webhook pins a launcher); kube-scheduler
// allocating the claim. Timed from the order's create to the claim's allocation, with the
// placement and the claim's create on the way.
// The peer, in the same run and alternating with ours: kube-scheduler's own allocation for a pod,
// a claim of the class's DeviceClass (tolerating the catalog's taint, any device of the class)
// and an unpinned pod using it, timed from the claim's create to its allocation.
// Prints the medians and 90th percentiles and ours over the peer's (the binder and reconciler's
// cost on top of what kube-scheduler takes anyway).
//
//   bench_dra_claims [nodes=1000] [orders=40] [seed-threads=16]
//   bench_dra_claims --kubeconfig FILE [...]   an existing, empty cluster, left filled
//
// The nodes have no kubelet: pods stay Pending once bound, which is all the allocation needs
// (kube-scheduler writes it before it binds); the control plane gives the node lifecycle
// controller an hour, so they stay Ready (real_cluster.h).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agent/status/resource_slice.h"
#include "test/bench/real_cluster.h"
#include "test/support/fixture_host.h"
#include "test/support/process.h"

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
constexpr const char* kNamespace = "tenant";
constexpr const char* kClass = "a100-dra";
constexpr const char* kDeviceClass = "a100-dra.gpu.cozystack.io";

double Milliseconds(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

std::string NodeName(int n) { return "node-" + std::to_string(n); }

json Node(int n) {
  const json resources = {{"cpu", "64"}, {"memory", "512Gi"}, {"pods", "110"}};
  return {
      {"apiVersion", "v1"},
      {"kind", "Node"},
      {"metadata", {{"name", NodeName(n)}, {"labels", {{"kubernetes.io/hostname", NodeName(n)}}}}},
      {"status",
       {{"conditions", {{{"type", "Ready"}, {"status", "True"}, {"reason", "KubeletReady"}}}},
        {"capacity", resources},
        {"allocatable", resources}}}};
}

// The GPUNode its agent would publish: the two vfio-bound A100s, no device plugin advertising
// them (a dra class's units).
json GpuNode(int n, const json& sliceDevices) {
  json devices = json::array();
  for (const json& device : sliceDevices) {
    const json& attributes = device["attributes"];
    devices.push_back({{"pciAddress", attributes["resource.kubernetes.io/pciBusID"]["string"]},
                       {"vendorID", attributes["vendorID"]["string"]},
                       {"deviceID", attributes["deviceID"]["string"]},
                       {"classCode", "030200"},
                       {"driver", "vfio-pci"},
                       {"health", "Healthy"},
                       {"allocatable", 0},
                       {"allocated", 0},
                       {"resources", json::array()}});
  }
  return {{"apiVersion", "gpu.cozystack.io/v1alpha1"},
          {"kind", "GPUNode"},
          {"metadata", {{"name", NodeName(n)}}},
          {"status",
           {{"resourceNames", json::array()},
            {"summary", {{"gpus", devices.size()}}},
            {"devices", devices}}}};
}

json GpuClass(const std::string& selector) {
  return {{"apiVersion", "gpu.cozystack.io/v1alpha1"},
          {"kind", "GPUClass"},
          {"metadata", {{"name", kClass}}},
          {"spec",
           {{"vendor", "NVIDIA"},
            {"model", "A100 PCIe 40GB"},
            {"mode", "passthrough"},
            {"maxCount", 8},
            {"source", {{"dra", {{"pciVendorSelector", selector}}}}}}}};
}

json Order(const std::string& name) {
  return {{"apiVersion", "gpu.cozystack.io/v1alpha1"},
          {"kind", "GPUDevice"},
          {"metadata", {{"name", name}, {"namespace", kNamespace}}},
          {"spec", {{"className", kClass}, {"count", 1}}}};
}

// A pod using claim `claim` (the compute container's claim, by request when given), pinned to
// `node` by the pod webhook's matchFields term when one is named.
json Pod(const std::string& name, const std::string& claim, const std::string& request,
         const std::string& node) {
  json claimRef = {{"name", "gpu"}};
  if (!request.empty()) claimRef["request"] = request;
  json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata", {{"name", name}, {"namespace", kNamespace}}},
              {"spec",
               {{"resourceClaims", {{{"name", "gpu"}, {"resourceClaimName", claim}}}},
                {"containers",
                 {{{"name", "compute"},
                   {"image", "example.invalid/virt-launcher:1"},
                   {"resources", {{"claims", {claimRef}}}}}}}}}};
  if (!node.empty()) {
    pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
       ["nodeSelectorTerms"] = {
           {{"matchFields", {{{"key", "metadata.name"}, {"operator", "In"}, {"values", {node}}}}}}};
  }
  return pod;
}

// The peer's claim: one device of the class, any, tolerating the catalog's taint.
json PeerClaim(const std::string& name) {
  return {{"apiVersion", "resource.k8s.io/v1"},
          {"kind", "ResourceClaim"},
          {"metadata", {{"name", name}, {"namespace", kNamespace}}},
          {"spec",
           {{"devices",
             {{"requests",
               {{{"name", "gpu"},
                 {"exactly",
                  {{"deviceClassName", kDeviceClass},
                   {"allocationMode", "ExactCount"},
                   {"count", 1},
                   {"tolerations",
                    {{{"key", "gpu.cozystack.io/catalog"},
                      {"operator", "Exists"},
                      {"effect", "NoSchedule"}}}}}}}}}}}}}};
}

std::string ClaimPath(const std::string& name) {
  return cozy::kube::ResourcePath("resource.k8s.io", "v1", "resourceclaims", kNamespace, name);
}

// Polls `read` every 5 ms until it returns true; false after `limit`.
template <typename Read>
bool PollUntil(Read read, std::chrono::seconds limit) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    try {
      if (read()) return true;
    } catch (const cozy::kube::ApiError& error) {
      if (error.kind() != cozy::kube::ErrorKind::kNotFound) throw;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

bool Allocated(cozy::kube::Client& client, const std::string& claim) {
  const json object = client.Get(ClaimPath(claim));
  return object.contains("status") && object["status"].contains("allocation");
}

struct Ours {
  double placed = 0, claimed = 0, allocated = 0;  // ms from the order's create
};

std::optional<Ours> OrderToAllocation(cozy::kube::Client& client, int i) {
  const std::string name = "order-" + std::to_string(i);
  const auto start = Clock::now();
  client.Create(
      cozy::kube::ResourcePath("gpu.cozystack.io", "v1alpha1", "gpudevices", kNamespace, ""),
      Order(name));
  Ours ours;
  std::string node;
  const bool placed = PollUntil(
      [&] {
        const json device = client.Get(cozy::kube::ResourcePath("gpu.cozystack.io", "v1alpha1",
                                                                "gpudevices", kNamespace, name));
        const json status = device.value("status", json::object());
        if (status.value("phase", "") != "Bound") return false;
        node = status.value("nodeName", "");
        return true;
      },
      std::chrono::seconds(60));
  if (!placed) return std::nullopt;
  ours.placed = Milliseconds(Clock::now() - start);
  if (!PollUntil([&] { return !client.Get(ClaimPath(name)).is_null(); }, std::chrono::seconds(60)))
    return std::nullopt;
  ours.claimed = Milliseconds(Clock::now() - start);
  client.Create(cozy::kube::ResourcePath("", "v1", "pods", kNamespace, ""),
                Pod("launcher-" + std::to_string(i), name, "gpu-0", node));
  if (!PollUntil([&] { return Allocated(client, name); }, std::chrono::seconds(60)))
    return std::nullopt;
  ours.allocated = Milliseconds(Clock::now() - start);
  return ours;
}

std::optional<double> PeerAllocation(cozy::kube::Client& client, int i) {
  const std::string name = "peer-" + std::to_string(i);
  const auto start = Clock::now();
  client.Create(cozy::kube::ResourcePath("resource.k8s.io", "v1", "resourceclaims", kNamespace, ""),
                PeerClaim(name));
  client.Create(cozy::kube::ResourcePath("", "v1", "pods", kNamespace, ""),
                Pod("peer-pod-" + std::to_string(i), name, "", ""));
  if (!PollUntil([&] { return Allocated(client, name); }, std::chrono::seconds(60)))
    return std::nullopt;
  return Milliseconds(Clock::now() - start);
}

double Quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t at = static_cast<size_t>(q * static_cast<double>(values.size() - 1) + 0.5);
  return values[std::min(at, values.size() - 1)];
}

int Run(const cozy::bench::Mode& mode, int nodes, int orders, int threads) {
  const std::filesystem::path source = COZY_SOURCE_DIR;
  cozy::bench::ControlPlane cluster(mode, source);
  const std::filesystem::path work = cluster.work();
  cluster.ApplyCrds(/*kubeVirt=*/false);
  const auto& config = cluster.config();
  cozy::kube::Client client(config, cozy::bench::BenchClientOptions());

  // gpu-agent's own devices for an a100-vfio host (two A100 40GB on vfio-pci), per node.
  const cozy::sysfs::HostScan scan = cozy::testing::FixtureHost("a100-vfio").Scan();
  const auto seeding = Clock::now();
  for (const char* ns : {"cozy-system", kNamespace}) {  // the controller's Lease, the orders
    cozy::bench::CreateWithStatus(
        client, {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}},
        "namespaces", false);
  }
  cozy::bench::CreateWithStatus(client, GpuClass("10DE:20F1"), "gpuclasses", true);
  cozy::bench::Parallel(config, threads, nodes, [&](int n, cozy::kube::Client& seeder) {
    const json node = seeder.Create(cozy::kube::ResourcePath("", "v1", "nodes", "", ""), Node(n));
    seeder.MergePatch(cozy::kube::ResourcePath("", "v1", "nodes", "", NodeName(n)) + "/status",
                      {{"status", Node(n)["status"]}});
    const json devices = cozy::agent::SliceDevices(scan, NodeName(n));
    cozy::bench::CreateWithStatus(seeder, GpuNode(n, devices), "gpunodes", true);
    seeder.Create(cozy::kube::ResourcePath("resource.k8s.io", "v1", "resourceslices", "", ""),
                  cozy::agent::ResourceSliceObject(
                      NodeName(n), node["metadata"]["uid"].get<std::string>(), devices, 1));
  });
  std::printf("seeded %d nodes x 2 GPUs (Node, GPUNode, ResourceSlice) in %.1f s (%d threads)\n",
              nodes, Milliseconds(Clock::now() - seeding) / 1000, threads);

  const int port = cozy::testing::FreePort();
  cozy::bench::WebhookCertificates(work / "certs");
  cozy::bench::ControllerProcess controller(
      {GPU_CONTROLLER, "run", "--kubeconfig", cluster.kubeconfig().string(), "--identity", "bench",
       "--enable-gpu", "--health-addr", "127.0.0.1:" + std::to_string(port), "--qps", "0",
       "--webhook-addr", "127.0.0.1:0", "--webhook-cert-dir", (work / "certs").string(),
       "--webhook-client-ca", (work / "certs/ca.crt").string()},
      work / "controller.log");
  auto failed = [&](const char* what) {
    const auto tail = cozy::testing::RunCommand(
        "tail -n 20 " + cozy::testing::ShellQuote(controller.log().string()));
    std::fprintf(stderr, "%s\n--- controller log (last lines)\n%s", what, tail.out.c_str());
    return 1;
  };
  const auto starting = Clock::now();
  if (!cozy::testing::WaitFor([&] { return cozy::bench::Ready(port); }, std::chrono::minutes(5),
                              std::chrono::milliseconds(200))) {
    return failed("the controller did not get ready");
  }
  if (!PollUntil(
          [&] {
            return !client
                        .Get(cozy::kube::ResourcePath("resource.k8s.io", "v1", "deviceclasses", "",
                                                      kDeviceClass))
                        .is_null();
          },
          std::chrono::seconds(120))) {
    return failed("the reconciler wrote no DeviceClass");
  }
  std::printf("controller ready, the class's DeviceClass written, %.1f s after start\n",
              Milliseconds(Clock::now() - starting) / 1000);

  std::vector<double> placed, claimed, allocated, peer;
  for (int i = 0; i < orders; ++i) {
    const std::optional<Ours> ours = OrderToAllocation(client, i);
    if (!ours) return failed(("order-" + std::to_string(i) + " was not allocated in time").c_str());
    placed.push_back(ours->placed);
    claimed.push_back(ours->claimed);
    allocated.push_back(ours->allocated);
    const std::optional<double> own = PeerAllocation(client, i);
    if (!own) return failed(("peer-" + std::to_string(i) + " was not allocated in time").c_str());
    peer.push_back(*own);
  }
  auto line = [](const char* what, const std::vector<double>& values) {
    std::printf("  %-62s median %7.1f ms   p90 %7.1f ms\n", what, Quantile(values, 0.5),
                Quantile(values, 0.9));
  };
  std::printf("%d orders and %d peer claims at %d nodes, one at a time, alternating:\n", orders,
              orders, nodes);
  line("ours: the order Bound (the binder's placement)", placed);
  line("ours: its claim created (the reconciler)", claimed);
  line("ours: the claim allocated (a pinned pod, kube-scheduler)", allocated);
  line("peer: a claim allocated for an unpinned pod (kube-scheduler)", peer);
  std::printf("order to allocated claim / kube-scheduler's own allocation: %.2fx (medians)\n",
              Quantile(allocated, 0.5) / Quantile(peer, 0.5));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    cozy::bench::Mode mode;
    const std::vector<std::string> words = cozy::bench::ParseMode(argc, argv, mode);
    if (!mode.Real()) mode.realCluster = true;  // only a real kube-scheduler allocates claims
    const int nodes = cozy::bench::Positional(words, 0, 1000);
    const int orders = cozy::bench::Positional(words, 1, 40);
    const int threads = cozy::bench::Positional(words, 2, 16);
    if (nodes <= 0 || orders <= 0 || orders > nodes || threads <= 0) {
      std::fprintf(stderr, "need nodes > 0, 0 < orders <= nodes, seed-threads > 0\n");
      return 2;
    }
    return Run(mode, nodes, orders, threads);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "bench_dra_claims: %s\n", error.what());
    return 1;
  }
}
