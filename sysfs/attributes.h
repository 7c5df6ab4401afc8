// Parsers for the text formats of sysfs attributes, one per format, as the kernel writes them.
// Pure: they take the file's text and return a value or a reason, never touching the disk.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "sysfs/host_scan.h"

namespace cozy::sysfs {

// A parsed value or the reason it could not be parsed ("not hex: \"0xzz\"").
template <typename T>
class Parsed {
 public:
  Parsed(T value) : value_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  static Parsed Error(std::string reason) { return Parsed(ErrorTag{std::move(reason)}); }

  bool ok() const { return std::holds_alternative<T>(value_); }
  explicit operator bool() const { return ok(); }
  const T& value() const { return std::get<T>(value_); }
  const T& operator*() const { return value(); }
  const T* operator->() const { return &value(); }
  const std::string& error() const { return std::get<ErrorTag>(value_).reason; }

 private:
  struct ErrorTag {
    std::string reason;
  };
  explicit Parsed(ErrorTag error) : value_(std::move(error)) {}
  std::variant<T, ErrorTag> value_;
};

// Removes the trailing newline (and surrounding blanks) every sysfs text attribute ends with;
// the one trim of the project's host readers (sysfs, procfs).
std::string_view TrimAttribute(std::string_view text);
// 0-9, a-f, A-F.
bool IsHexDigit(char c);

// "0x10de\n" -> 0x10de. Requires the 0x prefix, at most `maxDigits` hex digits after it.
Parsed<uint32_t> ParseHexAttribute(std::string_view text, size_t maxDigits);
// vendor, device, subsystem_vendor, subsystem_device: "0x%04x".
Parsed<uint16_t> ParseHexId(std::string_view text);
// class: "0x%06x".
Parsed<uint32_t> ParseClassCode(std::string_view text);
// numa_node: "%d"; -1 (no affinity) yields nullopt.
Parsed<std::optional<int32_t>> ParseNumaNode(std::string_view text);
// sriov_totalvfs, sriov_numvfs, available_instances, current_vgpu_type: "%u".
Parsed<uint32_t> ParseUnsigned(std::string_view text);

// mdev type `description`: "num_heads=4, frl_config=60, framebuffer=1024M, ..., max_instance=16".
// Returns the key/value pairs; unknown keys are kept. Text without any "k=v" is an error.
Parsed<std::map<std::string, std::string>> ParseMdevDescription(std::string_view text);
// max_instance= of a description, when present and a number.
std::optional<int64_t> MaxInstancesFromDescription(std::string_view text);

// nvidia/creatable_vgpu_types: an optional "ID : vGPU Name" header, then "<id> : <name>" lines.
// An empty file is an empty list (nothing fits on this VF now).
Parsed<std::vector<VgpuTypeEntry>> ParseCreatableVgpuTypes(std::string_view text);

// uevent: KEY=VALUE lines.
Parsed<std::map<std::string, std::string>> ParseUevent(std::string_view text);

// What a PCI function's `uevent` says of it: the kernel's pci_uevent writes PCI_CLASS=%04X,
// PCI_ID=%04X:%04X and PCI_SUBSYS_ID=%04X:%04X from the same fields as `class`, `vendor`,
// `device` and `subsystem_*`, in one file instead of five.
struct PciUeventIdentity {
  uint16_t vendorId = 0;
  uint16_t deviceId = 0;
  uint32_t classCode = 0;
  uint16_t subsystemVendorId = 0;
  uint16_t subsystemDeviceId = 0;
};
// nullopt unless all three keys are there once each and well formed (hex of any case).
std::optional<PciUeventIdentity> ParsePciUevent(std::string_view text);

// A UUID, 8-4-4-4-12 hex digits (any case on input): an mdev's name, a device plugin's mdev ID.
bool IsMdevUuid(std::string_view text);
std::string ToLower(std::string_view text);

// The last element of a link target ("../../../../kernel/iommu_groups/40" -> "40").
std::string_view LinkBasename(std::string_view target);
// The element before the last ("../../../devices/.../0000:5e:00.0/<uuid>" -> "0000:5e:00.0").
std::string_view LinkParentName(std::string_view target);

}  // namespace cozy::sysfs
