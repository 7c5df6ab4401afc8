// `gpu-agent` is a light launcher (agent/commands/main.cpp): it answers an offline scan with sysfs
// discovery alone and execs gpu-agent-full for `run` and for scans that need kubelet or the API.
// These tests hold the split to what it promises: the same answers as the full agent, none of
// the daemon's libraries loaded for an offline scan, and a clear error when the full agent is
// missing.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "test/support/fixture_host.h"

namespace cozy {
namespace {

using testing::FixtureHost;
using testing::GpuAgentBinary;
using testing::RunCommand;
using testing::ShellQuote;
using testing::TempDir;

const std::filesystem::path kFullAgent = COZY_GPU_AGENT_FULL_BINARY;

// The shared libraries an ELF binary asks for (readelf's NEEDED entries).
std::set<std::string> Needed(const std::filesystem::path& binary) {
  const auto result = RunCommand("readelf -d " + ShellQuote(binary.string()));
  EXPECT_EQ(result.exitCode, 0) << result.err;
  std::set<std::string> libraries;
  std::istringstream lines(result.out);
  for (std::string line; std::getline(lines, line);) {
    const auto open = line.find("(NEEDED)");
    const auto start = line.find('[');
    const auto end = line.find(']');
    if (open != std::string::npos && start != std::string::npos && end > start) {
      libraries.insert(line.substr(start + 1, end - start - 1));
    }
  }
  return libraries;
}

bool AnyStartsWith(const std::set<std::string>& libraries, const std::string& prefix) {
  for (const auto& library : libraries) {
    if (library.rfind(prefix, 0) == 0) {
      return true;
    }
  }
  return false;
}

TEST(LightAgent, LinksDiscoveryOnlyWhileTheFullAgentLinksTheRest) {
  const auto light = Needed(GpuAgentBinary());
  const auto full = Needed(kFullAgent);
  EXPECT_TRUE(AnyStartsWith(light, "libpci.so"));
  for (const char* heavy :
       {"libgrpc", "libprotobuf", "libcurl", "libsystemd", "libudev", "libsdbus-c++"}) {
    EXPECT_FALSE(AnyStartsWith(light, heavy)) << "gpu-agent links " << heavy;
    EXPECT_TRUE(AnyStartsWith(full, heavy)) << "gpu-agent-full lacks " << heavy;
  }
}

std::string OfflineScan(const std::filesystem::path& binary, const FixtureHost& host,
                        const std::string& output) {
  return ShellQuote(binary.string()) + " scan --sysfs-root " + ShellQuote(host.root().string()) +
         " --pci-ids " + ShellQuote(testing::FixturePciIds().string()) +
         " --node-name gpu-node-1 --pod-resources unix:///nonexistent/kubelet.sock -o " + output;
}

TEST(LightAgent, OfflineScanAnswersExactlyAsTheFullAgent) {
  for (const char* spec : {"a100-vfio", "t4-vgpu-4", "broken", "hgx-h100"}) {
    const FixtureHost host(spec);
    for (const char* output : {"json", "yaml", "table"}) {
      const auto light = RunCommand(OfflineScan(GpuAgentBinary(), host, output));
      const auto full = RunCommand(OfflineScan(kFullAgent, host, output));
      EXPECT_EQ(light.exitCode, full.exitCode) << spec << " " << output;
      EXPECT_EQ(light.out, full.out) << spec << " " << output;
      EXPECT_EQ(light.err, full.err) << spec << " " << output;
      EXPECT_FALSE(light.out.empty()) << spec << " " << output;
    }
  }
}

// The launcher alone in a directory: what a hoster sees when gpu-agent-full is not installed,
// and proof of which commands the launcher answers itself.
class LauncherAlone : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::copy_file(GpuAgentBinary(), launcher_);
    std::filesystem::permissions(launcher_, std::filesystem::perms::owner_all);
  }
  std::string Command(const std::string& arguments) const {
    return ShellQuote(launcher_.string()) + " " + arguments;
  }
  TempDir directory_;
  std::filesystem::path launcher_ = directory_.path() / "gpu-agent";
};

constexpr char kNotInstalled[] = "gpu-agent-full (the daemon and the kubelet/API clients) is not";

TEST_F(LauncherAlone, AnswersAnOfflineScanItself) {
  const FixtureHost host("a100-vfio");
  const auto result = RunCommand(OfflineScan(launcher_, host, "json"));
  EXPECT_EQ(result.exitCode, 0) << result.err;
  EXPECT_NE(result.out.find("\"0000:3b:00.0\""), std::string::npos) << result.out;
  EXPECT_EQ(result.err.find(kNotInstalled), std::string::npos) << result.err;
}

TEST_F(LauncherAlone, RunAndOnlineScansNeedTheFullAgentAndSaySo) {
  const FixtureHost host("a100-vfio");
  // A file where the kubelet socket would be: talking to it is gRPC, the full agent's job.
  const auto socket = directory_.path() / "kubelet.sock";
  std::ofstream(socket) << "";
  const std::string onHost = "--sysfs-root " + ShellQuote(host.root().string());
  for (const std::string& arguments :
       {"run --node-name n " + onHost,
        "scan " + onHost + " --pod-resources unix://" + ShellQuote(socket.string()),
        "scan " + onHost + " --pod-resources unix:///nonexistent --kubeconfig /nonexistent"}) {
    const auto result = RunCommand(Command(arguments));
    EXPECT_EQ(result.exitCode, 1) << arguments;
    EXPECT_NE(result.err.find(kNotInstalled), std::string::npos) << arguments << ": " << result.err;
    EXPECT_NE(result.err.find((directory_.path() / "gpu-agent-full").string()), std::string::npos)
        << "names where it looked: " << result.err;
  }
}

TEST(LightAgent, RunReachesTheFullAgentWithTheSameArguments) {
  const FixtureHost host("a100-vfio");
  // Only the full agent checks --debounce: its refusal proves the exec and the arguments.
  const auto result =
      RunCommand(ShellQuote(GpuAgentBinary().string()) + " run --node-name n --sysfs-root " +
                 ShellQuote(host.root().string()) + " --debounce soon");
  EXPECT_EQ(result.exitCode, 2) << result.err;
  EXPECT_EQ(result.err, "gpu-agent: --debounce soon: not a duration such as 5s, 500ms or 10m\n");
}

}  // namespace
}  // namespace cozy
