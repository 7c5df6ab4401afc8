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

#include "api/gpuclass.h"
#include "api/gpudevice.h"
#include "api/gpunode_types.h"
#include "api/keys.h"
#include "controller/binder/binder.h"
#include "controller/binder/loop.h"
#include "controller/daemon/caches.h"
#include "controller/daemon/metrics.h"
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
std::string Hostname() {
  std::array<char, 256> name{};
  if (gethostname(name.data(), name.size() - 1) != 0) {
    return "";
  }
  return name.data();
}

class Controller : public webhook::ClusterSource, public BinderSource, public ReconcilerSource {
 public:
  Controller(const RunOptions& options, kube::ClientConfig config)
      : options_(options),
        identity_(options.identity.empty() ? Hostname() : options.identity),
        client_(config, ClientOptions(options)),
        discovery_(client_, kube::DiscoveryOptions{options.discoveryInterval}),
        caches_(client_, discovery_, options_, [this](Readers readers) { Changed(readers); }),
        // Every write of the leader's, first attempt or retry, ends by the instant its Lease
        // lets it lead until (kube/leader_election.h); elector_ is made below, before any pass.
        // The resync asks both loops for a pass.
        reconciler_(
            loop_, client_, leading_, [this] { return elector_->LeadingUntil(); }, *this,
            options.resync, [this] { Trigger(); }) {
    kube::LeaderElectionOptions election;
    election.leaseNamespace = options.namespaceName;
    election.leaseName = "gpu-controller";
    election.identity = identity_;
    election.leaseDuration = options.leaseDuration;
    election.renewDeadline = options.renewDeadline;
    election.retryPeriod = options.retryPeriod;
    election.onStartedLeading = [this] {
      if (binder_) binder_->TookTheLead();  // before leading_: its first pass lists (D3)
      leading_ = true;
      loop_.Post([this] {
        ++acquisitions_;
        LogInfo("leading", LogFields{{"identity", identity_}});
        Trigger();
      });
    };
    election.onStoppedLeading = [this](const std::string& why) {
      leading_ = false;
      loop_.Post([why] { LogWarning("stopped leading", LogFields{{"why", why}}); });
    };
    election.onNewLeader = [](const std::string& holder) {
      LogInfo("leader", LogFields{{"holder", holder.empty() ? "(released)" : holder}});
    };
    election.log = [](const std::string& message) {
      runtime::LogDebug("leader election", LogFields{{"message", message}});
    };
    elector_ = std::make_unique<kube::LeaderElector>(client_, std::move(election));
    if (options.enableGpu) {
      binder_ = std::make_unique<BinderLoop>(loop_, client_, leading_, identity_, *this,
                                             [this] { return elector_->LeadingUntil(); });
      // A thousand VM starts at once: the reconciler waits (1 s at most) for their answers.
      reconciler_.SetYield([this] { return binder_->Answering(); });
    }
  }

  int Run() {
    // Signals first: AddSignal blocks them for this thread, and the threads started below
    // inherit the mask, so SIGTERM reaches the loop and nothing else.
    runtime::Signal term = loop_.AddSignal(SIGTERM, [this](const signalfd_siginfo&) { Stop(); });
    runtime::Signal interrupt =
        loop_.AddSignal(SIGINT, [this](const signalfd_siginfo&) { Stop(); });
    // What runs, in the order it starts; it stops in the reverse (runtime::Manager). A watched
    // kind is one Watch line; readiness is every cache that gates it synced.
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
    // Each with who reads it: a change wakes those (and the webhooks' snapshot), and the
    // reconciler's passes wait for the caches it reads to sync.
    Watch(kClassCache, Readers::kBoth);
    Watch(kDeviceCache, Readers::kBoth);
    Watch(kGpuNodeCache, Readers::kBoth);
    Watch(kSettingsCache, Readers::kReconciler);
    if (options_.enableGpu) {
      // What the binder's model reads besides the GPU objects (with GPUs on), each change
      // filtered to those the model reads something different in (docs/controller.md, "Who wakes
      // for a change"): a pod's status heartbeat, or a pod of cpu and memory alone, wakes nobody.
      Watch(kNamespaceCache, Readers::kBinder, kube::Cache<model::Namespace>::WhenValueDiffers());
      Watch(kQuotaCache, Readers::kBinder, kube::Cache<model::ResourceQuota>::WhenValueDiffers());
      Watch(kNodeCache, Readers::kBinder, kube::Cache<model::Node>::WhenValueDiffers());
      WatchPods();
    }
    // The kinds that come and go start and stop with their kind being served (Tick); whatever
    // runs at the end stops here. They never gate readiness (G4).
    manager_.Add("optional caches", {}, [this] { caches_.StopOptional(); });
    manager_.Add(
        "discovery", [this] { discovery_.Start(); }, [this] { discovery_.Stop(); });
    // Stopped by Stop(), before the loop ends: a leader releases the Lease (G8).
    manager_.Add("leader election", [this] { elector_->Start(); }, {});
    if (options_.enableGpu) {
      manager_.Add(
          "webhooks", [this] { StartWebhooks(); },
          [this] {
            if (webhookServer_) webhookServer_->Stop();
          });
    }
    manager_.Start();

    reconciler_.Start();
    if (binder_) binder_->Start();
    tick_ = loop_.AddTimer("tick", [this] { Tick(); });
    tick_.Arm(std::chrono::milliseconds(0));
    loop_.EnableWatchdog();
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
  static kube::ClientOptions ClientOptions(const RunOptions& options) {
    kube::ClientOptions client;
    client.userAgent = "gpu-controller";
    kube::SetRateLimit(client, options.qps, options.burst);
    return client;
  }

  // G2, G3: the webhooks only with GPUs on, served by every replica from the caches started
  // above. Their writes go through a client of their own whose requests end well inside the
  // API server's webhook timeout.
  void StartWebhooks() {
    kube::ClientOptions options = ClientOptions(options_);
    options.userAgent = "gpu-controller-webhook";
    options.requestTimeout = std::chrono::seconds(3);
    options.maxRetries = 1;
    webhookClient_ = std::make_unique<kube::Client>(client_.config(), options);
    webhook::WebhookOptions webhookOptions;
    webhookOptions.bindWait = options_.bindWait;
    webhookOptions.kubevirtControllerUser = options_.kubevirtControllerUser;
    webhooks_ = std::make_unique<webhook::Webhooks>(*webhookClient_, *this, webhookOptions);
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

  using Readers = ClusterCaches::Readers;

  // Any cache thread: something `readers` read changed. The webhooks' snapshot is built again
  // on any change, and waiting webhooks and binder passes wake.
  void Changed(Readers readers) {
    {
      std::lock_guard lock(changedMutex_);
      ++generation_;
    }
    changed_.notify_all();
    // A change that wakes no pass (the quiet room took it) wakes no loop either.
    if (readers != Readers::kNone) loop_.Post([this, readers] { Trigger(readers); });
  }

  // Loop thread: a pass soon, collapsing a burst of changes into one.
  void Trigger(Readers readers = Readers::kBoth) {
    if (stopping_ || readers == Readers::kNone) return;
    if (binder_ && readers != Readers::kReconciler) binder_->Trigger();
    if (readers != Readers::kBinder) reconciler_.Trigger();
  }

  // A cache of the manager's: its changes (those `matters` lets through; none: all) trigger
  // the passes of its readers and wake waiting webhooks; it gates readiness, and the
  // reconciler's passes wait for it when the reconciler reads it; its metrics and list/watch
  // errors are exported and logged under `name`.
  template <class T>
  void Watch(const Watched<T>& watched, Readers readers,
             typename kube::Cache<T>::ChangeFilter matters = nullptr) {
    kube::Cache<T>& cache = caches_.Make(watched);
    const std::string name = watched.Name();
    if (matters) cache.SetChangeFilter(std::move(matters));
    cache.SetOnChange([this, readers] { Changed(readers); });
    runtime::Manager::Runnable runnable;
    runnable.name = name;
    runnable.start = [this, &cache] { cache.Start(&caches_.Loop()); };
    runnable.stop = [&cache] { cache.Stop(); };
    runnable.synced = [&cache] { return cache.Synced(); };
    runnable.gatesReadiness = true;
    manager_.Add(std::move(runnable));
    watched_.emplace_back(name, &cache);
    if (readers != Readers::kBinder) reconcilerReads_.push_back(&cache);
  }

  // Pods, with a filter of two steps (docs/controller.md, "Who wakes for a change"). A change the
  // model reads nothing different in (model::PodChangeMatters) is taken quietly. Of the others,
  // those the binder's quiet room absorbs (BinderLoop's QuietRoom: the last full pass decided only
  // held keeps, and the pod's units fit in its node's room) still renew the webhooks' snapshot,
  // whose budgets and room count the pod, but wake no binder pass. The filter runs for each change
  // of a step, and the step's change callback after them, on the thread that steps the pods cache:
  // the informer loop's, or a list worker's while the cache lists (never two at once). While usage
  // records are served, every change that matters also asks the reconciler for a pass within a
  // second (ReconcilerLoop::TriggerForRecords), which writes the pods' raw-name usage records
  // (C11).
  void WatchPods() {
    Watch(kPodCache, Readers::kBoth, [this](const model::Pod* before, const model::Pod* after) {
      if (!model::PodChangeMatters(before, after)) return false;
      // Absorbed, or recorded for the pass in flight (which passes again if its room
      // does not take it): the webhooks' snapshot renews, no pass wakes now.
      if (binder_ && binder_->quietRoom().Absorbs(before, after) != QuietRoom::Take::kRefused) {
        podsAbsorbed_ = true;
      } else {
        podsWakeBinder_ = true;
      }
      return true;
    });
    caches_.Get(kPodCache).SetOnChange([this] {
      const bool absorbedOnly = podsAbsorbed_ && !podsWakeBinder_;
      podsAbsorbed_ = podsWakeBinder_ = false;
      Changed(absorbedOnly ? Readers::kNone : Readers::kBinder);
      // The reconciler reads pods only for their usage records (none while Cozystack's kinds
      // are not served), which may lag a second: pod churn costs it a pass a second at most.
      if (caches_.records.Get() != nullptr) {
        loop_.Post([this] {
          if (!stopping_) reconciler_.TriggerForRecords();
        });
      }
    });
  }

  // ReconcilerSource, for the reconciler's loop: whether every cache it reads has listed, and a
  // pass's input from them.
  bool ReconcilerCachesSynced() const override {
    return std::all_of(reconcilerReads_.begin(), reconcilerReads_.end(),
                       [](const kube::CacheBase* cache) { return cache->Synced(); });
  }

  ReconcileInput BuildInput() const override { return caches_.BuildInput(); }

  // Readiness: everything the manager runs has started and the caches that need no KubeVirt
  // have listed (KubeVirt's never count, G4).
  bool Ready() const { return manager_.Ready(); }

  // BinderSource, for the binder's loop.
  bool BinderCachesSynced() const override { return Ready(); }
  bool AnyUnansweredRequest() const override {
    return !caches_.Get(kDeviceCache).IndexKeys("pending", "pending").empty();
  }
  std::vector<std::shared_ptr<const api::GpuDevice>> CachedDevices() const override {
    return caches_.Get(kDeviceCache).List();
  }
  std::shared_ptr<const api::GpuDevice> CachedDevice(const std::string& key) const override {
    return caches_.Get(kDeviceCache).Get(key);
  }

  // Everything but the devices, as the caches show it (ClusterCaches). Any thread.
  bool FillSnapshot(model::Snapshot& snapshot) const override {
    return caches_.FillSnapshot(snapshot);
  }

  // webhook::ClusterSource, on the webhook server's threads (Generation and WaitForChange are
  // BinderSource's too, on the binder's worker).
  bool Synced() const override { return Ready(); }
  uint64_t Generation() const override { return generation_.load(); }
  void WaitForChange(uint64_t seen, std::chrono::steady_clock::time_point until) const override {
    std::unique_lock lock(changedMutex_);
    changed_.wait_until(lock, until, [&] { return generation_.load() != seen; });
  }

  std::shared_ptr<const webhook::Prepared> Prepare() override {
    std::lock_guard lock(preparedMutex_);
    // Read the generation before the caches: a change during the build makes the next
    // request build again rather than keep a state older than it claims.
    const uint64_t generation = generation_.load();
    if (prepared_ && preparedGeneration_ == generation) return prepared_;
    // The view it replaces lends the new one's model what did not change (the nodes' tables,
    // the numbers of every device object both hold), and goes once that is built.
    const std::shared_ptr<const webhook::Prepared> previous = std::move(prepared_);
    prepared_ = caches_.Prepared(previous.get());
    preparedGeneration_ = generation;
    return prepared_;
  }

  std::shared_ptr<const api::GpuDevice> Device(const std::string& ns,
                                               const std::string& name) const override {
    return caches_.Get(kDeviceCache).Get(ns + "/" + name);
  }

  std::vector<std::shared_ptr<const api::GpuDevice>> AttachedTo(
      const std::string& ns, const std::string& vmiName) const override {
    return caches_.Get(kDeviceCache).ByIndex("vmi", ns + "/" + vmiName);
  }

  // Loop thread, every second: the kinds that come and go, health and metrics.
  void Tick() {
    if (caches_.FollowDiscovery()) Trigger();
    if (webhooks_) webhookMetrics_.Take(webhooks_->TakeStats());
    LogCacheErrors();
    health_.Heartbeat();
    // With GPUs on, ready also means the webhooks answer: the API server may be sent here.
    // A webhook pool that is full is not ready either: the Service then sends the API server to
    // another replica while this one catches up (docs/health-server.md, "POST routes and TLS").
    health_.SetReady(Ready() && (!webhookServer_ ||
                                 (webhookServer_->serving() && !webhookServer_->Saturated())));
    health_.SetMetrics(Metrics());
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

  std::string Metrics() const {
    runtime::MetricsWriter out;
    WriteLeaderMetrics(out, leading_, acquisitions_, elector_->Transitions());
    reconciler_.WriteMetrics(out);
    if (binder_) binder_->WriteMetrics(out);
    if (webhooks_) {
      webhookMetrics_.Write(out, webhookServer_->stats());
      out.Family("gpu_controller_webhook_callers_authenticated", "gauge",
                 "1 when the webhooks serve only callers with a client certificate of "
                 "--webhook-client-ca; 0 when any TLS client is answered "
                 "(--webhook-allow-unauthenticated-callers).");
      out.Sample("gpu_controller_webhook_callers_authenticated", "",
                 options_.webhookClientCa.empty() ? 0 : 1);
    }
    std::vector<std::pair<std::string, const kube::CacheBase*>> caches;
    ForEachCache([&caches](const std::string& name, const kube::CacheBase& cache) {
      caches.emplace_back(name, &cache);
    });
    WriteCacheMetrics(out, caches, loop_.callbackFailures());
    return out.Take();
  }

  void Stop() {
    if (stopping_) return;
    stopping_ = true;
    LogInfo("stopping: finishing the pass in flight, then releasing the Lease");
    runtime::Notify("STOPPING=1");
    leading_ = false;  // the pass in flight makes no further writes
    reconciler_.Stop();
    if (binder_) binder_->Stop();
    elector_->Stop();  // a leader releases the Lease (G8)
    loop_.Exit(0);
  }

  RunOptions options_;
  std::string identity_;
  // The webhooks' view: the snapshot and model for one state of the caches, built again when
  // a cache changed (generation_ counts changes).
  std::atomic<uint64_t> generation_{0};
  // Signalled with each change, for the webhooks waiting on the binder's answer.
  mutable std::mutex changedMutex_;
  mutable std::condition_variable changed_;
  std::mutex preparedMutex_;
  std::shared_ptr<const webhook::Prepared> prepared_;
  uint64_t preparedGeneration_ = 0;
  std::unique_ptr<kube::Client> webhookClient_;
  std::unique_ptr<webhook::Webhooks> webhooks_;
  std::unique_ptr<webhook::Server> webhookServer_;
  WebhookMetrics webhookMetrics_;  // loop thread, from TakeStats
  runtime::Loop loop_;
  kube::Client client_;
  kube::Discovery discovery_;
  ClusterCaches caches_;
  std::unique_ptr<kube::LeaderElector> elector_;
  std::atomic<bool> leading_{false};
  ReconcilerLoop reconciler_;
  std::unique_ptr<BinderLoop> binder_;  // with --enable-gpu
  runtime::HealthServer health_;
  runtime::Manager manager_;  // what Run starts in order and stops in reverse
  // The caches Watch added, by name, in order; and those the reconciler's passes wait for.
  std::vector<std::pair<std::string, const kube::CacheBase*>> watched_;
  std::vector<const kube::CacheBase*> reconcilerReads_;
  std::map<std::string, std::string> cacheErrors_;  // the last error logged, by cache (loop)
  std::map<std::string, int> pagesHalvedSaid_;      // list pages halved, as last logged
  runtime::Timer tick_;
  bool stopping_ = false;
  // The thread stepping the pods cache (WatchPods): what the filter made of one step's changes.
  bool podsAbsorbed_ = false;
  bool podsWakeBinder_ = false;
  // Metrics, loop thread.
  int64_t acquisitions_ = 0;
};

}  // namespace

std::map<std::string, std::string> SettingsData(
    const std::vector<std::string>& hosterNames,
    const model::SharedVector<api::GpuNodeInventory>& gpuNodes,
    const model::PermittedHostDevices& permitted, const std::vector<api::GpuClass>& classes,
    bool rawNamesForbidden, std::string_view webhookCallers) {
  std::string joined;
  for (const auto& name : model::EffectiveGpuResourceNames(model::Settings{hosterNames}, gpuNodes,
                                                           permitted, classes)) {
    joined += (joined.empty() ? "" : ",") + name;
  }
  std::map<std::string, std::string> data = {
      {std::string(api::kSettingsResourceNamesKey), joined},
      {std::string(api::kSettingsRawNamePolicyKey),
       std::string(rawNamesForbidden ? api::kRawNamePolicyForbidden : api::kRawNamePolicyAllowed)}};
  if (!webhookCallers.empty()) {
    data[std::string(api::kSettingsWebhookCallersKey)] = std::string(webhookCallers);
  }
  return data;
}

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
