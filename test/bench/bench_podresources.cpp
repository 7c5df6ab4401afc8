// Benchmark: device-ID resolution against a large synthetic host (cost per ID), and one
// pod-resources round trip (GetAllocatableResources + List) with 500 pods through the fake
// kubelet next to a bare RPC on the same socket (ratio). A program, not a timed test: it prints
// figures measured in the same run; docs/benchmarks.md records them.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "agent/status/resolver.h"
#include "agent/status/units.h"
#include "podresources/api.grpc.pb.h"
#include "podresources/client.h"
#include "test/fakes/fake_kubelet.h"
#include "test/support/hosts.h"

namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

template <typename Body>
double MedianSeconds(int runs, Body body) {
  std::vector<double> samples;
  for (int i = 0; i < runs; ++i) {
    const auto start = Clock::now();
    body();
    samples.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  return Median(samples);
}

// 10,000 IDs cycling through every shape a node sees, including ones that resolve to nothing.
std::vector<std::string> MixedIds(const cozy::sysfs::HostScan& host) {
  std::vector<std::string> vfAddresses;
  std::vector<std::string> groups;
  std::vector<std::string> mdevUuids;
  std::vector<std::string> mdevGroups;
  for (const auto& function : host.functions) {
    if (function.physicalFunction) {
      vfAddresses.push_back(function.address.ToString());
      if (function.driver == "vfio-pci") {
        groups.push_back(std::to_string(*function.iommuGroup));
      }
    }
    for (const auto& mdev : function.mdevs) {
      mdevUuids.push_back(mdev.uuid);
      mdevGroups.push_back(std::to_string(*mdev.iommuGroup));
    }
  }
  std::vector<std::string> ids;
  for (size_t i = 0; ids.size() < 10000; ++i) {
    switch (i % 10) {
      case 0:
      case 1:
        ids.push_back(vfAddresses[i % vfAddresses.size()]);
        break;
      case 2: {  // NVML spelling of an address
        std::string upper = "0000" + vfAddresses[i % vfAddresses.size()];
        std::transform(upper.begin(), upper.end(), upper.begin(),
                       [](char c) { return static_cast<char>(std::toupper(c)); });
        ids.push_back(upper);
        break;
      }
      case 3:
        ids.push_back(groups[i % groups.size()]);
        break;
      case 4:
        ids.push_back(mdevUuids[i % mdevUuids.size()]);
        break;
      case 5:
        ids.push_back(mdevGroups[i % mdevGroups.size()]);
        break;
      case 6:
        ids.push_back("GPU-3b6c5f0e-8a2f-11ee-b9d1-0242ac12" + std::to_string(1000 + i % 16) +
                      "::" + std::to_string(i % 4));
        break;
      case 7:
        ids.push_back("MIG-5c0a6f0e-0a1b-5c2d-9e3f-4a5b6c7d" + std::to_string(1000 + i % 64));
        break;
      case 8:
        ids.push_back(std::to_string(i % 4));  // plain indexes over non-vfio groups
        break;
      default:
        ids.push_back("kvm" + std::to_string(i % 110));
        break;
    }
  }
  return ids;
}

cozy::fakes::Scenario FiveHundredPods(const cozy::sysfs::HostScan& host) {
  cozy::fakes::Scenario scenario;
  std::vector<std::string> ids;
  for (const auto& function : host.functions) {
    for (const auto& mdev : function.mdevs) {
      ids.push_back(mdev.uuid);
    }
    if (function.driver == "vfio-pci") {
      ids.push_back(function.address.ToString());
    }
  }
  for (const auto& id : ids) {
    scenario.allocatable.push_back({"nvidia.com/NVIDIA_L40S-4Q", {id}, std::vector<int64_t>{0}});
  }
  for (int pod = 0; pod < 500; ++pod) {
    const std::string id = ids[static_cast<size_t>(pod) % ids.size()];
    scenario.pods.push_back(
        {"tenant-" + std::to_string(pod % 20),
         "virt-launcher-vm-" + std::to_string(pod),
         {{"compute", {{"nvidia.com/NVIDIA_L40S-4Q", {id}, std::vector<int64_t>{0}}}},
          {"guest-console-log", {}}}});
  }
  scenario.pods.push_back({"bench", "empty", {}});
  return scenario;
}

}  // namespace

int main() {
  const cozy::sysfs::HostScan host = cozy::testing::LargeSyntheticHost();
  const std::vector<std::string> ids = MixedIds(host);

  // --- resolution ---
  size_t placed = 0;
  const double resolveSeconds = MedianSeconds(21, [&] {
    const cozy::agent::Resolver resolver(host);
    placed = 0;
    for (const auto& id : ids) {
      placed += resolver.Resolve(id).functions.size();
    }
  });
  cozy::podresources::Allocation allocation;
  for (size_t i = 0; i < ids.size(); ++i) {
    allocation.allocatable["example.com/resource-" + std::to_string(i % 8)].push_back(
        {ids[i], std::vector<int64_t>{0}});
  }
  int64_t units = 0;
  const double countSeconds = MedianSeconds(21, [&] {
    const auto report = cozy::agent::CountUnits(host, allocation, {}, {}, {});
    units = 0;
    for (const auto& function : report.functions) {
      units += function.allocatable;
    }
  });
  std::printf("host: %zu PCI functions (%zu GPU), %zu mdevs\n", host.functions.size(),
              host.Gpus().size(), host.mdevParents.size());
  std::printf("resolve %zu mixed IDs (%zu placements): %.1f us total, %.0f ns per ID\n", ids.size(),
              placed, resolveSeconds * 1e6, resolveSeconds * 1e9 / static_cast<double>(ids.size()));
  std::printf("count units over the same IDs (%lld units): %.1f us total, %.0f ns per ID\n",
              static_cast<long long>(units), countSeconds * 1e6,
              countSeconds * 1e9 / static_cast<double>(ids.size()));

  // --- pod-resources round trip ---
  char pattern[] = "/tmp/cozy-bench-XXXXXX";
  if (::mkdtemp(pattern) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string socket = std::string(pattern) + "/kubelet.sock";
  cozy::fakes::FakeKubelet kubelet;
  kubelet.Start(socket, FiveHundredPods(host));

  cozy::podresources::ClientOptions options;
  options.endpoint = "unix://" + socket;
  cozy::podresources::Client client(options);
  size_t pods = 0;
  size_t allocatable = 0;
  bool ok = true;
  const int runs = 201;
  const double fetchSeconds = MedianSeconds(runs, [&] {
    const auto result = client.Fetch();
    ok = ok && result.state == cozy::podresources::FetchState::kOk;
    if (result.allocation) {
      pods = result.allocation->pods.size();
      allocatable = result.allocation->allocatable.begin()->second.size();
    }
  });

  // The bare RPC: Get of a pod without containers, on its own channel to the same socket.
  auto channel = grpc::CreateChannel(options.endpoint, grpc::InsecureChannelCredentials());
  auto stub = v1::PodResourcesLister::NewStub(channel);
  v1::GetPodResourcesRequest request;
  request.set_pod_name("empty");
  request.set_pod_namespace("bench");
  const double bareSeconds = MedianSeconds(runs, [&] {
    grpc::ClientContext context;
    v1::GetPodResourcesResponse response;
    ok = ok && stub->Get(&context, request, &response).ok();
  });
  kubelet.Stop();
  std::filesystem::remove_all(pattern);
  if (!ok) {
    std::fprintf(stderr, "bench: a call failed\n");
    return 1;
  }
  std::printf(
      "fetch (GetAllocatableResources + List, %zu pods, %zu allocatable): %.0f us "
      "median of %d\n",
      pods, allocatable, fetchSeconds * 1e6, runs);
  std::printf("bare Get RPC on the same socket: %.0f us median of %d\n", bareSeconds * 1e6, runs);
  std::printf("ratio fetch / bare RPC: %.1f\n", fetchSeconds / bareSeconds);
  return 0;
}
