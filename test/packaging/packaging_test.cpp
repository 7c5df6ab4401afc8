// gpu-agent_<version>_<arch>.deb and gpu-controller_<version>_<arch>.deb as a hoster gets
// them: cpack builds both into a temporary directory, dpkg-deb shows their contents and control
// fields, the unpacked binaries run, and lintian finds no error.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "test/support/fixture_host.h"

namespace cozy {
namespace {

using testing::RunCommand;
using testing::ShellQuote;

std::string Trimmed(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class Package : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = std::make_unique<testing::TempDir>();
    const auto built = RunCommand(std::string(COZY_CPACK) + " -G DEB -B " +
                                  ShellQuote(directory_->path().string()) + " --config " +
                                  ShellQuote(std::string(COZY_BINARY_DIR) + "/CPackConfig.cmake"));
    cpackOutput_ = built.out + built.err;
    cpackExit_ = built.exitCode;
    arch_ = Trimmed(RunCommand("dpkg --print-architecture").out);
    deb_ = directory_->path() / ("gpu-agent_" COZY_VERSION "_" + arch_ + ".deb");
    controllerDeb_ = directory_->path() / ("gpu-controller_" COZY_VERSION "_" + arch_ + ".deb");
  }
  static void TearDownTestSuite() { directory_.reset(); }

  void SetUp() override {
    ASSERT_EQ(cpackExit_, 0) << cpackOutput_;
    ASSERT_TRUE(std::filesystem::exists(deb_)) << deb_ << " missing; cpack said:\n" << cpackOutput_;
  }

  static std::string Field(const std::string& name, const std::filesystem::path& deb = deb_) {
    return Trimmed(RunCommand("dpkg-deb -f " + ShellQuote(deb.string()) + " " + name).out);
  }
  // path -> mode of the package's files; every entry owned by root, directories 0755.
  static std::map<std::string, std::string> Files(const std::filesystem::path& deb) {
    const auto listing = RunCommand("dpkg-deb -c " + ShellQuote(deb.string()));
    EXPECT_EQ(listing.exitCode, 0) << listing.err;
    // -rwxr-xr-x root/root   1234 2026-11-29 23:00 ./usr/bin/gpu-agent
    static const std::regex line(R"(^(\S+) (\S+)\s+\d+ \S+ \S+ \.(/\S*)$)");
    std::map<std::string, std::string> files;
    std::stringstream lines(listing.out);
    for (std::string text; std::getline(lines, text);) {
      std::smatch match;
      EXPECT_TRUE(std::regex_match(text, match, line)) << text;
      if (match.empty()) continue;
      EXPECT_EQ(match[2].str(), "root/root") << text;
      if (match[1].str()[0] == 'd') {
        EXPECT_EQ(match[1].str(), "drwxr-xr-x") << text;
      } else {
        files[match[3].str()] = match[1].str();
      }
    }
    return files;
  }

  static std::unique_ptr<testing::TempDir> directory_;
  static std::string cpackOutput_;
  static int cpackExit_;
  static std::string arch_;
  static std::filesystem::path deb_;
  static std::filesystem::path controllerDeb_;
};

std::unique_ptr<testing::TempDir> Package::directory_;
std::string Package::cpackOutput_;
int Package::cpackExit_ = -1;
std::string Package::arch_;
std::filesystem::path Package::deb_;
std::filesystem::path Package::controllerDeb_;

TEST_F(Package, HoldsTheAgentItsUnitDefaultsBusPolicyAndTheDebianDocsOnly) {
  const auto listing = RunCommand("dpkg-deb -c " + ShellQuote(deb_.string()));
  ASSERT_EQ(listing.exitCode, 0) << listing.err;
  // -rwxr-xr-x root/root   1234 2026-11-29 23:00 ./usr/bin/gpu-agent
  static const std::regex line(R"(^(\S+) (\S+)\s+\d+ \S+ \S+ \.(/\S*)$)");
  std::map<std::string, std::string> files;  // path -> mode
  std::stringstream lines(listing.out);
  for (std::string text; std::getline(lines, text);) {
    std::smatch match;
    ASSERT_TRUE(std::regex_match(text, match, line)) << text;
    EXPECT_EQ(match[2].str(), "root/root") << text;
    if (match[1].str()[0] == 'd') {
      EXPECT_EQ(match[1].str(), "drwxr-xr-x") << text;
    } else {
      files[match[3].str()] = match[1].str();
    }
  }
  const std::map<std::string, std::string> expected = {
      {"/usr/bin/gpu-agent", "-rwxr-xr-x"},
      {"/usr/libexec/gpu-agent/gpu-agent-full", "-rwxr-xr-x"},
      {"/lib/systemd/system/gpu-agent.service", "-rw-r--r--"},
      {"/etc/default/gpu-agent", "-rw-r--r--"},
      {"/usr/share/dbus-1/system.d/io.cozystack.GPUAgent1.conf", "-rw-r--r--"},
      {"/usr/share/doc/gpu-agent/copyright", "-rw-r--r--"},
      {"/usr/share/doc/gpu-agent/changelog.gz", "-rw-r--r--"},
  };
  EXPECT_EQ(files, expected) << listing.out;
}

TEST_F(Package, ControlFieldsAndDependenciesFromTheBinary) {
  EXPECT_EQ(Field("Package"), "gpu-agent");
  EXPECT_EQ(Field("Version"), COZY_VERSION);
  EXPECT_EQ(Field("Architecture"), arch_);
  EXPECT_EQ(Field("Section"), "admin");
  EXPECT_NE(Field("Maintainer").find('@'), std::string::npos);
  // dpkg-shlibdeps turned the binary's NEEDED libraries into versioned Depends.
  const std::string depends = Field("Depends");
  for (const char* library : {"libc6 (>=", "libstdc++6 (>=", "libpci3", "libudev1", "libsystemd0",
                              "libgrpc++1", "libprotobuf", "libsdbus-c++1"}) {
    EXPECT_NE(depends.find(library), std::string::npos) << library << " in " << depends;
  }
  for (const char* library : {"libgtest", "libgmock", "libbenchmark", "-dev"}) {
    EXPECT_EQ(depends.find(library), std::string::npos) << library << " in " << depends;
  }
  const auto conffiles = RunCommand("dpkg-deb -I " + ShellQuote(deb_.string()) + " conffiles");
  EXPECT_EQ(conffiles.out, "/etc/default/gpu-agent\n") << conffiles.err;
}

TEST_F(Package, UnpackedAgentRunsAndShipsTheRepositoryFiles) {
  testing::TempDir root;
  const auto unpacked = RunCommand("dpkg-deb -x " + ShellQuote(deb_.string()) + " " +
                                   ShellQuote(root.path().string()));
  ASSERT_EQ(unpacked.exitCode, 0) << unpacked.err;
  const auto version =
      RunCommand(ShellQuote((root.path() / "usr/bin/gpu-agent").string()) + " --version");
  EXPECT_EQ(version.exitCode, 0) << version.err;
  EXPECT_EQ(version.out, "gpu-agent " COZY_VERSION "\n");
  // `run` goes on in /usr/libexec/gpu-agent/gpu-agent-full, found from /usr/bin: its own
  // refusal of a bad --debounce (the launcher does not check it) shows it was reached.
  const auto run = RunCommand(ShellQuote((root.path() / "usr/bin/gpu-agent").string()) +
                              " run --node-name n --sysfs-root / --debounce soon");
  EXPECT_EQ(run.exitCode, 2) << run.err;
  EXPECT_EQ(run.err, "gpu-agent: --debounce soon: not a duration such as 5s, 500ms or 10m\n");
  const std::filesystem::path source = COZY_SOURCE_DIR;
  EXPECT_EQ(ReadFile(root.path() / "lib/systemd/system/gpu-agent.service"),
            ReadFile(source / "systemd/gpu-agent.service"));
  EXPECT_EQ(ReadFile(root.path() / "etc/default/gpu-agent"),
            ReadFile(source / "systemd/gpu-agent.default"));
  EXPECT_EQ(ReadFile(root.path() / "usr/share/dbus-1/system.d/io.cozystack.GPUAgent1.conf"),
            ReadFile(source / "systemd/io.cozystack.GPUAgent1.conf"));
  // Stripped: no .debug_info section left for lintian's unstripped-binary-or-object.
  const auto sections =
      RunCommand("LC_ALL=C objdump -h " + ShellQuote((root.path() / "usr/bin/gpu-agent").string()));
  EXPECT_EQ(sections.out.find(".debug_info"), std::string::npos);
  const auto changelog = RunCommand(
      "gzip -dc " + ShellQuote((root.path() / "usr/share/doc/gpu-agent/changelog.gz").string()));
  EXPECT_NE(changelog.out.find("gpu-agent (" COZY_VERSION ")"), std::string::npos)
      << "the changelog's top entry is not this version";
}

TEST_F(Package, LintianFindsNoError) {
  // Warnings are expected and listed in docs/install.md; errors fail.
  const auto lint = RunCommand("lintian --fail-on error --tag-display-limit 0 " +
                               ShellQuote(deb_.string()) + " 2>&1");
  EXPECT_EQ(lint.exitCode, 0) << lint.out;
  EXPECT_EQ(lint.out.find("\nE: "), std::string::npos) << lint.out;
  EXPECT_FALSE(lint.out.starts_with("E: ")) << lint.out;
  std::cout << "lintian:\n" << lint.out;
}

// gpu-controller's package: the daemon the image runs and the kubectl plugin, nothing of the
// agent's, no conffile.
TEST_F(Package, ControllerPackageHoldsTheControllerAndThePluginOnly) {
  ASSERT_TRUE(std::filesystem::exists(controllerDeb_)) << cpackOutput_;
  const std::map<std::string, std::string> expected = {
      {"/usr/bin/gpu-controller", "-rwxr-xr-x"},
      {"/usr/bin/kubectl-gpu", "-rwxr-xr-x"},
      {"/usr/share/doc/gpu-controller/copyright", "-rw-r--r--"},
      {"/usr/share/doc/gpu-controller/changelog.gz", "-rw-r--r--"},
  };
  EXPECT_EQ(Files(controllerDeb_), expected);
}

TEST_F(Package, ControllerControlFieldsAndDependenciesFromTheBinaries) {
  ASSERT_TRUE(std::filesystem::exists(controllerDeb_)) << cpackOutput_;
  EXPECT_EQ(Field("Package", controllerDeb_), "gpu-controller");
  EXPECT_EQ(Field("Version", controllerDeb_), COZY_VERSION);
  EXPECT_EQ(Field("Architecture", controllerDeb_), arch_);
  EXPECT_EQ(Field("Section", controllerDeb_), "admin");
  EXPECT_EQ(Field("Recommends", controllerDeb_), "");  // pci.ids is the agent's
  const std::string description = Field("Description", controllerDeb_);
  EXPECT_TRUE(description.starts_with("GPU catalog controller")) << description;
  EXPECT_NE(description.find("kubectl gpu"), std::string::npos) << description;
  EXPECT_TRUE(Field("Description")
                  .starts_with("Kubernetes node agent that publishes the node's "
                               "GPUs\n"))
      << Field("Description");
  // dpkg-shlibdeps: the controller's and the plugin's libraries, none of the agent's.
  const std::string depends = Field("Depends", controllerDeb_);
  for (const char* library : {"libc6 (>=", "libstdc++6 (>=", "libcurl", "libssl3", "libyaml-cpp"}) {
    EXPECT_NE(depends.find(library), std::string::npos) << library << " in " << depends;
  }
  for (const char* library :
       {"libpci3", "libudev1", "libsdbus-c++1", "libgrpc++1", "libgtest", "-dev"}) {
    EXPECT_EQ(depends.find(library), std::string::npos) << library << " in " << depends;
  }
  const auto conffiles =
      RunCommand("dpkg-deb -I " + ShellQuote(controllerDeb_.string()) + " conffiles");
  EXPECT_NE(conffiles.exitCode, 0) << conffiles.out;
}

TEST_F(Package, UnpackedControllerAndPluginRun) {
  ASSERT_TRUE(std::filesystem::exists(controllerDeb_)) << cpackOutput_;
  testing::TempDir root;
  const auto unpacked = RunCommand("dpkg-deb -x " + ShellQuote(controllerDeb_.string()) + " " +
                                   ShellQuote(root.path().string()));
  ASSERT_EQ(unpacked.exitCode, 0) << unpacked.err;
  const auto version =
      RunCommand(ShellQuote((root.path() / "usr/bin/gpu-controller").string()) + " --version");
  EXPECT_EQ(version.exitCode, 0) << version.err;
  EXPECT_EQ(version.out, COZY_VERSION "\n");
  const auto help =
      RunCommand(ShellQuote((root.path() / "usr/bin/kubectl-gpu").string()) + " --help");
  EXPECT_EQ(help.exitCode, 0) << help.err;
  for (const char* word : {"kubectl gpu", "catalog", "nodes", "why", "--kubeconfig", "--context",
                           "--namespace", "--output"}) {
    EXPECT_NE(help.out.find(word), std::string::npos) << word << " in\n" << help.out;
  }
  const auto sections = RunCommand("LC_ALL=C objdump -h " +
                                   ShellQuote((root.path() / "usr/bin/kubectl-gpu").string()));
  EXPECT_EQ(sections.out.find(".debug_info"), std::string::npos);
  const auto changelog =
      RunCommand("gzip -dc " +
                 ShellQuote((root.path() / "usr/share/doc/gpu-controller/changelog.gz").string()));
  EXPECT_NE(changelog.out.find("gpu-controller (" COZY_VERSION ")"), std::string::npos)
      << "the changelog's top entry is not this version";
}

TEST_F(Package, LintianFindsNoErrorInTheControllerPackage) {
  ASSERT_TRUE(std::filesystem::exists(controllerDeb_)) << cpackOutput_;
  const auto lint = RunCommand("lintian --fail-on error --tag-display-limit 0 " +
                               ShellQuote(controllerDeb_.string()) + " 2>&1");
  EXPECT_EQ(lint.exitCode, 0) << lint.out;
  EXPECT_EQ(lint.out.find("\nE: "), std::string::npos) << lint.out;
  EXPECT_FALSE(lint.out.starts_with("E: ")) << lint.out;
  std::cout << "lintian (gpu-controller):\n" << lint.out;
}

}  // namespace
}  // namespace cozy
