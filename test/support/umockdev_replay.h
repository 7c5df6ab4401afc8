// Replayed device events: a umockdev testbed holding a fixture host, the built `gpu-agent run`
// reading it through umockdev's preload (`--sysfs-root /`), and the fake API server whose
// request log shows what the agent wrote. Tests and the latency benchmark script the kernel's
// uevent sequences (research/sysfs.md §6) against it: change the testbed's sysfs the way the
// kernel does, emit each event with umockdev_testbed_uevent(), read the patches.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <sys/types.h>

#include <nlohmann/json.hpp>

#include "test/fakes/fake_apiserver.h"
#include "test/support/fixture_host.h"
#include "test/support/process.h"

typedef struct _UMockdevTestbed UMockdevTestbed;

namespace cozy::testing {

// Call first in main(). umockdev's preload must be in the process from its start, so a process
// without it re-executes itself with LD_PRELOAD naming libumockdev-preload.so.0 (after the ASan
// runtime in ASan builds, which must come first). Returns "" when the preload is in place, else
// why it cannot be (the tests then skip with that reason).
std::string EnterUmockdevPreload(char** argv);

// Why replayed events cannot reach the agent's monitor of `udevSource` (auto, udev, kernel) on
// this machine, or "" when they can. umockdev sends udev-format messages to every monitor
// socket of the testbed; libudev takes them on udev and kernel monitors alike.
std::string UmockdevUnusableReason(const std::string& udevSource = "auto");

struct ReplayOptions {
  std::string debounce;  // empty: the agent's default (50 ms)
  std::string udevSource = "auto";
  int verbosity = 0;
};

class UmockdevReplay {
 public:
  // Builds `spec` (a fixture spec, fixtures/sysfs/README.md) into a new testbed.
  explicit UmockdevReplay(const nlohmann::json& spec);
  ~UmockdevReplay();
  UmockdevReplay(const UmockdevReplay&) = delete;
  UmockdevReplay& operator=(const UmockdevReplay&) = delete;

  // The testbed's root: it holds sys/, which the preload shows the agent as /sys.
  const std::filesystem::path& root() const { return root_; }

  // Starts the fake API server and `gpu-agent run --sysfs-root /`, and waits until the agent
  // published its first status and listens for events. False (with the log) when it did not.
  bool Start(const ReplayOptions& options = ReplayOptions());
  // SIGTERM; returns the wait status.
  int StopAgent();
  std::string AgentLog() const;
  fake::FakeApiServer& server() { return *server_; }

  // sysfs changes, by path relative to the testbed root ("sys/devices/...").
  void Write(const std::string& relative, const std::string& text);
  void Link(const std::string& relative, const std::string& target);
  void Remove(const std::string& relative);  // a file, a link or a whole directory
  // Copies a file, a link or a directory (links kept as links) from another built tree.
  void CopyFrom(const std::filesystem::path& otherRoot, const std::string& relative);
  // Emits one uevent for a device ("/sys/devices/..."): its properties come from the device's
  // `uevent` file, as the kernel's do. Waits first until the agent's socket has room, because
  // umockdev 0.17 aborts when a send would block (0.19.4 retries instead).
  void Uevent(const std::string& devpath, const std::string& action);

  // The status PATCHes of the own GPUNode logged so far (cleared by ClearRequests()).
  std::vector<fake::LoggedRequest> StatusPatches() const;
  // Every write (POST, PUT, PATCH, DELETE) logged so far.
  std::vector<fake::LoggedRequest> Writes() const;
  nlohmann::json PublishedStatus() const;
  // A counter or gauge from the agent's /metrics (no labels); nullopt when unreadable.
  std::optional<double> Metric(const std::string& name) const;

  // What `gpu-agent scan` makes of a built tree: the status the agent should publish for it.
  static nlohmann::json ExpectedStatus(const std::filesystem::path& treeRoot);
  // Every entry under sys/ of a tree, as "path -> link target" or "path: contents" lines,
  // without the vfio group devices and driver directories (the fixture builder makes no group
  // devices, and driver directories only for drivers something is bound to).
  static std::vector<std::string> Listing(const std::filesystem::path& treeRoot);
  // "- line" for what only `treeRoot` has, "+ line" for what only `otherRoot` has; "" if alike.
  static std::string ListingDifference(const std::filesystem::path& treeRoot,
                                       const std::filesystem::path& otherRoot);

 private:
  void WaitForRoom();

  UMockdevTestbed* testbed_ = nullptr;
  std::filesystem::path root_;
  TempDir directory_;
  std::unique_ptr<fake::FakeApiServer> server_;
  pid_t pid_ = -1;
  int healthPort_ = 0;
  // Sockets connected to the agent's event sockets (by path), to wait for room on.
  std::map<std::string, int> listeners_;
};

}  // namespace cozy::testing
