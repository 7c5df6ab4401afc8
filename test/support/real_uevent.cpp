#include "test/support/real_uevent.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>

namespace cozy::testing {

std::optional<std::string> WritableUevent() {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/sys/bus/pci/devices", error)) {
    const std::string path = entry.path().string() + "/uevent";
    if (::access(path.c_str(), W_OK) == 0) {
      return path;
    }
  }
  return std::nullopt;
}

bool EmitUevent(const std::string& ueventPath) {
  const int fd = ::open(ueventPath.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    return false;
  }
  const bool written = ::write(fd, "change", 6) == 6;
  ::close(fd);
  return written;
}

}  // namespace cozy::testing
