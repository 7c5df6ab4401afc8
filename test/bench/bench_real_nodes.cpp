// Two figures on real nodes (docs/benchmarks.md, "On real nodes: a VM start to its placed
// launcher, and catalog freshness"): a control plane of `scripts/cluster.sh up` (kube-apiserver,
// etcd, kube-controller-manager, kube-scheduler), two real kubelets of `scripts/cluster.sh node` on
// the fixture host a100-vfio (2 A100 each, advertised by the test device plugin), each node's
// `gpu-agent run` with its default settings reading its kubelet's pod-resources as the chart's
// agent (a token bound to its pod on that node), and `gpu-controller run --enable-gpu` as the
// chart's controller, its webhooks registered by the chart's configurations at 127.0.0.1.
//
// 1. VM start to placed launcher: from a VMI's create to its launcher pod's spec.nodeName set by
//    kube-scheduler, seen by a watch. Each start: the VMI created and admitted by the VMI webhook
//    (the GPUs attached, the binder's answer), then the launcher pod created as virt-controller
//    creates it (owned by the VMI, a limit of the GPU resource per `gpus` entry), pinned by the pod
//    webhook, bound by kube-scheduler. Two kinds of start, interleaved: a GPUDevice held for the
//    VM (ordered and Bound before the clock starts) and a VMI with a deviceTemplate (the webhook
//    creates the device). Each VM's pod, VMI and devices are deleted before the next start. The
//    peer, interleaved in the same run: a pod that asks for no GPU, create to bound; and a VM
//    with no GPU (its VMI, which no webhook of ours sees, then its launcher), to show what the
//    GPUs add to KubeVirt's own path.
// 2. Catalog freshness: from a GPU pod seen Running by a watch (kubelet admitted it and its device
//    plugin allocated the GPU) to its node's GPUNode, seen by a watch, showing the unit allocated.
//    The peer: a write of the bench's own (a ConfigMap merge patch) until its watch sees it, the
//    floor of any publish. Where the time goes is read afterwards from the API server's audit log
//    (kubelet's pod status write, the agent's GPUNode write: their server-side times) and the
//    agent's log (the pass that found the unit), and the bench times pod-resources calls on the
//    same kubelet socket itself.
//
//   bench_real_nodes [starts=100] [pods=100]    (0 skips that part)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fixtures/sysfs/fixture_builder.h"
#include "kube/client.h"
#include "kube/config.h"
#include "kube/errors.h"
#include "kube/watch.h"
#include "podresources/client.h"
#include "test/bench/real_cluster.h"
#include "test/support/fixture_host.h"
#include "test/support/gpu_objects.h"
#include "test/support/process.h"

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using Wall = std::chrono::system_clock;
using namespace cozy;

constexpr const char* kResource = "nvidia.com/GA100_A100_PCIE_40GB";
constexpr const char* kClass = "a100";
constexpr const char* kSystem = "cozy-system";
constexpr const char* kTenant = "bench-tenant";     // the VMs' namespace, a tenant's
constexpr const char* kPods = "bench-pods";         // the freshness pods' namespace, nobody's
constexpr int kGpusPerNode = 2;                     // a100-vfio
constexpr std::chrono::milliseconds kDebounce{50};  // gpu-agent run's default --debounce

// When a watch delivered something, on both clocks (the wall clock compares with the audit log's
// and the agent log's times).
struct Instant {
  Clock::time_point steady;
  Wall::time_point wall;
  static Instant Now() { return {Clock::now(), Wall::now()}; }
};

// Milliseconds of a duration on either clock (both count nanoseconds).
double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// Nearest rank: the smallest sample with at least q of the samples at or below it.
double Quantile(std::vector<double> samples, double q) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(samples.size())));
  return samples[std::clamp<size_t>(rank, 1, samples.size()) - 1];
}
double Max(const std::vector<double>& samples) {
  return samples.empty() ? 0 : *std::max_element(samples.begin(), samples.end());
}
std::string Figures(const std::vector<double>& ms) {
  char line[160];
  std::snprintf(line, sizeof line, "n %3zu  p50 %8.1f ms  p99 %8.1f ms  max %8.1f ms", ms.size(),
                Quantile(ms, 0.5), Quantile(ms, 0.99), Max(ms));
  return line;
}

// --- what the watches saw ------------------------------------------------------------------

struct PodSeen {
  std::optional<Instant> bound;    // spec.nodeName set
  std::optional<Instant> running;  // status.phase Running
  std::optional<Instant> ready;    // condition Ready True
  std::optional<Instant> gone;     // DELETED
  bool readyWithRunning = false;   // Ready came in the same event as Running
  std::string node;
};

struct Allocation {
  Instant at;
  int allocated = 0;
  int allocatable = 0;
};

// Every pod's moments and every GPUNode's allocated units, as the watches deliver them.
class Board {
 public:
  void OnPod(const kube::WatchEvent& event, const Instant& at) {
    const json& pod = event.object;
    const json& metadata = pod.value("metadata", json::object());
    const std::string key =
        metadata.value("namespace", std::string()) + "/" + metadata.value("name", std::string());
    std::lock_guard lock(mutex_);
    PodSeen& seen = pods_[key];
    if (event.type == "DELETED") {
      if (!seen.gone) seen.gone = at;
    } else {
      const std::string node = pod.value("spec", json::object()).value("nodeName", "");
      if (!node.empty() && !seen.bound) {
        seen.bound = at;
        seen.node = node;
      }
      const json status = pod.value("status", json::object());
      const bool running = status.value("phase", "") == "Running";
      bool ready = false;
      for (const json& condition : status.value("conditions", json::array())) {
        if (condition.value("type", "") == "Ready" && condition.value("status", "") == "True") {
          ready = true;
        }
      }
      if (running && !seen.running) {
        seen.running = at;
        seen.readyWithRunning = ready && !seen.ready;
      }
      if (ready && !seen.ready) seen.ready = at;
    }
    changed_.notify_all();
  }

  void OnGpuNode(const kube::WatchEvent& event, const Instant& at) {
    if (event.type == "DELETED") return;
    const json& node = event.object;
    const std::string name = node.value("metadata", json::object()).value("name", "");
    const json status = node.value("status", json::object());
    if (!status.contains("devices")) return;
    Allocation allocation{at, 0, 0};
    for (const json& device : status["devices"]) {
      allocation.allocated += device.value("allocated", 0);
      allocation.allocatable += device.value("allocatable", 0);
    }
    std::lock_guard lock(mutex_);
    auto& history = gpuNodes_[name];
    if (history.empty() || history.back().allocated != allocation.allocated ||
        history.back().allocatable != allocation.allocatable) {
      history.push_back(allocation);
    }
    changed_.notify_all();
  }

  PodSeen Pod(const std::string& key) {
    std::lock_guard lock(mutex_);
    return pods_[key];
  }
  size_t HistorySize(const std::string& node) {
    std::lock_guard lock(mutex_);
    return gpuNodes_[node].size();
  }
  std::optional<Allocation> Latest(const std::string& node) {
    std::lock_guard lock(mutex_);
    const auto& history = gpuNodes_[node];
    if (history.empty()) return std::nullopt;
    return history.back();
  }

  // Waits until the pod's moment `what` is known, at most `limit`.
  std::optional<Instant> WaitPod(const std::string& key, std::optional<Instant> PodSeen::*what,
                                 Clock::duration limit) {
    std::unique_lock lock(mutex_);
    changed_.wait_until(lock, Clock::now() + limit, [&] { return (pods_[key].*what).has_value(); });
    return pods_[key].*what;
  }
  // Waits for the first entry of the node's history from `from` on whose units satisfy `want`.
  std::optional<Allocation> WaitAllocation(const std::string& node, size_t from,
                                           const std::function<bool(const Allocation&)>& want,
                                           Clock::duration limit) {
    std::unique_lock lock(mutex_);
    std::optional<Allocation> found;
    changed_.wait_until(lock, Clock::now() + limit, [&] {
      const auto& history = gpuNodes_[node];
      for (size_t i = from; i < history.size(); ++i) {
        if (want(history[i])) {
          found = history[i];
          return true;
        }
      }
      return false;
    });
    return found;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, PodSeen> pods_;
  std::map<std::string, std::vector<Allocation>> gpuNodes_;
};

// One collection listed, then watched from the list's resourceVersion on a thread of its own
// (a client of its own); every object goes to `on` with the moment it arrived. A watch that ends
// is opened again from the last resourceVersion, relisted when that is gone.
class Watcher {
 public:
  using OnEvent = std::function<void(const kube::WatchEvent&, const Instant&)>;
  Watcher(const kube::ClientConfig& config, std::string collection, OnEvent on)
      : client_(config, bench::BenchClientOptions()),
        collection_(std::move(collection)),
        on_(std::move(on)) {
    Relist();  // before the thread: objects made after this are watched
    thread_ = std::thread([this] { Run(); });
  }
  ~Watcher() {
    stop_ = true;
    thread_.join();
  }
  Watcher(const Watcher&) = delete;
  Watcher& operator=(const Watcher&) = delete;

 private:
  void Relist() {
    const json list = client_.List(collection_);
    const Instant at = Instant::Now();
    resourceVersion_ = list["metadata"].value("resourceVersion", "");
    for (const json& item : list["items"]) on_({"ADDED", item, false}, at);
  }
  void Run() {
    while (!stop_) {
      try {
        if (!stream_ || stream_->Done()) {
          if (stream_ && stream_->Error() &&
              stream_->Error()->kind() == kube::ErrorKind::kExpired) {
            Relist();
          } else if (stream_ && stream_->Error()) {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
          }
          kube::WatchOptions options;
          options.resourceVersion = resourceVersion_;
          stream_ = client_.Watch(collection_, options);
        }
        stream_->Poll(std::chrono::milliseconds(100));
        std::vector<kube::WatchEvent> events = stream_->TakeEvents();
        const Instant at = Instant::Now();
        for (auto& event : events) {
          if (event.type == "ERROR") {  // 410 Gone as an event: list again
            stream_.reset();
            Relist();
            break;
          }
          resourceVersion_ =
              event.object["metadata"].value("resourceVersion", std::string(resourceVersion_));
          if (event.type != "BOOKMARK") on_(event, at);
        }
      } catch (const std::exception&) {
        stream_.reset();  // the API server going away at the end, or a hiccup: try again
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    }
  }

  kube::Client client_;
  std::string collection_;
  OnEvent on_;
  std::string resourceVersion_;
  std::unique_ptr<kube::WatchStream> stream_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// --- the cluster ---------------------------------------------------------------------------

std::string PodsPath(const std::string& ns, const std::string& name = "") {
  return kube::ResourcePath("", "v1", "pods", ns, name);
}
std::string DevicesPath(const std::string& ns, const std::string& name = "") {
  return kube::ResourcePath("gpu.cozystack.io", "v1alpha1", "gpudevices", ns, name);
}
std::string VmisPath(const std::string& ns, const std::string& name = "") {
  return kube::ResourcePath("kubevirt.io", "v1", "virtualmachineinstances", ns, name);
}

void WriteFile(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

std::string Tail(const std::filesystem::path& log, int lines = 15) {
  return testing::RunCommand("tail -n " + std::to_string(lines) + " " +
                             testing::ShellQuote(log.string()) + " 2>/dev/null")
      .out;
}

// A kubeconfig for the cluster with a bearer token (a service account's, TokenRequest).
std::filesystem::path TokenKubeconfig(const bench::ControlPlane& cluster,
                                      const std::string& serviceAccount,
                                      const std::string& boundPod, const std::string& file) {
  std::string arguments = "create token " + serviceAccount + " -n " + kSystem + " --duration 4h";
  if (!boundPod.empty()) arguments += " --bound-object-kind Pod --bound-object-name " + boundPod;
  const auto token = cluster.Kubectl(arguments);
  if (token.exitCode != 0 || token.out.empty()) {
    throw std::runtime_error("kubectl " + arguments + ": " + token.err);
  }
  std::string value = token.out;
  while (!value.empty() && (value.back() == '\n' || value.back() == '\r')) value.pop_back();
  const auto ca = testing::RunCommand("base64 -w0 " +
                                      testing::ShellQuote((cluster.dir() / "pki/ca.crt").string()));
  if (ca.exitCode != 0) throw std::runtime_error("base64 of the cluster's CA: " + ca.err);
  const std::filesystem::path path = cluster.work() / file;
  WriteFile(path,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: bench\n  cluster:\n"
            "    server: " +
                cluster.config().server + "\n    certificate-authority-data: " + ca.out +
                "\nusers:\n- name: bench\n  user:\n    token: " + value +
                "\ncontexts:\n- name: bench\n  context: {cluster: bench, user: bench}\n"
                "current-context: bench\n");
  std::filesystem::permissions(
      path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  return path;
}

// `scripts/cluster.sh node DIR NAME --host ROOT`: a real kubelet registering NAME, Ready with the
// fixture's GPUs in its allocatable; returns the node's directory.
std::filesystem::path StartNode(const bench::ControlPlane& cluster,
                                const std::filesystem::path& source, const std::string& name,
                                const std::filesystem::path& root) {
  const std::filesystem::path log = cluster.work() / ("node-" + name + ".log");
  const auto started = Clock::now();
  const auto node = testing::RunCommand(bench::ControlPlane::Quote(source / "scripts/cluster.sh") +
                                        " node " + bench::ControlPlane::Quote(cluster.dir()) + " " +
                                        name + " --host " + bench::ControlPlane::Quote(root) +
                                        " --label gpu.cozystack.io/gpu-node=true 2>" +
                                        bench::ControlPlane::Quote(log));
  std::string dir = node.out;
  while (!dir.empty() && dir.back() == '\n') dir.pop_back();
  dir = dir.substr(dir.rfind('\n') == std::string::npos ? 0 : dir.rfind('\n') + 1);
  if (node.exitCode != 0 || dir.empty() || !std::filesystem::is_directory(dir)) {
    throw std::runtime_error("scripts/cluster.sh node " + name + ": " + Tail(log));
  }
  std::printf(
      "node %s Ready with its GPUs in %.1f s (kubelet, image-less runtime, device plugin)\n",
      name.c_str(), std::chrono::duration<double>(Clock::now() - started).count());
  return dir;
}

// Waits until a GET of the object says 404, at most `limit`.
bool WaitGone(kube::Client& client, const std::string& path, Clock::duration limit) {
  return testing::WaitFor(
      [&] {
        try {
          client.Get(path);
          return false;
        } catch (const kube::ApiError& error) {
          if (error.kind() == kube::ErrorKind::kNotFound) return true;
          throw;
        }
      },
      std::chrono::ceil<std::chrono::milliseconds>(limit), std::chrono::milliseconds(50));
}

// Deletes an object (one already gone is fine) and waits until it is gone.
bool DeleteAndWait(kube::Client& client, const std::string& path, Clock::duration limit) {
  try {
    client.Delete(path);
  } catch (const kube::ApiError& error) {
    if (error.kind() != kube::ErrorKind::kNotFound) throw;
  }
  return WaitGone(client, path, limit);
}

// --- the API server's audit log -------------------------------------------------------------

// Parses "2026-12-06T07:08:28.123456Z" (the audit log's; the agent log's has milliseconds).
std::optional<Wall::time_point> ParseTime(const std::string& text) {
  std::tm tm{};
  char fraction[16] = {};
  if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d.%15[0-9]Z", &tm.tm_year, &tm.tm_mon,
                  &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec, fraction) != 7) {
    return std::nullopt;
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  const std::string micros = (std::string(fraction) + "000000").substr(0, 6);
  return Wall::from_time_t(timegm(&tm)) + std::chrono::microseconds(std::atoi(micros.c_str()));
}

// One write the API server answered with 2xx: who, what, when it arrived and when its answer
// was complete (the audit policy of scripts/cluster.sh logs writes with their bodies).
struct Write {
  std::string verb;  // create, patch, update, delete
  std::string resource;
  std::string subresource;
  std::string ns;
  std::string name;  // objectRef.name, else the body's metadata.name (a create)
  std::string user;
  Wall::time_point received;
  Wall::time_point done;
  json body;
};

// The writes in the bench's namespaces and to GPUNodes.
std::vector<Write> ReadWrites(const std::filesystem::path& log) {
  std::vector<Write> writes;
  std::ifstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find(kTenant) == std::string::npos && line.find(kPods) == std::string::npos &&
        line.find("\"gpunodes\"") == std::string::npos) {
      continue;
    }
    const json event = json::parse(line, nullptr, false);
    if (!event.is_object() || event.value("stage", "") != "ResponseComplete") continue;
    const std::string verb = event.value("verb", "");
    if (verb != "create" && verb != "patch" && verb != "update" && verb != "delete") continue;
    const int code = event.value("responseStatus", json::object()).value("code", 0);
    if (code < 200 || code >= 300) continue;
    const auto received = ParseTime(event.value("requestReceivedTimestamp", ""));
    const auto done = ParseTime(event.value("stageTimestamp", ""));
    if (!received || !done) continue;
    const json ref = event.value("objectRef", json::object());
    Write write{verb,
                ref.value("resource", ""),
                ref.value("subresource", ""),
                ref.value("namespace", ""),
                ref.value("name", ""),
                event.value("user", json::object()).value("username", ""),
                *received,
                *done,
                event.value("requestObject", json::object())};
    if (write.name.empty() && write.body.is_object()) {
      write.name = write.body.value("metadata", json::object()).value("name", "");
    }
    writes.push_back(std::move(write));
  }
  return writes;
}

// The first write matching `want` that arrived at or after `from`.
const Write* FirstWrite(const std::vector<Write>& writes, Wall::time_point from,
                        const std::function<bool(const Write&)>& want) {
  for (const Write& write : writes) {
    if (write.received >= from && want(write)) return &write;
  }
  return nullptr;
}

// A status body's `status` key, or an empty object.
json StatusOf(const Write& write) {
  return write.body.is_object() ? write.body.value("status", json::object()) : json::object();
}

// Steps of a timeline and their durations, printed as p50/p99 each.
class Steps {
 public:
  void Add(const std::string& step, double ms) {
    if (!figures_.count(step)) order_.push_back(step);
    figures_[step].push_back(ms);
  }
  void Print(const char* indent) const {
    for (const std::string& step : order_) {
      std::printf("%s%-58s %s\n", indent, step.c_str(), Figures(figures_.at(step)).c_str());
    }
  }

 private:
  std::vector<std::string> order_;
  std::map<std::string, std::vector<double>> figures_;
};

// --- 1. VM start to placed launcher --------------------------------------------------------

// The kinds of start, measured in turn: a VM with a held GPUDevice, one with a deviceTemplate,
// the peer (a pod asking for no GPU), and a VM with no GPU at all (its VMI, which no webhook of
// ours sees, and its launcher): what KubeVirt's own path costs before any GPU.
enum class Kind { kHeld, kTemplate, kPeer, kPlainVm };
constexpr size_t kKinds = 4;

// One measured start (or peer pod): its names and the bench's own times.
struct Start {
  Kind kind;
  std::string vmi;
  std::string device;
  std::string pod;
  Wall::time_point sent;  // the VMI's create (the peer: the pod's) about to be sent
  Instant bound;          // the launcher's (the pod's) spec.nodeName seen
  double totalMs = 0;
  double vmiCallMs = 0;       // the VMI create call, as the bench saw it
  double launcherCallMs = 0;  // the launcher's (the peer pod's) create call
};

// A round's name: its number, or "warm" for the warm-up (-1).
std::string Suffix(int round) { return round < 0 ? "warm" : std::to_string(round); }

class VmStarts {
 public:
  VmStarts(kube::Client& client, Board& board) : client_(client), board_(board) {}

  // One start of kind held (a GPUDevice ordered and Bound first) or template; its VM deleted
  // after. Throws on anything that is not as it should be.
  Start Run(int round, Kind kind) {
    if (kind == Kind::kPeer) return Peer(round);
    if (kind == Kind::kPlainVm) return PlainVm(round);
    const bool held = kind == Kind::kHeld;
    Start start{kind, std::string(held ? "vm-h-" : "vm-t-") + Suffix(round), "", "", {}, {}};
    json references;
    if (held) {
      start.device = "held-" + Suffix(round);
      client_.Create(DevicesPath(kTenant),
                     {{"apiVersion", "gpu.cozystack.io/v1alpha1"},
                      {"kind", "GPUDevice"},
                      {"metadata", {{"name", start.device}, {"namespace", kTenant}}},
                      {"spec", {{"className", kClass}, {"count", 1}}}});
      const bool bound = testing::WaitFor(
          [&] {
            return client_.Get(DevicesPath(kTenant, start.device))
                       .value("status", json::object())
                       .value("phase", "") == "Bound";
          },
          std::chrono::seconds(30), std::chrono::milliseconds(20));
      if (!bound) throw std::runtime_error("GPUDevice " + start.device + " not Bound in 30 s");
      references = {{"devices", {start.device}}};
    } else {
      start.device = start.vmi + "-gpu";  // model::TemplateDeviceName of a short name
      references = {{"templates", {{{"name", "gpu"}, {"className", kClass}, {"count", 1}}}}};
    }
    // Labelled and annotated as charts/vm-instance renders a VM's template.
    const json vmi = {
        {"apiVersion", "kubevirt.io/v1"},
        {"kind", "VirtualMachineInstance"},
        {"metadata",
         {{"name", start.vmi},
          {"namespace", kTenant},
          {"labels", {{"gpu.cozystack.io/device-references", "true"}}},
          {"annotations", {{"gpu.cozystack.io/device-references", references.dump()}}}}},
        {"spec", {{"domain", {{"devices", json::object()}}}}}};

    // The clock starts as the VMI's create is sent.
    start.sent = Wall::now();
    const auto t0 = Clock::now();
    const json admitted = client_.Create(VmisPath(kTenant), vmi);
    const auto t1 = Clock::now();
    int gpus = 0;
    for (const json& entry : admitted["spec"]["domain"]["devices"].value("gpus", json::array())) {
      if (entry.value("deviceName", "") == kResource) ++gpus;
    }
    if (gpus != 1) {
      throw std::runtime_error("VMI " + start.vmi + " admitted with " + std::to_string(gpus) +
                               " gpus entries of " + kResource + ", not 1");
    }
    // The launcher as virt-controller creates it for the VMI (Launcher).
    start.pod = "virt-launcher-" + start.vmi + "-bench";
    const json launcher = Launcher(start.pod, start.vmi, admitted, gpus);
    const json created = client_.Create(PodsPath(kTenant), launcher);
    const auto t2 = Clock::now();
    const std::string key = std::string(kTenant) + "/" + start.pod;
    const auto bound = board_.WaitPod(key, &PodSeen::bound, std::chrono::seconds(30));
    if (!bound) throw std::runtime_error("launcher " + start.pod + " not bound in 30 s");
    start.bound = *bound;
    start.totalMs = Ms(bound->steady - t0);
    start.vmiCallMs = Ms(t1 - t0);
    start.launcherCallMs = Ms(t2 - t1);

    // On the node its GPU is on: the pod webhook's pin, kube-scheduler's bind.
    const std::string placed = client_.Get(DevicesPath(kTenant, start.device))
                                   .value("status", json::object())
                                   .value("nodeName", "");
    const std::string node = board_.Pod(key).node;
    if (node != placed || PinnedNode(created) != placed) {
      throw std::runtime_error("launcher " + start.pod + " pinned to '" + PinnedNode(created) +
                               "', bound to '" + node + "'; its GPU is on '" + placed + "'");
    }
    if (round >= 0) ++onNode_[node];

    // The VM ends: its pod (kubelet stops it and frees the GPU), its VMI, its devices.
    if (!DeleteAndWait(client_, PodsPath(kTenant, start.pod), std::chrono::seconds(60))) {
      throw std::runtime_error("launcher " + start.pod + " not gone 60 s after its delete");
    }
    if (!DeleteAndWait(client_, VmisPath(kTenant, start.vmi), std::chrono::seconds(30))) {
      throw std::runtime_error("VMI " + start.vmi + " not gone 30 s after its delete");
    }
    // A held order is the tenant's to delete; a template device the controller deletes with its
    // VMI (D14).
    const std::string devicePath = DevicesPath(kTenant, start.device);
    const bool gone = held ? DeleteAndWait(client_, devicePath, std::chrono::seconds(60))
                           : WaitGone(client_, devicePath, std::chrono::seconds(60));
    if (!gone) throw std::runtime_error("GPUDevice " + start.device + " not gone 60 s after");
    return start;
  }

  const std::map<std::string, int>& onNode() const { return onNode_; }

 private:
  // The peer: a pod asking for no GPU, create to bound, then deleted.
  Start Peer(int round) {
    Start start{Kind::kPeer, "", "", "peer-" + Suffix(round), {}, {}};
    const json pod = {
        {"apiVersion", "v1"},
        {"kind", "Pod"},
        {"metadata", {{"name", start.pod}, {"namespace", kTenant}}},
        {"spec",
         {{"terminationGracePeriodSeconds", 1},
          {"containers", {{{"name", "main"}, {"image", "example.invalid/pause:1"}}}}}}};
    start.sent = Wall::now();
    const auto t0 = Clock::now();
    client_.Create(PodsPath(kTenant), pod);
    const auto t1 = Clock::now();
    const auto bound = board_.WaitPod(std::string(kTenant) + "/" + start.pod, &PodSeen::bound,
                                      std::chrono::seconds(30));
    if (!bound) throw std::runtime_error("peer pod " + start.pod + " not bound in 30 s");
    start.bound = *bound;
    start.totalMs = Ms(bound->steady - t0);
    start.launcherCallMs = Ms(t1 - t0);
    if (!DeleteAndWait(client_, PodsPath(kTenant, start.pod), std::chrono::seconds(60))) {
      throw std::runtime_error("peer pod " + start.pod + " not gone 60 s after its delete");
    }
    return start;
  }

  // A VM with no GPU: its VMI (without the device-reference label, so no webhook of ours sees
  // it), its launcher as virt-controller creates it, bound by kube-scheduler; then deleted.
  Start PlainVm(int round) {
    Start start{Kind::kPlainVm, "vm-p-" + Suffix(round), "", "", {}, {}};
    const json vmi = {{"apiVersion", "kubevirt.io/v1"},
                      {"kind", "VirtualMachineInstance"},
                      {"metadata", {{"name", start.vmi}, {"namespace", kTenant}}},
                      {"spec", {{"domain", {{"devices", json::object()}}}}}};
    start.sent = Wall::now();
    const auto t0 = Clock::now();
    const json admitted = client_.Create(VmisPath(kTenant), vmi);
    const auto t1 = Clock::now();
    start.pod = "virt-launcher-" + start.vmi + "-bench";
    const json launcher = Launcher(start.pod, start.vmi, admitted, 0);
    client_.Create(PodsPath(kTenant), launcher);
    const auto t2 = Clock::now();
    const auto bound = board_.WaitPod(std::string(kTenant) + "/" + start.pod, &PodSeen::bound,
                                      std::chrono::seconds(30));
    if (!bound) throw std::runtime_error("launcher " + start.pod + " not bound in 30 s");
    start.bound = *bound;
    start.totalMs = Ms(bound->steady - t0);
    start.vmiCallMs = Ms(t1 - t0);
    start.launcherCallMs = Ms(t2 - t1);
    if (!DeleteAndWait(client_, PodsPath(kTenant, start.pod), std::chrono::seconds(60)) ||
        !DeleteAndWait(client_, VmisPath(kTenant, start.vmi), std::chrono::seconds(30))) {
      throw std::runtime_error("VM " + start.vmi + " not gone 60 s after its delete");
    }
    return start;
  }

  // The launcher pod as virt-controller creates it for the VMI `admitted`: owned by it, labelled as
  // KubeVirt labels launchers, and with `gpus` > 0 the VMI's device-reference label and a limit of
  // the resource per gpus entry (how virt-controller renders them).
  static json Launcher(const std::string& name, const std::string& vmi, const json& admitted,
                       int gpus) {
    json labels = {{"kubevirt.io", "virt-launcher"}, {"vm.kubevirt.io/name", vmi}};
    json container = {{"name", "compute"}, {"image", "example.invalid/virt-launcher:1"}};
    if (gpus > 0) {
      labels["gpu.cozystack.io/device-references"] = "true";
      container["resources"] = {{"limits", {{kResource, std::to_string(gpus)}}}};
    }
    return {{"apiVersion", "v1"},
            {"kind", "Pod"},
            {"metadata",
             {{"name", name},
              {"namespace", kTenant},
              {"labels", labels},
              {"ownerReferences",
               {{{"apiVersion", "kubevirt.io/v1"},
                 {"kind", "VirtualMachineInstance"},
                 {"name", vmi},
                 {"uid", admitted["metadata"].value("uid", "")},
                 {"controller", true},
                 {"blockOwnerDeletion", true}}}}}},
            {"spec", {{"terminationGracePeriodSeconds", 1}, {"containers", {container}}}}};
  }

  static std::string PinnedNode(const json& pod) {
    const json terms = pod["spec"]["affinity"]["nodeAffinity"]
                          ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
    if (!terms.is_array() || terms.empty()) return "";
    for (const json& field : terms[0].value("matchFields", json::array())) {
      const json values = field.value("values", json::array());
      if (field.value("key", "") == "metadata.name" && !values.empty() && values[0].is_string()) {
        return values[0].get<std::string>();
      }
    }
    return "";
  }

  kube::Client& client_;
  Board& board_;
  std::map<std::string, int> onNode_;
};

// Where a start's time goes, from the API server's times of each write (the audit log) and the
// bench's own: every step from the VMI's create sent to the launcher's bind seen, so the steps
// add up to the whole.
void StartSteps(const std::vector<Write>& writes, const Start& start, const std::string& controller,
                Steps& steps) {
  const Write* pod = FirstWrite(writes, start.sent, [&](const Write& w) {
    return w.verb == "create" && w.resource == "pods" && w.subresource.empty() && w.ns == kTenant &&
           w.name == start.pod;
  });
  if (pod == nullptr) return;
  const Write* binding = FirstWrite(writes, pod->received, [&](const Write& w) {
    return w.verb == "create" && w.resource == "pods" && w.subresource == "binding" &&
           w.name == start.pod;
  });
  if (binding == nullptr) return;
  auto tail = [&](Wall::time_point from) {
    steps.Add("launcher create arrives (from the VMI's answer)", Ms(pod->received - from));
    steps.Add("launcher create in the API server (pod webhook)", Ms(pod->done - pod->received));
    steps.Add("-> kube-scheduler's binding arrives", Ms(binding->received - pod->done));
    steps.Add("binding in the API server", Ms(binding->done - binding->received));
    steps.Add("-> the bench's watch sees spec.nodeName", Ms(start.bound.wall - binding->done));
  };
  if (start.kind == Kind::kPeer) {
    steps.Add("pod create arrives (from its send)", Ms(pod->received - start.sent));
    steps.Add("pod create in the API server", Ms(pod->done - pod->received));
    steps.Add("-> kube-scheduler's binding arrives", Ms(binding->received - pod->done));
    steps.Add("binding in the API server", Ms(binding->done - binding->received));
    steps.Add("-> the bench's watch sees spec.nodeName", Ms(start.bound.wall - binding->done));
    return;
  }
  const Write* vmi = FirstWrite(writes, start.sent, [&](const Write& w) {
    return w.verb == "create" && w.resource == "virtualmachineinstances" && w.name == start.vmi;
  });
  if (vmi == nullptr) return;
  if (start.kind == Kind::kPlainVm) {
    steps.Add("VMI create arrives (from its send)", Ms(vmi->received - start.sent));
    steps.Add("VMI create in the API server (no webhook of ours)", Ms(vmi->done - vmi->received));
    tail(vmi->done);
    return;
  }
  const Write* attach = FirstWrite(writes, vmi->received, [&](const Write& w) {
    return w.verb == "patch" && w.resource == "gpudevices" && w.subresource == "status" &&
           w.name == start.device && w.user == controller &&
           StatusOf(w).value("attachment", json()).is_object();
  });
  if (attach == nullptr) return;
  const Write* answer = FirstWrite(writes, attach->received, [&](const Write& w) {
    return w.verb == "patch" && w.resource == "gpudevices" && w.subresource == "status" &&
           w.name == start.device && w.user == controller &&
           StatusOf(w).value("bindResponse", json()).is_object();
  });
  if (answer == nullptr) return;
  steps.Add("VMI create arrives (from its send)", Ms(vmi->received - start.sent));
  if (start.kind == Kind::kTemplate) {
    const Write* made = FirstWrite(writes, vmi->received, [&](const Write& w) {
      return w.verb == "create" && w.resource == "gpudevices" && w.name == start.device;
    });
    if (made == nullptr) return;
    steps.Add("-> the webhook's template device create arrives",
              Ms(made->received - vmi->received));
    steps.Add("template device create in the API server", Ms(made->done - made->received));
    steps.Add("-> the webhook's attach write arrives", Ms(attach->received - made->done));
  } else {
    steps.Add("-> the webhook's attach write arrives", Ms(attach->received - vmi->received));
  }
  steps.Add("attach write in the API server", Ms(attach->done - attach->received));
  steps.Add("-> the binder's answer arrives", Ms(answer->received - attach->done));
  steps.Add("answer write in the API server", Ms(answer->done - answer->received));
  steps.Add("-> the VMI create answered (webhook's answer, VMI stored)",
            Ms(vmi->done - answer->done));
  tail(vmi->done);
}

// --- 2. catalog freshness ------------------------------------------------------------------

struct FreshPod {
  std::string name;
  std::string node;
  Wall::time_point created;  // its create about to be sent
  Instant running;           // seen Running
  Instant allocated;         // its node's GPUNode seen with the unit allocated
  bool readyWithRunning = false;
  Wall::time_point deleted;  // its delete about to be sent
  Instant freed;             // its node's GPUNode seen with the unit free again
};

// The agent's "inventory changed" lines (the pass that found a new status, just before it is
// offered to the publisher): their times, in order.
std::vector<Wall::time_point> InventoryChanges(const std::filesystem::path& log) {
  std::vector<Wall::time_point> times;
  std::ifstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find(" inventory changed") == std::string::npos) continue;
    if (const auto at = ParseTime(line.substr(0, line.find(' ')))) times.push_back(*at);
  }
  return times;
}

// Where a pod's freshness goes: kubelet's status write that made the pod Running and the agent's
// GPUNode write that carried the unit (the audit log), the agent's pass (its log).
void FreshSteps(const std::vector<Write>& writes, const FreshPod& pod,
                const std::vector<Wall::time_point>& passes, const std::string& agent, Steps& steps,
                int& agentFirst, int& unmatched) {
  const Write* running = FirstWrite(writes, pod.created, [&](const Write& w) {
    return w.verb == "patch" && w.resource == "pods" && w.subresource == "status" &&
           w.ns == kPods && w.name == pod.name && StatusOf(w).value("phase", "") == "Running";
  });
  const Write* published = FirstWrite(writes, pod.created, [&](const Write& w) {
    if (w.resource != "gpunodes" || w.subresource != "status" || w.name != pod.node ||
        w.user != agent) {
      return false;
    }
    const json devices = StatusOf(w).value("devices", json());
    int allocated = 0;
    if (devices.is_array()) {
      for (const json& device : devices) allocated += device.value("allocated", 0);
    }
    return allocated > 0;
  });
  if (running == nullptr || published == nullptr) {
    ++unmatched;
    return;
  }
  if (published->received < running->done) ++agentFirst;
  // The pass that found the unit: the last "inventory changed" before the write arrived (the
  // log's times are to the millisecond).
  std::optional<Wall::time_point> pass;
  for (const auto& at : passes) {
    if (at + std::chrono::milliseconds(1) < pod.created) continue;
    if (at > published->received) break;
    pass = at;
  }
  steps.Add("kubelet's Running write done -> the bench's watch sees it",
            Ms(pod.running.wall - running->done));
  steps.Add("kubelet's Running write done -> agent's write arrives",
            Ms(published->received - running->done));
  if (pass) {
    steps.Add("  of which: -> the agent's pass logged", Ms(*pass - running->done));
    steps.Add("  of which: pass logged -> its write arrives", Ms(published->received - *pass));
  }
  steps.Add("agent's write in the API server", Ms(published->done - published->received));
  steps.Add("agent's write done -> the bench's watch sees it",
            Ms(pod.allocated.wall - published->done));
}

// Where the time to free a deleted pod's unit goes: kubelet's write of the pod's final phase
// once it stopped it (the agent counts a pod in a final phase as holding nothing, A7), and the
// agent's GPUNode write with nothing allocated.
void FreeSteps(const std::vector<Write>& writes, const FreshPod& pod, const std::string& agent,
               Steps& steps, int& unmatched) {
  const Write* final = FirstWrite(writes, pod.deleted, [&](const Write& w) {
    const std::string phase = StatusOf(w).value("phase", "");
    return w.verb == "patch" && w.resource == "pods" && w.subresource == "status" &&
           w.ns == kPods && w.name == pod.name && (phase == "Succeeded" || phase == "Failed");
  });
  const Write* published = FirstWrite(writes, pod.deleted, [&](const Write& w) {
    if (w.resource != "gpunodes" || w.subresource != "status" || w.name != pod.node ||
        w.user != agent) {
      return false;
    }
    const json devices = StatusOf(w).value("devices", json());
    if (!devices.is_array()) return false;
    int allocated = 0;
    for (const json& device : devices) allocated += device.value("allocated", 0);
    return allocated == 0;
  });
  if (final == nullptr || published == nullptr) {
    ++unmatched;
    return;
  }
  steps.Add("the pod's delete sent -> kubelet's final-phase write done",
            Ms(final->done - pod.deleted));
  steps.Add("-> the agent's write (nothing allocated) arrives",
            Ms(published->received - final->done));
  steps.Add("agent's write in the API server", Ms(published->done - published->received));
  steps.Add("agent's write done -> the bench's watch sees it",
            Ms(pod.freed.wall - published->done));
}

// pod-resources (GetAllocatableResources + List) timed by the bench on the node's own socket,
// spaced so kubelet's limit (100 a second) never holds it back.
std::vector<double> TimePodResources(const std::filesystem::path& nodeDir, int calls) {
  podresources::ClientOptions options;
  options.endpoint = "unix://" + (nodeDir / "root/pod-resources/kubelet.sock").string();
  podresources::Client client(options);
  std::vector<double> ms;
  for (int i = 0; i < calls; ++i) {
    const auto started = Clock::now();
    const auto result = client.Fetch();
    const auto took = Clock::now() - started;
    if (result.state != podresources::FetchState::kOk) {
      throw std::runtime_error("pod-resources on " + options.endpoint + ": " + result.message);
    }
    if (i > 0) ms.push_back(Ms(took));  // the first one dials
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return ms;
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return one + " " + five + " " + fifteen;
}

// --- the run -------------------------------------------------------------------------------

// What both parts use: the cluster, the bench's client and watches, the nodes and their agents.
struct Context {
  const bench::ControlPlane& cluster;
  kube::Client& client;
  Board& board;
  const std::vector<std::string>& nodes;
  const std::map<std::string, std::filesystem::path>& nodeDirs;
  const std::map<std::string, std::filesystem::path>& agentLogs;
  const std::map<std::string, int>& agentPorts;
  std::filesystem::path controllerLog;
  std::string controllerUser;
  std::string agentUser;

  // An error naming `what`, with the ends of the controller's and the agents' logs.
  std::runtime_error Failure(const std::string& what) const {
    std::string text = what + "\n--- controller log (last lines)\n" + Tail(controllerLog);
    for (const auto& [node, log] : agentLogs) {
      text += "--- agent of " + node + " (last lines)\n" + Tail(log);
    }
    return std::runtime_error(text);
  }
};

void VmStartPart(const Context& context, int starts) {
  VmStarts vms(context.client, context.board);
  std::vector<Start> measured;
  try {
    // Warm-up: one of each, not counted.
    for (size_t k = 0; k < kKinds; ++k) vms.Run(-1, static_cast<Kind>(k));
    const auto began = Clock::now();
    for (int round = 0; round < starts; ++round) {
      // The kinds in turn, each first in as many rounds as the others.
      for (size_t k = 0; k < kKinds; ++k) {
        measured.push_back(
            vms.Run(round, static_cast<Kind>((static_cast<size_t>(round) + k) % kKinds)));
      }
      if ((round + 1) % 25 == 0) {
        std::printf("  %d rounds of %zu (%.0f s)\n", round + 1, kKinds,
                    std::chrono::duration<double>(Clock::now() - began).count());
      }
    }
  } catch (const std::runtime_error& error) {
    throw context.Failure(error.what());
  }
  std::printf(
      "\n1. VM start to placed launcher: %d starts of each kind on 2 real nodes x %d A100, each "
      "VM\n"
      "   deleted (launcher, VMI, devices) before the next; VMI create sent -> the launcher's\n"
      "   spec.nodeName seen by a watch\n",
      starts, kGpusPerNode);
  const char* names[] = {"held GPUDevice", "deviceTemplate", "peer: a pod with no GPU",
                         "a VM with no GPU"};
  std::vector<double> totals[kKinds], vmiCalls[kKinds], launcherCalls[kKinds];
  for (const Start& start : measured) {
    const auto k = static_cast<size_t>(start.kind);
    totals[k].push_back(start.totalMs);
    vmiCalls[k].push_back(start.vmiCallMs);
    launcherCalls[k].push_back(start.launcherCallMs);
  }
  for (size_t k = 0; k < kKinds; ++k) {
    std::printf("   %-37s %s\n", names[k], Figures(totals[k]).c_str());
    if (static_cast<Kind>(k) != Kind::kPeer) {
      std::printf("     %-35s %s\n", "VMI create call", Figures(vmiCalls[k]).c_str());
      std::printf("     %-35s %s\n", "launcher create call", Figures(launcherCalls[k]).c_str());
    } else {
      std::printf("     %-35s %s\n", "pod create call", Figures(launcherCalls[k]).c_str());
    }
  }
  for (const auto& [node, count] : vms.onNode()) {
    std::printf("   launchers bound on %s: %d\n", node.c_str(), count);
  }
  const double peer50 = Quantile(totals[2], 0.5);
  const double peer99 = Quantile(totals[2], 0.99);
  for (size_t k = 0; k < 2; ++k) {
    const double ratio = Quantile(totals[k], 0.99) / peer99;
    std::printf("   %s / peer: p50 %.2fx, p99 %.2fx (goal: p99 within 2x of the peer's: %s)\n",
                names[k], Quantile(totals[k], 0.5) / peer50, ratio,
                ratio <= 2.0 ? "met" : "not met");
  }
  // The GPUs' own share: a start against a VM start without GPUs, in the same run.
  const double vm50 = Quantile(totals[3], 0.5);
  const double vm99 = Quantile(totals[3], 0.99);
  for (size_t k = 0; k < 2; ++k) {
    std::printf("   %s / a VM with no GPU: p50 %.2fx, p99 %.2fx\n", names[k],
                Quantile(totals[k], 0.5) / vm50, Quantile(totals[k], 0.99) / vm99);
  }
  // Where the time goes, step by step (the API server's own times from its audit log).
  const std::vector<Write> writes = ReadWrites(context.cluster.dir() / "logs/audit.log");
  for (size_t k = 0; k < kKinds; ++k) {
    Steps steps;
    for (const Start& start : measured) {
      if (static_cast<size_t>(start.kind) == k) {
        StartSteps(writes, start, context.controllerUser, steps);
      }
    }
    std::printf("   where the time goes, %s (the API server's times, its audit log):\n", names[k]);
    steps.Print("     ");
  }
  std::printf("\n");
}

void FreshnessPart(const Context& context, int pods) {
  Board& board = context.board;
  kube::Client& client = context.client;
  const std::string peerPath = kube::ResourcePath("", "v1", "configmaps", kPods, "bench-peer");
  std::mutex peerMutex;
  std::condition_variable peerSeen;
  std::map<std::string, Instant> seqSeen;
  Watcher peerWatch(context.cluster.config(), kube::ResourcePath("", "v1", "configmaps", kPods),
                    [&](const kube::WatchEvent& event, const Instant& at) {
                      const std::string seq =
                          event.object.value("data", json::object()).value("seq", "");
                      std::lock_guard lock(peerMutex);
                      seqSeen.emplace(seq, at);
                      peerSeen.notify_all();
                    });
  std::map<std::string, std::string> metricsBefore;
  for (const std::string& node : context.nodes) {
    metricsBefore[node] = bench::ControllerMetrics(context.agentPorts.at(node));
  }
  std::vector<FreshPod> fresh;
  std::vector<double> freshness, peerMs, freed;
  int readyTogether = 0;
  const auto began = Clock::now();
  for (int p = -2; p < pods; ++p) {  // two of warm-up, one on each node
    const std::string& node = context.nodes[static_cast<size_t>((p + 2) % 2)];
    const std::string name = "fresh-" + std::to_string(p + 2);
    const std::string key = std::string(kPods) + "/" + name;
    const size_t from = board.HistorySize(node);
    FreshPod pod{name, node, Wall::now(), {}, {}, false, {}, {}};
    client.Create(PodsPath(kPods), {{"apiVersion", "v1"},
                                    {"kind", "Pod"},
                                    {"metadata", {{"name", name}, {"namespace", kPods}}},
                                    {"spec",
                                     {{"nodeSelector", {{"kubernetes.io/hostname", node}}},
                                      {"terminationGracePeriodSeconds", 1},
                                      {"containers",
                                       {{{"name", "compute"},
                                         {"image", "example.invalid/gpu-job:1"},
                                         {"resources", {{"limits", {{kResource, "1"}}}}}}}}}}});
    const auto running = board.WaitPod(key, &PodSeen::running, std::chrono::seconds(60));
    if (!running) throw context.Failure("pod " + name + " not Running 60 s after its create");
    const auto allocated = board.WaitAllocation(
        node, from, [](const Allocation& a) { return a.allocated >= 1; }, std::chrono::seconds(30));
    if (!allocated) {
      throw context.Failure("GPUNode " + node + " did not show " + name + "'s unit in 30 s");
    }
    pod.running = *running;
    pod.allocated = allocated->at;
    pod.readyWithRunning = board.Pod(key).readyWithRunning;

    // The peer: a write of the bench's own, until its watch sees it.
    const std::string seq = "p" + std::to_string(p + 2);
    const auto written = Clock::now();
    client.MergePatch(peerPath, {{"data", {{"seq", seq}}}});
    std::optional<Instant> seen;
    {
      std::unique_lock lock(peerMutex);
      if (peerSeen.wait_for(lock, std::chrono::seconds(10), [&] { return seqSeen.count(seq); })) {
        seen = seqSeen[seq];
      }
    }
    if (!seen) throw std::runtime_error("the bench's own ConfigMap write not seen in 10 s");

    // The pod goes, and its unit is free again, before the next.
    const size_t beforeDelete = board.HistorySize(node);
    const auto deleting = Clock::now();
    pod.deleted = Wall::now();
    client.Delete(PodsPath(kPods, name));
    if (!board.WaitPod(key, &PodSeen::gone, std::chrono::seconds(60))) {
      throw context.Failure("pod " + name + " not gone 60 s after its delete");
    }
    const auto free = board.WaitAllocation(
        node, beforeDelete, [](const Allocation& a) { return a.allocated == 0; },
        std::chrono::seconds(30));
    if (!free) throw context.Failure("GPUNode " + node + " did not free " + name + "'s unit");
    if (p < 0) continue;
    pod.freed = free->at;
    freshness.push_back(Ms(pod.allocated.steady - pod.running.steady));
    peerMs.push_back(Ms(seen->steady - written));
    freed.push_back(Ms(free->at.steady - deleting));
    readyTogether += pod.readyWithRunning ? 1 : 0;
    fresh.push_back(pod);
    if ((p + 1) % 25 == 0) {
      std::printf("  %d pods (%.0f s)\n", p + 1,
                  std::chrono::duration<double>(Clock::now() - began).count());
    }
  }
  std::printf(
      "\n2. Catalog freshness: %d GPU pods one at a time, alternating the 2 nodes; the pod seen\n"
      "   Running by a watch -> its node's GPUNode seen by a watch with the unit allocated (the\n"
      "   Ready condition came in the same event as Running for %d of the %d)\n",
      pods, readyTogether, pods);
  std::printf("   %-44s %s\n", "Running -> GPUNode allocated", Figures(freshness).c_str());
  std::printf("   %-44s %s\n", "peer: the bench's own write -> its watch", Figures(peerMs).c_str());
  std::printf("   %-44s %s\n", "(the pod's delete sent -> GPUNode free)", Figures(freed).c_str());
  const int early = static_cast<int>(
      std::count_if(freshness.begin(), freshness.end(), [](double ms) { return ms < 0; }));
  std::printf("   the GPUNode showed the unit before the watch showed the pod Running: %d of %d\n",
              early, pods);
  const double budget = static_cast<double>(kDebounce.count()) + 50;
  const double p99 = Quantile(freshness, 0.99);
  std::printf("   freshness / peer: p99 %.2fx; goal p99 within debounce + 50 ms = %.0f ms: %s\n",
              p99 / Quantile(peerMs, 0.99), budget, p99 <= budget ? "met" : "not met");

  // Where the time goes: the agents' own counters, pod-resources timed here, and the steps.
  for (const std::string& node : context.nodes) {
    const std::string after = bench::ControllerMetrics(context.agentPorts.at(node));
    auto delta = [&](const std::string& name, const std::string& result = "") {
      auto keep = [&](const std::map<std::string, std::string>& labels) {
        return result.empty() || bench::Label(labels, "result") == result;
      };
      return bench::Sum(after, name, keep) - bench::Sum(metricsBefore[node], name, keep);
    };
    const double passes = delta("gpu_agent_scan_duration_seconds_count");
    std::printf(
        "   agent of %s: %.0f passes (scan mean %.2f ms), %.0f pod-resources reads; GPUNode "
        "writes %.0f, unchanged %.0f, failed %.0f, held by its rate limit %.0f\n",
        node.c_str(), passes,
        passes > 0 ? delta("gpu_agent_scan_duration_seconds_sum") / passes * 1e3 : 0.0,
        delta("gpu_agent_pod_resources_fetches_total"),
        delta("gpu_agent_publishes_total", "written"),
        delta("gpu_agent_publishes_total", "unchanged"),
        delta("gpu_agent_publishes_total", "failed"), delta("gpu_agent_publishes_total", "waited"));
  }
  for (const std::string& node : context.nodes) {
    std::printf("   %-44s %s\n", ("pod-resources read of " + node + " (the bench's)").c_str(),
                Figures(TimePodResources(context.nodeDirs.at(node), 51)).c_str());
  }
  const std::vector<Write> writes = ReadWrites(context.cluster.dir() / "logs/audit.log");
  std::map<std::string, std::vector<Wall::time_point>> passes;
  for (const auto& [node, log] : context.agentLogs) passes[node] = InventoryChanges(log);
  Steps steps;
  int agentFirst = 0;
  int unmatched = 0;
  for (const FreshPod& pod : fresh) {
    FreshSteps(writes, pod, passes[pod.node], context.agentUser, steps, agentFirst, unmatched);
  }
  std::printf(
      "   where the time goes (the API server's times from its audit log, the agent's pass from\n"
      "   its log; %d pods not found there): the agent's write arrived before kubelet's Running\n"
      "   write was done for %d pods\n",
      unmatched, agentFirst);
  steps.Print("     ");
  Steps freeing;
  unmatched = 0;
  for (const FreshPod& pod : fresh) FreeSteps(writes, pod, context.agentUser, freeing, unmatched);
  std::printf("   and of a deleted pod's unit (%d pods not found in the audit log):\n", unmatched);
  freeing.Print("     ");
}

int Run(int starts, int pods) {
  const std::filesystem::path source = COZY_SOURCE_DIR;
  const std::vector<std::string> nodes = {"gpu-node-a", "gpu-node-b"};
  bench::Mode mode;
  mode.realCluster = true;
  bench::ControlPlane cluster(mode, source);
  const std::filesystem::path work = cluster.work();

  // Each node's fixture host, in the work directory: removed with it, after the nodes stopped
  // (on Ctrl-C too).
  std::map<std::string, std::filesystem::path> hosts;
  std::map<std::string, std::filesystem::path> nodeDirs;
  for (const std::string& node : nodes) {
    hosts[node] = work / ("host-" + node);
    fixtures::BuildTree(fixtures::LoadSpec(testing::SpecPath("a100-vfio")), hosts[node]);
    nodeDirs[node] = StartNode(cluster, source, node, hosts[node]);
  }

  cluster.ApplyCrds(/*kubeVirt=*/true);
  const auto whoami = cluster.Kubectl("auth whoami -o jsonpath={.status.userInfo.username}");
  if (whoami.exitCode != 0 || whoami.out.empty()) {
    throw std::runtime_error("kubectl auth whoami: " + whoami.err);
  }
  // The bench creates the launchers as the cluster's admin: to the pod webhook and the chart's
  // policies that user is KubeVirt's controller here (E14).
  const std::string kubevirtUser = whoami.out;
  WriteFile(work / "cluster.yaml", std::string(R"(apiVersion: v1
kind: Namespace
metadata: {name: cozy-system}
---
apiVersion: v1
kind: Namespace
metadata:
  name: bench-tenant
  labels: {gpu.cozystack.io/tenant-namespace: "true"}
---
apiVersion: v1
kind: Namespace
metadata: {name: bench-pods}
---
apiVersion: v1
kind: Namespace
metadata: {name: kubevirt}
---
apiVersion: kubevirt.io/v1
kind: KubeVirt
metadata: {name: kubevirt, namespace: kubevirt}
spec:
  configuration:
    developerConfiguration: {featureGates: [HostDevices]}
    permittedHostDevices:
      pciHostDevices: [{pciVendorSelector: "10DE:20F1", resourceName: )") +
                                       kResource + R"(}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: bench-peer, namespace: bench-pods}
data: {seq: init}
)");
  cluster.KubectlOrThrow("apply -f " + testing::ShellQuote((work / "cluster.yaml").string()));

  // The chart: GPUs on, the webhooks at 127.0.0.1 with a certificate for that address, callers
  // authenticated by the CA of the API server's webhook client certificate; its workloads stay
  // empty (no ReplicaSet or DaemonSet controller runs here): the bench runs the agents and the
  // controller as the chart's service accounts.
  bench::WebhookCertificates(work / "certs");
  const int webhookPort = testing::FreePort();
  const int healthPort = testing::FreePort();
  const std::filesystem::path clientCa = cluster.dir() / "pki/webhook-client-ca.crt";
  bench::ApplyGpusOnChart(cluster, work / "certs", webhookPort, clientCa,
                          "--set controller.replicas=0 --set policies.kubevirtControllerUser=" +
                              testing::ShellQuote(kubevirtUser));
  {
    kube::Client client(cluster.config(), bench::BenchClientOptions());
    json gpuClass = testing::GpuClassObject(kClass, kResource);
    gpuClass["spec"]["maxCount"] = 4;
    gpuClass["spec"]["nodeSelector"] = {{"matchLabels", {{"gpu.cozystack.io/gpu-node", "true"}}}};
    client.Create(kube::ResourcePath("gpu.cozystack.io", "v1alpha1", "gpuclasses"), gpuClass);
  }

  // Each node's agent: its pod on the node (kubelet runs it), a token bound to that pod, and
  // `gpu-agent run` with its default settings (--debounce 50ms, pod-resources every 10 s and on
  // each change of the node's pods), reading the node's own kubelet.
  std::vector<std::unique_ptr<bench::ChildProcess>> agents;
  std::map<std::string, int> agentPorts;
  std::map<std::string, std::filesystem::path> agentLogs;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const std::string& node = nodes[i];
    WriteFile(work / ("agent-pod-" + node + ".yaml"),
              "apiVersion: v1\nkind: Pod\nmetadata: {name: gpu-agent-" + node +
                  ", namespace: cozy-system, labels: {app.kubernetes.io/name: gpu-agent}}\n"
                  "spec:\n  serviceAccountName: gpu-agent\n  nodeName: " +
                  node + "\n  containers: [{name: agent, image: example.invalid/gpu-agent:1}]\n");
    cluster.KubectlOrThrow("apply -f " +
                           testing::ShellQuote((work / ("agent-pod-" + node + ".yaml")).string()));
    const auto kubeconfig =
        TokenKubeconfig(cluster, "gpu-agent", "gpu-agent-" + node, "agent-" + node + ".kubeconfig");
    agentPorts[node] = testing::FreePort();
    agents.push_back(std::make_unique<bench::ChildProcess>(
        std::vector<std::string>{
            COZY_GPU_AGENT_BINARY, "run", "--node-name", node, "--kubeconfig", kubeconfig.string(),
            "--sysfs-root", hosts[node].string(), "--pci-ids",
            (source / "fixtures/pci.ids").string(), "--pod-resources",
            "unix://" + (nodeDirs[node] / "root/pod-resources/kubelet.sock").string(),
            "--udev-source", "off", "--dbus", "off", "--health-addr",
            "127.0.0.1:" + std::to_string(agentPorts[node])},
        work / ("agent-" + node + ".log")));
    agentLogs[node] = agents.back()->log();
  }

  // The controller as the chart's service account.
  const std::string controllerUser =
      std::string("system:serviceaccount:") + kSystem + ":gpu-controller";
  const std::string agentUser = std::string("system:serviceaccount:") + kSystem + ":gpu-agent";
  const auto controllerKubeconfig =
      TokenKubeconfig(cluster, "gpu-controller", "", "controller.kubeconfig");
  bench::ControllerProcess controller(
      {GPU_CONTROLLER, "run", "--kubeconfig", controllerKubeconfig.string(), "--namespace", kSystem,
       "--identity", "bench", "--enable-gpu", "--health-addr",
       "127.0.0.1:" + std::to_string(healthPort), "--webhook-addr",
       "127.0.0.1:" + std::to_string(webhookPort), "--webhook-cert-dir", (work / "certs").string(),
       "--webhook-client-ca", clientCa.string(), "--kubevirt-controller-user", kubevirtUser},
      work / "controller.log");
  auto logs = [&](const std::string& what) {
    std::string text = what + "\n--- controller log (last lines)\n" + Tail(controller.log());
    for (size_t i = 0; i < nodes.size(); ++i) {
      text += "--- agent of " + nodes[i] + " (last lines)\n" + Tail(agents[i]->log());
    }
    return std::runtime_error(text);
  };

  Board board;
  Watcher podWatch(
      cluster.config(), PodsPath(""),
      [&](const kube::WatchEvent& event, const Instant& at) { board.OnPod(event, at); });
  Watcher gpuNodeWatch(
      cluster.config(), kube::ResourcePath("gpu.cozystack.io", "v1alpha1", "gpunodes"),
      [&](const kube::WatchEvent& event, const Instant& at) { board.OnGpuNode(event, at); });
  for (const std::string& node : nodes) {
    const auto published = board.WaitAllocation(
        node, 0, [](const Allocation& a) { return a.allocatable == kGpusPerNode; },
        std::chrono::seconds(60));
    if (!published) throw logs("the agent of " + node + " published no GPUNode with 2 units");
  }
  std::printf("agents published both nodes' GPUNodes, %d A100 each\n", kGpusPerNode);
  const auto starting = Clock::now();
  if (!testing::WaitFor([&] { return bench::Ready(healthPort); }, std::chrono::minutes(2),
                        std::chrono::milliseconds(200))) {
    throw logs("the controller did not get ready in 2 minutes");
  }
  std::printf("controller ready in %.1f s\n",
              std::chrono::duration<double>(Clock::now() - starting).count());

  kube::ClientOptions options = bench::BenchClientOptions();
  options.maxRetries = 0;  // every timed request is one request
  kube::Client client(cluster.config(), options);
  // The API server calls the webhooks once a dry-run start with an annotation that does not
  // parse is refused by the VMI webhook.
  const bool called = testing::WaitFor(
      [&] {
        kube::WriteOptions dryRun;
        dryRun.dryRun = true;
        try {
          client.Create(VmisPath(kTenant),
                        {{"apiVersion", "kubevirt.io/v1"},
                         {"kind", "VirtualMachineInstance"},
                         {"metadata",
                          {{"name", "probe"},
                           {"namespace", kTenant},
                           {"labels", {{"gpu.cozystack.io/device-references", "true"}}},
                           {"annotations", {{"gpu.cozystack.io/device-references", "not json"}}}}},
                         {"spec", {{"domain", {{"devices", json::object()}}}}}},
                        dryRun);
        } catch (const kube::ApiError& error) {
          return std::string(error.what())
                     .find("admission webhook \"virtualmachineinstances.gpu.cozystack.io\"") !=
                 std::string::npos;
        }
        return false;
      },
      std::chrono::seconds(60), std::chrono::milliseconds(500));
  if (!called) throw logs("the API server did not call the VMI webhook within 60 s");
  std::printf("webhooks registered at https://127.0.0.1:%d and called by the API server\n",
              webhookPort);
  std::printf("load average before the parts (1, 5, 15 min): %s, %u CPUs\n\n",
              LoadAverage().c_str(), std::thread::hardware_concurrency());
  const Context context{cluster,    client,           board,          nodes,    nodeDirs, agentLogs,
                        agentPorts, controller.log(), controllerUser, agentUser};
  if (starts > 0) VmStartPart(context, starts);
  if (pods > 0) FreshnessPart(context, pods);
  std::printf("load average after (1, 5, 15 min): %s\n", LoadAverage().c_str());

  for (size_t i = 0; i < agents.size(); ++i) {
    if (!agents[i]->Running()) throw logs("the agent of " + nodes[i] + " exited");
  }
  controller.Stop();
  return 0;  // figures, not pass or fail: anything that went wrong threw
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines as they come, also into a file
  try {
    std::vector<std::string> words;
    for (int i = 1; i < argc; ++i) {
      if (std::string(argv[i]).starts_with("-")) {
        std::fprintf(stderr, "usage: bench_real_nodes [starts=100] [pods=100]\n");
        return 2;
      }
      words.emplace_back(argv[i]);
    }
    const int starts = bench::Positional(words, 0, 100);
    const int pods = bench::Positional(words, 1, 100);
    if (starts < 0 || pods < 0 || starts + pods == 0) {
      std::fprintf(stderr, "need starts >= 0 and pods >= 0, not both 0\n");
      return 2;
    }
    return Run(starts, pods);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "bench_real_nodes: %s\n", error.what());
    return 1;
  }
}
