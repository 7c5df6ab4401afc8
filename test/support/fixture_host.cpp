#include "test/support/fixture_host.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
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

namespace {

// This user's directory of made files, shared by the test programs ctest runs one test at a
// time: created 0700, and refused if another user owns it or may write to it.
fs::path MadeOnceRoot() {
  const fs::path root =
      fs::temp_directory_path() / ("cozy-test-made-" + std::to_string(::getuid()));
  ::mkdir(root.c_str(), 0700);
  struct stat info {};
  if (::lstat(root.c_str(), &info) != 0 || !S_ISDIR(info.st_mode) || info.st_uid != ::getuid() ||
      (info.st_mode & 077) != 0) {
    throw std::runtime_error("MakeOnce: " + root.string() +
                             " is not a directory of this user's alone");
  }
  return root;
}

}  // namespace

CommandResult MakeOnce(const std::string& script, const std::filesystem::path& dir) {
  // One directory per script and half day: certificates made for a day stay valid while used.
  const auto halfDays = std::chrono::duration_cast<std::chrono::hours>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count() /
                        12;
  const fs::path made = MadeOnceRoot() / (std::to_string(std::hash<std::string>{}(script)) + "-" +
                                          std::to_string(halfDays));
  CommandResult result{0, "", ""};
  if (!fs::exists(made / ".done")) {
    // Made apart, then renamed into place: a program that loses the race uses the winner's.
    const fs::path making = made.string() + ".making-" + std::to_string(::getpid());
    fs::remove_all(making);
    fs::create_directories(making);
    result = RunCommand("cd " + ShellQuote(making.string()) + " && (" + script + ")");
    if (result.exitCode != 0) {
      fs::remove_all(making);
      return result;
    }
    std::ofstream(making / ".out", std::ios::binary) << result.out;
    std::ofstream(making / ".done") << "";
    std::error_code lost;
    fs::rename(making, made, lost);
    if (lost) fs::remove_all(making);
  }
  std::ifstream out(made / ".out", std::ios::binary);
  std::stringstream buffer;
  buffer << out.rdbuf();
  result.out = buffer.str();
  fs::create_directories(dir);
  for (const auto& entry : fs::directory_iterator(made)) {
    const std::string name = entry.path().filename().string();
    if (name == ".out" || name == ".done") continue;
    fs::copy(entry.path(), dir / name,
             fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  }
  return result;
}

}  // namespace cozy::testing
