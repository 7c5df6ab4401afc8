// The controller under pod churn (docs/benchmarks.md, of that name), through the fake API server:
// `gpu-controller run --enable-gpu` (the real program) over N nodes x 8 GPUs, half of the units
// held by GPUDevices, and P pods, a tenth of them asking for a GPU each. It runs `seconds` quiet
// (the floor: the same cluster with no churn, the peer in the same run), then `seconds` under
// `rate` pod events a second through the API (create, a status write to Running, delete), nine in
// ten of them on pods of cpu and memory alone and one in ten on GPU pods (created and deleted).
// Prints, for each phase: the controller's CPU seconds per wall second (its own
// process_cpu_seconds_total), binder and reconciler passes, and at the end its resident memory, the
// changes its caches took without a pass, the churn's CPU as a ratio to the floor, and the other
// peer: a reference walk of the churn's pod events (parse and decode alone, on one thread). Then
// the answer time of `binds` bind requests (a new order, then its status.bindRequest, as the VMI
// webhook writes it; from that write to the binder's answer seen through the API): spread over
// `seconds` without churn (the peer), then over `seconds` of the same churn.
//
//   bench_churn [nodes=1000] [pods=20000] [rate=50] [seconds=20] [binds=100]
//
// The size docs/benchmarks.md reports is bench_churn 5000 100000 50 60 (a machine with a few GB
// free). With BENCH_GPU_CONTROLLER=/path/to/gpu-controller it drives that build instead (an earlier
// commit's: the before and after of a change, on the same cluster and churn). With
// BENCH_USAGE_RECORDS=1 the fake serves Cozystack's usage-record kinds as well.
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "api/time.h"
#include "controller/model/readers.h"
#include "controller/snapshot_json.h"
#include "kube/client.h"
#include "kube/config.h"
#include "kube/json_stream.h"
#include "test/bench/proc_cpu.h"
#include "test/bench/real_cluster.h"
#include "test/fakes/fake_apiserver.h"
#include "test/support/gpu_objects.h"
#include "test/support/process.h"

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using cozy::bench::CpuSeconds;
using cozy::bench::ThisThreadCpu;
using cozy::bench::ThreadCpu;
constexpr int kGpusPerNode = 8;
constexpr int kTenants = 100;
constexpr const char* kGpuResource = "nvidia.com/GA100";

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
std::string Tenant(int i) { return "tenant-" + std::to_string(i % kTenants); }
std::string NodeName(int n) { return "node-" + std::to_string(n); }

json Pod(const std::string& name, const std::string& ns, const std::string& node, bool gpu) {
  json requests = {{"cpu", "100m"}, {"memory", "128Mi"}};
  json limits = requests;
  if (gpu) {
    requests[kGpuResource] = "1";
    limits[kGpuResource] = "1";
  }
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", ns}}},
          {"spec",
           {{"nodeName", node},
            {"containers",
             {{{"name", "c"},
               {"image", "busybox"},
               {"resources", {{"requests", requests}, {"limits", limits}}}}}}}},
          {"status", {{"phase", "Running"}}}};
}

json Device(int i, const std::string& node) {
  return {{"apiVersion", "gpu.cozystack.io/v1alpha1"},
          {"kind", "GPUDevice"},
          {"metadata",
           {{"name", "d" + std::to_string(i)},
            {"namespace", Tenant(i)},
            {"finalizers", {"gpu.cozystack.io/device-protection"}}}},
          {"spec", {{"className", "a100"}, {"count", 1}}},
          {"status", {{"phase", "Bound"}, {"nodeName", node}}}};
}

double ResidentMiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

struct Phase {
  double cpuPerSecond = 0;
  double ignoredPodChanges = 0;  // taken by the pod cache without waking a pass
  double quietPodChanges = 0;    // GPU pod changes the binder's quiet room took (none before)
  double binderPasses = 0;
  double reconcilePasses = 0;
  int events = 0;
  std::map<std::string, double> threadCpu;  // seconds by thread name, /proc's 10 ms ticks
};

double Metric(const std::string& metrics, const std::string& name, const char* key = nullptr,
              const char* value = nullptr) {
  return cozy::bench::Sum(metrics, name, [&](const std::map<std::string, std::string>& labels) {
    return key == nullptr || cozy::bench::Label(labels, key) == value;
  });
}

// The controller's CPU seconds: its own process_cpu_seconds_total (to the nanosecond, ended
// threads included), or /proc's ticks for a build that does not export it (an earlier commit's
// through BENCH_GPU_CONTROLLER).
bool preciseCpu = true;
double Cpu(pid_t pid, const std::string& metrics) {
  if (metrics.find("\nprocess_cpu_seconds_total ") != std::string::npos) {
    return Metric(metrics, "process_cpu_seconds_total");
  }
  preciseCpu = false;
  return CpuSeconds(pid);
}

// `seconds` of the controller's life, with `event` called `rate` times a second (none: quiet).
Phase Measure(pid_t controller, int port, int seconds, int rate,
              const std::function<void(int)>& event) {
  const std::string before = cozy::bench::ControllerMetrics(port);
  const double cpuBefore = Cpu(controller, before);
  const auto threadsBefore = ThreadCpu(controller);
  const auto start = Clock::now();
  Phase phase;
  if (rate > 0 && event) {
    const auto every = std::chrono::microseconds(1000000 / rate);
    for (auto next = start; Clock::now() - start < std::chrono::seconds(seconds); next += every) {
      std::this_thread::sleep_until(next);
      event(phase.events++);
    }
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(seconds));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the metrics' next tick
  const double wall = Seconds(Clock::now() - start);
  const std::string after = cozy::bench::ControllerMetrics(port);
  phase.cpuPerSecond = (Cpu(controller, after) - cpuBefore) / wall;
  for (const auto& [name, cpu] : ThreadCpu(controller)) {
    const auto was = threadsBefore.find(name);
    const double used = cpu - (was == threadsBefore.end() ? 0 : was->second);
    if (used > 0) phase.threadCpu[name] = used;
  }
  phase.binderPasses = Metric(after, "gpu_controller_binder_passes_total", "kind", "full") -
                       Metric(before, "gpu_controller_binder_passes_total", "kind", "full");
  phase.reconcilePasses = Metric(after, "gpu_controller_reconcile_passes_total") -
                          Metric(before, "gpu_controller_reconcile_passes_total");
  const char* ignored = "gpu_controller_cache_ignored_changes_total";
  phase.ignoredPodChanges =
      Metric(after, ignored, "cache", "pods") - Metric(before, ignored, "cache", "pods");
  const char* quiet = "gpu_controller_binder_quiet_pod_changes_total";
  phase.quietPodChanges = Metric(after, quiet) - Metric(before, quiet);
  return phase;
}

// `count` bind requests spread over `seconds`, each on a new order in a tenant's namespace,
// answered or not within 10 s; returns each answer's time in seconds (a request never answered
// counts as 10 s).
std::vector<double> BindRequests(const std::filesystem::path& kubeconfig, const std::string& run,
                                 int count, int seconds) {
  cozy::kube::Client client(cozy::kube::LoadKubeconfig(kubeconfig),
                            cozy::bench::BenchClientOptions());
  std::vector<double> answers;
  const auto start = Clock::now();
  const auto every = std::chrono::microseconds(1000000LL * seconds / std::max(count, 1));
  for (int i = 0; i < count; ++i) {
    std::this_thread::sleep_until(start + every * i);
    const std::string ns = Tenant(i);
    const std::string name = "bind-" + run + "-" + std::to_string(i);
    const std::string path = "/apis/gpu.cozystack.io/v1alpha1/namespaces/" + ns + "/gpudevices/";
    const std::string id = run + "-" + std::to_string(i);
    double answered = 10;
    try {
      client.Create(path, {{"apiVersion", "gpu.cozystack.io/v1alpha1"},
                           {"kind", "GPUDevice"},
                           {"metadata", {{"name", name}, {"namespace", ns}}},
                           {"spec", {{"className", "a100"}, {"count", 1}}}});
      const auto asked = Clock::now();
      client.MergePatch(
          path + name + "/status",
          {{"status",
            {{"bindRequest",
              {{"id", id},
               {"requestedAt", cozy::api::FormatTime(std::chrono::system_clock::now())}}}}}});
      while (Clock::now() - asked < std::chrono::seconds(10)) {
        const json device = client.Get(path + name);
        const json response = device.value("status", json::object()).value("bindResponse", json());
        if (response.is_object() && response.value("id", "") == id) {
          answered = Seconds(Clock::now() - asked);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    } catch (const std::exception& error) {
      std::fprintf(stderr, "bind request %s: %s\n", id.c_str(), error.what());
    }
    answers.push_back(answered);
  }
  return answers;
}

// The reference walk, the other peer: the least that taking the churn's pod events
// costs, in this process on one thread: each event's text (a pod as the server stores it, in a
// watch event) parsed and decoded as the controller's pods cache decodes it, and the model's
// filter asked whether it matters. Returns CPU seconds per event.
double ReferenceWalk(const cozy::fake::FakeApiServer& server, int pods) {
  std::vector<std::string> lines;
  const int step = std::max(1, pods / 1000);
  for (int i = 0; i < pods; i += step) {
    const json object = server.Object("v1", "pods", Tenant(i), "p" + std::to_string(i));
    if (object.is_object()) lines.push_back(json{{"type", "MODIFIED"}, {"object", object}}.dump());
  }
  if (lines.empty()) return 0;
  int matters = 0;
  const int rounds = 5;
  const double start = ThisThreadCpu();
  for (int round = 0; round < rounds; ++round) {
    for (const std::string& line : lines) {
      const json event = json::parse(line);
      const cozy::model::Pod pod = cozy::controller::PodFromJson(event.at("object"));
      matters += cozy::model::PodChangeMatters(nullptr, &pod) ? 1 : 0;
    }
  }
  const double perEvent = (ThisThreadCpu() - start) / static_cast<double>(rounds * lines.size());
  if (matters == 0) std::printf("(no pod of the reference walk asks for a GPU)\n");
  return perEvent;
}

// A pod as a real cluster serves it: the bench's pod plus what the API server and kubelet add
// (managedFields of three managers, status conditions and container statuses), about 5 KB.
json RealSized(json pod) {
  json fields = json::object();
  for (const char* f : {"f:metadata", "f:spec", "f:status"}) {
    json inner = json::object();
    for (int i = 0; i < 12; ++i) inner["f:field" + std::to_string(i)] = {{"f:sub", json::object()}};
    fields[f] = inner;
  }
  for (const char* manager : {"kube-controller-manager", "kube-scheduler", "kubelet"}) {
    pod["metadata"]["managedFields"].push_back({{"manager", manager},
                                                {"operation", "Update"},
                                                {"apiVersion", "v1"},
                                                {"time", "2026-12-04T00:00:00Z"},
                                                {"fieldsType", "FieldsV1"},
                                                {"fieldsV1", fields}});
  }
  for (const char* type :
       {"PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"}) {
    pod["status"]["conditions"].push_back(
        {{"type", type}, {"status", "True"}, {"lastTransitionTime", "2026-12-04T00:00:00Z"}});
  }
  pod["status"]["containerStatuses"] = {
      {{"name", "c"},
       {"ready", true},
       {"restartCount", 0},
       {"image", "registry.example.com/app:1.2.3"},
       {"imageID", "registry.example.com/app@sha256:" + std::string(64, 'a')},
       {"containerID", "containerd://" + std::string(64, 'b')},
       {"state", {{"running", {{"startedAt", "2026-12-04T00:00:00Z"}}}}}}};
  return pod;
}

// The skim's peer (docs/controller.md, "Who wakes for a change"): what the pods watch spends on a
// pod the cache does not keep, SkimEvent over its text with no document, against the parse and
// decode it replaced, on the bench's pods and on the same pods at a real cluster's size.
void SkimWalk(const cozy::fake::FakeApiServer& server, int pods) {
  std::vector<std::string> small, real;
  const int step = std::max(1, pods / 1000);
  for (int i = pods / 10; i < pods; i += step) {  // the pods of cpu and memory alone
    const json object = server.Object("v1", "pods", Tenant(i), "p" + std::to_string(i));
    if (!object.is_object()) continue;
    small.push_back(json{{"type", "MODIFIED"}, {"object", object}}.dump());
    real.push_back(json{{"type", "MODIFIED"}, {"object", RealSized(object)}}.dump());
  }
  if (small.empty()) return;
  auto time = [&](const std::vector<std::string>& lines, bool skim) {
    int kept = 0;
    const int rounds = 5;
    const double start = ThisThreadCpu();
    for (int round = 0; round < rounds; ++round) {
      for (const std::string& line : lines) {
        if (skim) {
          kept += cozy::kube::SkimEvent(line, cozy::model::PodKeyIsExtendedResource) ? 0 : 1;
        } else {
          const json event = json::parse(line);
          const cozy::model::Pod pod = cozy::controller::PodFromJson(event.at("object"));
          kept += cozy::model::PodAsksForExtendedResources(pod) ? 1 : 0;
        }
      }
    }
    if (kept != 0) std::printf("(a pod of the skim walk was kept)\n");
    return (ThisThreadCpu() - start) / static_cast<double>(rounds * lines.size()) * 1e6;
  };
  const double smallWhole = time(small, false), smallSkim = time(small, true);
  const double realWhole = time(real, false), realSkim = time(real, true);
  std::printf(
      "skim of a pod the cache does not keep: %.1f us against %.1f us parsed and decoded "
      "(%.2f); at a real pod's size (%zu bytes) %.1f us against %.1f us (%.2f)\n",
      smallSkim, smallWhole, smallSkim / smallWhole, real.front().size(), realSkim, realWhole,
      realSkim / realWhole);
}

double Quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const auto at = static_cast<size_t>(q * static_cast<double>(values.size()));
  return values[std::min(values.size() - 1, at)];
}

void PrintAnswers(const char* name, const std::vector<double>& answers) {
  std::printf("%-18s %3zu bind requests answered in p50 %6.1f ms, p99 %6.1f ms, max %6.1f ms\n",
              name, answers.size(), Quantile(answers, 0.5) * 1e3, Quantile(answers, 0.99) * 1e3,
              Quantile(answers, 1.0) * 1e3);
}

void Print(const char* name, const Phase& phase) {
  std::printf(
      "%-6s %4d events: CPU %.4f s/s (%.2f %% of a core), binder full passes %.0f, "
      "reconciler passes %.0f, pod changes taken without a pass %.0f (GPU pods in the quiet "
      "room %.0f)\n",
      name, phase.events, phase.cpuPerSecond, phase.cpuPerSecond * 100, phase.binderPasses,
      phase.reconcilePasses, phase.ignoredPodChanges, phase.quietPodChanges);
  std::vector<std::pair<double, std::string>> threads;
  for (const auto& [thread, cpu] : phase.threadCpu) threads.emplace_back(cpu, thread);
  std::sort(threads.rbegin(), threads.rend());
  std::printf("       CPU by thread:");
  for (const auto& [cpu, thread] : threads) std::printf(" %s %.2f s", thread.c_str(), cpu);
  // The informer loop reads every cache's watch (docs/kubernetes.md, "One thread for every cache's
  // watch"); an earlier commit's build read the pods' on a thread of their own.
  auto pods = phase.threadCpu.find("informers");
  if (pods == phase.threadCpu.end()) pods = phase.threadCpu.find("c:pods");
  if (phase.events > 0 && pods != phase.threadCpu.end()) {
    std::printf("; the %s thread %.0f us per event", pods->first.c_str(),
                pods->second / phase.events * 1e6);
  }
  std::printf("\n");
}

int Run(int nodes, int pods, int rate, int seconds, int binds) {
  char pattern[] = "/tmp/bench-churn.XXXXXX";
  const std::filesystem::path work = ::mkdtemp(pattern);
  cozy::fake::FakeApiServerOptions options;
  options.crdPaths = {std::filesystem::path(COZY_SOURCE_DIR) / "charts/gpu/templates/crds"};
  // BENCH_USAGE_RECORDS=1: Cozystack's Workload kinds served too, so the controller writes the
  // devices' and the GPU pods' usage records (C11), and every GPU pod change wakes the reconciler.
  const char* records = std::getenv("BENCH_USAGE_RECORDS");
  if (records != nullptr && std::string(records) == "1") {
    options.crdPaths.push_back(std::filesystem::path(COZY_SOURCE_DIR) / "test/fakes/crds");
  }
  options.bookmarkInterval = std::chrono::minutes(1);  // as a real server's
  cozy::fake::FakeApiServer server(options);
  server.Start();
  const auto seeding = Clock::now();
  server.Seed(
      {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "cozy-system"}}}});
  for (int t = 0; t < kTenants; ++t) {
    server.Seed({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", Tenant(t)}}}});
  }
  server.Seed(cozy::testing::GpuClassObject("a100", kGpuResource));
  for (int n = 0; n < nodes; ++n) {
    server.Seed(cozy::testing::ReadyNode(NodeName(n)));
    server.Seed(cozy::testing::GpuNodeObject(NodeName(n), kGpusPerNode));
  }
  const int devices = nodes * kGpusPerNode / 2;
  for (int i = 0; i < devices; ++i) server.Seed(Device(i, NodeName(i / kGpusPerNode)));
  // GPU pods on the nodes' other half: one GPU each, a tenth of the pods.
  const int gpuPods = pods / 10;
  for (int i = 0; i < pods; ++i) {
    const bool gpu = i < gpuPods;
    const int node = gpu ? (devices + i) / kGpusPerNode % nodes : i % nodes;
    server.Seed(Pod("p" + std::to_string(i), Tenant(i), NodeName(node), gpu));
  }
  std::printf(
      "seeded %d nodes x %d GPUs, %d held devices, %d pods (%d asking for a GPU) in %.1f s\n",
      nodes, kGpusPerNode, devices, pods, gpuPods, Seconds(Clock::now() - seeding));

  std::ofstream(work / "kubeconfig") << server.Kubeconfig("churn");
  cozy::bench::WebhookCertificates(work / "certs");
  const int port = cozy::testing::FreePort();
  // BENCH_GPU_CONTROLLER: another build of the program (an earlier commit's, as the peer).
  const char* program = std::getenv("BENCH_GPU_CONTROLLER");
  pid_t controller = cozy::testing::Spawn(
      {program != nullptr ? program : GPU_CONTROLLER, "run", "--kubeconfig",
       (work / "kubeconfig").string(), "--identity", "bench", "--enable-gpu", "--health-addr",
       "127.0.0.1:" + std::to_string(port), "--qps", "0", "--webhook-addr", "127.0.0.1:0",
       "--webhook-cert-dir", (work / "certs").string(),
       // No caller reaches these webhooks: the bench's CA stands in for the API server's.
       "--webhook-client-ca", (work / "certs/ca.crt").string()},
      work / "controller.log");
  const bool ready = cozy::testing::WaitFor(
      [&] {
        return cozy::bench::Ready(port) &&
               Metric(cozy::bench::ControllerMetrics(port), "gpu_controller_binder_passes_total",
                      "kind", "full") > 0;
      },
      std::chrono::minutes(10), std::chrono::milliseconds(200));
  if (!ready) {
    std::fprintf(stderr, "the controller did not get ready; see %s\n",
                 (work / "controller.log").c_str());
    cozy::testing::Finish(controller);
    return 1;
  }
  std::this_thread::sleep_for(std::chrono::seconds(5));  // the first passes' writes settle
  if (records != nullptr && std::string(records) == "1") {
    // The first passes write a record of every held device and GPU pod: the quiet phase starts
    // once none has been added for 3 s.
    cozy::kube::ClientConfig config;
    config.server = server.url();
    cozy::kube::Client client(config);
    size_t written = SIZE_MAX;
    auto still = Clock::now();
    for (const auto until = Clock::now() + std::chrono::minutes(5); Clock::now() < until;) {
      const size_t count = client.Get("/apis/cozystack.io/v1alpha1/workloads")["items"].size();
      if (count != written) {
        written = count;
        still = Clock::now();
      } else if (Clock::now() - still > std::chrono::seconds(3)) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    std::printf("usage records written before the quiet phase: %zu\n", written);
  }

  const Phase floor = Measure(controller, port, seconds, 0, nullptr);
  Print("quiet", floor);

  cozy::kube::Client client(cozy::kube::LoadKubeconfig(work / "kubeconfig"),
                            cozy::bench::BenchClientOptions());
  cozy::kube::DeleteOptions now;
  now.gracePeriodSeconds = 0;
  // Event e: nine in ten on cpu pods (create, then Running, then delete, in turn), one in ten
  // on a GPU pod (created, then deleted).
  auto event = [&](int e) {
    const bool gpu = e % 10 == 9;
    const int n = e / 3;
    // A GPU pod is named, and namespaced, by its pair of events (e / 20), so its delete finds it.
    const std::string name = (gpu ? "churn-gpu-" : "churn-") + std::to_string(gpu ? e / 20 : n);
    const std::string ns = Tenant(gpu ? e / 20 : n);
    const std::string path = "/api/v1/namespaces/" + ns + "/pods/" + name;
    try {
      if (gpu) {
        if ((e / 10) % 2 == 0) {
          client.Create("/api/v1/namespaces/" + ns + "/pods",
                        Pod(name, ns, NodeName(nodes - 1), true));
        } else {
          client.Delete(path, now);
        }
        return;
      }
      switch (e % 3) {
        case 0:
          client.Create("/api/v1/namespaces/" + ns + "/pods",
                        Pod(name, ns, NodeName(n % nodes), false));
          break;
        case 1:
          client.MergePatch(path + "/status", {{"status", {{"phase", "Running"}}}});
          break;
        default:
          client.Delete(path, now);
          break;
      }
    } catch (const std::exception&) {
      // The rotation may name a pod another event already removed: churn, not a failure.
    }
  };
  const Phase churn = Measure(controller, port, seconds, rate, event);
  Print("churn", churn);

  // Bind answers, without churn and during it (the same churn, continued).
  const std::vector<double> quietAnswers =
      BindRequests(work / "kubeconfig", "quiet", binds, seconds);
  PrintAnswers("without churn", quietAnswers);
  std::vector<double> churnAnswers;
  std::thread requests(
      [&] { churnAnswers = BindRequests(work / "kubeconfig", "churn", binds, seconds); });
  Measure(controller, port, seconds, rate, [&](int e) { event(e + churn.events); });
  requests.join();
  PrintAnswers("during churn", churnAnswers);
  if (Quantile(quietAnswers, 0.5) > 0) {
    std::printf("bind answers during churn / without: p50 %.2f, p99 %.2f (goal: as fast)\n",
                Quantile(churnAnswers, 0.5) / Quantile(quietAnswers, 0.5),
                Quantile(churnAnswers, 0.99) / Quantile(quietAnswers, 0.99));
  }

  // Per 1,000 pods: the slope between two runs of different pod counts (docs/benchmarks.md);
  // this run's total has everything else in it.
  std::printf("controller resident memory %.1f MiB\n", ResidentMiB(controller));
  // The controller's own CPU clock (process_cpu_seconds_total) counts to the nanosecond; /proc's
  // ticks (an earlier build's) count 10 ms, and a quiet phase may use none.
  if (floor.cpuPerSecond > 0) {
    std::printf("churn CPU / quiet CPU: %.1fx (goal: within 2x; quiet %.3f %% of a core%s)\n",
                churn.cpuPerSecond / floor.cpuPerSecond, floor.cpuPerSecond * 100,
                preciseCpu ? "" : ", counted in /proc's 10 ms ticks");
  } else {
    std::printf("churn CPU / quiet CPU: the quiet phase used no clock tick\n");
  }
  const double reference = ReferenceWalk(server, pods);
  const double eventsPerSecond = churn.events / (seconds + 1.5);
  if (reference > 0) {
    std::printf(
        "reference walk: %.1f us of CPU per pod event (parse and decode alone); at the churn's "
        "%.0f events/s %.3f %% of a core; churn CPU above the floor / reference: %.1fx\n",
        reference * 1e6, eventsPerSecond, reference * eventsPerSecond * 100,
        (churn.cpuPerSecond - floor.cpuPerSecond) / (reference * eventsPerSecond));
  } else {
    std::printf("reference walk: no seeded pods to walk\n");
  }
  if (pods > 0) {
    SkimWalk(server, pods);
  }
  std::printf("churn CPU %.2f %% of a core (goal: under 5 %%)\n", churn.cpuPerSecond * 100);
  cozy::testing::Finish(controller);
  std::filesystem::remove_all(work);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  auto arg = [&](int i, int fallback) { return argc > i ? std::atoi(argv[i]) : fallback; };
  try {
    return Run(arg(1, 1000), arg(2, 20000), arg(3, 50), arg(4, 20), arg(5, 100));
  } catch (const std::exception& error) {
    std::fprintf(stderr, "bench_churn: %s\n", error.what());
    return 1;
  }
}
