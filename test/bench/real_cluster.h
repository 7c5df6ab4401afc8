// The benchmarks' real-cluster mode (docs/benchmarks.md, "On a real control plane"): a real control
// plane (etcd, kube-apiserver, kube-controller-manager of `scripts/cluster.sh up`, or an existing
// cluster's kubeconfig), the cluster seeded through it by several threads with a client each,
// `gpu-controller run --enable-gpu` on it, and the API server's own counters (`/metrics`) read
// before and after.
// Header-only, for bench_binder, bench_admission and bench_real_nodes (whose nodes' agents are
// ChildProcesses).
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kube/client.h"
#include "kube/config.h"
#include "kube/errors.h"
#include "test/support/fixture_host.h"
#include "test/support/process.h"

namespace cozy::bench {

// --real-cluster or --kubeconfig FILE taken out of the command line; the rest is positional.
struct Mode {
  bool realCluster = false;  // bring a control plane up (scripts/cluster.sh) and down
  std::string kubeconfig;    // an existing cluster, left as it is at the end
  bool Real() const { return realCluster || !kubeconfig.empty(); }
};

inline std::vector<std::string> ParseMode(int argc, char** argv, Mode& mode) {
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--real-cluster") {
      mode.realCluster = true;
    } else if (word == "--kubeconfig" && i + 1 < argc) {
      mode.kubeconfig = argv[++i];
    } else if (word.starts_with("--kubeconfig=")) {
      mode.kubeconfig = word.substr(std::strlen("--kubeconfig="));
    } else if (word.starts_with("--")) {
      throw std::invalid_argument("unknown option " + word);
    } else {
      positional.push_back(word);
    }
  }
  if (mode.realCluster && !mode.kubeconfig.empty()) {
    throw std::invalid_argument("--real-cluster and --kubeconfig exclude each other");
  }
  return positional;
}

inline int Positional(const std::vector<std::string>& words, size_t at, int fallback) {
  return at < words.size() ? std::atoi(words[at].c_str()) : fallback;
}

// What a signal handler stops on SIGINT/SIGTERM: the controller and other children the bench
// started, then the control plane and the bench's work directory (exec of a shell running
// `cluster.sh down DIR` and removing the directory, which replaces this process). Only
// async-signal-safe calls in the handler; the argument vector is built beforehand.
struct SignalCleanup {
  static inline std::atomic<pid_t> controller{-1};
  // Other programs the bench started (ChildProcess: the nodes' agents), 0 where none.
  static inline std::array<std::atomic<pid_t>, 8> children{};
  static inline std::vector<std::string> words;
  static inline std::vector<char*> argv;

  static void Handler(int) {
    const pid_t pid = controller.load();
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      ::kill(pid, SIGCONT);  // held (bench_binder's HeldProcess): the SIGTERM is taken now
    }
    for (auto& child : children) {
      const pid_t other = child.load();
      if (other > 0) ::kill(other, SIGTERM);
    }
    if (!argv.empty()) ::execv(argv[0], argv.data());
    ::_exit(130);
  }
  static void Arm(const std::string& script, const std::string& dir, const std::string& work) {
    words = {"/bin/sh", "-c", "\"$0\" down \"$1\"; rm -rf -- \"$2\"; exit 130", script, dir, work};
    argv.clear();
    for (auto& word : words) argv.push_back(word.data());
    argv.push_back(nullptr);
    Install();
  }
  static void Disarm() {
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    argv.clear();
    words.clear();
  }
  static void Install() {
    struct sigaction action {};
    action.sa_handler = Handler;
    ::sigemptyset(&action.sa_mask);
    ::sigaction(SIGINT, &action, nullptr);
    ::sigaction(SIGTERM, &action, nullptr);
  }
};

// The control plane: brought up in a temporary directory (and down again when this goes, on
// failure too, or on SIGINT/SIGTERM), or an existing cluster's kubeconfig.
class ControlPlane {
 public:
  ControlPlane(const Mode& mode, const std::filesystem::path& sourceDir) : source_(sourceDir) {
    const auto bin = testing::RunCommand(Quote(source_ / "scripts/cluster.sh") + " bin");
    if (bin.exitCode != 0) throw std::runtime_error("scripts/cluster.sh bin: " + bin.err);
    bin_ = bin.out.substr(0, bin.out.find('\n'));
    if (!std::filesystem::exists(std::filesystem::path(bin_) / "kubectl")) {
      throw std::runtime_error(bin_ + "/kubectl is not built (scripts/cluster.sh build)");
    }
    const char* path = std::getenv("PATH");
    ::setenv("PATH", (bin_ + ":" + (path ? path : "/usr/bin:/bin")).c_str(), 1);
    char pattern[] = "/tmp/bench-cluster.XXXXXX";
    if (::mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
    work_ = pattern;
    try {
      if (mode.realCluster) {
        dir_ = work_ / "cluster";
        SignalCleanup::Arm((source_ / "scripts/cluster.sh").string(), dir_.string(),
                           work_.string());
        owned_ = true;
        // The benches' nodes are API objects without a kubelet (bench_real_nodes' have one): the
        // node lifecycle controller is given an hour before it finds them NotReady, which would
        // take them out of the catalog mid-run (cluster.sh's default is 10 s).
        ::setenv("COZY_CLUSTER_NODE_GRACE", "3600s", 0);
        const auto started = std::chrono::steady_clock::now();
        const auto up = testing::RunCommand(Quote(source_ / "scripts/cluster.sh") + " up " +
                                            Quote(dir_) + " 2>&1");
        if (up.exitCode != 0) throw std::runtime_error("scripts/cluster.sh up: " + up.out);
        std::printf(
            "control plane up in %.1f s (scripts/cluster.sh up %s)\n",
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(),
            dir_.c_str());
        kubeconfig_ = dir_ / "kubeconfig";
      } else {
        kubeconfig_ = std::filesystem::absolute(mode.kubeconfig);
        SignalCleanup::Install();
      }
      config_ = kube::LoadKubeconfig(kubeconfig_);
      const auto version = Kubectl("version -o json");
      if (version.exitCode != 0) throw std::runtime_error("kubectl version: " + version.err);
      const auto versions = nlohmann::json::parse(version.out, nullptr, false);
      std::printf("API server %s, Kubernetes %s\n", config_.server.c_str(),
                  versions.is_object() ? versions.value("serverVersion", nlohmann::json::object())
                                             .value("gitVersion", "?")
                                             .c_str()
                                       : "?");
    } catch (...) {
      Down();
      throw;
    }
  }
  ~ControlPlane() { Down(); }
  void Down() {
    if (owned_) {
      testing::RunCommand(Quote(source_ / "scripts/cluster.sh") + " down " + Quote(dir_) +
                          " >/dev/null 2>&1");
      SignalCleanup::Disarm();
      owned_ = false;
    }
    std::error_code ignored;
    if (!work_.empty()) std::filesystem::remove_all(work_, ignored);
    work_.clear();
  }
  ControlPlane(const ControlPlane&) = delete;
  ControlPlane& operator=(const ControlPlane&) = delete;

  const std::filesystem::path& kubeconfig() const { return kubeconfig_; }
  const std::filesystem::path& source() const { return source_; }
  const kube::ClientConfig& config() const { return config_; }
  const std::filesystem::path& work() const { return work_; }
  // The cluster's directory (DIR/pki holds its CA) when this brought it up; empty otherwise.
  const std::filesystem::path& dir() const { return dir_; }
  const std::string& bin() const { return bin_; }
  bool owned() const { return owned_; }

  testing::CommandResult Kubectl(const std::string& arguments) const {
    return testing::RunCommand(Quote(std::filesystem::path(bin_) / "kubectl") + " --kubeconfig " +
                               Quote(kubeconfig_) + " --request-timeout=60s " + arguments);
  }
  void KubectlOrThrow(const std::string& arguments) const {
    const auto result = Kubectl(arguments);
    if (result.exitCode != 0) {
      throw std::runtime_error("kubectl " + arguments + ": " + result.err + result.out);
    }
  }
  // The chart's CRDs (GPUClass, GPUDevice, GPUNode) and, with `kubeVirt`, KubeVirt's as the
  // controller reads them (test/fakes/crds), applied and Established. Never the usage-record
  // kinds: with them served the controller writes a Workload per Bound device while a bench
  // measures.
  void ApplyCrds(bool kubeVirt) const {
    std::string files = "-f " + Quote(source_ / "charts/gpu/templates/crds");
    std::string established =
        "crd/gpuclasses.gpu.cozystack.io crd/gpudevices.gpu.cozystack.io "
        "crd/gpunodes.gpu.cozystack.io";
    if (kubeVirt) {
      for (const char* kind : {"virtualmachineinstances", "virtualmachines", "kubevirts"}) {
        files += " -f " + Quote(source_ / "test/fakes/crds" /
                                ("kubevirt.io_" + std::string(kind) + ".yaml"));
        established += " crd/" + std::string(kind) + ".kubevirt.io";
      }
    }
    KubectlOrThrow("apply " + files);
    KubectlOrThrow("wait --for=condition=Established --timeout=60s " + established);
  }
  // The API server's Prometheus text (kubectl get --raw /metrics).
  std::string Metrics() const {
    const auto result = Kubectl("get --raw /metrics");
    if (result.exitCode != 0) throw std::runtime_error("GET /metrics: " + result.err);
    return result.out;
  }

  static std::string Quote(const std::filesystem::path& path) {
    return testing::ShellQuote(path.string());
  }

 private:
  std::filesystem::path source_;
  std::filesystem::path work_;
  std::filesystem::path dir_;
  std::filesystem::path kubeconfig_;
  std::string bin_;
  kube::ClientConfig config_;
  bool owned_ = false;
};

// One Prometheus sample: its labels and value.
struct Sample {
  std::map<std::string, std::string> labels;
  double value = 0;
};

// Every sample of metric `name` in a Prometheus text exposition.
inline std::vector<Sample> Samples(const std::string& text, const std::string& name) {
  std::vector<Sample> samples;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (!line.starts_with(name)) continue;
    size_t at = name.size();
    Sample sample;
    if (at < line.size() && line[at] == '{') {
      ++at;
      while (at < line.size() && line[at] != '}') {
        const size_t equals = line.find("=\"", at);
        if (equals == std::string::npos) break;
        std::string key = line.substr(at, equals - at);
        size_t end = equals + 2;
        std::string value;
        while (end < line.size() && line[end] != '"') {
          if (line[end] == '\\' && end + 1 < line.size()) ++end;
          value += line[end++];
        }
        sample.labels[key] = value;
        at = end + 1;
        if (at < line.size() && line[at] == ',') ++at;
      }
      ++at;
    }
    if (at >= line.size() || line[at] != ' ') continue;  // another metric with this prefix
    sample.value = std::strtod(line.c_str() + at + 1, nullptr);
    samples.push_back(std::move(sample));
  }
  return samples;
}

inline double Sum(const std::string& text, const std::string& name,
                  const std::function<bool(const std::map<std::string, std::string>&)>& keep) {
  double sum = 0;
  for (const auto& sample : Samples(text, name)) {
    if (keep(sample.labels)) sum += sample.value;
  }
  return sum;
}

inline std::string Label(const std::map<std::string, std::string>& labels, const char* key) {
  auto it = labels.find(key);
  return it == labels.end() ? "" : it->second;
}

inline bool IsWrite(const std::map<std::string, std::string>& labels) {
  const std::string verb = Label(labels, "verb");
  return verb == "POST" || verb == "PUT" || verb == "PATCH" || verb == "DELETE" ||
         verb == "APPLY" || verb == "DELETECOLLECTION";
}

// The API server's write counters (apiserver_request_total), "VERB resource[/subresource]
// code" -> count, Leases left out (the controller's and the API server's own renewals).
inline std::map<std::string, double> Writes(const std::string& metrics) {
  std::map<std::string, double> writes;
  for (const auto& sample : Samples(metrics, "apiserver_request_total")) {
    if (!IsWrite(sample.labels) || Label(sample.labels, "resource") == "leases") continue;
    if (!Label(sample.labels, "dry_run").empty()) continue;
    std::string key = Label(sample.labels, "verb") + " " + Label(sample.labels, "resource");
    if (!Label(sample.labels, "subresource").empty())
      key += "/" + Label(sample.labels, "subresource");
    writes[key + " " + Label(sample.labels, "code")] += sample.value;
  }
  return writes;
}

// after - before, the keys that moved.
inline std::map<std::string, double> Delta(const std::map<std::string, double>& before,
                                           const std::map<std::string, double>& after) {
  std::map<std::string, double> delta;
  for (const auto& [key, value] : after) {
    auto it = before.find(key);
    const double moved = value - (it == before.end() ? 0 : it->second);
    if (moved != 0) delta[key] = moved;
  }
  return delta;
}

inline std::string Describe(const std::map<std::string, double>& writes) {
  std::string text;
  for (const auto& [key, value] : writes) {
    if (!text.empty()) text += ", ";
    text += key + ": " + std::to_string(static_cast<long long>(value));
  }
  return text.empty() ? "none" : text;
}

// Waits until the API server's write counters stand still for `still` (at most `limit`);
// prints what was written meanwhile (the controller's first pass: each GPUNode's condition).
inline void WaitForStillWrites(const ControlPlane& cluster, std::chrono::seconds still,
                               std::chrono::seconds limit) {
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  const auto first = Writes(cluster.Metrics());
  auto last = first;
  auto since = Clock::now();
  while (Clock::now() < started + limit && Clock::now() - since < still) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    auto now = Writes(cluster.Metrics());
    if (now != last) {
      last = std::move(now);
      since = Clock::now();
    }
  }
  std::printf("writes after the first pass stood still %.1f s later (%s)\n",
              std::chrono::duration<double>(since - started).count(),
              Describe(Delta(first, last)).c_str());
}

// A client per thread, no rate limit, a few retries for the API server's 429s and 5xx.
inline kube::ClientOptions BenchClientOptions() {
  kube::ClientOptions options;
  options.qps = 0;
  options.maxRetries = 8;
  options.requestTimeout = std::chrono::seconds(60);
  options.userAgent = "cozy-gpu-bench";
  return options;
}

// fn(i, client) for every i in [0, count), spread over `threads` threads each with a client of
// its own; rethrows the first failure after every thread stopped.
inline void Parallel(const kube::ClientConfig& config, int threads, int count,
                     const std::function<void(int, kube::Client&)>& fn) {
  std::atomic<int> next{0};
  std::mutex mutex;
  std::exception_ptr failure;
  std::vector<std::thread> workers;
  for (int t = 0; t < std::max(1, threads); ++t) {
    workers.emplace_back([&] {
      kube::Client client(config, BenchClientOptions());
      for (int i = next++; i < count; i = next++) {
        try {
          fn(i, client);
        } catch (...) {
          std::lock_guard lock(mutex);
          if (!failure) failure = std::current_exception();
          next = count;
        }
      }
    });
  }
  for (auto& worker : workers) worker.join();
  if (failure) std::rethrow_exception(failure);
}

// The path of an object's collection and its own path, from apiVersion, kind's plural and
// namespace.
inline std::string CollectionOf(const nlohmann::json& object, const std::string& plural) {
  const std::string apiVersion = object.at("apiVersion").get<std::string>();
  const size_t slash = apiVersion.find('/');
  const std::string group = slash == std::string::npos ? "" : apiVersion.substr(0, slash);
  const std::string version =
      slash == std::string::npos ? apiVersion : apiVersion.substr(slash + 1);
  return kube::ResourcePath(group, version, plural,
                            object["metadata"].value("namespace", std::string()));
}

// Creates the object, then writes its status through the status subresource (a create drops
// it for kinds that have one), as an agent or the binder would have; an object already there
// (a rerun on --kubeconfig) is an error.
inline void CreateWithStatus(kube::Client& client, const nlohmann::json& object,
                             const std::string& plural, bool statusSubresource) {
  const std::string collection = CollectionOf(object, plural);
  nlohmann::json body = object;
  if (statusSubresource) body.erase("status");
  client.Create(collection, body);
  if (statusSubresource && object.contains("status")) {
    client.MergePatch(collection + "/" + object["metadata"]["name"].get<std::string>() + "/status",
                      {{"status", object["status"]}});
  }
}

// The gpu-controller process, stopped (SIGTERM, then waited for) when this goes.
class ControllerProcess {
 public:
  ControllerProcess(const std::vector<std::string>& arguments, const std::filesystem::path& log)
      : log_(log) {
    pid_ = testing::Spawn(arguments, log);
    SignalCleanup::controller = pid_;
  }
  ~ControllerProcess() { Stop(); }
  ControllerProcess(const ControllerProcess&) = delete;
  ControllerProcess& operator=(const ControllerProcess&) = delete;
  void Stop() {
    SignalCleanup::controller = -1;
    testing::Finish(pid_);
  }
  pid_t pid() const { return pid_; }
  const std::filesystem::path& log() const { return log_; }

 private:
  pid_t pid_ = -1;
  std::filesystem::path log_;
};

// Another program of the bench's (a node's agent), stopped (SIGTERM, then waited for) when this
// goes, and by SignalCleanup on SIGINT/SIGTERM.
class ChildProcess {
 public:
  ChildProcess(const std::vector<std::string>& arguments, const std::filesystem::path& log)
      : log_(log) {
    pid_ = testing::Spawn(arguments, log);
    if (pid_ <= 0) throw std::runtime_error("cannot start " + arguments.front());
    for (auto& slot : SignalCleanup::children) {
      pid_t none = 0;
      if (slot.compare_exchange_strong(none, pid_)) {
        slot_ = &slot;
        break;
      }
    }
    if (slot_ == nullptr) {
      Stop();
      throw std::runtime_error("more children than SignalCleanup keeps");
    }
  }
  ~ChildProcess() { Stop(); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  void Stop() {
    if (slot_ != nullptr) slot_->store(0);
    slot_ = nullptr;
    testing::Finish(pid_);
  }
  // Whether it still runs (one that exited is reaped here).
  bool Running() {
    int status = 0;
    if (pid_ > 0 && ::waitpid(pid_, &status, WNOHANG) == pid_) {
      if (slot_ != nullptr) slot_->store(0);
      slot_ = nullptr;
      pid_ = -1;
    }
    return pid_ > 0;
  }
  pid_t pid() const { return pid_; }
  const std::filesystem::path& log() const { return log_; }

 private:
  pid_t pid_ = -1;
  std::atomic<pid_t>* slot_ = nullptr;
  std::filesystem::path log_;
};

// A CA and a serving certificate for 127.0.0.1 signed by it (the API server dials the
// webhooks by URL at that address): DIR/tls.crt, DIR/tls.key and DIR/ca.crt, whose PEM is the
// webhook configurations' caBundle.
inline void WebhookCertificates(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  const auto made = testing::RunCommand(
      "cd " + testing::ShellQuote(dir.string()) +
      " && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1"
      " -subj /CN=bench-webhook-ca 2>/dev/null"
      " && printf 'subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth\\n' >san.ext"
      " && openssl req -newkey rsa:2048 -nodes -keyout tls.key -out tls.csr -subj /CN=127.0.0.1"
      " 2>/dev/null"
      " && openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out tls.crt"
      " -days 1 -extfile san.ext 2>/dev/null");
  if (made.exitCode != 0) {
    throw std::runtime_error("openssl could not make the webhook certificates: " + made.err);
  }
}

// The chart with GPUs on, rendered by `helm template` and applied in cozy-system: its webhooks at
// https://127.0.0.1:`webhookPort` with the serving pair of WebhookCertificates(certs) (its CA
// as the caBundle), callers authenticated by `clientCa` (the CA of the API server's webhook
// client certificate), or unauthenticated where that is empty; `extraSets` more `--set` flags,
// quoted. Its policies, RBAC and workloads come too (nothing here runs a workload's pods).
inline void ApplyGpusOnChart(const ControlPlane& cluster, const std::filesystem::path& certs,
                             int webhookPort, const std::filesystem::path& clientCa,
                             const std::string& extraSets = "") {
  const std::filesystem::path rendered = cluster.work() / "chart.yaml";
  const auto ca =
      testing::RunCommand("base64 -w0 " + testing::ShellQuote((certs / "ca.crt").string()));
  const auto helm = testing::RunCommand(
      "helm template gpu " + ControlPlane::Quote(cluster.source() / "charts/gpu") +
      " -n cozy-system --set gpu.enabled=true --set gpu.webhook.certManager=false"
      " --set gpu.webhook.caBundle=" +
      ca.out +
      " --set gpu.webhook.existingSecret=gpu-controller-webhook-tls"
      " --set 'gpu.webhook.networkPolicy.podCIDRs={10.244.0.0/16}'" +
      (clientCa.empty()
           ? std::string(" --set gpu.webhook.allowUnauthenticatedCallers=true")
           : " --set-file gpu.webhook.clientCA=" + testing::ShellQuote(clientCa.string())) +
      " --set gpu.webhook.url=https://127.0.0.1:" + std::to_string(webhookPort) + " " + extraSets +
      " > " + testing::ShellQuote(rendered.string()));
  if (ca.exitCode != 0 || helm.exitCode != 0) {
    throw std::runtime_error("helm template charts/gpu: " + ca.err + helm.err);
  }
  cluster.KubectlOrThrow("apply -n cozy-system -f " + testing::ShellQuote(rendered.string()));
}

// The controller's health endpoint answers /readyz with 200.
inline bool Ready(int healthPort) {
  return testing::RunCommand("curl -sf http://127.0.0.1:" + std::to_string(healthPort) +
                             "/readyz >/dev/null")
             .exitCode == 0;
}

inline std::string ControllerMetrics(int healthPort) {
  return testing::RunCommand("curl -s http://127.0.0.1:" + std::to_string(healthPort) + "/metrics")
      .out;
}

}  // namespace cozy::bench
