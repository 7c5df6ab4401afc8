#include "test/support/fixture_host.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "fixtures/sysfs/fixture_builder.h"
#include "sysfs/scanner.h"

namespace cozy::testing {

namespace fs = std::filesystem;

fs::path SourceDir() { return COZY_SOURCE_DIR; }
fs::path SpecPath(const std::string& name) {
  return SourceDir() / "fixtures/sysfs/specs" / (name + ".json");
}
fs::path FixturePciIds() { return SourceDir() / "fixtures/pci.ids"; }
fs::path GpuAgentBinary() { return COZY_GPU_AGENT_BINARY; }
fs::path SharedDir() {
  // The environment wins over the build's cache variable COZY_SHARED_DIR (../shared).
  const char* overridden = std::getenv("COZY_SHARED_DIR");
  return (overridden != nullptr && *overridden != '\0') ? fs::path(overridden)
                                                        : fs::path(COZY_SHARED_DIR);
}

std::string MissingSharedFile(const std::string& relative) {
  const fs::path path = SharedDir() / relative;
  std::error_code error;
  if (fs::is_regular_file(path, error)) {
    return {};
  }
  return path.string() +
         " is absent: the real captures live in shared/ beside the checkout (CI has it; set "
         "COZY_SHARED_DIR or the CMake cache variable COZY_SHARED_DIR to point elsewhere)";
}

TempDir::TempDir() {
  std::string pattern = (fs::temp_directory_path() / "cozy-test.XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw std::runtime_error("mkdtemp failed");
  }
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ignored;
  fs::remove_all(path_, ignored);
}

FixtureHost::FixtureHost(const std::string& specName) {
  fixtures::BuildTree(fixtures::LoadSpec(SpecPath(specName)), directory_.path());
}

sysfs::HostScan FixtureHost::Scan() const {
  sysfs::ScanOptions options;
  options.root = root().string();
  options.pciIdsPath = FixturePciIds().string();
  return sysfs::ScanHost(options);
}

std::string ShellQuote(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

CommandResult RunCommand(const std::string& commandLine) {
  TempDir scratch;
  const fs::path outPath = scratch.path() / "out";
  const fs::path errPath = scratch.path() / "err";
  const std::string full = "(" + commandLine + ") >" + ShellQuote(outPath.string()) + " 2>" +
                           ShellQuote(errPath.string()) + " </dev/null";
  const int status = std::system(full.c_str());
  CommandResult result;
  result.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  auto slurp = [](const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream buffer;
    buffer << in.rdbuf();
    return buffer.str();
  };
  result.out = slurp(outPath);
  result.err = slurp(errPath);
  return result;
}

}  // namespace cozy::testing
