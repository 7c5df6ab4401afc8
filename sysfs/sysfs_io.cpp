#include "sysfs/sysfs_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

namespace cozy::sysfs {
namespace {

constexpr size_t kMaxAttributeBytes = 64 * 1024;

std::string ErrnoText(int error) { return std::strerror(error); }

// A text attribute (sysfs pages are at most 4 KiB; 64 KiB is the hard limit here) from the
// descriptor `fd` an open returned (negative: why it failed, from errno); closes it.
FileText ReadOpenedFile(int fd) {
  FileText result;
  if (fd < 0) {
    result.status = (errno == ENOENT || errno == ENOTDIR) ? IoStatus::kMissing : IoStatus::kError;
    result.error = ErrnoText(errno);
    return result;
  }
  // sysfs hands a text attribute over in one read; a short read is the end of it. Only a full
  // buffer needs another read (regular files in fixture trees behave the same). The buffer is
  // left uninitialised: read() fills what is used, and zeroing 4 KiB per attribute was a tenth
  // of a scan's instructions.
  std::array<char, 4096> buffer;  // NOLINT(cppcoreguidelines-pro-type-member-init)
  while (true) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      result.status = IoStatus::kError;
      result.error = ErrnoText(errno);
      break;
    }
    result.text.append(buffer.data(), static_cast<size_t>(n));
    if (static_cast<size_t>(n) < buffer.size()) {
      break;
    }
    if (result.text.size() > kMaxAttributeBytes) {
      result.status = IoStatus::kError;
      result.error = "longer than " + std::to_string(kMaxAttributeBytes) + " bytes";
      break;
    }
  }
  ::close(fd);
  if (result.status != IoStatus::kOk) {
    result.text.clear();
  }
  return result;
}

LinkTarget ReadLinkTargetAt(int directoryFd, const char* path) {
  LinkTarget result;
  std::array<char, 4096> buffer;  // NOLINT(cppcoreguidelines-pro-type-member-init): as above
  const ssize_t n = ::readlinkat(directoryFd, path, buffer.data(), buffer.size());
  if (n < 0) {
    result.status = (errno == ENOENT || errno == ENOTDIR) ? IoStatus::kMissing : IoStatus::kError;
    result.error = errno == EINVAL ? "not a symbolic link" : ErrnoText(errno);
    return result;
  }
  if (static_cast<size_t>(n) >= buffer.size()) {
    result.status = IoStatus::kError;
    result.error = "link target too long";
    return result;
  }
  result.target.assign(buffer.data(), static_cast<size_t>(n));
  return result;
}

// The entries of an open directory, read with getdents64 into one buffer: no DIR (whose
// fdopendir costs an fcntl per directory), no allocation but the names'.
DirectoryListing ListDirectoryFd(int fd) {
  DirectoryListing result;
  alignas(8) std::array<char, 16384> buffer;  // NOLINT(cppcoreguidelines-pro-type-member-init)
  while (true) {
    const long n = ::syscall(SYS_getdents64, fd, buffer.data(), buffer.size());
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      result.status = IoStatus::kError;
      result.error = ErrnoText(errno);
      result.names.clear();
      return result;
    }
    if (n == 0) {
      return result;
    }
    for (long offset = 0; offset < n;) {
      // The kernel's struct linux_dirent64: ino, off, reclen, type, then the name.
      const char* record = buffer.data() + offset;
      uint16_t length = 0;
      std::memcpy(&length, record + offsetof(struct dirent64, d_reclen), sizeof(length));
      const char* name = record + offsetof(struct dirent64, d_name);
      if (name[0] != '.') {
        result.names.emplace_back(name);
      }
      offset += length;
    }
  }
}

int DirectoryFlags(Directory::Mode mode) {
  return (mode == Directory::Mode::kListable ? O_RDONLY : O_PATH) | O_DIRECTORY | O_CLOEXEC;
}

}  // namespace

bool PathExists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

std::string JoinPath(std::string_view base, std::string_view relative) {
  std::string out(base);
  while (!relative.empty() && relative.front() == '/') {
    relative.remove_prefix(1);
  }
  if (out.empty() || out.back() != '/') {
    out += '/';
  }
  out += relative;
  return out;
}

std::optional<std::string> NormalizeLexically(std::string_view path) {
  const bool absolute = !path.empty() && path.front() == '/';
  // Parts are appended to `out` as they come; ".." takes the last one off again.
  std::string out = absolute ? "/" : "";
  out.reserve(path.size() + 1);
  const size_t floor = out.size();
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) {
      end = path.size();
    }
    const std::string_view part = path.substr(start, end - start);
    if (part == "..") {
      if (out.size() == floor) {
        return std::nullopt;
      }
      const size_t slash = out.rfind('/');
      out.resize(slash == std::string::npos || slash < floor ? floor : slash);
    } else if (!part.empty() && part != ".") {
      if (out.size() > floor) {
        out += '/';
      }
      out += part;
    }
    start = end + 1;
  }
  return out;
}

Directory::Directory(const std::string& path, Mode mode) : path_(path) {
  fd_ = ::open(path.c_str(), DirectoryFlags(mode));
  Opened();
}

Directory::Directory(const Directory& parent, const std::string& relative, std::string path,
                     Mode mode)
    : path_(std::move(path)) {
  if (!parent.ok()) {
    status_ = parent.status_;
    error_ = parent.error_;
    return;
  }
  fd_ = ::openat(parent.fd_, relative.c_str(), DirectoryFlags(mode));
  Opened();
}

void Directory::Opened() {
  if (fd_ < 0) {
    status_ = (errno == ENOENT || errno == ENOTDIR) ? IoStatus::kMissing : IoStatus::kError;
    error_ = ErrnoText(errno);
  }
}

Directory::Directory(Directory&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      status_(other.status_),
      error_(std::move(other.error_)) {}

Directory::~Directory() {
  if (fd_ >= 0) {
    ::close(fd_);
  }
}

FileText Directory::Read(const std::string& relative) const {
  return ReadOpenedFile(
      ::openat(fd_, relative.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
}

LinkTarget Directory::ReadLink(const std::string& relative) const {
  return ReadLinkTargetAt(fd_, relative.c_str());
}

DirectoryListing Directory::ListEntries() const {
  if (fd_ < 0) {
    DirectoryListing listing;
    listing.status = status_;
    listing.error = error_;
    return listing;
  }
  return ListDirectoryFd(fd_);
}

bool Directory::IsSubdirectory(const std::string& relative) const {
  struct stat info {};
  return ::fstatat(fd_, relative.c_str(), &info, 0) == 0 && S_ISDIR(info.st_mode);
}

}  // namespace cozy::sysfs
