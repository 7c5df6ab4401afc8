// The kernel's own uevents for tests and benchmarks: writing "change" to a real PCI device's
// `uevent` file makes the kernel emit one (needs root and a writable sysfs).
#pragma once

#include <optional>
#include <string>

namespace cozy::testing {

// The `uevent` file of a real device under /sys/bus/pci/devices that this process may write;
// nullopt when there is none (not root, or a read-only sysfs).
std::optional<std::string> WritableUevent();

// Asks the kernel for one "change" uevent; false when the write failed.
bool EmitUevent(const std::string& ueventPath);

// The reason a test or benchmark gives when it cannot do either.
inline constexpr char kNoRealUevents[] =
    "no writable /sys/bus/pci/devices/*/uevent here (not root, or a read-only sysfs): the "
    "kernel cannot be asked for a real uevent";

}  // namespace cozy::testing
