#include "controller/daemon/daemon.h"

#include <pthread.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "api/gpuclass.h"
#include "api/gpudevice.h"
#include "api/gpunode_types.h"
#include "api/keys.h"
#include "controller/binder/binder.h"
#include "controller/binder/loop.h"
#include "controller/daemon/caches.h"
#include "controller/daemon/metrics.h"
#include "controller/daemon/view.h"
#include "controller/kinds.h"
#include "controller/model/readers.h"
#include "controller/reconciler/loop.h"
#include "controller/webhook/server.h"
#include "controller/webhook/webhooks.h"
#include "kube/cache.h"
#include "kube/client.h"
#include "kube/config.h"
#include "kube/discovery.h"
#include "kube/leader_election.h"
#include "runtime/duration.h"
#include "runtime/health_server.h"
#include "runtime/log.h"
#include "runtime/loop.h"
#include "runtime/manager.h"
#include "runtime/metrics.h"

namespace cozy::controller {
namespace {

using runtime::LogFields;
using runtime::LogInfo;
using runtime::LogWarning;

// What the caches take of the flags.
CacheOptions CachesOf(const RunOptions& options) {
  CacheOptions caches;
  caches.namespaceName = options.namespaceName;
  caches.enableGpu = options.enableGpu;
  caches.gpuResourceNames = options.gpuResourceNames;
  caches.rawNamesForbidden = options.rawNamesForbidden;
  caches.attachmentGrace = options.attachmentGrace;
  caches.notReadyGrace = options.notReadyGrace;
  return caches;
}

// What the reconcilers take of the flags.
ReconcilerOptions ReconcilersOf(const RunOptions& options) {
  ReconcilerOptions reconcilers;
  reconcilers.namespaceName = options.namespaceName;
  reconcilers.gpuResourceNames = options.gpuResourceNames;
  reconcilers.rawNamesForbidden = options.rawNamesForbidden;
  // With GPUs on, whether the webhooks authenticate their callers: `kubectl gpu` warns of an
  // install that does not.
  if (options.enableGpu) {
    reconcilers.webhookCallers = options.webhookClientCa.empty()
                                     ? std::string(api::kWebhookCallersUnauthenticated)
                                     : std::string(api::kWebhookCallersAuthenticated);
  }
  return reconcilers;
}

std::string Hostname() {
  std::array<char, 256> name{};
  if (gethostname(name.data(), name.size() - 1) != 0) {
    return "";
  }
  return name.data();
}

// A replica, as a list of parts (runtime::Manager): started in the order Run adds them, stopped
// in the reverse. What the passes and webhooks read is the ClusterView; leadership is one handle
// (kube::Leadership) that the elector sets and every leader-only part reads.
class Controller {
 public:
  Controller(const RunOptions& options, kube::ClientConfig config)
      : options_(options),
        identity_(options.identity.empty() ? Hostname() : options.identity),
        client_(config, ClientOptions(options, identity_)),
        discovery_(client_, kube::DiscoveryOptions{options.discoveryInterval}),
        caches_(client_, discovery_, CachesOf(options_),
                [this](Readers readers) { Changed(readers); }),
        view_(caches_, manager_),
        // The resync asks both loops for a pass.
        reconciler_(
            loop_, client_, leadership_, view_, options.resync, [this] { Trigger(); },
            StandardReconcilers(ReconcilersOf(options))) {
    elector_ = std::make_unique<kube::LeaderElector>(client_, Election());
    // Every write of the leader's, first attempt or retry, ends by the instant its Lease lets it
    // lead until (kube/leader_election.h).
    leadership_.SetUntil([this] { return elector_->LeadingUntil(); });
    DeclareLeaderMetrics(registry_);
    ReconcilerMetrics::Declare(registry_);
    if (options.enableGpu) {
      binder_ = std::make_unique<BinderLoop>(loop_, client_, leadership_, identity_, view_);
      binder_->SetCatalogTenantSeries(
          static_cast<size_t>(std::max(0, options.catalogTenantSeries)));
      pods_ = std::make_unique<PodChanges>(&binder_->quietRoom());
      // A thousand VM starts at once: the reconciler waits (1 s at most) for their answers.
      reconciler_.SetYield([this] { return binder_->Answering(); });
      BinderLoop::DeclareMetrics(registry_);
      WebhookMetrics::Declare(registry_);
    }
    DeclareCacheMetrics(registry_);
    // /metrics is rendered at each scrape, its figures read on the loop thread then (a pass
    // count is that of every pass ended so far: what the tests' waits for passes stand on;
    // docs/testing.md, "Waiting for passes"). A loop that does not answer within the registry's
    // bound leaves the figures of the last scrape it answered (docs/runtime.md, "Metrics
    // registry").
    registry_.AddCollector([this](runtime::MetricsScrape& out) { CollectMetrics(out); },
                           [this](std::function<void()> work) { loop_.Post(std::move(work)); });
    health_.SetRegistry(&registry_);
  }

  int Run() {
    // Signals first: AddSignal blocks them for this thread, and the threads started below
    // inherit the mask, so SIGTERM reaches the loop and nothing else.
    runtime::Signal term = loop_.AddSignal(SIGTERM, [this](const signalfd_siginfo&) { Stop(); });
    runtime::Signal interrupt =
        loop_.AddSignal(SIGINT, [this](const signalfd_siginfo&) { Stop(); });
    AddParts();
    manager_.Start();
    LogInfo("gpu-controller running",
            LogFields{{"identity", identity_},
                      {"namespace", options_.namespaceName},
                      {"gpu", options_.enableGpu ? "enabled" : "disabled"},
                      {"health", options_.healthAddress}});
    const int code = loop_.Run();
    manager_.Stop();
    return code;
  }

 private:
  using Readers = ClusterCaches::Readers;

  // What runs, in the order it starts; it stops in the reverse once the loop has ended. A watched
  // kind is a cache of the table (controller/watched.h); readiness is every cache that gates it
  // synced. The leader's passes stop before the Lease is released (G8), and their writes end with
  // the leadership (Stop).
  void AddParts() {
    manager_.Add(
        "health",
        [this] {
          if (options_.healthAddress != "off" && !health_.Start(options_.healthAddress)) {
            throw std::runtime_error("--health-addr " + options_.healthAddress + ": " +
                                     health_.error());
          }
        },
        [this] { health_.Stop(); });
    caches_.AddDeviceIndexes();
    // Each kind of the table (controller/watched.h) that does not come and go, with GPUs on the
    // GPU-only ones too: a change that matters wakes its readers (and the webhooks' snapshot),
    // and the reconciler's passes wait for the caches it reads to sync.
    ForEachWatched([this](const auto& watched) {
      if (watched.followsDiscovery || (watched.gpuOnly && !options_.enableGpu)) return;
      Watch(watched);
    });
    if (options_.enableGpu) WatchPods();
    // The kinds that come and go start and stop with their kind being served (Tick); whatever
    // runs at the end stops here. They never gate readiness (G4).
    manager_.Add("optional caches", {}, [this] { caches_.StopOptional(); });
    manager_.Add(
        "discovery", [this] { discovery_.Start(); }, [this] { discovery_.Stop(); });
    // A leader releases the Lease when it stops (G8), after the passes below have stopped.
    manager_.Add(
        "leader election", [this] { elector_->Start(); }, [this] { elector_->Stop(); });
    if (options_.enableGpu) {
      manager_.Add(
          "webhooks", [this] { StartWebhooks(); },
          [this] {
            if (webhookStopper_.joinable()) webhookStopper_.join();
            if (webhookServer_) webhookServer_->Stop();
          });
    }
    AddLeaderPart(
        "reconciler", [this] { reconciler_.Start(); }, [this] { reconciler_.Stop(); });
    if (binder_) {
      // Told before the leadership turns on: its first pass lists the devices from the API
      // server before it trusts the cache (D3 across a leader change).
      AddLeaderPart(
          "binder", [this] { binder_->Start(); }, [this] { binder_->Stop(); },
          [this] { binder_->TookTheLead(); });
    }
    manager_.Add(
        "tick",
        [this] {
          tick_ = loop_.AddTimer("tick", [this] { Tick(); });
          tick_.Arm(std::chrono::milliseconds(0));
        },
        [this] { tick_.Cancel(); });
    manager_.Add("watchdog", [this] { loop_.EnableWatchdog(); }, {});
  }

  void AddLeaderPart(std::string name, std::function<void()> start, std::function<void()> stop,
                     std::function<void()> lead = {}) {
    runtime::Manager::Runnable runnable;
    runnable.name = std::move(name);
    runnable.start = std::move(start);
    runnable.stop = std::move(stop);
    runnable.needsLease = true;
    runnable.lead = std::move(lead);
    manager_.Add(std::move(runnable));
  }

  kube::LeaderElectionOptions Election() {
    kube::LeaderElectionOptions election;
    election.leaseNamespace = options_.namespaceName;
    election.leaseName = "gpu-controller";
    election.identity = identity_;
    election.leaseDuration = options_.leaseDuration;
    election.renewDeadline = options_.renewDeadline;
    election.retryPeriod = options_.retryPeriod;
    election.onStartedLeading = [this] {
      manager_.Lead();  // before the leadership turns on
      leadership_.Set(true);
      loop_.Post([this] {
        ++acquisitions_;
        LogInfo("leading", LogFields{{"identity", identity_}});
        Trigger();
      });
    };
    election.onStoppedLeading = [this](const std::string& why) {
      leadership_.Set(false);
      loop_.Post([why] { LogWarning("stopped leading", LogFields{{"why", why}}); });
    };
    election.onNewLeader = [](const std::string& holder) {
      LogInfo("leader", LogFields{{"holder", holder.empty() ? "(released)" : holder}});
    };
    election.log = [](const std::string& message) {
      runtime::LogDebug("leader election", LogFields{{"message", message}});
    };
    return election;
  }

  // The replica's identity in its User-Agent, so that the API server's audit log names which
  // replica made each request (both run as one service account, from one address behind a
  // Service): "gpu-controller (replica-0)", as client-go puts the binary's name first.
  static kube::ClientOptions ClientOptions(const RunOptions& options, const std::string& identity,
                                           const std::string& part = "gpu-controller") {
    kube::ClientOptions client;
    client.userAgent = part + " (" + identity + ")";
    kube::SetRateLimit(client, options.qps, options.burst);
    return client;
  }

  // G2, G3: the webhooks only with GPUs on, served by every replica from the caches started
  // above. Their writes go through a client of their own whose requests end well inside the
  // API server's webhook timeout.
  void StartWebhooks() {
    kube::ClientOptions options = ClientOptions(options_, identity_, "gpu-controller-webhook");
    options.requestTimeout = std::chrono::seconds(3);
    options.maxRetries = 1;
    webhookClient_ = std::make_unique<kube::Client>(client_.config(), options);
    webhook::WebhookOptions webhookOptions;
    webhookOptions.bindWait = options_.bindWait;
    webhookOptions.kubevirtControllerUser = options_.kubevirtControllerUser;
    webhooks_ = std::make_unique<webhook::Webhooks>(*webhookClient_, view_, webhookOptions);
    webhook::ServerOptions serverOptions;
    serverOptions.address = options_.webhookAddress;
    serverOptions.certDir = options_.webhookCertDir;
    serverOptions.clientCaFile = options_.webhookClientCa;
    webhookServer_ = std::make_unique<webhook::Server>(serverOptions);
    webhooks_->Register(*webhookServer_);
    webhookServer_->Start();
    LogInfo("admission webhooks serving",
            LogFields{{"address", options_.webhookAddress},
                      {"port", std::to_string(webhookServer_->port())},
                      {"certDir", options_.webhookCertDir},
                      {"clientCA", options_.webhookClientCa.empty() ? "none: any TLS client"
                                                                    : options_.webhookClientCa}});
    if (options_.webhookClientCa.empty()) {
      LogWarning(
          "admission webhooks accept any TLS client (--webhook-allow-unauthenticated-callers): "
          "set --webhook-client-ca to the CA of the API server's webhook client certificate "
          "(docs/install.md, \"Who may call the webhooks\")");
    }
  }

  // Any cache thread: something `readers` read changed. The webhooks' snapshot is built again
  // on any change, and waiting webhooks and binder passes wake.
  void Changed(Readers readers) {
    view_.Changed();
    // A change that wakes no pass (the quiet room took it) wakes no loop either.
    if (readers != Readers::kNone) loop_.Post([this, readers] { Trigger(readers); });
  }

  // Loop thread: a pass soon, collapsing a burst of changes into one.
  void Trigger(Readers readers = Readers::kBoth) {
    if (stopping_ || readers == Readers::kNone) return;
    if (binder_ && readers != Readers::kReconciler) binder_->Trigger();
    if (readers != Readers::kBinder) reconciler_.Trigger();
  }

  // A cache of the manager's: its changes (those its `matters` lets through; none: all) trigger
  // the passes of its readers and wake waiting webhooks; it gates readiness, and the
  // reconciler's passes wait for it when the reconciler reads it; its metrics and list/watch
  // errors are exported and logged under its name.
  template <class T>
  void Watch(const Watched<T>& watched) {
    kube::Cache<T>& cache = caches_.Make(watched);
    const std::string name = watched.Name();
    const Readers readers = watched.readers;
    cache.SetOnChange([this, readers] { Changed(readers); });
    runtime::Manager::Runnable runnable;
    runnable.name = name;
    runnable.start = [this, &cache] { cache.Start(&caches_.Loop()); };
    runnable.stop = [&cache] { cache.Stop(); };
    runnable.synced = [&cache] { return cache.Synced(); };
    runnable.gatesReadiness = true;
    manager_.Add(std::move(runnable));
    watched_.emplace_back(name, &cache);
    if (readers != Readers::kBinder) view_.ReconcilerReads(cache);
  }

  // Pods (watched as every kind is), through PodChanges' two steps (controller/daemon/view.h).
  // While usage records are served, every change that matters also asks the reconciler for a
  // pass within a second (ReconcilerLoop::TriggerForRecords), which writes the pods' raw-name
  // usage records (C11).
  void WatchPods() {
    kube::Cache<model::Pod>& pods = caches_.Get(kPodCache);
    pods.SetChangeFilter([this](const model::Pod* before, const model::Pod* after) {
      return pods_->Matters(before, after);
    });
    pods.SetOnChange([this] {
      Changed(pods_->TakeStep());
      // The reconciler reads pods only for their usage records (none while Cozystack's kinds
      // are not served), which may lag a second: pod churn costs it a pass a second at most.
      if (caches_.Running(kUsageRecordCache) != nullptr) {
        loop_.Post([this] {
          if (!stopping_) reconciler_.TriggerForRecords();
        });
      }
    });
  }

  // Loop thread, every second: the kinds that come and go, health, and the webhooks' latencies
  // taken into their histogram (so that they do not pile up between scrapes).
  void Tick() {
    if (caches_.FollowDiscovery()) Trigger();
    if (webhooks_) webhookMetrics_.Take(webhooks_->TakeStats());
    LogCacheErrors();
    health_.Heartbeat();
    // With GPUs on, ready also means the webhooks answer: the API server may be sent here.
    // A webhook pool that is full is not ready either: the Service then sends the API server to
    // another replica while this one catches up (docs/health-server.md, "POST routes and TLS").
    health_.SetReady(
        !stopping_ && manager_.Ready() &&
        (!webhookServer_ || (webhookServer_->serving() && !webhookServer_->Saturated())));
    tick_.Arm(std::chrono::seconds(1));
  }

  // Every cache that exists now, by name: the watched ones (Watch), then the optional ones
  // while their kinds are served.
  template <class Visit>
  void ForEachCache(Visit&& visit) const {
    for (const auto& [name, cache] : watched_) visit(name, *cache);
    caches_.ForEachOptional(visit);
  }

  // A cache that cannot list or watch (an API server refusing, a response over the client's
  // cap, an object that does not decode) is logged once per new error, so a controller that
  // stays unready says why.
  void LogCacheErrors() {
    ForEachCache([this](const std::string& name, const auto& cache) {
      // A list page over the response cap was asked for again with half as many objects: said
      // once per new page size, so a controller slow to become ready says why.
      const kube::InformerStats stats = cache.Stats();
      int& halvedSaid = pagesHalvedSaid_[name];
      if (stats.pagesHalved != halvedSaid) {
        LogWarning("cache list page over the response cap; asking for smaller pages",
                   LogFields{{"cache", name},
                             {"pageSize", std::to_string(stats.pageSize)},
                             {"halved", std::to_string(stats.pagesHalved)}});
        halvedSaid = stats.pagesHalved;
      }
      const std::string error = cache.LastError();
      std::string& said = cacheErrors_[name];
      if (error == said) return;
      if (!error.empty()) {
        LogWarning(
            "cache cannot list or watch; retrying with backoff",
            LogFields{
                {"cache", name}, {"synced", cache.Synced() ? "true" : "false"}, {"error", error}});
      }
      said = error;
    });
  }

  // Loop thread, at each scrape of /metrics: the figures of every declared family.
  void CollectMetrics(runtime::MetricsScrape& out) {
    WriteLeaderMetrics(out, leadership_.Leading(), acquisitions_, elector_->Transitions());
    reconciler_.WriteMetrics(out);
    if (binder_) binder_->WriteMetrics(out);
    if (webhooks_) {
      webhookMetrics_.Take(webhooks_->TakeStats());
      webhookMetrics_.Write(out, webhookServer_->stats(), !options_.webhookClientCa.empty());
    }
    std::vector<std::pair<std::string, const kube::CacheBase*>> caches;
    ForEachCache([&caches](const std::string& name, const kube::CacheBase& cache) {
      caches.emplace_back(name, &cache);
    });
    WriteCacheMetrics(out, caches, loop_.callbackFailures());
  }

  // Loop thread, on SIGTERM or SIGINT (docs/controller.md, "How a replica starts and stops").
  // With webhooks served they drain first, while everything else runs on (the leader keeps
  // placing, so a VM start waiting for the binder is answered): the replica is unready at once,
  // so the Service's endpoints drop it, and each answer closes its connection, so the API
  // server's kept connections move to the other replica after an answer they have read; after
  // --shutdown-delay new connections are refused and the reviews begun are answered
  // (StopWebhooks). Then the leadership ends, so the passes in flight make no further writes; the
  // loop ends, and Run stops the parts in reverse (the passes, then the Lease released, G8). A
  // second signal cuts the delay short.
  void Stop() {
    if (stopping_) {
      if (drain_.Armed()) {
        drain_.Cancel();
        StopWebhooks();
      }
      return;
    }
    stopping_ = true;
    runtime::Notify("STOPPING=1");
    health_.SetReady(false);
    if (!webhookServer_ || !webhookServer_->serving()) {
      Finish();
      return;
    }
    webhookServer_->Drain();
    LogInfo("stopping: unready, the webhooks' connections closing after each answer",
            LogFields{{"for", runtime::FormatDuration(options_.shutdownDelay)}});
    drain_ = loop_.AddTimer("drain", [this] { StopWebhooks(); });
    drain_.Arm(options_.shutdownDelay);
  }

  // Loop thread: no new webhook connections, and the reviews begun are answered, on a thread of
  // its own while the loop goes on serving what they wait for (the binder's answer); then Finish.
  void StopWebhooks() {
    if (webhookStopper_.joinable()) return;
    LogInfo("stopping: no new webhook connections; answering the reviews begun");
    // A review waits for the binder at most --bind-wait, then writes what it decided.
    const std::chrono::milliseconds grace = options_.bindWait + std::chrono::seconds(5);
    webhookStopper_ = std::jthread([this, grace] {
      webhookServer_->StopServing(grace);
      loop_.Post([this] { Finish(); });
    });
  }

  void Finish() {
    LogInfo("stopping: finishing the pass in flight, then releasing the Lease");
    leadership_.Set(false);
    loop_.Exit(0);
  }

  RunOptions options_;
  std::string identity_;
  std::unique_ptr<kube::Client> webhookClient_;
  std::unique_ptr<webhook::Webhooks> webhooks_;
  std::unique_ptr<webhook::Server> webhookServer_;
  WebhookMetrics webhookMetrics_;  // loop thread, from TakeStats
  runtime::Loop loop_;
  kube::Client client_;
  kube::Discovery discovery_;
  runtime::Manager manager_;  // what Run starts in order and stops in reverse
  ClusterCaches caches_;
  ClusterView view_;
  kube::Leadership leadership_;
  std::unique_ptr<kube::LeaderElector> elector_;
  ReconcilerLoop reconciler_;
  std::unique_ptr<BinderLoop> binder_;  // with --enable-gpu
  std::unique_ptr<PodChanges> pods_;    // with --enable-gpu
  // The families /metrics renders, declared once (controller/daemon/metrics.h); before the
  // health server that renders them.
  runtime::MetricsRegistry registry_;
  runtime::HealthServer health_;
  // The caches Watch added, by name, in order.
  std::vector<std::pair<std::string, const kube::CacheBase*>> watched_;
  std::map<std::string, std::string> cacheErrors_;  // the last error logged, by cache (loop)
  std::map<std::string, int> pagesHalvedSaid_;      // list pages halved, as last logged
  runtime::Timer tick_;
  runtime::Timer drain_;  // Stop: the webhooks drain until it fires
  bool stopping_ = false;
  // Metrics, loop thread.
  int64_t acquisitions_ = 0;
  // StopWebhooks' thread; joined by the webhooks' stop, and before anything it uses goes.
  std::jthread webhookStopper_;
};

}  // namespace

int RunController(const RunOptions& options) {
  if (options.enableGpu && options.webhookClientCa.empty() &&
      !options.webhookAllowUnauthenticated) {
    // Secure by default: a webhook that answers anyone writes on the strength of what any
    // caller on the network says (docs/security.md).
    throw std::invalid_argument(
        "--enable-gpu serves admission webhooks, and without --webhook-client-ca any TLS client "
        "that reaches the port could call them: give --webhook-client-ca the CA of the API "
        "server's webhook client certificate (docs/install.md, \"Who may call the webhooks\"), "
        "or --webhook-allow-unauthenticated-callers to run without it");
  }
  if (options.attachmentGrace <= std::chrono::milliseconds::zero()) {
    // G9: a zero grace would clear every attachment before its VMI appears.
    throw std::invalid_argument(
        "--attachment-grace must be positive: a grace of zero would "
        "clear every attachment before its VMI appears");
  }
  kube::ClientConfig config = kube::LoadConfig(
      options.kubeconfig.empty() ? std::nullopt
                                 : std::optional<std::filesystem::path>(options.kubeconfig));
  // Block the stop signals before any thread starts (the worker starts with the controller):
  // each thread inherits the mask, so SIGTERM waits for the loop's signalfd instead of killing
  // the process on whichever thread the kernel picks, and the Lease is released (G8).
  sigset_t stopSignals;
  sigemptyset(&stopSignals);
  sigaddset(&stopSignals, SIGTERM);
  sigaddset(&stopSignals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stopSignals, nullptr);
  Controller controller(options, std::move(config));
  return controller.Run();
}

}  // namespace cozy::controller
