#include "sysfs/pci_ids.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "sysfs/attributes.h"  // IsHexDigit
#include "sysfs/pci_address.h"

namespace cozy::sysfs {
namespace {

bool IsWhite(char c) { return c == ' ' || c == '\t'; }

// libpci's id_hex: `count` hex digits of either case at the start of `text`, or nothing.
std::optional<uint16_t> Hex(std::string_view text, size_t count) {
  const auto value = ParseHexDigits(text.substr(0, count), count, count);
  return value ? std::optional<uint16_t>(static_cast<uint16_t>(*value)) : std::nullopt;
}

// "xxxx<white>name" at the start of `text` (tabs already taken off): the ID and the name.
std::optional<std::pair<uint16_t, std::string_view>> IdAndName(std::string_view text) {
  const auto id = Hex(text, 4);
  if (!id || text.size() < 5 || !IsWhite(text[4])) {
    return std::nullopt;
  }
  size_t at = 5;
  while (at < text.size() && IsWhite(text[at])) {
    ++at;
  }
  if (at == text.size()) {
    return std::nullopt;  // libpci: a parse error
  }
  return std::make_pair(*id, text.substr(at));
}

// Skipped lines: blank, or a comment after any blanks.
bool Skipped(std::string_view line) {
  size_t at = 0;
  while (at < line.size() && IsWhite(line[at])) {
    ++at;
  }
  return at == line.size() || line[at] == '#';
}

size_t Nesting(std::string_view line) {
  size_t tabs = 0;
  while (tabs < line.size() && line[tabs] == '\t') {
    ++tabs;
  }
  return tabs;
}

}  // namespace

PciIdsFile::PciIdsFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  // libpci's pci_open: "NAME.gz" that cannot be opened is read as NAME. Debian's libpci names
  // /usr/share/misc/pci.ids.gz and ships /usr/share/misc/pci.ids.
  constexpr std::string_view kGz = ".gz";
  if (fd < 0 && path.size() >= kGz.size() &&
      std::string_view(path).substr(path.size() - kGz.size()) == kGz) {
    fd = ::open(path.substr(0, path.size() - kGz.size()).c_str(), O_RDONLY | O_CLOEXEC);
  }
  if (fd < 0) {
    return;
  }
  // Read, not mapped: a file truncated under a mapping (a careless package upgrade) would kill
  // the daemon with SIGBUS; a read sees whatever the file holds. A non-regular file (a FIFO)
  // is not read: it could block the scan.
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    return;
  }
  // One byte more than the stat says, so the read that finds the end needs no bigger buffer;
  // not zeroed first (1.3 MB of stores for nothing).
  size_t capacity = static_cast<size_t>(info.st_size) + 1;
  text_ = std::make_unique_for_overwrite<char[]>(capacity);
  size_t filled = 0;
  while (true) {
    if (filled == capacity) {  // grown since the stat
      auto bigger = std::make_unique_for_overwrite<char[]>(2 * capacity);
      std::memcpy(bigger.get(), text_.get(), filled);
      text_ = std::move(bigger);
      capacity *= 2;
    }
    const ssize_t n = ::read(fd, text_.get() + filled, capacity - filled);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      break;
    }
    filled += static_cast<size_t>(n);
  }
  ::close(fd);
  data_ = text_.get();
  size_ = filled;
  // gzip's magic: a compressed pci.ids is libpci's to read.
  usable_ = !(size_ >= 2 && static_cast<unsigned char>(data_[0]) == 0x1f &&
              static_cast<unsigned char>(data_[1]) == 0x8b);
}

PciIdsFile::Line PciIdsFile::LineAt(size_t offset) const {
  const char* start = data_ + offset;
  const size_t left = size_ - offset;
  const void* newline = std::memchr(start, '\n', left);
  const size_t length =
      newline == nullptr ? left : static_cast<size_t>(static_cast<const char*>(newline) - start);
  Line line;
  line.next = offset + length + (newline == nullptr ? 0 : 1);
  std::string_view text(start, length);
  const size_t carriage = text.find('\r');
  if (carriage != std::string_view::npos) {
    text = text.substr(0, carriage);
  }
  if (!text.empty() && IsWhite(text.back())) {
    text.remove_suffix(1);
  }
  line.text = text;
  return line;
}

size_t PciIdsFile::NextLine(size_t offset) const {
  const void* newline = std::memchr(data_ + offset, '\n', size_ - offset);
  return newline == nullptr ? size_
                            : static_cast<size_t>(static_cast<const char*>(newline) - data_) + 1;
}

// Walks on through the file's lines until `vendorId`'s block opens or the file ends, keeping
// the first line of each vendor's block on the way: a host's vendors are found in one walk that
// stops at the last of them. Only a line that starts with a hex digit can open a block (device
// lines start with a tab, "C 03" and the other capital-letter blocks with a letter and a space):
// the rest are stepped over unread.
const PciIdsFile::VendorBlock* PciIdsFile::FindVendor(uint16_t vendorId) {
  const auto known = vendors_.find(vendorId);
  if (known != vendors_.end()) {
    return &known->second;
  }
  return WalkVendors(vendorId);
}

// The walk itself, from where the last one stopped: to `stopAt`'s block, or (-1) to the end.
const PciIdsFile::VendorBlock* PciIdsFile::WalkVendors(int32_t stopAt) {
  while (walked_ < size_) {
    const size_t offset = walked_;
    if (!IsHexDigit(data_[offset])) {
      walked_ = NextLine(offset);
      continue;
    }
    const Line line = LineAt(offset);
    walked_ = line.next;
    const std::string_view text = line.text;
    if (text.size() >= 2 && text[0] >= 'A' && text[0] <= 'Z' && text[1] == ' ') {
      continue;
    }
    const auto entry = IdAndName(text);
    if (!entry) {
      continue;
    }
    const auto [block, added] =
        vendors_.try_emplace(entry->first, VendorBlock{entry->second, line.next});
    if (added && entry->first == stopAt) {
      return &block->second;
    }
  }
  return nullptr;
}

// The first line naming `deviceId` in a vendor's block, or nothing.
std::string_view PciIdsFile::FindDevice(const VendorBlock& vendor, uint16_t deviceId) const {
  size_t offset = vendor.devicesFrom;
  while (offset < size_) {
    // Two tabs: a subsystem (or a comment), stepped over unread.
    if (data_[offset] == '\t' && offset + 1 < size_ && data_[offset + 1] == '\t') {
      offset = NextLine(offset);
      continue;
    }
    const Line line = LineAt(offset);
    offset = line.next;
    if (Skipped(line.text)) {
      continue;
    }
    if (Nesting(line.text) == 0) {
      break;  // the next block
    }
    const auto entry = IdAndName(line.text.substr(1));
    if (entry && entry->first == deviceId) {
      return entry->second;
    }
  }
  return {};
}

void PciIdsFile::IndexVendors() {
  if (usable_) {
    WalkVendors(-1);
  }
}

std::string PciIdsFile::VendorName(uint16_t vendorId) {
  if (!usable_) {
    return {};
  }
  const VendorBlock* vendor = FindVendor(vendorId);
  return vendor == nullptr ? std::string() : std::string(vendor->name);
}

std::string PciIdsFile::DeviceName(uint16_t vendorId, uint16_t deviceId) {
  if (!usable_) {
    return {};
  }
  // A host asks for the same few devices over and over: each is looked for once.
  const uint32_t key = (static_cast<uint32_t>(vendorId) << 16) | deviceId;
  const auto known = devices_.find(key);
  if (known != devices_.end()) {
    return std::string(known->second);
  }
  const VendorBlock* vendor = FindVendor(vendorId);
  const std::string_view name =
      vendor == nullptr ? std::string_view() : FindDevice(*vendor, deviceId);
  devices_.emplace(key, name);
  return std::string(name);
}

}  // namespace cozy::sysfs
