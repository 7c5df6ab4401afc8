// gpu-agent on D-Bus as a user meets it (DESIGN §4.6): a real dbus-daemon this test starts, with
// the system bus's default policy and the shipped systemd/io.cozystack.GPUAgent1.conf included;
// `gpu-agent run --dbus system` finding it through DBUS_SYSTEM_BUS_ADDRESS; busctl, dbus-send
// and setpriv as the clients. The fake kubelet answers over a real unix socket, read once an
// hour, so every rescan seen here is the test's doing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include <httplib.h>

#include "test/fakes/fake_kubelet.h"
#include "test/support/fixture_host.h"
#include "test/support/process.h"

namespace cozy {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using testing::Finish;
using testing::FreePort;
using testing::RunCommand;
using testing::ShellQuote;
using testing::Spawn;
using testing::WaitFor;

constexpr const char* kName = "io.cozystack.GPUAgent1";
constexpr const char* kPath = "/io/cozystack/GPUAgent1";

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool Alive(pid_t pid) { return pid > 0 && ::waitpid(pid, nullptr, WNOHANG) == 0; }

// The system bus as Debian's /usr/share/dbus-1/system.conf sets it up (default deny for owning
// names and for method calls, root may monitor), listening in `directory`, plus the policy the
// .deb ships.
std::string BusConfig(const std::filesystem::path& socket) {
  return R"(<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <auth>EXTERNAL</auth>
  <listen>unix:path=)" +
         socket.string() + R"(</listen>
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus"
           send_interface="org.freedesktop.DBus.Introspectable"/>
    <allow send_destination="org.freedesktop.DBus"
           send_interface="org.freedesktop.DBus.Properties"/>
  </policy>
  <policy user="root">
    <allow send_destination="org.freedesktop.DBus"
           send_interface="org.freedesktop.DBus.Monitoring"/>
  </policy>
  <include>)" +
         (testing::SourceDir() / "systemd/io.cozystack.GPUAgent1.conf").string() +
         R"(</include>
</busconfig>
)";
}

// One interface of an introspection document as comparable lines: each method, signal and
// property with its attributes and those of its args and annotations (sorted), members sorted,
// comments gone; so documents that differ only in order or layout compare equal.
std::vector<std::string> InterfaceMembers(const std::string& xml, const std::string& interface) {
  const std::string text = std::regex_replace(xml, std::regex("<!--[\\s\\S]*?-->"), "");
  const size_t begin = text.find("<interface name=\"" + interface + "\"");
  if (begin == std::string::npos) {
    return {};
  }
  const std::string block = text.substr(begin, text.find("</interface>", begin) - begin);
  static const std::regex tag(R"(<(method|signal|property|arg|annotation)\b([^>]*?)/?>)");
  static const std::regex attribute(R"re((\w+)="([^"]*)")re");
  std::vector<std::string> members;
  for (auto it = std::sregex_iterator(block.begin(), block.end(), tag);
       it != std::sregex_iterator(); ++it) {
    std::map<std::string, std::string> attributes;
    const std::string inside = (*it)[2].str();
    for (auto a = std::sregex_iterator(inside.begin(), inside.end(), attribute);
         a != std::sregex_iterator(); ++a) {
      attributes[(*a)[1].str()] = (*a)[2].str();
    }
    const std::string kind = (*it)[1].str();
    std::string line = kind;
    for (const auto& [key, value] : attributes) {
      line += " " + key + "=" + value;
    }
    if ((kind == "arg" || kind == "annotation") && !members.empty()) {
      members.back() += "; " + line;  // args keep their order: it is the signature's
    } else {
      members.push_back(line);
    }
  }
  std::sort(members.begin(), members.end());
  return members;
}

class DbusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Other users must reach the bus socket (the policy tests run clients as nobody).
    std::filesystem::permissions(directory_.path(), std::filesystem::perms(0755));
    std::ofstream(directory_.path() / "bus.conf") << BusConfig(BusSocket());
    StartBus();
    kubelet_.Start(
        (directory_.path() / "kubelet.sock").string(),
        fakes::LoadScenario(
            (testing::SourceDir() / "fixtures/kubelet/a100-kubevirt-pci.json").string()));
  }

  void TearDown() override {
    Finish(monitor_);
    Finish(agent_);
    Finish(bus_);
    kubelet_.Stop();
  }

  std::filesystem::path BusSocket() const { return directory_.path() / "bus"; }
  std::string Address() const { return "unix:path=" + BusSocket().string(); }

  void StartBus() {
    std::filesystem::remove(BusSocket());
    bus_ = Spawn({"dbus-daemon", "--nofork", "--nopidfile",
                  "--config-file=" + (directory_.path() / "bus.conf").string()},
                 directory_.path() / "bus.log");
    ASSERT_GT(bus_, 0);
    ASSERT_TRUE(WaitFor([&] { return std::filesystem::exists(BusSocket()); }))
        << ReadFile(directory_.path() / "bus.log");
  }

  std::vector<std::string> AgentArguments() {
    return {testing::GpuAgentBinary().string(),
            "run",
            "--node-name",
            "gpu-node-1",
            "--sysfs-root",
            host_.root().string(),
            "--pci-ids",
            testing::FixturePciIds().string(),
            "--pod-resources",
            "unix://" + (directory_.path() / "kubelet.sock").string(),
            "--pod-resources-interval",
            "1h",
            "--udev-source",
            "off",
            "--dbus",
            "system",
            "--health-addr",
            "127.0.0.1:" + std::to_string(healthPort_),
            "-v",
            "1"};
  }

  void StartAgent() {
    agent_ = Spawn(AgentArguments(), AgentLogPath(), {{"DBUS_SYSTEM_BUS_ADDRESS", Address()}});
    ASSERT_GT(agent_, 0);
  }

  std::filesystem::path AgentLogPath() const { return directory_.path() / "agent.log"; }
  std::string AgentLog() const { return ReadFile(AgentLogPath()); }

  testing::CommandResult Busctl(const std::string& arguments, const std::string& as = "") {
    return RunCommand(as + "busctl --address=" + ShellQuote(Address()) + " " + arguments);
  }

  // The Inventory property through busctl, parsed; null when the call failed.
  json Inventory(const std::string& as = "") {
    const auto result = Busctl(std::string("--json=short get-property ") + kName + " " + kPath +
                                   " " + kName + " Inventory",
                               as);
    if (result.exitCode != 0) {
      return nullptr;
    }
    return json::parse(json::parse(result.out).at("data").get<std::string>());
  }

  bool NameServed() { return !Inventory().is_null(); }

  // What `gpu-agent scan` prints for the same tree and kubelet: the status to compare with.
  json ScanStatus() {
    const auto scan =
        RunCommand(ShellQuote(testing::GpuAgentBinary().string()) + " scan --node-name gpu-node-1" +
                   " --sysfs-root " + ShellQuote(host_.root().string()) + " --pci-ids " +
                   ShellQuote(testing::FixturePciIds().string()) + " --pod-resources " +
                   ShellQuote("unix://" + (directory_.path() / "kubelet.sock").string()));
    EXPECT_EQ(scan.exitCode, 0) << scan.err;
    return json::parse(scan.out).at("status");
  }

  // busctl monitor, as root: the signals on the agent's object, one JSON message a line.
  void StartMonitor() {
    monitor_ = Spawn({"busctl", "--address=" + Address(), "--json=short", "monitor",
                      std::string("--match=type='signal',path='") + kPath + "'"},
                     directory_.path() / "monitor.log");
    ASSERT_GT(monitor_, 0);
    ASSERT_TRUE(WaitFor([&] {
      return ReadFile(directory_.path() / "monitor.log").find("Monitoring") != std::string::npos;
    }));
  }
  std::vector<json> Signals(const std::string& member) {
    std::vector<json> signals;
    std::stringstream lines(ReadFile(directory_.path() / "monitor.log"));
    for (std::string line; std::getline(lines, line);) {
      if (line.starts_with("{")) {
        const json message = json::parse(line);
        if (message.value("member", "") == member) {
          signals.push_back(message);
        }
      }
    }
    return signals;
  }

  std::string Metrics() {
    httplib::Client client("127.0.0.1", healthPort_);
    const auto response = client.Get("/metrics");
    return response ? response->body : "";
  }
  int64_t Scans() {
    static const std::regex line(R"(\ngpu_agent_scans_total (\d+)\n)");
    std::smatch match;
    const std::string text = Metrics();
    return std::regex_search(text, match, line) ? std::stoll(match[1].str()) : -1;
  }
  int Healthz() {
    httplib::Client client("127.0.0.1", healthPort_);
    const auto response = client.Get("/healthz");
    return response ? response->status : -1;
  }

  static json Device(const json& status, const std::string& address) {
    for (const auto& device : status.at("devices")) {
      if (device.at("pciAddress") == address) {
        return device;
      }
    }
    return nullptr;
  }

  testing::TempDir directory_;
  testing::FixtureHost host_{"a100-vfio"};
  fakes::FakeKubelet kubelet_;
  int healthPort_ = FreePort();
  pid_t bus_ = -1;
  pid_t agent_ = -1;
  pid_t monitor_ = -1;
};

bool Root() { return ::geteuid() == 0; }
constexpr const char* kNotRoot =
    "not root: the shipped policy lets only root own io.cozystack.GPUAgent1, so the agent "
    "cannot serve on this bus (ANonRootAgentIsRefusedTheNameAndKeepsRunning covers this case)";

TEST_F(DbusTest, InventoryIsWhatTheAgentPublishesAndTheObjectIsTheRepositoryXml) {
  if (!Root()) {
    GTEST_SKIP() << kNotRoot;
  }
  StartAgent();
  ASSERT_TRUE(WaitFor([&] { return NameServed(); })) << AgentLog();
  const json inventory = Inventory();
  EXPECT_EQ(inventory, ScanStatus());
  EXPECT_EQ(Device(inventory, "0000:3b:00.0").at("driver"), "vfio-pci");
  EXPECT_NE(AgentLog().find("serving on D-Bus bus=system name=io.cozystack.GPUAgent1"),
            std::string::npos)
      << AgentLog();
  EXPECT_NE(Metrics().find("\ngpu_agent_dbus_connected 1\n"), std::string::npos);

  const auto introspected =
      Busctl(std::string("introspect --xml-interface ") + kName + " " + kPath);
  ASSERT_EQ(introspected.exitCode, 0) << introspected.err;
  const auto expected = InterfaceMembers(
      ReadFile(testing::SourceDir() / "agent/dbus/io.cozystack.GPUAgent1.xml"), kName);
  ASSERT_FALSE(expected.empty());
  EXPECT_EQ(InterfaceMembers(introspected.out, kName), expected) << introspected.out;
}

TEST_F(DbusTest, RescanRescansAndOnlyAChangeIsAnnounced) {
  if (!Root()) {
    GTEST_SKIP() << kNotRoot;
  }
  StartAgent();
  ASSERT_TRUE(WaitFor([&] { return NameServed(); })) << AgentLog();
  StartMonitor();
  const int64_t before = Scans();
  ASSERT_GE(before, 1);

  // Nothing changed: a pass, no signal.
  const auto unchanged =
      Busctl(std::string("call ") + kName + " " + kPath + " " + kName + " Rescan");
  ASSERT_EQ(unchanged.exitCode, 0) << unchanged.err;
  EXPECT_EQ(unchanged.out, "");  // no reply arguments
  EXPECT_EQ(Scans(), before + 1);
  EXPECT_NE(AgentLog().find("D-Bus Rescan(): rescanning"), std::string::npos);
  std::this_thread::sleep_for(500ms);
  EXPECT_TRUE(Signals("InventoryChanged").empty()) << ReadFile(directory_.path() / "monitor.log");
  EXPECT_TRUE(Signals("PropertiesChanged").empty());

  // Rebind 3b:00.0 from vfio-pci to nvidia in the fixture: Rescan() returns after the pass that
  // sees it, and exactly one InventoryChanged carries the new inventory.
  const auto device = host_.root() / "sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0";
  std::filesystem::remove(device / "driver");
  std::filesystem::create_directories(host_.root() / "sys/bus/pci/drivers/nvidia");
  std::filesystem::create_symlink("../../../../bus/pci/drivers/nvidia", device / "driver");
  const auto changed = Busctl(std::string("call ") + kName + " " + kPath + " " + kName + " Rescan");
  ASSERT_EQ(changed.exitCode, 0) << changed.err;
  EXPECT_EQ(Scans(), before + 2);
  const json inventory = Inventory();
  EXPECT_EQ(Device(inventory, "0000:3b:00.0").at("driver"), "nvidia");
  // (Not compared with `gpu-agent scan` here: the daemon remembers that kubelet advertised
  // 3b:00.0 before, so the device is Unhealthy to it and merely Unadvertised to a lone scan.)
  EXPECT_EQ(Device(inventory, "0000:3b:00.0").at("health"), "Unhealthy");
  ASSERT_TRUE(WaitFor([&] { return !Signals("PropertiesChanged").empty(); }, 5s));
  std::this_thread::sleep_for(500ms);  // a second signal would have arrived by now
  const auto announced = Signals("InventoryChanged");
  ASSERT_EQ(announced.size(), 1U) << ReadFile(directory_.path() / "monitor.log");
  EXPECT_EQ(announced[0].at("interface"), kName);
  EXPECT_EQ(announced[0].at("payload").at("type"), "s");
  EXPECT_EQ(json::parse(announced[0].at("payload").at("data").at(0).get<std::string>()), inventory);
  // PropertiesChanged invalidates Inventory instead of carrying the document a second time.
  const auto invalidated = Signals("PropertiesChanged");
  ASSERT_EQ(invalidated.size(), 1U);
  EXPECT_EQ(invalidated[0].at("payload").at("data"),
            json::parse(R"(["io.cozystack.GPUAgent1", {}, ["Inventory"]])"));
}

TEST_F(DbusTest, PolicyLetsEveryoneReadAndOnlyRootRescan) {
  if (!Root()) {
    GTEST_SKIP() << kNotRoot << "; and setpriv needs root to become nobody";
  }
  StartAgent();
  ASSERT_TRUE(WaitFor([&] { return NameServed(); })) << AgentLog();
  const std::string nobody = "setpriv --reuid=nobody --regid=nogroup --clear-groups ";
  const int64_t before = Scans();
  // Reading: the property and introspection.
  EXPECT_EQ(Inventory(nobody), Inventory());
  const auto introspected =
      Busctl(std::string("introspect --xml-interface ") + kName + " " + kPath, nobody);
  EXPECT_EQ(introspected.exitCode, 0) << introspected.err;
  EXPECT_NE(introspected.out.find("<method name=\"Rescan\""), std::string::npos);
  // Calling Rescan: refused by the bus before it reaches the agent.
  const auto refused =
      RunCommand(nobody + "dbus-send --bus=" + ShellQuote(Address()) +
                 " --print-reply --dest=" + kName + " " + kPath + " " + kName + ".Rescan");
  EXPECT_NE(refused.exitCode, 0);
  EXPECT_NE(refused.err.find("org.freedesktop.DBus.Error.AccessDenied"), std::string::npos)
      << refused.out << refused.err;
  EXPECT_EQ(Scans(), before);
  // Root may.
  const auto allowed =
      RunCommand("dbus-send --bus=" + ShellQuote(Address()) + " --print-reply --dest=" + kName +
                 " " + kPath + " " + kName + ".Rescan");
  EXPECT_EQ(allowed.exitCode, 0) << allowed.err;
  EXPECT_EQ(Scans(), before + 1);
}

TEST_F(DbusTest, ASecondAgentFindsTheNameTakenAndKeepsRunningWithoutDbus) {
  if (!Root()) {
    GTEST_SKIP() << kNotRoot;
  }
  StartAgent();
  ASSERT_TRUE(WaitFor([&] { return NameServed(); })) << AgentLog();
  const int secondPort = FreePort();
  auto arguments = AgentArguments();
  arguments[arguments.size() - 3] = "127.0.0.1:" + std::to_string(secondPort);
  pid_t second =
      Spawn(arguments, directory_.path() / "second.log", {{"DBUS_SYSTEM_BUS_ADDRESS", Address()}});
  ASSERT_GT(second, 0);
  const auto secondLog = [&] { return ReadFile(directory_.path() / "second.log"); };
  EXPECT_TRUE(WaitFor([&] { return secondLog().find("inventory") != std::string::npos; }));
  EXPECT_TRUE(WaitFor([&] {
    return secondLog().find(
               "cannot serve on D-Bus; going on without it and retrying bus=system "
               "name=io.cozystack.GPUAgent1") != std::string::npos;
  })) << secondLog();
  EXPECT_NE(secondLog().find("another process owns the name"), std::string::npos) << secondLog();
  std::this_thread::sleep_for(500ms);
  EXPECT_TRUE(Alive(second));
  httplib::Client client("127.0.0.1", secondPort);
  const auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("\ngpu_agent_dbus_connected 0\n"), std::string::npos);
  EXPECT_NE(Inventory(), nullptr);  // the first one still answers
  const int status = Finish(second);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST_F(DbusTest, ANonRootAgentIsRefusedTheNameAndKeepsRunning) {
  auto arguments = AgentArguments();
  testing::TempDir readable;
  if (Root()) {
    // Root runs the agent as nobody, which the shipped policy does not let own the name. The
    // clone may sit where only root may enter (CI's does): nobody gets its own copies of the
    // two binaries and pci.ids in a directory it can read.
    namespace fs = std::filesystem;
    fs::permissions(host_.root(), fs::perms(0755));
    fs::permissions(readable.path(), fs::perms(0755));
    const fs::path agent = testing::GpuAgentBinary();
    for (const char* name : {"gpu-agent", "gpu-agent-full"}) {
      fs::copy_file(agent.parent_path() / name, readable.path() / name);
      fs::permissions(readable.path() / name, fs::perms(0755));
    }
    fs::copy_file(testing::FixturePciIds(), readable.path() / "pci.ids");
    fs::permissions(readable.path() / "pci.ids", fs::perms(0644));
    arguments[0] = (readable.path() / "gpu-agent").string();
    for (size_t i = 0; i + 1 < arguments.size(); ++i) {
      if (arguments[i] == "--pci-ids") {
        arguments[i + 1] = (readable.path() / "pci.ids").string();
      }
    }
    arguments.insert(arguments.begin(),
                     {"setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"});
  }
  agent_ = Spawn(arguments, AgentLogPath(), {{"DBUS_SYSTEM_BUS_ADDRESS", Address()}});
  ASSERT_GT(agent_, 0);
  EXPECT_TRUE(WaitFor([&] {
    return AgentLog().find("the bus policy does not let this user own the name") !=
           std::string::npos;
  })) << AgentLog();
  EXPECT_TRUE(WaitFor([&] { return Healthz() == 200; }));
  EXPECT_TRUE(Alive(agent_));
  EXPECT_EQ(Inventory(), nullptr);
}

TEST_F(DbusTest, SessionTakesTheSessionBusAddress) {
  if (!Root()) {
    GTEST_SKIP() << kNotRoot;
  }
  auto arguments = AgentArguments();
  *std::find(arguments.begin(), arguments.end(), "system") = "session";
  // The system bus address leads nowhere: only the session one can have been used.
  agent_ = Spawn(
      arguments, AgentLogPath(),
      {{"DBUS_SESSION_BUS_ADDRESS", Address()},
       {"DBUS_SYSTEM_BUS_ADDRESS", "unix:path=" + (directory_.path() / "no-such-bus").string()}});
  ASSERT_GT(agent_, 0);
  ASSERT_TRUE(WaitFor([&] { return NameServed(); })) << AgentLog();
  EXPECT_NE(AgentLog().find("serving on D-Bus bus=session"), std::string::npos) << AgentLog();
}

TEST_F(DbusTest, TheAgentOutlivesItsBusAndComesBackWithIt) {
  if (!Root()) {
    GTEST_SKIP() << kNotRoot;
  }
  StartAgent();
  ASSERT_TRUE(WaitFor([&] { return NameServed(); })) << AgentLog();
  Finish(bus_, SIGKILL);
  EXPECT_TRUE(WaitFor([&] {
    return AgentLog().find("lost the D-Bus connection; going on without it and reconnecting") !=
           std::string::npos;
  })) << AgentLog();
  std::this_thread::sleep_for(1500ms);
  EXPECT_TRUE(Alive(agent_));
  EXPECT_EQ(Healthz(), 200);
  EXPECT_NE(Metrics().find("\ngpu_agent_dbus_connected 0\n"), std::string::npos);
  // A bus back at the same address: the agent reconnects (backing off from 1 s).
  StartBus();
  EXPECT_TRUE(WaitFor([&] { return NameServed(); }, 15s)) << AgentLog();
  EXPECT_EQ(Inventory(), ScanStatus());
  EXPECT_TRUE(Alive(agent_));
  const int status = Finish(agent_);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

}  // namespace
}  // namespace cozy
