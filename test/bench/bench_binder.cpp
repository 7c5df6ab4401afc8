// The binder at scale, through the fake API server: `gpu-controller run --enable-gpu` (the real
// program) over N nodes x 8 GPUs whose units are all held but 2 x R, then two bursts of R orders
// with bind requests:
//  - written while the binder runs: the time from the first request written to all answered;
//  - written before the binder sees them (the controller held with SIGSTOP while they are
//    written, as a kubelet blip or a leader's pause leaves it a backlog): the time from its
//    SIGCONT to all answered. This is the binder's own rate: no request's write shares the
//    window with its answers, which on a real API server halves what is left for them.
// Prints, for each: answers per second and API placement writes per bound device (goal: 1);
// then writes in a quiet window (goal: 0), and, as the peers measured in the same process, the
// model's pass over the same cluster without any API (what the API, the caches and the process
// add is the ratio) and a bare loop of status merge patches against the same API server, serial
// and on 8 connections (the binder's answers per second as a ratio to what the API server can
// take; goal: 0.5 of the concurrent rate).
//
//   bench_binder [nodes=5000] [requests=1000] [quiet-seconds=60]
//
// BENCH_GPU_CONTROLLER=/path/to/gpu-controller drives that build instead (an A/B against an
// earlier commit's); BENCH_CONTROLLER_LOG=FILE keeps the controller's log there, with -v (each
// pass's times), on the fake.
//
// With --real-cluster (a control plane of scripts/cluster.sh brought up in a temporary
// directory and down at the end) or --kubeconfig FILE (an existing, empty cluster, left filled):
// the same through a real kube-apiserver and etcd (docs/benchmarks.md, "On a real control plane").
// The cluster is seeded through the API server by [seed-threads=16] threads, each with a client of
// its own; the orders are created before the controller starts and the bind requests are status
// patches written at once, as the VMI webhook writes them; writes are counted by the API server
// itself (apiserver_request_total in its /metrics, before and after). Since each answer's request
// is a write through the same server, it also prints the server's status writes while answering
// (the requests' and the binder's) against the concurrent bare rate: what the server took in all.
// The second burst's requests are written with the controller held, as on the fake.
//
//   bench_binder --real-cluster [nodes=1000] [requests=1000] [quiet-seconds=60] [seed-threads=16]
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "controller/model/model.h"
#include "controller/snapshot_json.h"
#include "kube/watch.h"
#include "test/bench/proc_cpu.h"
#include "test/bench/real_cluster.h"
#include "test/fakes/fake_apiserver.h"
#include "test/support/fixture_host.h"
#include "test/support/gpu_objects.h"
#include "test/support/process.h"

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
constexpr int kGpusPerNode = 8;
constexpr int kTenants = 100;
constexpr const char* kRequestLabel = "bench.cozystack.io/request";

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The program under test: this build's gpu-controller, or BENCH_GPU_CONTROLLER's (an earlier
// commit's, built in a worktree: an A/B in one run of the same bench).
std::string ControllerProgram() {
  const char* program = std::getenv("BENCH_GPU_CONTROLLER");
  return program && *program ? program : GPU_CONTROLLER;
}

json Node(int n) { return cozy::testing::ReadyNode("node-" + std::to_string(n)); }

json GpuNode(int n) {
  return cozy::testing::GpuNodeObject("node-" + std::to_string(n), kGpusPerNode);
}

json Namespace(const std::string& name) {
  return {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", name}}}};
}

json GpuClass() {
  return {{"apiVersion", "gpu.cozystack.io/v1alpha1"},
          {"kind", "GPUClass"},
          {"metadata", {{"name", "a100"}, {"finalizers", {"gpu.cozystack.io/class-protection"}}}},
          {"spec",
           {{"vendor", "nvidia"},
            {"model", "A100"},
            {"mode", "passthrough"},
            {"source", {{"devicePlugin", {{"resourceName", "nvidia.com/GA100"}}}}}}}};
}

std::string DeviceNamespace(int i) { return "tenant-" + std::to_string(i % kTenants); }

json Device(int i, const std::string& node, const std::string& requestId) {
  json device = {{"apiVersion", "gpu.cozystack.io/v1alpha1"},
                 {"kind", "GPUDevice"},
                 {"metadata",
                  {{"name", "d" + std::to_string(i)},
                   {"namespace", DeviceNamespace(i)},
                   {"finalizers", {"gpu.cozystack.io/device-protection"}}}},
                 {"spec", {{"className", "a100"}, {"count", 1}}}};
  if (!node.empty()) {
    device["status"] = {{"phase", "Bound"}, {"nodeName", node}};
  } else {
    device["metadata"]["labels"] = {{kRequestLabel, "true"}};  // for the bench's AnswerWatch
    device["status"] = {
        {"bindRequest", {{"id", requestId}, {"requestedAt", "2026-12-01T00:00:00Z"}}}};
  }
  return device;
}

// Waits for the controller's /readyz, then for its first full pass over the held set (on
// taking the lead it lists every device from the API server, D3, and writes each GPUNode's
// TakesBinds condition).
bool WaitForController(int port, const std::filesystem::path& log) {
  const auto starting = Clock::now();
  const bool ready =
      cozy::testing::WaitFor([&] { return cozy::bench::Ready(port); }, std::chrono::minutes(5),
                             std::chrono::milliseconds(200));
  if (!ready) {
    std::fprintf(stderr, "the controller did not get ready; see %s\n", log.c_str());
    return false;
  }
  std::printf("controller ready (caches listed) in %.1f s\n", Seconds(Clock::now() - starting));
  const bool firstPass = cozy::testing::WaitFor(
      [&] {
        return cozy::bench::ControllerMetrics(port).find(
                   "gpu_controller_binder_passes_total{kind=\"full\"}") != std::string::npos;
      },
      std::chrono::minutes(5), std::chrono::milliseconds(200));
  if (!firstPass) {
    std::fprintf(stderr, "the binder made no pass; see %s\n", log.c_str());
    return false;
  }
  std::printf(
      "first full pass done %.1f s after start (a list of every device, every "
      "GPUNode's condition)\n",
      Seconds(Clock::now() - starting));
  return true;
}

// The controller's own account of the burst.
void PrintControllerMetrics(int port) {
  const std::string metrics = cozy::bench::ControllerMetrics(port);
  for (const char* name :
       {"gpu_controller_binder_passes_total{kind=\"answers\"}",
        "gpu_controller_binder_passes_total{kind=\"full\"}",
        "gpu_controller_binder_pass_duration_seconds_sum",
        "gpu_controller_binder_device_reads_total", "gpu_controller_binder_conflicts_total"}) {
    const size_t found = metrics.find("\n" + std::string(name) + " ");
    const size_t at = found == std::string::npos ? found : found + 1;
    std::printf("  %s %s\n", name,
                at == std::string::npos
                    ? "0"
                    : metrics
                          .substr(at + std::string(name).size() + 1,
                                  metrics.find('\n', at) - at - std::string(name).size() - 1)
                          .c_str());
  }
}

// The peer: the model's pass over the same cluster (the requests' devices included), no API.
void ModelPeer(const json& all, double answerSeconds) {
  const cozy::model::Snapshot snapshot =
      cozy::controller::DecodeSnapshotList({{"kind", "List"}, {"items", all}});
  std::vector<double> passes;
  size_t decisions = 0;
  for (int round = 0; round < 5; ++round) {
    const auto start = Clock::now();
    const cozy::model::Model model(snapshot);
    decisions = model.PlanPass().size();
    passes.push_back(Seconds(Clock::now() - start));
  }
  std::sort(passes.begin(), passes.end());
  std::printf("model pass without the API (median of 5): %.1f ms, %zu decisions\n",
              passes[2] * 1000, decisions);
  std::printf("answer time / model pass: %.0fx\n", answerSeconds / passes[2]);
}

// Where the CPU of the answer window went: the controller's by thread (the pass's writers end
// with it: "ended" is the process's less its live threads), and the bench's own (the fake API
// server serving every request, and the bench's check of the answers).
void PrintCpu(pid_t controller, const std::map<std::string, double>& before, double controllerCpu,
              double benchCpu, double seconds) {
  std::map<std::string, double> used = cozy::bench::ThreadCpu(controller);
  double live = 0;
  for (auto& [name, cpu] : used) {
    auto found = before.find(name);
    cpu -= found == before.end() ? 0 : found->second;
    live += cpu;
  }
  used["(ended)"] = std::max(0.0, controllerCpu - live);
  std::printf("CPU while answering (%.2f s, in cores): controller %.2f (", seconds,
              controllerCpu / seconds);
  const char* separator = "";
  for (const auto& [name, cpu] : used) {
    if (cpu < 0.005) continue;
    std::printf("%s%s %.2f", separator, name.c_str(), cpu / seconds);
    separator = ", ";
  }
  std::printf("), bench and its API server %.2f\n", benchCpu / seconds);
}

// The physical limit (docs/benchmarks.md, "Binds against the physical limit"): the same API server
// taking a bare loop of status merge patches on the first burst's devices (each answered by then),
// one after the other on one connection (as the binder once wrote) and spread over kBareConnections
// connections. Each burst's answers per second are printed as a ratio to each.
constexpr int kBareConnections = 8;

// A burst's answers: what it is called, its answers per second, and the status writes the API
// server took while the binder answered, the requests' own included (0 where the requests were
// not written through it in that time).
struct BurstRate {
  std::string name;
  double answersPerSecond = 0;
  double serverWritesPerSecond = 0;
};

void BarePatchPeer(const cozy::kube::ClientConfig& config, int first, int requests,
                   const std::vector<BurstRate>& bursts) {
  auto patch = [&](int r, cozy::kube::Client& client, const char* run) {
    const int i = first + r;
    client.MergePatch(
        cozy::kube::ResourcePath("gpu.cozystack.io", "v1alpha1", "gpudevices", DeviceNamespace(i),
                                 "d" + std::to_string(i), "status"),
        {{"status", {{"bindResponse", {{"message", std::string(run) + " bare patch"}}}}}});
  };
  auto rate = [&](int connections, const char* run) {
    const auto start = Clock::now();
    cozy::bench::Parallel(config, connections, requests,
                          [&](int r, cozy::kube::Client& client) { patch(r, client, run); });
    return requests / Seconds(Clock::now() - start);
  };
  const double serial = rate(1, "serial");
  const double concurrent = rate(kBareConnections, "concurrent");
  std::printf(
      "bare status merge patches on the same API server: %.0f/s on 1 connection, %.0f/s on %d\n",
      serial, concurrent, kBareConnections);
  for (const BurstRate& burst : bursts) {
    std::printf(
        "binder answers / bare patches, requests written %s: %.2f of serial, %.2f of concurrent "
        "(goal 0.5)\n",
        burst.name.c_str(), burst.answersPerSecond / serial, burst.answersPerSecond / concurrent);
    if (burst.serverWritesPerSecond > 0) {
      // Each answer's request was a status write through the same API server, in the same
      // time: what the server took in all, against what it can take.
      std::printf(
          "  the API server's status writes while answering, the requests' and the binder's: "
          "%.0f/s, %.2f of concurrent\n",
          burst.serverWritesPerSecond, burst.serverWritesPerSecond / concurrent);
    }
  }
}

// Holds a process stopped (SIGSTOP) until Release or the end of the scope (SIGCONT): the
// controller, while a burst's requests are written, so that it meets them all at once.
class HeldProcess {
 public:
  explicit HeldProcess(pid_t pid) : pid_(pid) {
    ::kill(pid_, SIGSTOP);
    const std::string stat = "/proc/" + std::to_string(pid_) + "/stat";
    cozy::testing::WaitFor(
        [&] {
          std::ifstream in(stat);
          std::string line;
          std::getline(in, line);
          const size_t paren = line.rfind(')');
          return paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] == 'T';
        },
        std::chrono::seconds(10), std::chrono::milliseconds(1));
  }
  ~HeldProcess() { Release(); }
  HeldProcess(const HeldProcess&) = delete;
  HeldProcess& operator=(const HeldProcess&) = delete;
  void Release() {
    if (pid_ > 0) ::kill(pid_, SIGCONT);
    pid_ = -1;
  }

 private:
  pid_t pid_;
};

// A self-signed serving pair for the webhooks, which serve with GPUs on (never called here).
bool SelfSignedCertificate(const std::filesystem::path& dir) {
  const auto certificate = cozy::testing::RunCommand(
      "mkdir -p " + cozy::testing::ShellQuote(dir.string()) + " && cd " +
      cozy::testing::ShellQuote(dir.string()) +
      " && openssl req -x509 -newkey rsa:2048 -nodes -keyout tls.key -out tls.crt -days 1"
      " -subj /CN=bench 2>/dev/null");
  if (certificate.exitCode != 0) {
    std::fprintf(stderr, "openssl could not make the webhooks' certificate: %s\n",
                 certificate.err.c_str());
    return false;
  }
  return true;
}

// Answers to the bind requests as a watch on the requests' devices delivers them, each taken
// once: device index -> bound.
class AnswerWatch {
 public:
  AnswerWatch(const cozy::kube::ClientConfig& config, int first, int count)
      : client_(config, cozy::bench::BenchClientOptions()), first_(first), count_(count) {}

  // Lists the requests' devices (the watch starts at the list's resourceVersion).
  void Start() { Relist(); }

  // Takes what the watch delivered until every request is answered or `limit` passed.
  bool Wait(std::chrono::seconds limit) {
    const auto deadline = Clock::now() + limit;
    while (static_cast<int>(answers_.size()) < count_ && Clock::now() < deadline) {
      if (!stream_ || stream_->Done()) {
        if (stream_ && stream_->Error() &&
            stream_->Error()->kind() == cozy::kube::ErrorKind::kExpired) {
          Relist();
        }
        cozy::kube::WatchOptions options;
        options.labelSelector = std::string(kRequestLabel) + "=true";
        options.resourceVersion = resourceVersion_;
        stream_ = client_.Watch(Collection(), options);
      }
      stream_->Poll(std::chrono::milliseconds(100));
      for (auto& event : stream_->TakeEvents()) {
        if (event.type == "BOOKMARK" || event.type == "ADDED" || event.type == "MODIFIED") {
          resourceVersion_ = event.object["metadata"].value("resourceVersion", resourceVersion_);
        }
        if (event.type == "ERROR") {
          Relist();
          stream_.reset();
          break;
        }
        if (event.type == "ADDED" || event.type == "MODIFIED") Take(event.object);
      }
    }
    return static_cast<int>(answers_.size()) == count_;
  }
  int answered() const { return static_cast<int>(answers_.size()); }
  int bound() const {
    return static_cast<int>(
        std::count_if(answers_.begin(), answers_.end(), [](const auto& a) { return a.second; }));
  }

 private:
  static std::string Collection() {
    return cozy::kube::ResourcePath("gpu.cozystack.io", "v1alpha1", "gpudevices");
  }
  void Relist() {
    cozy::kube::ListOptions options;
    options.labelSelector = std::string(kRequestLabel) + "=true";
    const json list = client_.List(Collection(), options);
    resourceVersion_ = list["metadata"].value("resourceVersion", "");
    for (const json& item : list["items"]) Take(item);
  }
  void Take(const json& device) {
    const std::string name = device["metadata"].value("name", "");
    if (name.size() < 2) return;
    const int i = std::atoi(name.c_str() + 1);
    if (i < first_ || i >= first_ + count_ || answers_.count(i)) return;
    const json status = device.value("status", json::object());
    if (status.value("bindResponse", json::object()).value("id", "") !=
        "req-" + std::to_string(i)) {
      return;
    }
    answers_[i] = status.value("phase", "") == "Bound";
  }

  cozy::kube::Client client_;
  int first_;
  int count_;
  std::string resourceVersion_;
  std::unique_ptr<cozy::kube::WatchStream> stream_;
  std::map<int, bool> answers_;
};

// A burst's requests, written by `write`: with `hold`, at once, the controller held (SIGSTOP)
// until Start; without, by Start. Start returns when the burst began: the controller's release,
// or the first request written.
class BurstStart {
 public:
  BurstStart(pid_t controller, bool hold, std::function<void()> write) : write_(std::move(write)) {
    if (!hold) return;
    held_.emplace(controller);
    Write();
  }
  Clock::time_point Start() {
    const auto start = Clock::now();
    if (held_) {
      held_->Release();
    } else {
      Write();
    }
    return start;
  }
  double writeSeconds() const { return writeSeconds_; }

 private:
  void Write() {
    const auto writing = Clock::now();
    write_();
    writeSeconds_ = Seconds(Clock::now() - writing);
  }
  std::function<void()> write_;
  std::optional<HeldProcess> held_;
  double writeSeconds_ = 0;
};

// The two bursts' names, in the order they run.
constexpr const char* kLive = "while the binder runs";
constexpr const char* kHeld = "before the binder sees them";

int RunFake(int nodes, int requests, int quietSeconds) {
  // Every unit held but one per request of the two bursts.
  const int held = nodes * kGpusPerNode - 2 * requests;
  char pattern[] = "/tmp/bench-binder.XXXXXX";
  const std::filesystem::path work = ::mkdtemp(pattern);

  cozy::fake::FakeApiServerOptions options;
  options.crdPaths = {std::filesystem::path(COZY_SOURCE_DIR) / "charts/gpu/templates/crds"};
  cozy::fake::FakeApiServer server(options);
  server.Start();
  json all = json::array();  // the same cluster for the model alone
  auto seed = [&](const json& object) {
    server.Seed(object);
    all.push_back(object);
  };
  const auto seeding = Clock::now();
  seed(Namespace("cozy-system"));
  for (int t = 0; t < kTenants; ++t) seed(Namespace("tenant-" + std::to_string(t)));
  seed(GpuClass());
  for (int n = 0; n < nodes; ++n) {
    seed(Node(n));
    seed(GpuNode(n));
  }
  // Held units fill the nodes in order, so the free ones are spread over the last nodes.
  for (int i = 0; i < held; ++i) {
    seed(Device(i, "node-" + std::to_string(i / kGpusPerNode), ""));
  }
  std::printf("seeded %d nodes x %d GPUs, %d held devices in %.1f s\n", nodes, kGpusPerNode, held,
              Seconds(Clock::now() - seeding));

  std::ofstream(work / "kubeconfig") << server.Kubeconfig("binder");
  const cozy::kube::ClientConfig config = cozy::kube::LoadKubeconfig(work / "kubeconfig");
  const int port = cozy::testing::FreePort();
  if (!SelfSignedCertificate(work / "certs")) return 1;
  std::vector<std::string> arguments = {
      ControllerProgram(), "run", "--kubeconfig", (work / "kubeconfig").string(), "--identity",
      "bench", "--enable-gpu", "--health-addr", "127.0.0.1:" + std::to_string(port), "--qps", "0",
      "--webhook-addr", "127.0.0.1:0", "--webhook-cert-dir", (work / "certs").string(),
      // No caller reaches these webhooks: the serving
      // certificate stands in for the API server's CA.
      "--webhook-client-ca", (work / "certs/tls.crt").string()};
  if (std::getenv("BENCH_CONTROLLER_LOG")) arguments.push_back("-v");  // each pass's times
  pid_t controller = cozy::testing::Spawn(arguments, work / "controller.log");
  if (!WaitForController(port, work / "controller.log")) {
    cozy::testing::Finish(controller);
    return 1;
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the passes its writes trigger

  // One burst: `requests` orders with their requests, from device `first` on, written while the
  // binder runs or with the controller held until all are in.
  bool done = true;
  std::vector<BurstRate> rates;
  auto burst = [&](int first, bool hold) {
    // The answers are seen as the real-cluster run sees them, through a watch on the requests'
    // label (polling the fake's store for each request would hold its lock against the writes).
    AnswerWatch answers(config, first, requests);
    answers.Start();
    server.ClearRequests();
    auto write = [&] {
      for (int i = first; i < first + requests; ++i) {
        server.Seed(Device(i, "", "req-" + std::to_string(i)));
      }
    };
    BurstStart start(controller, hold, write);
    const auto threadsBefore = cozy::bench::ThreadCpu(controller);
    const double controllerBefore = cozy::bench::CpuSeconds(controller);
    const double benchBefore = cozy::bench::CpuSeconds(getpid());
    const auto asked = start.Start();
    const bool answered = answers.Wait(std::chrono::minutes(10));
    done = done && answered;
    const int left = requests - answers.answered();
    const int bound = answers.bound();
    const double answerSeconds = Seconds(Clock::now() - asked);
    std::printf("requests written %s%s:\n", hold ? kHeld : kLive,
                hold ? " (the controller held with SIGSTOP while they were written; timed from "
                       "its SIGCONT)"
                     : "");
    PrintCpu(controller, threadsBefore, cozy::bench::CpuSeconds(controller) - controllerBefore,
             cozy::bench::CpuSeconds(getpid()) - benchBefore, answerSeconds);
    int placementWrites = 0;
    for (const auto& request : server.Requests()) {
      if (request.method == "PATCH" && request.status < 300 && request.path.ends_with("/status") &&
          request.path.find("/gpudevices/") != std::string::npos) {
        ++placementWrites;
      }
    }
    std::printf("%d bind requests answered%s in %.2f s: %.0f answers/s, %d bound\n",
                requests - left, answered ? "" : " (TIMED OUT)", answerSeconds,
                (requests - left) / answerSeconds, bound);
    std::printf("placement writes per bound device: %.2f (%d writes)\n",
                bound > 0 ? static_cast<double>(placementWrites) / bound : 0.0, placementWrites);
    rates.push_back({hold ? kHeld : kLive, (requests - left) / answerSeconds, 0});
    for (int i = first; i < first + requests; ++i) {
      all.push_back(Device(i, "", "req-" + std::to_string(i)));
    }
  };
  burst(held, false);
  std::this_thread::sleep_for(std::chrono::seconds(2));  // the full pass after the answers
  burst(held + requests, true);

  // A quiet window: nothing changes, nothing should be written.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  server.ClearRequests();
  std::this_thread::sleep_for(std::chrono::seconds(quietSeconds));
  int quietWrites = 0;
  for (const auto& request : server.Requests()) {
    if (request.method != "GET" && request.path.find("/leases/") == std::string::npos) {
      ++quietWrites;
    }
  }
  std::printf("writes in a quiet %d s (the Lease's renewals aside): %d\n", quietSeconds,
              quietWrites);
  PrintControllerMetrics(port);
  cozy::testing::Finish(controller);
  if (const char* log = std::getenv("BENCH_CONTROLLER_LOG")) {
    std::filesystem::copy_file(work / "controller.log", log,
                               std::filesystem::copy_options::overwrite_existing);
  }
  BarePatchPeer(config, held, requests, rates);

  ModelPeer(all,
            rates.front().answersPerSecond > 0 ? requests / rates.front().answersPerSecond : 0.0);
  std::filesystem::remove_all(work);
  return done && quietWrites == 0 ? 0 : 1;
}

double PlacementWrites(const std::map<std::string, double>& delta, bool success) {
  double sum = 0;
  for (const auto& [key, value] : delta) {
    const bool status = key.starts_with("PATCH gpudevices/status ") ||
                        key.starts_with("PUT gpudevices/status ") ||
                        key.starts_with("APPLY gpudevices/status ");
    const bool ok = key.substr(key.rfind(' ') + 1).starts_with('2');
    if (status && ok == success) sum += value;
  }
  return sum;
}

int RunReal(const cozy::bench::Mode& mode, int nodes, int requests, int quietSeconds, int threads) {
  // Every unit held but one per request of the two bursts.
  const int held = nodes * kGpusPerNode - 2 * requests;
  const std::filesystem::path source = COZY_SOURCE_DIR;
  cozy::bench::ControlPlane cluster(mode, source);
  const std::filesystem::path work = cluster.work();
  cluster.ApplyCrds(/*kubeVirt=*/false);  // the GPU kinds only, as the fake serves them here
  const auto& config = cluster.config();

  json all = json::array();  // the same cluster for the model alone
  const auto seeding = Clock::now();
  std::vector<json> namespaces = {Namespace("cozy-system")};
  for (int t = 0; t < kTenants; ++t) namespaces.push_back(Namespace("tenant-" + std::to_string(t)));
  cozy::bench::Parallel(config, threads, static_cast<int>(namespaces.size()),
                        [&](int i, cozy::kube::Client& client) {
                          cozy::bench::CreateWithStatus(client, namespaces[static_cast<size_t>(i)],
                                                        "namespaces", false);
                        });
  for (const auto& ns : namespaces) all.push_back(ns);
  {
    cozy::kube::Client client(config, cozy::bench::BenchClientOptions());
    cozy::bench::CreateWithStatus(client, GpuClass(), "gpuclasses", true);
    all.push_back(GpuClass());
  }
  cozy::bench::Parallel(config, threads, nodes, [&](int n, cozy::kube::Client& client) {
    cozy::bench::CreateWithStatus(client, Node(n), "nodes", false);  // a Node keeps its status
    cozy::bench::CreateWithStatus(client, GpuNode(n), "gpunodes", true);
  });
  for (int n = 0; n < nodes; ++n) {
    all.push_back(Node(n));
    all.push_back(GpuNode(n));
  }
  const double nodeSeconds = Seconds(Clock::now() - seeding);
  // Held units fill the nodes in order, so the free ones are spread over the last nodes.
  cozy::bench::Parallel(config, threads, held, [&](int i, cozy::kube::Client& client) {
    cozy::bench::CreateWithStatus(client, Device(i, "node-" + std::to_string(i / kGpusPerNode), ""),
                                  "gpudevices", true);
  });
  for (int i = 0; i < held; ++i)
    all.push_back(Device(i, "node-" + std::to_string(i / kGpusPerNode), ""));
  // The orders of both bursts, without their requests yet: the tenants' creates, before the
  // controller runs.
  cozy::bench::Parallel(config, threads, 2 * requests, [&](int r, cozy::kube::Client& client) {
    json order = Device(held + r, "", "");
    order.erase("status");
    order["metadata"]["labels"] = {{kRequestLabel, "true"}};
    cozy::bench::CreateWithStatus(client, order, "gpudevices", true);
  });
  const double seedSeconds = Seconds(Clock::now() - seeding);
  const int objects = static_cast<int>(namespaces.size()) + 1 + 2 * nodes + held + 2 * requests;
  std::printf(
      "seeded %d nodes x %d GPUs, %d held devices, %d orders through the API server in %.1f s "
      "(%d threads; nodes and GPUNodes %.1f s; %d objects, %.0f objects/s)\n",
      nodes, kGpusPerNode, held, 2 * requests, seedSeconds, threads, nodeSeconds, objects,
      objects / seedSeconds);

  const int port = cozy::testing::FreePort();
  if (!SelfSignedCertificate(work / "certs")) return 1;
  cozy::bench::ControllerProcess controller(
      {ControllerProgram(), "run", "--kubeconfig", cluster.kubeconfig().string(), "--identity",
       "bench", "--enable-gpu", "--health-addr", "127.0.0.1:" + std::to_string(port), "--qps", "0",
       "--webhook-addr", "127.0.0.1:0", "--webhook-cert-dir", (work / "certs").string(),
       "--webhook-client-ca", (work / "certs/tls.crt").string()},
      work / "controller.log");
  auto failed = [&] {
    const auto tail = cozy::testing::RunCommand(
        "tail -n 20 " + cozy::testing::ShellQuote(controller.log().string()));
    std::fprintf(stderr, "--- controller log (last lines)\n%s", tail.out.c_str());
    return 1;
  };
  if (!WaitForController(port, controller.log())) return failed();
  // The writes its first pass triggers (each GPUNode's condition, the orders' first status).
  cozy::bench::WaitForStillWrites(cluster, std::chrono::seconds(2), std::chrono::minutes(5));

  // One burst: the requests of `requests` orders, from device `first` on, written by `threads`
  // threads while the binder runs or with the controller held until all are in.
  bool done = true;
  std::vector<BurstRate> rates;
  std::string metricsAfter;
  auto burst = [&](int first, bool hold) {
    AnswerWatch answers(config, first, requests);
    answers.Start();
    auto write = [&] {
      cozy::bench::Parallel(config, threads, requests, [&](int r, cozy::kube::Client& client) {
        const int i = first + r;
        client.MergePatch(
            cozy::kube::ResourcePath("gpu.cozystack.io", "v1alpha1", "gpudevices",
                                     DeviceNamespace(i), "d" + std::to_string(i), "status"),
            {{"status", Device(i, "", "req-" + std::to_string(i))["status"]}});
      });
    };
    BurstStart start(controller.pid(), hold, write);
    // Held, after the requests: the window's writes are then the binder's alone.
    const std::string metricsBefore = cluster.Metrics();
    const auto before = cozy::bench::Writes(metricsBefore);
    const auto asked = start.Start();
    const double writeSeconds = start.writeSeconds();
    const bool answered = answers.Wait(std::chrono::minutes(10));
    done = done && answered;
    const double answerSeconds = Seconds(Clock::now() - asked);
    std::this_thread::sleep_for(std::chrono::seconds(2));
    metricsAfter = cluster.Metrics();
    const auto after = cozy::bench::Writes(metricsAfter);
    const auto writes = cozy::bench::Delta(before, after);
    const double placementWrites =
        PlacementWrites(writes, true) - (hold ? 0 : requests);  // less our requests
    const double refusedWrites = PlacementWrites(writes, false);
    const int count = answers.answered();
    const int bound = answers.bound();
    std::printf("requests written %s%s:\n", hold ? kHeld : kLive,
                hold ? " (the controller held with SIGSTOP while they were written; timed from "
                       "its SIGCONT)"
                     : "");
    std::printf(
        "%d bind requests (written in %.2f s by %d threads) answered%s in %.2f s: %.0f "
        "answers/s, %d bound\n",
        count, writeSeconds, threads, answered ? "" : " (TIMED OUT)", answerSeconds,
        count / answerSeconds, bound);
    std::printf(
        "placement writes per bound device: %.2f (%.0f status writes the API server accepted%s; "
        "%.0f refused)\n",
        bound > 0 ? placementWrites / bound : 0.0, placementWrites,
        hold ? "" : (", the " + std::to_string(requests) + " requests aside").c_str(),
        refusedWrites);
    std::printf("  API writes from %s to 2 s after the last answer: %s\n",
                hold ? "the SIGCONT" : "the requests", cozy::bench::Describe(writes).c_str());
    // The API server's own time for those status writes (ours and the binder's).
    auto statusPatches = [](const std::string& text, const char* suffix) {
      return cozy::bench::Sum(text, std::string("apiserver_request_duration_seconds") + suffix,
                              [](const auto& labels) {
                                return cozy::bench::Label(labels, "verb") == "PATCH" &&
                                       cozy::bench::Label(labels, "resource") == "gpudevices" &&
                                       cozy::bench::Label(labels, "subresource") == "status";
                              });
    };
    const double patches =
        statusPatches(metricsAfter, "_count") - statusPatches(metricsBefore, "_count");
    std::printf("  the API server's mean time per status write: %.1f ms (%.0f writes)\n",
                patches > 0
                    ? (statusPatches(metricsAfter, "_sum") - statusPatches(metricsBefore, "_sum")) /
                          patches * 1e3
                    : 0.0,
                patches);
    rates.push_back(
        {hold ? kHeld : kLive, count / answerSeconds, hold ? 0.0 : patches / answerSeconds});
    for (int i = first; i < first + requests; ++i) {
      all.push_back(Device(i, "", "req-" + std::to_string(i)));
    }
  };
  burst(held, false);
  burst(held + requests, true);
  const auto after = cozy::bench::Writes(metricsAfter);

  // A quiet window: nothing changes, nothing should be written.
  std::this_thread::sleep_for(std::chrono::seconds(quietSeconds));
  const auto quiet = cozy::bench::Delta(after, cozy::bench::Writes(cluster.Metrics()));
  double quietWrites = 0;
  for (const auto& [key, value] : quiet) quietWrites += value;
  std::printf(
      "writes in a quiet %d s (Lease renewals aside), as the API server counts them: %.0f (%s)\n",
      quietSeconds, quietWrites, cozy::bench::Describe(quiet).c_str());
  PrintControllerMetrics(port);
  controller.Stop();
  BarePatchPeer(config, held, requests, rates);

  ModelPeer(all,
            rates.front().answersPerSecond > 0 ? requests / rates.front().answersPerSecond : 0.0);
  return done && quietWrites == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines as they come, also into a file
  try {
    cozy::bench::Mode mode;
    const std::vector<std::string> words = cozy::bench::ParseMode(argc, argv, mode);
    const int nodes = cozy::bench::Positional(words, 0, mode.Real() ? 1000 : 5000);
    const int requests = cozy::bench::Positional(words, 1, 1000);
    const int quietSeconds = cozy::bench::Positional(words, 2, 60);
    if (nodes <= 0 || requests <= 0 || 2 * requests > nodes * kGpusPerNode || quietSeconds < 0) {
      std::fprintf(stderr, "need nodes > 0 and 0 < requests <= 4 x nodes (two bursts)\n");
      return 2;
    }
    if (!mode.Real()) return RunFake(nodes, requests, quietSeconds);
    return RunReal(mode, nodes, requests, quietSeconds, cozy::bench::Positional(words, 3, 16));
  } catch (const std::exception& error) {
    std::fprintf(stderr, "bench_binder: %s\n", error.what());
    return 1;
  }
}
