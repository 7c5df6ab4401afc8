// In-memory HostScan values for resolver, unit and benchmark code: what the lead's sysfs scan
// would produce for a host, built without a tree, so pure code is tested without I/O.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sysfs/host_scan.h"
#include "sysfs/pci_address.h"

namespace cozy::testing {

inline sysfs::PciAddress Address(std::string_view text) {
  const auto address = sysfs::ParsePciAddress(text);
  if (!address) {
    throw std::invalid_argument("not a PCI address: " + std::string(text));
  }
  return *address;
}

struct FunctionSpec {
  std::string address;
  uint16_t vendor = 0;
  uint16_t device = 0;
  uint32_t classCode = 0;
  std::optional<std::string> driver;
  std::optional<uint32_t> iommuGroup;
  bool isGpu = false;
  std::optional<std::string> physicalFunction;
};

class HostBuilder {
 public:
  HostBuilder& Add(const FunctionSpec& spec) {
    sysfs::PciFunction function;
    function.address = Address(spec.address);
    function.vendorId = spec.vendor;
    function.deviceId = spec.device;
    function.classCode = spec.classCode;
    function.driver = spec.driver;
    function.iommuGroup = spec.iommuGroup;
    function.isGpu = spec.isGpu;
    if (spec.physicalFunction) {
      function.physicalFunction = Address(*spec.physicalFunction);
    }
    host_.functions.push_back(std::move(function));
    return *this;
  }

  // A created mdev on `parent` with its own IOMMU group, bound as NVIDIA's vGPU mdevs are.
  HostBuilder& AddMdev(std::string_view parent, std::string uuid, std::string type,
                       std::optional<uint32_t> group,
                       std::optional<std::string> driver = "nvidia-vgpu-vfio") {
    for (auto& function : host_.functions) {
      if (function.address == Address(parent)) {
        function.mdevs.push_back(sysfs::Mdev{uuid, std::move(type), group, std::move(driver)});
        return *this;
      }
    }
    throw std::invalid_argument("mdev parent not added yet: " + std::string(parent));
  }

  // NVIDIA's per-VF vGPU files; `type` absent while current_vgpu_type reads 0.
  HostBuilder& SetCurrentVgpuType(std::string_view address, std::optional<std::string> type) {
    for (auto& function : host_.functions) {
      if (function.address == Address(address)) {
        function.vgpu = sysfs::NvidiaVgpu{std::move(type), {}};
        return *this;
      }
    }
    throw std::invalid_argument("no such function: " + std::string(address));
  }

  // Sorted functions and the derived maps, as the scan fills them.
  sysfs::HostScan Build() const {
    sysfs::HostScan host = host_;
    host.root = "/in-memory";
    std::sort(host.functions.begin(), host.functions.end(),
              [](const auto& a, const auto& b) { return a.address < b.address; });
    for (auto& function : host.functions) {
      std::sort(function.mdevs.begin(), function.mdevs.end(),
                [](const auto& a, const auto& b) { return a.uuid < b.uuid; });
      if (function.iommuGroup) {
        host.iommuGroups[*function.iommuGroup].push_back(function.address);
      }
      for (const auto& mdev : function.mdevs) {
        host.mdevParents.emplace(mdev.uuid, function.address);
      }
    }
    return host;
  }

 private:
  sysfs::HostScan host_;
};

// PCI class codes and IDs used by the hosts below.
inline constexpr uint32_t kClass3d = 0x030200;  // 3D controller (NVIDIA datacenter GPUs)
inline constexpr uint32_t kClassVga = 0x030000;
inline constexpr uint32_t kClassAccel = 0x120000;  // processing accelerator (AMD MI300)
inline constexpr uint32_t kClassAudio = 0x040300;
inline constexpr uint32_t kClassEthernet = 0x020000;
inline constexpr uint32_t kClassNvme = 0x010802;
inline constexpr uint32_t kClassHostBridge = 0x060000;
inline constexpr uint32_t kClassPciBridge = 0x060400;
inline constexpr uint16_t kNvidia = 0x10de;
inline constexpr uint16_t kAmd = 0x1002;
inline constexpr uint16_t kMellanox = 0x15b3;
inline constexpr uint16_t kIntel = 0x8086;

// The UUID of the synthetic host's mdev on GPU `gpu`, VF `vf`.
inline std::string SyntheticMdevUuid(int gpu, int vf) {
  char uuid[40];
  std::snprintf(uuid, sizeof(uuid), "%08x-0000-4000-8000-%012x", static_cast<unsigned>(gpu),
                static_cast<unsigned>(vf));
  return uuid;
}

// 16 GPUs x 32 SR-IOV VFs (~600 functions with audio, bridges, NICs and NVMe), for
// benchmarks. Even GPUs have their VFs on vfio-pci (KubeVirt passthrough: group IDs); odd
// GPUs have them on nvidia with one mdev each in its own group (vGPU: UUID or group IDs).
inline sysfs::HostScan LargeSyntheticHost() {
  HostBuilder builder;
  uint32_t group = 0;
  uint32_t mdevGroup = 10000;
  for (int gpu = 0; gpu < 16; ++gpu) {
    const unsigned bus = 0x10u + static_cast<unsigned>(gpu) * 8u;
    char address[32];
    std::snprintf(address, sizeof(address), "0000:%02x:01.0", bus - 1);
    builder.Add({address, kIntel, 0x347a, kClassPciBridge, "pcieport", group++, false, {}});
    std::snprintf(address, sizeof(address), "0000:%02x:02.0", bus - 2);
    builder.Add({address, kIntel, 0x347b, kClassPciBridge, "pcieport", group++, false, {}});
    char pf[32];
    std::snprintf(pf, sizeof(pf), "0000:%02x:00.0", bus);
    builder.Add({pf, kNvidia, 0x26b9, kClass3d, "nvidia", group++, true, {}});
    std::snprintf(address, sizeof(address), "0000:%02x:00.1", bus);
    builder.Add({address, kNvidia, 0x22ba, kClassAudio, "snd_hda_intel", group - 1, false, {}});
    const bool passthrough = gpu % 2 == 0;
    for (int vf = 0; vf < 32; ++vf) {
      std::snprintf(address, sizeof(address), "0000:%02x:%02x.%d", bus, 1 + vf / 8, vf % 8);
      builder.Add({address, kNvidia, 0x26b9, kClass3d, passthrough ? "vfio-pci" : "nvidia", group++,
                   true, std::string(pf)});
      if (!passthrough) {
        builder.AddMdev(address, SyntheticMdevUuid(gpu, vf), "nvidia-1155", mdevGroup++);
      }
    }
  }
  for (unsigned nic = 0; nic < 8; ++nic) {
    char address[32];
    std::snprintf(address, sizeof(address), "0000:c%u:00.0", nic);
    builder.Add({address, kMellanox, 0x1021, kClassEthernet, "mlx5_core", group++, false, {}});
    std::snprintf(address, sizeof(address), "0000:d%u:00.0", nic);
    builder.Add({address, 0x144d, 0xa80a, kClassNvme, "nvme", group++, false, {}});
  }
  return builder.Build();
}

}  // namespace cozy::testing
