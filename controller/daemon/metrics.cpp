#include "controller/daemon/metrics.h"

namespace cozy::controller {

void DeclareLeaderMetrics(runtime::MetricsRegistry& registry) {
  registry.Gauge("gpu_controller_leader", "1 while this replica holds the Lease.");
  registry.Counter("gpu_controller_leader_acquisitions_total",
                   "Times this replica became the leader.");
  registry.Gauge("gpu_controller_lease_transitions",
                 "The Lease's leaseTransitions as last seen: leadership changes in the cluster.");
}

void WebhookMetrics::Declare(runtime::MetricsRegistry& registry) {
  registry.Counter("gpu_controller_admission_total",
                   "Admission answers by webhook and result (allowed, refused, error).",
                   {"webhook", "result"});
  registry.HistogramFamily(
      "gpu_controller_admission_duration_seconds",
      "Time to answer one admission request, the VMI webhook's wait included.");
  registry.Counter("gpu_controller_admission_writes_total",
                   "The VMI webhook's writes: template devices created, attachments, conflicts, "
                   "rollbacks.",
                   {"kind"});
  registry.Counter("gpu_controller_admission_reinvocations_total",
                   "VMI admissions that found their own answered request and wrote nothing (E9).");
  registry.Counter("gpu_controller_admission_reinvocations_read_live_total",
                   "Of those, found only by reading the API server: this replica's cache did not "
                   "show another replica's answered request yet (E9 across replicas).");
  registry.Counter("gpu_controller_admission_bind_timeouts_total",
                   "VMI admissions the binder did not answer within the bound (E8).");
  registry.Counter("gpu_controller_webhook_certificate_loads_total",
                   "Serving certificate loads (result ok) and pairs that did not load (error).",
                   {"result"});
  registry.Gauge("gpu_controller_webhook_certificate_expiry_timestamp_seconds",
                 "When the served certificate expires (Unix seconds); a warning is logged in its "
                 "last 7 days.");
  registry.Counter("gpu_controller_webhook_connections_total",
                   "Webhook connections by outcome: accepted; refused by the server (malformed, "
                   "too large: rejected); 503 for a full pool or body budget (busy); closed at a "
                   "deadline (timed_out) or for a newer connection (overflowed); closed because "
                   "their address held its cap of unauthenticated connections (peer_capped); new "
                   "ones closed at once because every slot held a review being answered or an "
                   "authenticated caller (turned_away, which readiness reports); TLS handshakes "
                   "refused or broken (handshake_failed).",
                   {"outcome"});
  registry.Gauge("gpu_controller_webhook_connections_open", "Webhook connections open now.");
  registry.Counter("gpu_controller_webhook_reused_connection_requests_total",
                   "Reviews that came on a kept connection (keep-alive): each saved a TCP and TLS "
                   "handshake.");
  registry.Gauge("gpu_controller_webhook_workers_busy", "Webhook workers running a review now.");
  registry.Gauge("gpu_controller_webhook_queued_reviews",
                 "Complete reviews waiting for a webhook worker now.");
  registry.Gauge("gpu_controller_webhook_callers_authenticated",
                 "1 when the webhooks serve only callers with a client certificate of "
                 "--webhook-client-ca; 0 when any TLS client is answered "
                 "(--webhook-allow-unauthenticated-callers).");
}

void DeclareCacheMetrics(runtime::MetricsRegistry& registry) {
  registry.Gauge("gpu_controller_cache_synced", "1 once a cache has listed.", {"cache"});
  registry.Gauge("gpu_controller_cache_objects", "Objects in each cache.", {"cache"});
  registry.Counter("gpu_controller_cache_failures_total",
                   "Lists and watches of each cache that failed (each backs off; logged).",
                   {"cache"});
  registry.Counter("gpu_controller_cache_decode_failures_total",
                   "Objects each cache skipped because they do not decode.", {"cache"});
  registry.Counter("gpu_controller_cache_ignored_changes_total",
                   "Changes each cache took without waking a pass: nothing its readers read "
                   "changed (a status heartbeat, a pod that asks for no extended resource).",
                   {"cache"});
  registry.Counter("gpu_controller_loop_callback_failures_total",
                   "Event-loop callbacks that threw (logged with their source).");
}

void WriteLeaderMetrics(runtime::MetricsScrape& out, bool leading, int64_t acquisitions,
                        int64_t leaseTransitions) {
  out.Set("gpu_controller_leader", {}, leading ? 1 : 0);
  out.Set("gpu_controller_leader_acquisitions_total", {}, static_cast<double>(acquisitions));
  out.Set("gpu_controller_lease_transitions", {}, static_cast<double>(leaseTransitions));
}

void WebhookMetrics::Take(webhook::WebhookStats stats) {
  for (double seconds : stats.latencies) latency_.Observe(seconds);
  stats.latencies.clear();
  stats_ = std::move(stats);
}

void WebhookMetrics::Write(runtime::MetricsScrape& out, const webhook::Server::Stats& server,
                           bool authenticated) const {
  out.Show("gpu_controller_admission_total");
  for (const auto& [key, count] : stats_.answers) {
    const auto slash = key.find('/');
    out.Set("gpu_controller_admission_total", {key.substr(0, slash), key.substr(slash + 1)},
            static_cast<double>(count));
  }
  out.SetHistogram("gpu_controller_admission_duration_seconds", latency_);
  out.Set("gpu_controller_admission_writes_total", {"template"},
          static_cast<double>(stats_.templatesCreated));
  out.Set("gpu_controller_admission_writes_total", {"attachment"},
          static_cast<double>(stats_.attachments));
  out.Set("gpu_controller_admission_writes_total", {"conflict"},
          static_cast<double>(stats_.attachConflicts));
  out.Set("gpu_controller_admission_writes_total", {"rollback"},
          static_cast<double>(stats_.rollbacks));
  out.Set("gpu_controller_admission_reinvocations_total", {},
          static_cast<double>(stats_.reinvocations));
  out.Set("gpu_controller_admission_reinvocations_read_live_total", {},
          static_cast<double>(stats_.reinvocationsReadLive));
  out.Set("gpu_controller_admission_bind_timeouts_total", {},
          static_cast<double>(stats_.bindTimeouts));
  out.Set("gpu_controller_webhook_certificate_loads_total", {"ok"},
          static_cast<double>(server.certificateLoads));
  out.Set("gpu_controller_webhook_certificate_loads_total", {"error"},
          static_cast<double>(server.certificateErrors));
  out.Set("gpu_controller_webhook_certificate_expiry_timestamp_seconds", {},
          static_cast<double>(server.certificateNotAfter));
  out.Show("gpu_controller_webhook_connections_total");
  const std::pair<const char*, int64_t> outcomes[] = {
      {"accepted", server.http.accepted},
      {"rejected", server.http.rejected},
      {"busy", server.http.busy},
      {"timed_out", server.http.timedOut},
      {"overflowed", server.http.overflowed},
      {"peer_capped", server.http.peerCapped},
      {"turned_away", server.http.turnedAway},
      {"handshake_failed", server.http.handshakeFailures}};
  for (const auto& [outcome, count] : outcomes) {
    out.Set("gpu_controller_webhook_connections_total", {outcome}, static_cast<double>(count));
  }
  out.Set("gpu_controller_webhook_connections_open", {}, static_cast<double>(server.http.open));
  out.Set("gpu_controller_webhook_reused_connection_requests_total", {},
          static_cast<double>(server.http.reused));
  out.Set("gpu_controller_webhook_workers_busy", {}, static_cast<double>(server.http.active));
  out.Set("gpu_controller_webhook_queued_reviews", {}, static_cast<double>(server.http.queued));
  out.Set("gpu_controller_webhook_callers_authenticated", {}, authenticated ? 1 : 0);
}

void WriteCacheMetrics(runtime::MetricsScrape& out,
                       const std::vector<std::pair<std::string, const kube::CacheBase*>>& caches,
                       int64_t loopCallbackFailures) {
  out.Show("gpu_controller_cache_synced");
  out.Show("gpu_controller_cache_objects");
  out.Show("gpu_controller_cache_failures_total");
  out.Show("gpu_controller_cache_decode_failures_total");
  out.Show("gpu_controller_cache_ignored_changes_total");
  for (const auto& [name, cachePointer] : caches) {
    const kube::CacheBase& cache = *cachePointer;
    out.Set("gpu_controller_cache_synced", {name}, cache.Synced() ? 1 : 0);
    out.Set("gpu_controller_cache_objects", {name}, static_cast<double>(cache.Size()));
    out.Set("gpu_controller_cache_failures_total", {name},
            static_cast<double>(cache.Stats().failures));
    out.Set("gpu_controller_cache_decode_failures_total", {name},
            static_cast<double>(cache.DecodeFailures()));
    out.Set("gpu_controller_cache_ignored_changes_total", {name},
            static_cast<double>(cache.IgnoredChanges()));
  }
  out.Set("gpu_controller_loop_callback_failures_total", {},
          static_cast<double>(loopCallbackFailures));
}

}  // namespace cozy::controller
