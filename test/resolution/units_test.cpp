// Units per function and resource, health, resourceNames and unplaced (DESIGN §4.4), for
// every plugin ID shape of research/device-ids.md §3-6, on in-memory hosts.
#include "agent/status/units.h"

#include <gtest/gtest.h>

#include "test/support/hosts.h"

namespace cozy::agent {
namespace {

using podresources::AllocatableDevice;
using podresources::Allocation;
using podresources::PodAllocation;
using testing::Address;
using testing::HostBuilder;
using testing::kClass3d;
using testing::kNvidia;

constexpr const char* kA100 = "nvidia.com/GA100_A100_PCIE_80GB";

void Advertise(Allocation& allocation, const std::string& resource,
               const std::vector<std::string>& ids,
               std::optional<std::vector<int64_t>> numa = std::nullopt) {
  for (const auto& id : ids) {
    allocation.allocatable[resource].push_back(AllocatableDevice{id, numa});
  }
}

PodAllocation Pod(const std::string& ns, const std::string& name, const std::string& resource,
                  const std::vector<std::string>& ids) {
  return PodAllocation{ns, name, {{"compute", {{resource, ids}}}}};
}

const FunctionUnits& UnitsOf(const UnitReport& report, std::string_view address) {
  for (const auto& function : report.functions) {
    if (function.address == Address(address)) {
      return function;
    }
  }
  throw std::invalid_argument("no GPU function " + std::string(address) + " in the report");
}

UnitReport Count(const sysfs::HostScan& host, const Allocation& allocation,
                 const PodPhases& phases = {}, const NvmlGpuAddresses& nvml = {}) {
  return CountUnits(host, allocation, phases, {}, nvml);
}

// Two A100 80GB on vfio-pci for KubeVirt, an NVMe beside them.
sysfs::HostScan A100Host() {
  HostBuilder builder;
  builder.Add({"0000:3b:00.0", kNvidia, 0x20b5, kClass3d, "vfio-pci", 42u, true, {}})
      .Add({"0000:86:00.0", kNvidia, 0x20b5, kClass3d, "vfio-pci", 43u, true, {}})
      .Add({"0000:5e:00.0", 0x144d, 0xa80a, testing::kClassNvme, "nvme", 50u, false, {}});
  return builder.Build();
}

// A T4 on the nvidia driver with four GRID T4-1Q mdevs (groups 120-123).
sysfs::HostScan T4Host() {
  HostBuilder builder;
  builder.Add({"0000:af:00.0", kNvidia, 0x1eb8, kClass3d, "nvidia", 80u, true, {}});
  for (int i = 1; i <= 4; ++i) {
    builder.AddMdev("0000:af:00.0", "a1b2c3d4-0000-4000-8000-00000000000" + std::to_string(i),
                    "nvidia-222", 119u + static_cast<uint32_t>(i));
  }
  return builder.Build();
}

std::string T4Mdev(int i) { return "a1b2c3d4-0000-4000-8000-00000000000" + std::to_string(i); }

// A1, A2, A3: KubeVirt's PCI plugin advertises IOMMU group numbers.
TEST(CountUnits, A1_A100PassthroughThroughKubeVirtGroupIds) {
  Allocation allocation;
  Advertise(allocation, kA100, {"42", "43"}, std::vector<int64_t>{0});
  const UnitReport report = Count(A100Host(), allocation);
  ASSERT_EQ(report.functions.size(), 2u);  // GPUs only: the NVMe gets no entry
  for (const char* address : {"0000:3b:00.0", "0000:86:00.0"}) {
    const FunctionUnits& units = UnitsOf(report, address);
    EXPECT_EQ(units.allocatable, 1) << address;
    EXPECT_EQ(units.allocated, 0) << address;
    EXPECT_EQ(units.health, Health::kHealthy) << address;
    ASSERT_EQ(units.resources.size(), 1u);
    EXPECT_EQ(units.resources[0], (ResourceUnits{kA100, 1, 0}));
  }
  EXPECT_EQ(report.resourceNames, std::vector<std::string>{kA100});
  EXPECT_TRUE(report.unplaced.empty());
}

// NVIDIA's kubevirt plugin: PCI addresses from v1.5, group numbers before; same units.
TEST(CountUnits, A2_NvidiaKubevirtPluginAddressesAndOlderGroupNumbers) {
  for (const auto& ids : {std::vector<std::string>{"0000:3b:00.0", "0000:86:00.0"},
                          std::vector<std::string>{"42", "43"}}) {
    Allocation allocation;
    Advertise(allocation, kA100, ids, std::vector<int64_t>{1});
    allocation.pods.push_back(Pod("tenant-a", "virt-launcher-vm1-abcde", kA100, {ids[1]}));
    const UnitReport report = Count(A100Host(), allocation);
    EXPECT_EQ(UnitsOf(report, "0000:3b:00.0").allocatable, 1) << ids[0];
    EXPECT_EQ(UnitsOf(report, "0000:3b:00.0").allocated, 0) << ids[0];
    EXPECT_EQ(UnitsOf(report, "0000:86:00.0").allocatable, 1) << ids[0];
    EXPECT_EQ(UnitsOf(report, "0000:86:00.0").allocated, 1) << ids[0];
  }
}

// A6, A7: units per function (an mdev parent serves several); final pods hold nothing.
TEST(CountUnits, A6_A7_T4FourMdevsByUuidTwoRunningOneSucceeded) {
  const std::string resource = "nvidia.com/GRID_T4-1Q";
  Allocation allocation;
  Advertise(allocation, resource, {T4Mdev(1), T4Mdev(2), T4Mdev(3), T4Mdev(4)},
            std::vector<int64_t>{0});
  allocation.pods.push_back(Pod("tenant-a", "virt-launcher-vm1", resource, {T4Mdev(1)}));
  allocation.pods.push_back(Pod("tenant-b", "virt-launcher-vm2", resource, {T4Mdev(2)}));
  // kubelet 1.32/1.33 still list a finished pod with the device a new pod may hold.
  allocation.pods.push_back(Pod("tenant-c", "virt-launcher-old", resource, {T4Mdev(3)}));
  const PodPhases phases = {{"tenant-a/virt-launcher-vm1", "Running"},
                            {"tenant-b/virt-launcher-vm2", "Running"},
                            {"tenant-c/virt-launcher-old", "Succeeded"}};
  const UnitReport report = Count(T4Host(), allocation, phases);
  const FunctionUnits& t4 = UnitsOf(report, "0000:af:00.0");
  EXPECT_EQ(t4.allocatable, 4);
  EXPECT_EQ(t4.allocated, 2);
  EXPECT_EQ(t4.health, Health::kHealthy);
  EXPECT_EQ(t4.resources, (std::vector<ResourceUnits>{{resource, 4, 2}}));
  EXPECT_EQ(report.resourceNames, std::vector<std::string>{resource});
}

TEST(CountUnits, A7_FailedPodHoldsNothingUnknownPodIsActive) {
  const std::string resource = "nvidia.com/GRID_T4-1Q";
  Allocation allocation;
  Advertise(allocation, resource, {T4Mdev(1), T4Mdev(2)});
  allocation.pods.push_back(Pod("ns", "failed", resource, {T4Mdev(1)}));
  allocation.pods.push_back(Pod("ns", "not-watched-yet", resource, {T4Mdev(2)}));
  const UnitReport report = Count(T4Host(), allocation, {{"ns/failed", "Failed"}});
  EXPECT_EQ(UnitsOf(report, "0000:af:00.0").allocated, 1);
}

// KubeVirt's mdev plugin advertises each mdev's own IOMMU group number.
TEST(CountUnits, A2_KubeVirtMdevPluginGroupNumbers) {
  const std::string resource = "nvidia.com/GRID_T4-1Q";
  Allocation allocation;
  Advertise(allocation, resource, {"120", "121", "122", "123"});
  allocation.pods.push_back(Pod("tenant-a", "virt-launcher-vm1", resource, {"121"}));
  const UnitReport report = Count(T4Host(), allocation);
  EXPECT_EQ(UnitsOf(report, "0000:af:00.0").allocatable, 4);
  EXPECT_EQ(UnitsOf(report, "0000:af:00.0").allocated, 1);
}

// A5: health is read from allocatability.
TEST(CountUnits, A5_OneOfTwoTurnsUnhealthyAllocatableDrops) {
  Allocation allocation;
  Advertise(allocation, kA100, {"42", "43"});
  const UnitReport before = Count(A100Host(), allocation);
  EXPECT_EQ(before.functions[0].allocatable + before.functions[1].allocatable, 2);

  // kubelet lists only healthy devices: group 43's /dev/vfio node vanished.
  allocation.allocatable[kA100] = {AllocatableDevice{"42", std::nullopt}};
  const UnitReport after = CountUnits(A100Host(), allocation, {}, before.advertised, {});
  EXPECT_EQ(after.functions[0].allocatable + after.functions[1].allocatable, 1);
  EXPECT_EQ(UnitsOf(after, "0000:86:00.0").health, Health::kUnhealthy);
  EXPECT_EQ(UnitsOf(after, "0000:3b:00.0").health, Health::kHealthy);
}

TEST(CountUnits, A5_UnhealthyDeviceStillHeldByAPodIsUnhealthy) {
  Allocation allocation;
  Advertise(allocation, kA100, {"42"});
  // Group 43 is gone from the allocatable list but its pod keeps it; nothing is known from
  // earlier runs (a fresh agent), so only the holding pod says it exists.
  allocation.pods.push_back(Pod("tenant-a", "virt-launcher-vm1", kA100, {"43"}));
  const UnitReport report =
      Count(A100Host(), allocation, {{"tenant-a/virt-launcher-vm1", "Running"}});
  const FunctionUnits& held = UnitsOf(report, "0000:86:00.0");
  EXPECT_EQ(held.allocatable, 0);
  EXPECT_EQ(held.allocated, 1);
  EXPECT_EQ(held.health, Health::kUnhealthy);
  EXPECT_EQ(held.resources, (std::vector<ResourceUnits>{{kA100, 0, 1}}));
}

TEST(CountUnits, HealthUnadvertisedUntilAdvertisedThenUnhealthyForTheRun) {
  Allocation empty;
  const UnitReport first = Count(A100Host(), empty);
  for (const auto& function : first.functions) {
    EXPECT_EQ(function.health, Health::kUnadvertised);
  }
  EXPECT_TRUE(first.advertised.empty());
  EXPECT_TRUE(first.resourceNames.empty());

  Allocation advertised;
  Advertise(advertised, kA100, {"42"});
  const UnitReport second = CountUnits(A100Host(), advertised, {}, first.advertised, {});
  EXPECT_EQ(second.advertised, std::set<sysfs::PciAddress>{Address("0000:3b:00.0")});

  // The plugin stops advertising it (device went away from the list): Unhealthy, not
  // Unadvertised, for the rest of the run.
  const UnitReport third = CountUnits(A100Host(), empty, {}, second.advertised, {});
  EXPECT_EQ(UnitsOf(third, "0000:3b:00.0").health, Health::kUnhealthy);
  EXPECT_EQ(UnitsOf(third, "0000:86:00.0").health, Health::kUnadvertised);
  EXPECT_EQ(third.advertised, second.advertised);
}

// kubelet lists a device on two NUMA nodes twice; a pod may list an ID in two containers.
TEST(CountUnits, DeduplicatesByResourceAndId) {
  Allocation allocation;
  Advertise(allocation, kA100, {"0000:3b:00.0"}, std::vector<int64_t>{0});
  Advertise(allocation, kA100, {"0000:3b:00.0"}, std::vector<int64_t>{1});
  allocation.pods.push_back(PodAllocation{"ns",
                                          "pod",
                                          {{"compute", {{kA100, {"0000:3b:00.0", "0000:3b:00.0"}}}},
                                           {"sidecar", {{kA100, {"0000:3b:00.0"}}}}}});
  // A stale listing of the same device under a second active pod still counts once.
  allocation.pods.push_back(Pod("ns", "other", kA100, {"0000:3b:00.0"}));
  const UnitReport report = Count(A100Host(), allocation);
  EXPECT_EQ(UnitsOf(report, "0000:3b:00.0").allocatable, 1);
  EXPECT_EQ(UnitsOf(report, "0000:3b:00.0").allocated, 1);
}

// The same function advertised under two resources counts under each.
TEST(CountUnits, SameFunctionUnderTwoResources) {
  Allocation allocation;
  Advertise(allocation, kA100, {"42"});
  Advertise(allocation, "nvidia.com/A100_passthrough", {"0000:3b:00.0"});
  const UnitReport report = Count(A100Host(), allocation);
  const FunctionUnits& units = UnitsOf(report, "0000:3b:00.0");
  EXPECT_EQ(units.allocatable, 2);
  ASSERT_EQ(units.resources.size(), 2u);
  EXPECT_EQ(units.resources[0].name, "nvidia.com/A100_passthrough");  // sorted by name
  EXPECT_EQ(report.resourceNames.size(), 2u);
}

// The L40S (kernel 6.8+): vendor-specific VFIO VFs on the nvidia driver, advertised by PCI
// address (NVIDIA kubevirt plugin >= v1.5 or an external provider).
TEST(CountUnits, L40sVendorSpecificVfsByPciAddress) {
  const std::string resource = "nvidia.com/NVIDIA_L40S-4Q";
  HostBuilder builder;
  builder.Add({"0000:01:00.0", kNvidia, 0x26b9, kClass3d, "nvidia", 10u, true, {}});
  for (int vf = 4; vf <= 7; ++vf) {
    const std::string address = "0000:01:00." + std::to_string(vf);
    builder.Add({address, kNvidia, 0x26b9, kClass3d, "nvidia", 7u + static_cast<uint32_t>(vf), true,
                 "0000:01:00.0"});
    builder.SetCurrentVgpuType(address, "1561");
  }
  Allocation allocation;
  Advertise(allocation, resource, {"0000:01:00.4", "0000:01:00.5", "0000:01:00.6"});
  allocation.pods.push_back(Pod("tenant-a", "virt-launcher-vm1", resource, {"0000:01:00.5"}));
  const UnitReport report = Count(builder.Build(), allocation);
  EXPECT_EQ(UnitsOf(report, "0000:01:00.4").allocatable, 1);
  EXPECT_EQ(UnitsOf(report, "0000:01:00.5").allocated, 1);
  EXPECT_EQ(UnitsOf(report, "0000:01:00.7").health, Health::kUnadvertised);
  EXPECT_EQ(UnitsOf(report, "0000:01:00.0").health, Health::kUnadvertised);  // the PF
  EXPECT_EQ(report.resourceNames, std::vector<std::string>{resource});
}

// An HGX H100 box: 8 GPUs on the nvidia driver for containers.
sysfs::HostScan HgxHost() {
  HostBuilder builder;
  for (int i = 0; i < 8; ++i) {
    char address[16];
    std::snprintf(address, sizeof(address), "0000:%02x:00.0", 0x18 + i * 0x10);
    builder.Add(
        {address, kNvidia, 0x2330, kClass3d, "nvidia", 30u + static_cast<uint32_t>(i), true, {}});
  }
  return builder.Build();
}

std::string HgxGpuUuid(int i) {
  return "GPU-3b6c5f0e-8a2f-11ee-b9d1-0242ac12000" + std::to_string(i);
}

// A4: NVIDIA's container plugin: GPU-/MIG- UUIDs, "::N" replicas.
TEST(CountUnits, A4_HgxContainerPluginUuidsAreUnplaced) {
  Allocation allocation;
  for (int i = 0; i < 6; ++i) {
    Advertise(allocation, "nvidia.com/gpu", {HgxGpuUuid(i)}, std::vector<int64_t>{i / 4});
  }
  for (int replica = 0; replica < 4; ++replica) {  // GPU 6 time-sliced four ways
    Advertise(allocation, "nvidia.com/gpu.shared",
              {HgxGpuUuid(6) + "::" + std::to_string(replica)});
  }
  Advertise(
      allocation, "nvidia.com/mig-1g.10gb",
      {"MIG-5c0a6f0e-0a1b-5c2d-9e3f-4a5b6c7d8e90", "MIG-5c0a6f0e-0a1b-5c2d-9e3f-4a5b6c7d8e91"});
  allocation.pods.push_back(
      Pod("ml", "trainer-0", "nvidia.com/gpu", {HgxGpuUuid(0), HgxGpuUuid(1)}));
  allocation.pods.push_back(
      Pod("ml", "notebook", "nvidia.com/gpu.shared", {HgxGpuUuid(6) + "::2"}));
  const UnitReport report = Count(HgxHost(), allocation);
  for (const auto& function : report.functions) {
    EXPECT_EQ(function.allocatable, 0);
    EXPECT_EQ(function.health, Health::kUnadvertised);
  }
  EXPECT_EQ(report.resourceNames,
            (std::vector<std::string>{"nvidia.com/gpu", "nvidia.com/gpu.shared",
                                      "nvidia.com/mig-1g.10gb"}));
  EXPECT_EQ(report.unplaced, (std::vector<UnplacedUnits>{{"nvidia.com/gpu", 6, 2},
                                                         {"nvidia.com/gpu.shared", 4, 1},
                                                         {"nvidia.com/mig-1g.10gb", 2, 0}}));
}

// Past the design: NVIDIA's procfs places GPU UUIDs (and their replicas) on their function.
TEST(CountUnits, A4_HgxContainerPluginUuidsPlacedThroughProcfs) {
  NvmlGpuAddresses nvml;
  for (int i = 0; i < 8; ++i) {
    char address[16];
    std::snprintf(address, sizeof(address), "0000:%02x:00.0", 0x18 + i * 0x10);
    nvml.emplace(HgxGpuUuid(i), Address(address));
  }
  Allocation allocation;
  Advertise(allocation, "nvidia.com/gpu", {HgxGpuUuid(0), HgxGpuUuid(1)});
  for (int replica = 0; replica < 4; ++replica) {
    Advertise(allocation, "nvidia.com/gpu.shared",
              {HgxGpuUuid(6) + "::" + std::to_string(replica)});
  }
  Advertise(allocation, "nvidia.com/mig-1g.10gb", {"MIG-5c0a6f0e-0a1b-5c2d-9e3f-4a5b6c7d8e90"});
  allocation.pods.push_back(Pod("ml", "trainer-0", "nvidia.com/gpu", {HgxGpuUuid(1)}));
  const UnitReport report = Count(HgxHost(), allocation, {}, nvml);
  EXPECT_EQ(UnitsOf(report, "0000:18:00.0").allocatable, 1);
  EXPECT_EQ(UnitsOf(report, "0000:28:00.0").allocated, 1);
  EXPECT_EQ(UnitsOf(report, "0000:78:00.0").resources,
            (std::vector<ResourceUnits>{{"nvidia.com/gpu.shared", 4, 0}}));
  // A current MIG UUID still needs NVML.
  EXPECT_EQ(report.unplaced, (std::vector<UnplacedUnits>{{"nvidia.com/mig-1g.10gb", 1, 0}}));
  EXPECT_EQ(report.resourceNames.size(), 3u);
}

// AMD's plugin: PCI addresses (MI300X, class 0x12); its partitions are platform devices.
TEST(CountUnits, AmdPluginPciAddressesPartitionsIgnored) {
  HostBuilder builder;
  builder
      .Add({"0000:19:00.0", testing::kAmd, 0x74a1, testing::kClassAccel, "amdgpu", 20u, true, {}})
      .Add({"0000:3a:00.0", testing::kAmd, 0x74a1, testing::kClassAccel, "amdgpu", 21u, true, {}});
  Allocation allocation;
  Advertise(allocation, "amd.com/gpu", {"0000:19:00.0", "0000:3a:00.0"}, std::vector<int64_t>{0});
  Advertise(allocation, "amd.com/cpx_nps4", {"amdgpu_xcp_1", "amdgpu_xcp_2"});
  const UnitReport report = Count(builder.Build(), allocation);
  EXPECT_EQ(UnitsOf(report, "0000:19:00.0").allocatable, 1);
  EXPECT_EQ(UnitsOf(report, "0000:3a:00.0").allocatable, 1);
  EXPECT_EQ(report.resourceNames, std::vector<std::string>{"amd.com/gpu"});
  EXPECT_EQ(report.ignored.unknownShape, 2);
}

// A NIC VF passed to VMs by a PCI plugin (by address or group): not a GPU resource.
TEST(CountUnits, NicVfResourceDoesNotJoinResourceNames) {
  HostBuilder builder;
  builder.Add({"0000:3b:00.0", kNvidia, 0x20b5, kClass3d, "vfio-pci", 42u, true, {}})
      .Add({"0000:e1:00.0",
            testing::kMellanox,
            0x101d,
            testing::kClassEthernet,
            "mlx5_core",
            60u,
            false,
            {}})
      .Add({"0000:e1:00.2", testing::kMellanox, 0x101e, testing::kClassEthernet, "vfio-pci", 61u,
            false, "0000:e1:00.0"})
      .Add({"0000:e1:00.3", testing::kMellanox, 0x101e, testing::kClassEthernet, "vfio-pci", 62u,
            false, "0000:e1:00.0"});
  Allocation allocation;
  Advertise(allocation, kA100, {"42"});
  Advertise(allocation, "mellanox.com/cx7_vf", {"0000:e1:00.2", "62"});
  allocation.pods.push_back(Pod("net", "router", "mellanox.com/cx7_vf", {"62"}));
  const UnitReport report = Count(builder.Build(), allocation);
  EXPECT_EQ(report.resourceNames, std::vector<std::string>{kA100});
  EXPECT_EQ(report.functions.size(), 1u);
  EXPECT_EQ(report.ignored.notGpu, 2);
  ASSERT_EQ(report.ignoredIds.size(), 2u);
  EXPECT_EQ(report.ignoredIds[0].reason, IgnoredReason::kNotGpu);
  EXPECT_EQ(ToString(report.ignoredIds[0].reason), "notGpu");
  EXPECT_TRUE(report.unplaced.empty());
}

// A3: plain indexes over groups 0 and 1 holding non-vfio functions resolve to nothing.
TEST(CountUnits, A3_PlainIndexesOverNonVfioGroupsDoNotResolve) {
  HostBuilder builder;
  builder
      .Add({"0000:00:00.0", testing::kIntel, 0x09a2, testing::kClassHostBridge, {}, 0u, false, {}})
      .Add({"0000:01:00.0", kNvidia, 0x2236, kClass3d, "nvidia", 1u, true, {}})
      .Add({"0000:41:00.0", kNvidia, 0x2236, kClass3d, "vfio-pci", 42u, true, {}});
  Allocation allocation;
  Advertise(allocation, "example.com/gpu", {"0", "1"});
  allocation.pods.push_back(Pod("ns", "pod", "example.com/gpu", {"1"}));
  const UnitReport report = Count(builder.Build(), allocation);
  EXPECT_TRUE(report.resourceNames.empty());
  EXPECT_EQ(UnitsOf(report, "0000:01:00.0").allocatable, 0);
  EXPECT_EQ(UnitsOf(report, "0000:01:00.0").allocated, 0);
  EXPECT_EQ(UnitsOf(report, "0000:01:00.0").health, Health::kUnadvertised);
  EXPECT_EQ(report.ignored.noMatch, 2);
  EXPECT_EQ(report.ignoredIds,
            (std::vector<IgnoredId>{{"example.com/gpu", "0", IgnoredReason::kNoMatch},
                                    {"example.com/gpu", "1", IgnoredReason::kNoMatch}}));
}

// KubeVirt's generic plugins (kvm, tun, ...) share the node with GPU plugins.
TEST(CountUnits, GenericKubeVirtDevicesAreIgnoredAndCountedOnce) {
  Allocation allocation;
  Advertise(allocation, "devices.kubevirt.io/kvm", {"kvm0", "kvm1", "kvm0"});
  allocation.pods.push_back(Pod("ns", "vm", "devices.kubevirt.io/kvm", {"kvm0"}));
  Advertise(allocation, kA100, {"42"});
  const UnitReport report = Count(A100Host(), allocation);
  EXPECT_EQ(report.ignored.unknownShape, 2);
  EXPECT_EQ(report.resourceNames, std::vector<std::string>{kA100});
}

TEST(HealthToString, MatchesGpuNodeSchema) {
  EXPECT_EQ(ToString(Health::kHealthy), "Healthy");
  EXPECT_EQ(ToString(Health::kUnhealthy), "Unhealthy");
  EXPECT_EQ(ToString(Health::kUnadvertised), "Unadvertised");
}

}  // namespace
}  // namespace cozy::agent
