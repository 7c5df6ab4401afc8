// Vendor and device names from a pci.ids file, read the way libpci reads it but only as far as a
// lookup needs. libpci parses all 40,000 lines of Debian's pci.ids into a hash table on its first
// lookup (a fifth of an offline scan's instructions, docs/benchmarks.md); a host has a handful of
// distinct IDs. This reads the file, walks its vendor lines only as far as the vendors asked for,
// and reads a vendor's device lines only when one of its devices is asked for.
//
// The grammar is libpci's (lib/names-parse.c): a line ends at its first '\n' or '\r' and loses one
// trailing space or tab; blank lines and lines whose first non-blank character is '#' are
// skipped; a line's nesting is its count of leading tabs; at nesting 0, "C xx", "S xxxx" and any
// other capital letter followed by a space open blocks that hold no devices, and "vvvv<white>name"
// opens a vendor's; at nesting 1 inside a vendor's block, "dddd<white>name" names a device. Hex
// digits are taken in either case and a name is what follows the white space after the ID.
// Where the file breaks that grammar libpci refuses the whole file; here a malformed line names
// nothing and the others still do. lspci_oracle_test holds the names to libpci's on the same file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace cozy::sysfs {

class PciIdsFile {
 public:
  // Reads `path`, or when `path` ends in ".gz" and cannot be opened, `path` without it (as libpci
  // does). Not usable() when neither opens or the file is gzip-compressed (libpci, linked with
  // zlib, reads those; callers ask it instead).
  explicit PciIdsFile(const std::string& path);
  ~PciIdsFile() = default;
  PciIdsFile(const PciIdsFile&) = delete;
  PciIdsFile& operator=(const PciIdsFile&) = delete;

  bool usable() const { return usable_; }
  // Walks every vendor line now, so that a vendor's name is then one hash lookup (the walk
  // otherwise happens on the first lookup of a vendor not yet passed).
  void IndexVendors();
  // The names the file gives; empty when the ID is not listed (never a number).
  std::string VendorName(uint16_t vendorId);
  std::string DeviceName(uint16_t vendorId, uint16_t deviceId);

 private:
  // One line of the file without its end and with libpci's one trailing blank removed.
  struct Line {
    std::string_view text;
    size_t next = 0;  // where the following line starts
  };
  Line LineAt(size_t offset) const;
  size_t NextLine(size_t offset) const;  // where the line after the one at `offset` starts

  struct VendorBlock {
    std::string_view name;
    size_t devicesFrom = 0;  // the line after the vendor's own
  };
  const VendorBlock* FindVendor(uint16_t vendorId);
  const VendorBlock* WalkVendors(int32_t stopAt);
  std::string_view FindDevice(const VendorBlock& vendor, uint16_t deviceId) const;

  std::unique_ptr<char[]> text_;  // the whole file
  const char* data_ = nullptr;
  size_t size_ = 0;
  bool usable_ = false;
  size_t walked_ = 0;  // vendors are indexed up to here
  std::unordered_map<uint16_t, VendorBlock> vendors_;
  std::unordered_map<uint32_t, std::string_view> devices_;  // (vendor << 16 | device), asked
};

}  // namespace cozy::sysfs
