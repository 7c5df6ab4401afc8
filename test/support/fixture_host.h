// Test support: fixture hosts built into temporary trees, and paths of the built programs.
#pragma once

#include <filesystem>
#include <string>

#include "sysfs/host_scan.h"

namespace cozy::testing {

std::filesystem::path SourceDir();                        // the repository root
std::filesystem::path SpecPath(const std::string& name);  // fixtures/sysfs/specs/<name>.json
std::filesystem::path FixturePciIds();                    // fixtures/pci.ids
std::filesystem::path GpuAgentBinary();
// shared/ beside the checkout (may be absent): $COZY_SHARED_DIR, else the CMake cache variable
// COZY_SHARED_DIR (default <source>/../shared).
std::filesystem::path SharedDir();
// Empty when SharedDir()/<relative> is a file; else why a test on it must skip.
std::string MissingSharedFile(const std::string& relative);

// A fresh temporary directory, removed with everything under it when the object goes.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// A fixture host built from its spec into a temporary root.
class FixtureHost {
 public:
  explicit FixtureHost(const std::string& specName);
  const std::filesystem::path& root() const { return directory_.path(); }
  // Scans the tree with the fixture pci.ids.
  sysfs::HostScan Scan() const;

 private:
  TempDir directory_;
};

struct CommandResult {
  int exitCode = -1;
  std::string out;
  std::string err;
};
// Runs a command line through /bin/sh, capturing stdout and stderr.
CommandResult RunCommand(const std::string& commandLine);
std::string ShellQuote(const std::string& text);

}  // namespace cozy::testing
