// NVIDIA's driver procfs (`proc/driver/nvidia/gpus/<bdf>/information`): which PCI function
// carries which NVML GPU UUID, so `GPU-…` device IDs of NVIDIA's container plugin can be
// placed without NVML. Read through the same root as sysfs, so fixtures can carry it.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/resolver.h"

namespace cozy::agent {

// The normalised "GPU-…" UUID of an `information` file's "GPU UUID:" line; nullopt when the
// text has no such line or its value is not a GPU UUID.
std::optional<std::string> ParseNvidiaGpuInformation(std::string_view text);

struct NvidiaGpuUuids {
  NvmlGpuAddresses gpus;
  // What could not be read, each naming the file and the reason. No procfs directory at all
  // (no NVIDIA driver loaded) is not a problem.
  std::vector<std::string> problems;
};

// Scans `<root>/proc/driver/nvidia/gpus/*/information`; each directory's name is the
// function's address.
NvidiaGpuUuids ReadNvidiaGpuUuids(const std::filesystem::path& root);

}  // namespace cozy::agent
