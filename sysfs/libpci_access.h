// libpci, for enumeration and names, behind a guard: its error callback must not return and by
// default exits the process, so every call into it runs under a jump point that turns such an error
// into a message.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sysfs/pci_address.h"
#include "sysfs/pci_ids.h"

struct pci_access;
struct pci_dev;

namespace cozy::sysfs {

struct LibpciFunction {
  PciAddress address;
  pci_dev* device = nullptr;  // owned by the session
};

class LibpciSession {
 public:
  // `busPciPath` is what libpci's sysfs.path names: "<root>/sys/bus/pci".
  LibpciSession(const std::string& busPciPath, const std::string& pciIdsPath);
  ~LibpciSession();
  LibpciSession(const LibpciSession&) = delete;
  LibpciSession& operator=(const LibpciSession&) = delete;

  // Initialises libpci and lists the functions; false (with error()) when libpci gave up.
  bool Scan(std::vector<LibpciFunction>& functions);
  // pci.ids names; empty when the ID is not listed (never a guess, never a number). The file is
  // libpci's (its default, or the path the session was given).
  std::string VendorName(uint16_t vendorId);
  // Reads the names file now (after Scan), so that the first name asked for does not wait.
  void LoadNames();
  std::string DeviceName(uint16_t vendorId, uint16_t deviceId);

  const std::string& error() const { return error_; }
  // Warnings libpci printed during the last call (not fatal).
  std::vector<std::string> TakeWarnings();

 private:
  std::string LookupName(int kind, uint16_t vendorId, uint16_t deviceId);
  // The file libpci would read names from, read by lookup (sysfs/pci_ids.h); libpci's own
  // lookup when that file is not usable (gzip-compressed).
  PciIdsFile& Names();

  pci_access* access_ = nullptr;
  std::optional<PciIdsFile> names_;
  bool initialised_ = false;
  std::string busPciPath_;
  std::string pciIdsPath_;
  std::string error_;
  std::vector<std::string> warnings_;
};

}  // namespace cozy::sysfs
