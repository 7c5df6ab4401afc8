// Small, bounded reads of sysfs files, links and directories, reporting what failed on what,
// all through Directory handles (below).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cozy::sysfs {

enum class IoStatus { kOk, kMissing, kError };

struct FileText {
  IoStatus status = IoStatus::kOk;
  std::string text;   // the contents when kOk
  std::string error;  // strerror-style reason when kError
};

struct LinkTarget {
  IoStatus status = IoStatus::kOk;
  std::string target;  // the link's text, not resolved
  std::string error;
};

struct DirectoryListing {
  IoStatus status = IoStatus::kOk;
  std::vector<std::string> names;  // without "." entries, unsorted
  std::string error;
};

bool PathExists(const std::string& path);
bool IsDirectory(const std::string& path);

// "a/b" + "c" -> "a/b/c"; keeps a root of "/" from doubling the slash.
std::string JoinPath(std::string_view base, std::string_view relative);
// Resolves "." and ".." lexically. Returns nullopt when ".." would climb above `path`'s start.
std::optional<std::string> NormalizeLexically(std::string_view path);

}  // namespace cozy::sysfs

namespace cozy::sysfs {

// An open directory whose entries are read relative to it: one path walk per function instead
// of one per attribute. The first is opened by absolute path, so umockdev's redirection of /sys
// applies to it and thereby to everything read through it and the directories opened below it.
class Directory {
 public:
  // kPath: for reading entries only (O_PATH). kListable: also for ListEntries().
  enum class Mode { kPath, kListable };

  explicit Directory(const std::string& path, Mode mode = Mode::kPath);
  // `relative` below `parent`, walked from there; `path` is what messages call it.
  Directory(const Directory& parent, const std::string& relative, std::string path,
            Mode mode = Mode::kPath);
  ~Directory();
  Directory(const Directory&) = delete;
  Directory& operator=(const Directory&) = delete;
  Directory(Directory&& other) noexcept;
  Directory& operator=(Directory&&) = delete;

  bool ok() const { return fd_ >= 0; }
  IoStatus status() const { return status_; }
  const std::string& error() const { return error_; }
  const std::string& path() const { return path_; }

  FileText Read(const std::string& relative) const;
  LinkTarget ReadLink(const std::string& relative) const;
  // This directory's own entries, once (the handle's offset is then at the end); needs
  // Mode::kListable.
  DirectoryListing ListEntries() const;
  bool IsSubdirectory(const std::string& relative) const;

 private:
  void Opened();  // records why fd_ is not open, from errno

  std::string path_;
  int fd_ = -1;
  IoStatus status_ = IoStatus::kOk;
  std::string error_;
};

}  // namespace cozy::sysfs
