#include "test/support/umockdev_replay.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <glob.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <thread>

#include <httplib.h>
#include <umockdev.h>

#include "fixtures/sysfs/fixture_builder.h"

// Defined by the ASan runtime only, in ASan builds.
extern "C" void __asan_init() __attribute__((weak));

namespace cozy::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr const char* kPreload = "libumockdev-preload.so.0";
constexpr const char* kReexecMark = "COZY_UMOCKDEV_REEXEC";
const std::string kStatusPath = "/apis/gpu.cozystack.io/v1alpha1/gpunodes/n1/status";

std::string& PreloadProblem() {
  static std::string problem;
  return problem;
}

bool PreloadInProcess() {
  void* handle = ::dlopen(kPreload, RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) {
    return false;
  }
  ::dlclose(handle);
  return true;
}

// The ASan runtime's file, when this is an ASan build: it must stay first in LD_PRELOAD.
std::string AsanRuntime() {
  void (*init)() = &__asan_init;
  if (init == nullptr) {
    return {};
  }
  void* address = nullptr;
  std::memcpy(&address, &init, sizeof address);
  Dl_info info{};
  if (::dladdr(address, &info) == 0 || info.dli_fname == nullptr) {
    return {};
  }
  return info.dli_fname;
}

// udev-group monitors hear nothing where libudev believes udevd is absent (sd-device's
// device_monitor_new_full: no /run/udev/control and /dev not a devtmpfs).
bool DevIsDevtmpfs() {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string id, parent, device, root, mountPoint;
    fields >> id >> parent >> device >> root >> mountPoint;
    if (mountPoint == "/dev") {
      return line.find(" - devtmpfs ") != std::string::npos;
    }
  }
  return false;
}

std::vector<std::string> Glob(const std::string& pattern) {
  glob_t found{};
  std::vector<std::string> paths;
  if (::glob(pattern.c_str(), 0, nullptr, &found) == 0) {
    for (size_t i = 0; i < found.gl_pathc; ++i) {
      paths.emplace_back(found.gl_pathv[i]);
    }
  }
  ::globfree(&found);
  return paths;
}

}  // namespace

std::string EnterUmockdevPreload(char** argv) {
  if (PreloadInProcess()) {
    return "";
  }
  if (std::getenv(kReexecMark) != nullptr) {
    PreloadProblem() = std::string(kPreload) +
                       " did not load (is Debian's umockdev package installed?): replayed "
                       "device events need umockdev's preload";
    return PreloadProblem();
  }
  std::string preload = kPreload;
  if (const std::string asan = AsanRuntime(); !asan.empty()) {
    preload = asan + ":" + preload;
  }
  if (const char* existing = std::getenv("LD_PRELOAD"); existing != nullptr && *existing) {
    preload += std::string(":") + existing;
  }
  ::setenv("LD_PRELOAD", preload.c_str(), 1);
  ::setenv(kReexecMark, "1", 1);
  ::execv("/proc/self/exe", argv);
  PreloadProblem() =
      std::string("cannot re-execute under ") + kPreload + ": " + std::strerror(errno);
  return PreloadProblem();
}

std::string UmockdevUnusableReason(const std::string& udevSource) {
  if (!PreloadInProcess()) {
    return PreloadProblem().empty() ? std::string("not running under umockdev's preload")
                                    : PreloadProblem();
  }
  // "auto" picks the kernel source where /run/udev/control is missing, which hears them.
  if (udevSource == "udev" && !fs::exists("/run/udev/control") && !DevIsDevtmpfs()) {
    return "libudev disables udev-group monitors here (no /run/udev/control and /dev is not a "
           "devtmpfs), so replayed events cannot reach the agent";
  }
  return "";
}

UmockdevReplay::UmockdevReplay(const nlohmann::json& spec) {
  testbed_ = umockdev_testbed_new();
  gchar* root = umockdev_testbed_get_root_dir(testbed_);
  root_ = root;
  g_free(root);
  // The testbed starts with an empty sys/ (bus/ and class/ only); the fixture's tree replaces it.
  const fs::path built = directory_.path() / "tree";
  fixtures::BuildTree(spec, built);
  for (const auto& entry : fs::directory_iterator(built)) {
    fs::remove_all(root_ / entry.path().filename());
    fs::rename(entry.path(), root_ / entry.path().filename());
  }
}

UmockdevReplay::~UmockdevReplay() {
  StopAgent();
  if (server_) {
    server_->Stop();
  }
  for (const auto& [path, fd] : listeners_) {
    ::close(fd);
  }
  g_object_unref(testbed_);  // removes the testbed and unsets UMOCKDEV_DIR
}

bool UmockdevReplay::Start(const ReplayOptions& options) {
  fake::FakeApiServerOptions serverOptions;
  serverOptions.crdPaths = {SourceDir() / "charts/gpu/templates/crds"};
  server_ = std::make_unique<fake::FakeApiServer>(serverOptions);
  server_->Start();
  server_->Seed({{"apiVersion", "v1"},
                 {"kind", "Node"},
                 {"metadata", {{"name", "n1"}, {"uid", "11111111-1111-1111-1111-111111111111"}}}});
  std::ofstream(directory_.path() / "kubeconfig") << server_->Kubeconfig("agent-token");
  healthPort_ = FreePort();
  // Under the preload the testbed is /sys: the agent reads it as it would read the host's.
  std::vector<std::string> arguments = {GpuAgentBinary().string(),
                                        "run",
                                        "--node-name",
                                        "n1",
                                        "--kubeconfig",
                                        (directory_.path() / "kubeconfig").string(),
                                        "--sysfs-root",
                                        "/",
                                        "--pci-ids",
                                        FixturePciIds().string(),
                                        "--pod-resources",
                                        "unix://" + (directory_.path() / "absent.sock").string(),
                                        "--udev-source",
                                        options.udevSource,
                                        "--health-addr",
                                        "127.0.0.1:" + std::to_string(healthPort_),
                                        "-v",
                                        std::to_string(options.verbosity)};
  if (!options.debounce.empty()) {
    arguments.insert(arguments.end(), {"--debounce", options.debounce});
  }
  // The environment carries LD_PRELOAD and the testbed's UMOCKDEV_DIR to the agent.
  pid_ = Spawn(arguments, directory_.path() / "agent.log");
  if (pid_ < 0) {
    return false;
  }
  // Published its first status, and its monitor's socket is bound (events before are lost).
  return WaitFor(
      [&] {
        return !PublishedStatus().is_null() && !Glob((root_ / "event[0-9]*").string()).empty();
      },
      30s);
}

int UmockdevReplay::StopAgent() { return Finish(pid_); }

std::string UmockdevReplay::AgentLog() const {
  std::ifstream in(directory_.path() / "agent.log");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void UmockdevReplay::Write(const std::string& relative, const std::string& text) {
  fs::create_directories((root_ / relative).parent_path());
  std::ofstream(root_ / relative, std::ios::trunc) << text;
}

void UmockdevReplay::Link(const std::string& relative, const std::string& target) {
  fs::create_directories((root_ / relative).parent_path());
  fs::remove(root_ / relative);
  fs::create_symlink(target, root_ / relative);
}

void UmockdevReplay::Remove(const std::string& relative) { fs::remove_all(root_ / relative); }

void UmockdevReplay::CopyFrom(const fs::path& otherRoot, const std::string& relative) {
  const fs::path from = otherRoot / relative;
  const fs::path to = root_ / relative;
  fs::create_directories(to.parent_path());
  if (fs::is_symlink(from) || !fs::is_directory(from)) {
    fs::remove(to);
  }
  fs::copy(from, to,
           fs::copy_options::recursive | fs::copy_options::copy_symlinks |
               fs::copy_options::overwrite_existing);
}

void UmockdevReplay::WaitForRoom() {
  for (const std::string& path : Glob((root_ / "event[0-9]*").string())) {
    auto it = listeners_.find(path);
    if (it == listeners_.end()) {
      const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      sockaddr_un address{};
      address.sun_family = AF_UNIX;
      std::strncpy(address.sun_path, path.c_str(), sizeof address.sun_path - 1);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
        ::close(fd);
        continue;
      }
      it = listeners_.emplace(path, fd).first;
    }
    // A connected datagram socket is writable while the peer's queue has room.
    pollfd ready{it->second, POLLOUT, 0};
    ::poll(&ready, 1, 5000);
  }
}

void UmockdevReplay::Uevent(const std::string& devpath, const std::string& action) {
  WaitForRoom();
  umockdev_testbed_uevent(testbed_, devpath.c_str(), action.c_str());
}

std::vector<fake::LoggedRequest> UmockdevReplay::Writes() const {
  std::vector<fake::LoggedRequest> writes;
  for (const auto& request : server_->Requests()) {
    if (request.method == "POST" || request.method == "PUT" || request.method == "PATCH" ||
        request.method == "DELETE") {
      writes.push_back(request);
    }
  }
  return writes;
}

std::vector<fake::LoggedRequest> UmockdevReplay::StatusPatches() const {
  std::vector<fake::LoggedRequest> patches;
  for (const auto& request : Writes()) {
    if (request.method == "PATCH" && request.path == kStatusPath && request.status < 300) {
      patches.push_back(request);
    }
  }
  return patches;
}

nlohmann::json UmockdevReplay::PublishedStatus() const {
  const nlohmann::json node = server_->Object("gpu.cozystack.io/v1alpha1", "gpunodes", "", "n1");
  if (!node.is_object() || !node.contains("status") || !node["status"].contains("devices")) {
    return nullptr;
  }
  return node["status"];
}

std::optional<double> UmockdevReplay::Metric(const std::string& name) const {
  httplib::Client client("127.0.0.1", healthPort_);
  const auto response = client.Get("/metrics");
  if (!response || response->status != 200) {
    return std::nullopt;
  }
  std::istringstream lines(response->body);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.compare(0, name.size() + 1, name + " ") == 0) {
      return std::stod(line.substr(name.size() + 1));
    }
  }
  return std::nullopt;
}

nlohmann::json UmockdevReplay::ExpectedStatus(const fs::path& treeRoot) {
  const CommandResult result = RunCommand(
      ShellQuote(GpuAgentBinary().string()) + " scan -o json --sysfs-root " +
      ShellQuote(treeRoot.string()) + " --pci-ids " + ShellQuote(FixturePciIds().string()) +
      " --pod-resources " + ShellQuote("unix://" + (treeRoot / "absent.sock").string()));
  if (result.exitCode != 0) {
    return {{"error", result.err}};
  }
  return nlohmann::json::parse(result.out)["status"];
}

std::vector<std::string> UmockdevReplay::Listing(const fs::path& treeRoot) {
  std::vector<std::string> lines;
  const fs::path sys = treeRoot / "sys";
  for (auto it = fs::recursive_directory_iterator(sys); it != fs::recursive_directory_iterator();
       ++it) {
    const std::string relative = it->path().lexically_relative(treeRoot).string();
    if (relative == "sys/devices/virtual" || relative == "sys/class/vfio") {
      it.disable_recursion_pending();
      continue;
    }
    // A driver's directory stays while its module is loaded; the fixture builder makes one
    // only for a driver something is bound to. The links of bound devices are what count.
    if (relative.rfind("sys/bus/", 0) == 0 && relative.find("/drivers/") != std::string::npos &&
        !it->is_symlink()) {
      continue;
    }
    if (it->is_symlink()) {
      lines.push_back(relative + " -> " + fs::read_symlink(it->path()).string());
    } else if (it->is_directory()) {
      lines.push_back(relative + "/");
    } else {
      std::ifstream in(it->path());
      lines.push_back(
          relative + ": " +
          std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()));
    }
  }
  std::sort(lines.begin(), lines.end());
  return lines;
}

std::string UmockdevReplay::ListingDifference(const fs::path& treeRoot, const fs::path& otherRoot) {
  const std::vector<std::string> mine = Listing(treeRoot);
  const std::vector<std::string> other = Listing(otherRoot);
  std::vector<std::string> onlyMine;
  std::vector<std::string> onlyOther;
  std::set_difference(mine.begin(), mine.end(), other.begin(), other.end(),
                      std::back_inserter(onlyMine));
  std::set_difference(other.begin(), other.end(), mine.begin(), mine.end(),
                      std::back_inserter(onlyOther));
  std::string text;
  for (const std::string& line : onlyMine) {
    text += "- " + line + "\n";
  }
  for (const std::string& line : onlyOther) {
    text += "+ " + line + "\n";
  }
  return text;
}

}  // namespace cozy::testing
