#include "sysfs/libpci_access.h"

extern "C" {
#include <pci/pci.h>
}

#include <array>
#include <csetjmp>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace cozy::sysfs {
namespace {

// The jump point of the libpci call in progress on this thread, and where its messages go.
// libpci is C: no destructor is skipped when its error callback jumps back over its frames.
thread_local sigjmp_buf* activeJump = nullptr;
thread_local std::string* activeError = nullptr;
thread_local std::vector<std::string>* activeWarnings = nullptr;

__attribute__((format(printf, 1, 0))) std::string FormatMessage(const char* format,
                                                                va_list arguments) {
  std::array<char, 512> buffer{};
  std::vsnprintf(buffer.data(), buffer.size(), format, arguments);
  return buffer.data();
}

// GNU noreturn rather than [[noreturn]]: clang makes it part of the function type, as libpci's
// declaration of the callback field does.
extern "C" __attribute__((noreturn, format(printf, 1, 2))) void OnLibpciError(char* format, ...) {
  va_list arguments;
  va_start(arguments, format);
  const std::string message = FormatMessage(format, arguments);
  va_end(arguments);
  if (activeJump == nullptr) {
    // Unreachable by construction: every call into libpci runs under Guarded().
    std::fprintf(stderr, "gpu-agent: libpci error outside a guarded call: %s\n", message.c_str());
    std::abort();
  }
  if (activeError != nullptr) {
    *activeError = message;
  }
  siglongjmp(*activeJump, 1);
}

extern "C" __attribute__((format(printf, 1, 2))) void OnLibpciWarning(char* format, ...) {
  va_list arguments;
  va_start(arguments, format);
  const std::string message = FormatMessage(format, arguments);
  va_end(arguments);
  if (activeWarnings != nullptr) {
    activeWarnings->push_back(message);
  }
}

extern "C" void OnLibpciDebug(char* /*format*/, ...) {}

// Runs `call` with libpci's error callback turned into a return of false. `call` must not own
// objects with destructors: a jump skips them.
template <typename Call>
bool Guarded(std::string& error, std::vector<std::string>& warnings, Call&& call) {
  sigjmp_buf jump;
  sigjmp_buf* const previousJump = activeJump;
  std::string* const previousError = activeError;
  std::vector<std::string>* const previousWarnings = activeWarnings;
  activeError = &error;
  activeWarnings = &warnings;
  activeJump = &jump;
  bool completed = false;
  if (sigsetjmp(jump, 0) == 0) {
    call();
    completed = true;
  }
  activeJump = previousJump;
  activeError = previousError;
  activeWarnings = previousWarnings;
  return completed;
}

}  // namespace

LibpciSession::LibpciSession(const std::string& busPciPath, const std::string& pciIdsPath)
    : busPciPath_(busPciPath), pciIdsPath_(pciIdsPath) {}

LibpciSession::~LibpciSession() {
  if (access_ != nullptr) {
    pci_access* access = access_;
    Guarded(error_, warnings_, [access] { pci_cleanup(access); });
  }
}

bool LibpciSession::Scan(std::vector<LibpciFunction>& functions) {
  error_.clear();
  pci_access* access = nullptr;
  const bool allocated = Guarded(error_, warnings_, [&access] { access = pci_alloc(); });
  if (!allocated || access == nullptr) {
    error_ = "libpci: cannot allocate: " + error_;
    return false;
  }
  access_ = access;
  access->error = OnLibpciError;
  access->warning = OnLibpciWarning;
  access->debug = OnLibpciDebug;
  // Only the sysfs back-end: the automatic choice would fall back to raw I/O ports.
  access->method = PCI_ACCESS_SYS_BUS_PCI;
  const char* busPci = busPciPath_.c_str();
  const char* idsPath = pciIdsPath_.empty() ? nullptr : pciIdsPath_.c_str();
  const bool initialised = Guarded(error_, warnings_, [access, busPci, idsPath] {
    pci_set_param(access, const_cast<char*>("sysfs.path"), const_cast<char*>(busPci));
    // Names come from pci.ids alone, the same on every host and in every test: udev's hwdb
    // would name a device on one host and not on another.
    pci_set_param(access, const_cast<char*>("hwdb.disable"), const_cast<char*>("1"));
    if (idsPath != nullptr) {
      pci_set_name_list_path(access, const_cast<char*>(idsPath), 0);
    }
    pci_init(access);
    pci_scan_bus(access);
  });
  if (!initialised) {
    error_ = "libpci: " + error_;
    return false;
  }
  initialised_ = true;
  for (pci_dev* device = access->devices; device != nullptr; device = device->next) {
    PciAddress address;
    address.domain = static_cast<uint32_t>(device->domain);
    address.bus = device->bus;
    address.device = device->dev;
    address.function = device->func;
    functions.push_back({address, device});
  }
  return true;
}

PciIdsFile& LibpciSession::Names() {
  if (!names_) {
    names_.emplace(access_->id_file_name == nullptr ? std::string() : access_->id_file_name);
  }
  return *names_;
}

void LibpciSession::LoadNames() {
  if (initialised_ && Names().usable()) {
    Names().IndexVendors();
  }
}

std::string LibpciSession::VendorName(uint16_t vendorId) {
  if (initialised_ && Names().usable()) {
    return Names().VendorName(vendorId);
  }
  return LookupName(PCI_LOOKUP_VENDOR, vendorId, 0);
}

std::string LibpciSession::DeviceName(uint16_t vendorId, uint16_t deviceId) {
  if (initialised_ && Names().usable()) {
    return Names().DeviceName(vendorId, deviceId);
  }
  return LookupName(PCI_LOOKUP_DEVICE, vendorId, deviceId);
}

// pci_lookup_name reads as many IDs as `kind` needs; the extra one is ignored for vendors.
std::string LibpciSession::LookupName(int kind, uint16_t vendorId, uint16_t deviceId) {
  if (!initialised_) {
    return {};
  }
  std::array<char, 256> buffer{};
  const char* name = nullptr;
  pci_access* access = access_;
  Guarded(error_, warnings_, [&] {
    name =
        pci_lookup_name(access, buffer.data(), static_cast<int>(buffer.size()),
                        kind | PCI_LOOKUP_NO_NUMBERS | PCI_LOOKUP_NO_HWDB,
                        static_cast<unsigned int>(vendorId), static_cast<unsigned int>(deviceId));
  });
  return name == nullptr ? std::string() : std::string(name);
}

std::vector<std::string> LibpciSession::TakeWarnings() {
  std::vector<std::string> taken;
  taken.swap(warnings_);
  return taken;
}

}  // namespace cozy::sysfs
