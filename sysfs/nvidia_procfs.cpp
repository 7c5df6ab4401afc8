#include "sysfs/nvidia_procfs.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "sysfs/attributes.h"

namespace cozy::sysfs {

bool IsNvmlUuidBody(std::string_view body) {
  return !body.empty() &&
         std::all_of(body.begin(), body.end(), [](char c) { return IsHexDigit(c) || c == '-'; });
}

std::optional<std::string> ParseNvidiaGpuInformation(std::string_view text) {
  // Lines are "Key:<spaces>value" (nv-procfs.c); "GPU UUID:" appears once.
  constexpr std::string_view kKey = "GPU UUID:";
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) {
      end = text.size();
    }
    const std::string_view line = text.substr(start, end - start);
    if (line.starts_with(kKey)) {
      const std::string_view value = TrimAttribute(line.substr(kKey.size()));
      if (!value.starts_with("GPU-") || !IsNvmlUuidBody(value.substr(4))) {
        return std::nullopt;
      }
      return "GPU-" + ToLower(value.substr(4));
    }
    start = end + 1;
  }
  return std::nullopt;
}

NvidiaGpuUuids ReadNvidiaGpuUuids(const std::filesystem::path& root) {
  NvidiaGpuUuids result;
  const std::filesystem::path relative = "proc/driver/nvidia/gpus";
  const std::filesystem::path gpusDir = root / relative;
  std::error_code error;
  if (!std::filesystem::is_directory(gpusDir, error)) {
    return result;
  }
  std::filesystem::directory_iterator it(gpusDir, error);
  if (error) {
    result.problems.push_back({relative.string(), "cannot list: " + error.message()});
    return result;
  }
  for (; it != std::filesystem::directory_iterator(); it.increment(error)) {
    if (error) {
      result.problems.push_back({relative.string(), "cannot list: " + error.message()});
      break;
    }
    const std::string name = it->path().filename().string();
    const auto address = ParsePciAddress(name);
    const std::filesystem::path file = relative / name / "information";
    if (!address) {
      result.problems.push_back(
          {(relative / name).string(), "directory name is not a PCI address"});
      continue;
    }
    std::ifstream in(root / file);
    if (!in) {
      result.problems.push_back({file.string(), "cannot open"});
      continue;
    }
    std::ostringstream content;
    content << in.rdbuf();
    const auto uuid = ParseNvidiaGpuInformation(content.str());
    if (!uuid) {
      result.problems.push_back({file.string(), "no valid \"GPU UUID:\" line"});
      continue;
    }
    result.gpus.emplace(*uuid, *address);
  }
  return result;
}

}  // namespace cozy::sysfs
