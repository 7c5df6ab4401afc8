// Fuzz target for device-ID parsing and resolution: any bytes a device plugin could send as
// an ID (kubelet passes them through unchecked) must parse to a shape or to kUnknown, and
// resolve without crashing, against a host with every kind of resolution target.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "agent/status/resolver.h"
#include "sysfs/nvidia_procfs.h"
#include "test/support/hosts.h"

namespace {

void Check(bool condition) {
  if (!condition) {
    std::abort();
  }
}

const cozy::sysfs::HostScan& Host() {
  static const cozy::sysfs::HostScan host = [] {
    using namespace cozy::testing;
    HostBuilder builder;
    builder.Add({"0000:00:00.0", kIntel, 0x09a2, kClassHostBridge, {}, 0u, false, {}})
        .Add({"0000:3b:00.0", kNvidia, 0x20b5, kClass3d, "vfio-pci", 42u, true, {}})
        .Add({"0000:af:00.0", kNvidia, 0x1eb8, kClass3d, "nvidia", 80u, true, {}})
        .AddMdev("0000:af:00.0", "a1b2c3d4-0000-4000-8000-000000000001", "nvidia-222", 120u);
    return builder.Build();
  }();
  return host;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view id(reinterpret_cast<const char*>(data), size);
  const cozy::agent::DeviceId parsed = cozy::agent::ParseDeviceId(id);
  using cozy::agent::DeviceIdShape;
  switch (parsed.shape) {
    case DeviceIdShape::kPciAddress:
      // What parses as an address prints as one that parses back to the same address.
      Check(cozy::sysfs::ParsePciAddress(parsed.address.ToString()) == parsed.address);
      break;
    case DeviceIdShape::kIommuGroup:
      Check(std::to_string(parsed.iommuGroup) == id);
      break;
    case DeviceIdShape::kMdevUuid:
      Check(parsed.uuid.size() == 36);
      Check(cozy::agent::ParseDeviceId(parsed.uuid).uuid == parsed.uuid);
      break;
    case DeviceIdShape::kNvmlGpu:
      Check(parsed.uuid.starts_with("GPU-"));
      Check(cozy::agent::NormalizeNvmlGpuUuid(parsed.uuid) == parsed.uuid);
      break;
    case DeviceIdShape::kNvmlMig:
      Check(parsed.uuid.starts_with("MIG-"));
      break;
    case DeviceIdShape::kUnknown:
      break;
  }
  static const cozy::agent::Resolver resolver(Host(), {{"GPU-3b6c5f0e-8a2f-11ee-b9d1-0242ac120002",
                                                        cozy::testing::Address("0000:af:00.0")}});
  const cozy::agent::Resolution resolution = resolver.Resolve(parsed);
  for (const auto& address : resolution.functions) {
    Check(Host().Find(address) != nullptr);
  }
  // The same bytes as an NVIDIA procfs information file.
  (void)cozy::sysfs::ParseNvidiaGpuInformation(id);
  return 0;
}
