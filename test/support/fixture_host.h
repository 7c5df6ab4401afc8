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
// Runs `script`, shell commands that make files in their working directory (keys and
// certificates by the openssl CLI, valid a day), once per script and half day for all the test
// programs of this user (ctest runs each test as a program of its own), in a directory of this
// user's alone under the temporary directory, and copies what it made into `dir` (created when
// missing); the answer's `out` is that run's. A TLS test needs a directory of its own, not keys
// of its own, and making RSA keys was most of such a test's setup.
CommandResult MakeOnce(const std::string& script, const std::filesystem::path& dir);
std::string ShellQuote(const std::string& text);

}  // namespace cozy::testing
