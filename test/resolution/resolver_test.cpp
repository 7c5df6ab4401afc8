// Device-ID parsing and resolution by shape (DESIGN §4.3, research/device-ids.md §3-6).
#include "agent/status/resolver.h"

#include <gtest/gtest.h>

#include "test/support/hosts.h"

namespace cozy::agent {
namespace {

using testing::Address;
using testing::HostBuilder;

// --- ParseDeviceId: shapes only, no host ---

TEST(ParseDeviceId, PciAddressInAnyCaseAndDomainForm) {
  for (const char* id :
       {"0000:3b:00.0", "0000:3B:00.0", "3b:00.0", "3B:00.0", "00000000:3B:00.0"}) {
    const DeviceId parsed = ParseDeviceId(id);
    EXPECT_EQ(parsed.shape, DeviceIdShape::kPciAddress) << id;
    EXPECT_EQ(parsed.address, Address("0000:3b:00.0")) << id;
  }
  EXPECT_EQ(ParseDeviceId("0001:3b:00.0").address.domain, 1u);
}

TEST(ParseDeviceId, MdevUuidIsLowerCased) {
  const DeviceId parsed = ParseDeviceId("A1B2C3D4-0000-4000-8000-00000000000F");
  EXPECT_EQ(parsed.shape, DeviceIdShape::kMdevUuid);
  EXPECT_EQ(parsed.uuid, "a1b2c3d4-0000-4000-8000-00000000000f");
}

TEST(ParseDeviceId, DecimalIsAnIommuGroupOnlyInSysfsSpelling) {
  EXPECT_EQ(ParseDeviceId("0").shape, DeviceIdShape::kIommuGroup);
  EXPECT_EQ(ParseDeviceId("45").iommuGroup, 45u);
  EXPECT_EQ(ParseDeviceId("4294967295").iommuGroup, 4294967295u);
  // sysfs never names a group like these, so they are no group.
  for (const char* id : {"045", "+45", "-1", "4294967296", "99999999999", " 45", "45 ", "4 5"}) {
    EXPECT_EQ(ParseDeviceId(id).shape, DeviceIdShape::kUnknown) << '"' << id << '"';
  }
}

TEST(ParseDeviceId, NvmlGpuWithAndWithoutReplica) {
  const DeviceId gpu = ParseDeviceId("GPU-3B6C5F0E-8a2f-11ee-b9d1-0242ac120002");
  EXPECT_EQ(gpu.shape, DeviceIdShape::kNvmlGpu);
  EXPECT_EQ(gpu.uuid, "GPU-3b6c5f0e-8a2f-11ee-b9d1-0242ac120002");
  EXPECT_FALSE(gpu.replica);

  // Time-slicing and MPS replicas: split on the first "::" as NVIDIA's plugin does.
  const DeviceId replica = ParseDeviceId("GPU-3b6c5f0e-8a2f-11ee-b9d1-0242ac120002::3");
  EXPECT_EQ(replica.shape, DeviceIdShape::kNvmlGpu);
  EXPECT_EQ(replica.uuid, gpu.uuid);
  EXPECT_EQ(replica.replica, 3u);

  for (const char* id :
       {"GPU-", "GPU-xyz", "GPU-3b6c::", "GPU-3b6c::x", "GPU-3b6c::1::2", "gpu-3b6c5f0e"}) {
    EXPECT_EQ(ParseDeviceId(id).shape, DeviceIdShape::kUnknown) << id;
  }
}

TEST(ParseDeviceId, NvmlMigCurrentAndLegacyForms) {
  const DeviceId mig = ParseDeviceId("MIG-5c0a6f0e-0a1b-5c2d-9e3f-4a5b6c7d8e9f");
  EXPECT_EQ(mig.shape, DeviceIdShape::kNvmlMig);
  EXPECT_TRUE(mig.parentGpuUuid.empty());

  // Old drivers: MIG-GPU-<gpu uuid>/<gi>/<ci>, which names its parent GPU.
  const DeviceId legacy = ParseDeviceId("MIG-GPU-3B6C5F0E-8a2f-11ee-b9d1-0242ac120002/1/0::2");
  EXPECT_EQ(legacy.shape, DeviceIdShape::kNvmlMig);
  EXPECT_EQ(legacy.parentGpuUuid, "GPU-3b6c5f0e-8a2f-11ee-b9d1-0242ac120002");
  EXPECT_EQ(legacy.replica, 2u);

  for (const char* id : {"MIG-", "MIG-GPU-3b6c/1", "MIG-GPU-3b6c/1/x", "MIG-GPU-/1/0"}) {
    EXPECT_EQ(ParseDeviceId(id).shape, DeviceIdShape::kUnknown) << id;
  }
}

TEST(ParseDeviceId, OtherPluginsShapesAreUnknown) {
  // KubeVirt generic/iommufd/USB plugins, Intel's GPU plugin, AMD partitions, garbage.
  for (const char* id :
       {"kvm0", "iommufd1", "devices.kubevirt.io-ab12-0", "card0-1", "amdgpu_xcp_3", "", "all",
        "0000:3b:00", "0000:3b:20.0", "0000:3b:00.8", "a1b2c3d4-0000-4000-8000-00000000000"}) {
    EXPECT_EQ(ParseDeviceId(id).shape, DeviceIdShape::kUnknown) << '"' << id << '"';
  }
}

TEST(NormalizeNvmlGpuUuid, LowerCasesAndRejectsNonGpu) {
  EXPECT_EQ(NormalizeNvmlGpuUuid("GPU-ABCDEF01-0000-0000-0000-000000000000"),
            "GPU-abcdef01-0000-0000-0000-000000000000");
  EXPECT_EQ(NormalizeNvmlGpuUuid("MIG-abcdef01"), "");
  EXPECT_EQ(NormalizeNvmlGpuUuid("GPU-abcdef01::1"), "");
}

TEST(IsVfioDriver, NamesOfVfioDrivers) {
  for (const char* driver : {"vfio-pci", "nvgrace-gpu-vfio-pci", "nvgrace_gpu_vfio_pci",
                             "vfio_mdev", "nvidia-vgpu-vfio", "mlx5_vfio_pci"}) {
    EXPECT_TRUE(IsVfioDriver(driver)) << driver;
  }
  for (const char* driver : {"nvidia", "amdgpu", "pci-stub", "pcieport", ""}) {
    EXPECT_FALSE(IsVfioDriver(driver)) << driver;
  }
}

// --- Resolver against in-memory hosts ---

// Two A100s for VMs (one with its audio-less group to itself, one sharing its group with a
// vfio-bound companion), a T4 with mdevs, an nvidia-bound GPU, and non-GPU functions.
sysfs::HostScan MixedHost() {
  using testing::kClass3d;
  using testing::kNvidia;
  HostBuilder builder;
  builder
      .Add({"0000:00:00.0", testing::kIntel, 0x09a2, testing::kClassHostBridge, {}, 0u, false, {}})
      .Add({"0000:00:01.0",
            testing::kIntel,
            0x347a,
            testing::kClassPciBridge,
            "pcieport",
            1u,
            false,
            {}})
      .Add({"0000:3b:00.0", kNvidia, 0x20b5, kClass3d, "vfio-pci", 42u, true, {}})
      .Add({"0000:86:00.0", kNvidia, 0x20b5, kClass3d, "vfio-pci", 43u, true, {}})
      .Add({"0000:86:00.1", kNvidia, 0x1aef, testing::kClassAudio, "vfio-pci", 43u, false, {}})
      .Add({"0000:af:00.0", kNvidia, 0x1eb8, kClass3d, "nvidia", 80u, true, {}})
      .Add({"0000:d8:00.0", kNvidia, 0x2331, kClass3d, "nvidia", 90u, true, {}})
      .Add({"0000:e1:00.2",
            testing::kMellanox,
            0x101e,
            testing::kClassEthernet,
            "vfio-pci",
            95u,
            false,
            {}})
      .AddMdev("0000:af:00.0", "a1b2c3d4-0000-4000-8000-000000000001", "nvidia-222", 120u)
      .AddMdev("0000:af:00.0", "a1b2c3d4-0000-4000-8000-000000000002", "nvidia-222", 121u)
      .AddMdev("0000:af:00.0", "a1b2c3d4-0000-4000-8000-000000000003", "nvidia-222", 122u,
               "mdev_other");
  return builder.Build();
}

std::vector<sysfs::PciAddress> Functions(std::initializer_list<const char*> addresses) {
  std::vector<sysfs::PciAddress> out;
  for (const char* address : addresses) {
    out.push_back(Address(address));
  }
  return out;
}

// A2: an address names the function itself.
TEST(Resolver, A2_PciAddressNamesTheFunctionIfItExists) {
  const auto host = MixedHost();
  const Resolver resolver(host);
  for (const char* id : {"0000:3b:00.0", "0000:3B:00.0", "3b:00.0", "00000000:3B:00.0"}) {
    const Resolution resolution = resolver.Resolve(id);
    EXPECT_EQ(resolution.kind, ResolutionKind::kFunctions) << id;
    EXPECT_EQ(resolution.functions, Functions({"0000:3b:00.0"})) << id;
  }
  // A driver is not needed for an address: the plugin named the function itself.
  EXPECT_EQ(resolver.Resolve("0000:d8:00.0").functions, Functions({"0000:d8:00.0"}));
  EXPECT_EQ(resolver.Resolve("0000:3c:00.0").kind, ResolutionKind::kNoMatch);
  EXPECT_EQ(resolver.Resolve("0001:3b:00.0").kind, ResolutionKind::kNoMatch);
}

// A2: an mdev UUID names its parent.
TEST(Resolver, A2_MdevUuidNamesItsParent) {
  const auto host = MixedHost();
  const Resolver resolver(host);
  EXPECT_EQ(resolver.Resolve("A1B2C3D4-0000-4000-8000-000000000002").functions,
            Functions({"0000:af:00.0"}));
  EXPECT_EQ(resolver.Resolve("a1b2c3d4-0000-4000-8000-00000000ffff").kind,
            ResolutionKind::kNoMatch);
}

// A2, A3: a number is an IOMMU group, counted only through vfio-bound members.
TEST(Resolver, A3_GroupResolvesOnlyThroughVfioMembers) {
  const auto host = MixedHost();
  const Resolver resolver(host);
  EXPECT_EQ(resolver.Resolve("42").functions, Functions({"0000:3b:00.0"}));
  // A group holding a GPU and its audio function names both; unit counting keeps the GPU.
  EXPECT_EQ(resolver.Resolve("43").functions, Functions({"0000:86:00.0", "0000:86:00.1"}));
  // Group 80 holds an nvidia-bound GPU, group 0 a driverless host bridge, group 1 a bridge on
  // pcieport, 999 does not exist: plain indexes of a container plugin name nothing.
  for (const char* id : {"80", "0", "1", "999"}) {
    EXPECT_EQ(resolver.Resolve(id).kind, ResolutionKind::kNoMatch) << id;
  }
}

// KubeVirt's mdev plugin advertises the mdev's own IOMMU group number, not its UUID.
TEST(Resolver, A2_MdevGroupNumberNamesTheMdevParent) {
  const auto host = MixedHost();
  const Resolver resolver(host);
  EXPECT_EQ(resolver.Resolve("120").functions, Functions({"0000:af:00.0"}));
  EXPECT_EQ(resolver.Resolve("121").functions, Functions({"0000:af:00.0"}));
  // An mdev whose driver is no VFIO driver hands no group to a VM.
  EXPECT_EQ(resolver.Resolve("122").kind, ResolutionKind::kNoMatch);
}

// NVIDIA's vendor-specific VFIO VFs (kernel 6.8+) stay on the nvidia driver; KubeVirt's PCI
// plugin still takes one with a vGPU type set, and advertises its group.
TEST(Resolver, NvidiaVfWithVgpuTypeCountsThroughItsGroup) {
  HostBuilder builder;
  builder
      .Add({"0000:01:00.0", testing::kNvidia, 0x26b9, testing::kClass3d, "nvidia", 10u, true, {}})
      .Add({"0000:01:00.4", testing::kNvidia, 0x26b9, testing::kClass3d, "nvidia", 11u, true,
            "0000:01:00.0"})
      .Add({"0000:01:00.5", testing::kNvidia, 0x26b9, testing::kClass3d, "nvidia", 12u, true,
            "0000:01:00.0"})
      .SetCurrentVgpuType("0000:01:00.4", "1561")
      .SetCurrentVgpuType("0000:01:00.5", std::nullopt);
  const auto host = builder.Build();
  const Resolver resolver(host);
  EXPECT_EQ(resolver.Resolve("11").functions, Functions({"0000:01:00.4"}));
  // A VF without a vGPU type (current_vgpu_type reads 0) and the PF: no VM device.
  EXPECT_EQ(resolver.Resolve("12").kind, ResolutionKind::kNoMatch);
  EXPECT_EQ(resolver.Resolve("10").kind, ResolutionKind::kNoMatch);
}

// A4: NVML UUIDs are unplaced, unless NVIDIA's procfs placed the GPU.
TEST(Resolver, A4_NvmlIdsUnplacedWithoutProcfsPlacedWithIt) {
  const auto host = MixedHost();
  const std::string gpu = "GPU-3b6c5f0e-8a2f-11ee-b9d1-0242ac120002";
  const std::string mig = "MIG-5c0a6f0e-0a1b-5c2d-9e3f-4a5b6c7d8e9f";
  const std::string legacyMig = "MIG-GPU-3b6c5f0e-8a2f-11ee-b9d1-0242ac120002/1/0";
  {
    const Resolver resolver(host);
    for (const std::string& id : {gpu, gpu + "::1", mig, legacyMig}) {
      EXPECT_EQ(resolver.Resolve(id).kind, ResolutionKind::kNvmlUnplaced) << id;
    }
  }
  const Resolver resolver(host, {{gpu, Address("0000:d8:00.0")}});
  EXPECT_EQ(resolver.Resolve("GPU-3B6C5F0E-8A2F-11EE-B9D1-0242AC120002::1").functions,
            Functions({"0000:d8:00.0"}));
  EXPECT_EQ(resolver.Resolve(legacyMig).functions, Functions({"0000:d8:00.0"}));
  // A current MIG UUID needs NVML to find its parent.
  EXPECT_EQ(resolver.Resolve(mig).kind, ResolutionKind::kNvmlUnplaced);
}

TEST(Resolver, UnknownShapes) {
  const auto host = MixedHost();
  const Resolver resolver(host);
  const Resolution resolution = resolver.Resolve("kvm0");
  EXPECT_EQ(resolution.kind, ResolutionKind::kUnknownShape);
  EXPECT_TRUE(resolution.functions.empty());
}

}  // namespace
}  // namespace cozy::agent
