// Reads a sysfs root into a HostScan: libpci enumerates the PCI functions and names them; small
// readers take what libpci does not cover (links, SR-IOV, mdev, NVIDIA per-VF files).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "sysfs/host_scan.h"

namespace cozy::sysfs {

struct ScanOptions {
  std::string root = "/";  // the directory that holds sys/
  std::string pciIdsPath;  // empty: libpci's default (Debian's /usr/share/misc/pci.ids)
  std::vector<uint16_t> extraGpuVendors;  // PCI vendors whose class 0x03 functions are GPUs too
  // Threads reading functions at once: 0 one per CPU (at most 8, and one per 32 functions);
  // 1 the calling thread alone. The result is the same however many (ScanThreads test).
  int readers = 0;
};

// The root cannot be scanned at all: it does not exist or holds no sys/bus/pci.
class RootError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One discovery pass. Never exits the process and never throws for a bad function: what cannot
// be read is reported in HostScan::problems or PciFunction::problems. Throws RootError only.
HostScan ScanHost(const ScanOptions& options);

// NVIDIA, AMD, Intel, or one of the vendors the hoster added.
bool IsGpuVendor(uint16_t vendorId, const std::vector<uint16_t>& extraVendors);
// The GPU filter of DESIGN §4.2 for one function, VFs aside (a VF is a GPU when its PF is).
bool IsGpuFunction(uint16_t vendorId, uint32_t classCode,
                   const std::vector<uint16_t>& extraVendors);

constexpr uint16_t kVendorNvidia = 0x10de;
constexpr uint16_t kVendorAmd = 0x1002;
constexpr uint16_t kVendorIntel = 0x8086;

}  // namespace cozy::sysfs
