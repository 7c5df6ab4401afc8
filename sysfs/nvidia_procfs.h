// NVIDIA's driver procfs (`proc/driver/nvidia/gpus/<bdf>/information`): which PCI function
// carries which NVML GPU UUID, so `GPU-…` device IDs of NVIDIA's container plugin can be
// placed without NVML. A host reader beside the sysfs ones: read through the same root, so
// fixtures can carry it, and its problems are ScanProblems like theirs.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sysfs/host_scan.h"
#include "sysfs/pci_address.h"

namespace cozy::sysfs {

// NVML GPU UUID (normalised, "GPU-" + lower-case body) -> the PCI function NVIDIA's driver
// reports it on.
using NvmlGpuAddresses = std::map<std::string, PciAddress>;

// The body of an NVML UUID after "GPU-"/"MIG-": what the driver prints (hex and dashes), kept
// loose on length because drivers have changed it, but never empty and never odd characters.
bool IsNvmlUuidBody(std::string_view body);

// The normalised "GPU-…" UUID of an `information` file's "GPU UUID:" line; nullopt when the
// text has no such line or its value is not a GPU UUID.
std::optional<std::string> ParseNvidiaGpuInformation(std::string_view text);

struct NvidiaGpuUuids {
  NvmlGpuAddresses gpus;
  // What could not be read, each naming the file (relative to the root) and the reason. No
  // procfs directory at all (no NVIDIA driver loaded) is not a problem.
  std::vector<ScanProblem> problems;
};

// Scans `<root>/proc/driver/nvidia/gpus/*/information`; each directory's name is the
// function's address.
NvidiaGpuUuids ReadNvidiaGpuUuids(const std::filesystem::path& root);

}  // namespace cozy::sysfs
