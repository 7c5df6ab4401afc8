#include "agent/nvidia_procfs.h"

#include <fstream>
#include <sstream>

namespace cozy::agent {
namespace {

std::string_view Trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r");
  if (first == std::string_view::npos) {
    return {};
  }
  const auto last = text.find_last_not_of(" \t\r");
  return text.substr(first, last - first + 1);
}

}  // namespace

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
      std::string uuid = NormalizeNvmlGpuUuid(Trim(line.substr(kKey.size())));
      if (uuid.empty()) {
        return std::nullopt;
      }
      return uuid;
    }
    start = end + 1;
  }
  return std::nullopt;
}

NvidiaGpuUuids ReadNvidiaGpuUuids(const std::filesystem::path& root) {
  NvidiaGpuUuids result;
  const std::filesystem::path gpusDir = root / "proc/driver/nvidia/gpus";
  std::error_code error;
  if (!std::filesystem::is_directory(gpusDir, error)) {
    return result;
  }
  std::filesystem::directory_iterator it(gpusDir, error);
  if (error) {
    result.problems.push_back("listing " + gpusDir.string() + ": " + error.message());
    return result;
  }
  for (; it != std::filesystem::directory_iterator(); it.increment(error)) {
    if (error) {
      result.problems.push_back("listing " + gpusDir.string() + ": " + error.message());
      break;
    }
    const std::string name = it->path().filename().string();
    const auto address = sysfs::ParsePciAddress(name);
    const std::filesystem::path file = it->path() / "information";
    if (!address) {
      result.problems.push_back("reading " + it->path().string() +
                                ": directory name is not a PCI address");
      continue;
    }
    std::ifstream in(file);
    if (!in) {
      result.problems.push_back("reading " + file.string() + ": cannot open");
      continue;
    }
    std::ostringstream content;
    content << in.rdbuf();
    const auto uuid = ParseNvidiaGpuInformation(content.str());
    if (!uuid) {
      result.problems.push_back("reading " + file.string() + ": no valid \"GPU UUID:\" line");
      continue;
    }
    result.gpus.emplace(*uuid, *address);
  }
  return result;
}

}  // namespace cozy::agent
