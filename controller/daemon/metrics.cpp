#include "controller/daemon/metrics.h"

namespace cozy::controller {

void WriteLeaderMetrics(runtime::MetricsWriter& out, bool leading, int64_t acquisitions,
                        int64_t leaseTransitions) {
  out.Family("gpu_controller_leader", "gauge", "1 while this replica holds the Lease.");
  out.Sample("gpu_controller_leader", "", leading ? 1 : 0);
  out.Family("gpu_controller_leader_acquisitions_total", "counter",
             "Times this replica became the leader.");
  out.Sample("gpu_controller_leader_acquisitions_total", "", static_cast<double>(acquisitions));
  out.Family("gpu_controller_lease_transitions", "gauge",
             "The Lease's leaseTransitions as last seen: leadership changes in the cluster.");
  out.Sample("gpu_controller_lease_transitions", "", static_cast<double>(leaseTransitions));
}

void WebhookMetrics::Take(webhook::WebhookStats stats) {
  for (double seconds : stats.latencies) latency_.Observe(seconds);
  stats.latencies.clear();
  stats_ = std::move(stats);
}

void WebhookMetrics::Write(runtime::MetricsWriter& out,
                           const webhook::Server::Stats& server) const {
  out.Family("gpu_controller_admission_total", "counter",
             "Admission answers by webhook and result (allowed, refused, error).");
  for (const auto& [key, count] : stats_.answers) {
    const auto slash = key.find('/');
    out.Sample("gpu_controller_admission_total",
               runtime::Label("webhook", key.substr(0, slash)) + "," +
                   runtime::Label("result", key.substr(slash + 1)),
               static_cast<double>(count));
  }
  out.Family("gpu_controller_admission_duration_seconds", "histogram",
             "Time to answer one admission request, the VMI webhook's wait included.");
  latency_.Write(out, "gpu_controller_admission_duration_seconds");
  out.Family("gpu_controller_admission_writes_total", "counter",
             "The VMI webhook's writes: template devices created, attachments, conflicts, "
             "rollbacks.");
  out.Sample("gpu_controller_admission_writes_total", runtime::Label("kind", "template"),
             static_cast<double>(stats_.templatesCreated));
  out.Sample("gpu_controller_admission_writes_total", runtime::Label("kind", "attachment"),
             static_cast<double>(stats_.attachments));
  out.Sample("gpu_controller_admission_writes_total", runtime::Label("kind", "conflict"),
             static_cast<double>(stats_.attachConflicts));
  out.Sample("gpu_controller_admission_writes_total", runtime::Label("kind", "rollback"),
             static_cast<double>(stats_.rollbacks));
  out.Family("gpu_controller_admission_reinvocations_total", "counter",
             "VMI admissions that found their own answered request and wrote nothing (E9).");
  out.Sample("gpu_controller_admission_reinvocations_total", "",
             static_cast<double>(stats_.reinvocations));
  out.Family("gpu_controller_admission_reinvocations_read_live_total", "counter",
             "Of those, found only by reading the API server: this replica's cache did not "
             "show another replica's answered request yet (E9 across replicas).");
  out.Sample("gpu_controller_admission_reinvocations_read_live_total", "",
             static_cast<double>(stats_.reinvocationsReadLive));
  out.Family("gpu_controller_admission_bind_timeouts_total", "counter",
             "VMI admissions the binder did not answer within the bound (E8).");
  out.Sample("gpu_controller_admission_bind_timeouts_total", "",
             static_cast<double>(stats_.bindTimeouts));
  out.Family("gpu_controller_webhook_certificate_loads_total", "counter",
             "Serving certificate loads (result ok) and pairs that did not load (error).");
  out.Sample("gpu_controller_webhook_certificate_loads_total", runtime::Label("result", "ok"),
             static_cast<double>(server.certificateLoads));
  out.Sample("gpu_controller_webhook_certificate_loads_total", runtime::Label("result", "error"),
             static_cast<double>(server.certificateErrors));
  out.Family("gpu_controller_webhook_certificate_expiry_timestamp_seconds", "gauge",
             "When the served certificate expires (Unix seconds); a warning is logged in its "
             "last 7 days.");
  out.Sample("gpu_controller_webhook_certificate_expiry_timestamp_seconds", "",
             static_cast<double>(server.certificateNotAfter));
  out.Family("gpu_controller_webhook_connections_total", "counter",
             "Webhook connections by outcome: accepted; refused by the server (malformed, "
             "too large: rejected); 503 for a full pool or body budget (busy); closed at a "
             "deadline (timed_out) or for a newer connection (overflowed); closed because "
             "their address held its cap of unauthenticated connections (peer_capped); new "
             "ones closed at once because every slot held a review being answered or an "
             "authenticated caller (turned_away, which readiness reports); TLS handshakes "
             "refused or broken (handshake_failed).");
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
    out.Sample("gpu_controller_webhook_connections_total", runtime::Label("outcome", outcome),
               static_cast<double>(count));
  }
  out.Family("gpu_controller_webhook_connections_open", "gauge", "Webhook connections open now.");
  out.Sample("gpu_controller_webhook_connections_open", "", static_cast<double>(server.http.open));
  out.Family("gpu_controller_webhook_reused_connection_requests_total", "counter",
             "Reviews that came on a kept connection (keep-alive): each saved a TCP and TLS "
             "handshake.");
  out.Sample("gpu_controller_webhook_reused_connection_requests_total", "",
             static_cast<double>(server.http.reused));
  out.Family("gpu_controller_webhook_workers_busy", "gauge",
             "Webhook workers running a review now.");
  out.Sample("gpu_controller_webhook_workers_busy", "", static_cast<double>(server.http.active));
  out.Family("gpu_controller_webhook_queued_reviews", "gauge",
             "Complete reviews waiting for a webhook worker now.");
  out.Sample("gpu_controller_webhook_queued_reviews", "", static_cast<double>(server.http.queued));
}

void WriteCacheMetrics(runtime::MetricsWriter& out,
                       const std::vector<std::pair<std::string, const kube::CacheBase*>>& caches,
                       int64_t loopCallbackFailures) {
  out.Family("gpu_controller_cache_synced", "gauge", "1 once a cache has listed.");
  out.Family("gpu_controller_cache_objects", "gauge", "Objects in each cache.");
  out.Family("gpu_controller_cache_failures_total", "counter",
             "Lists and watches of each cache that failed (each backs off; logged).");
  out.Family("gpu_controller_cache_decode_failures_total", "counter",
             "Objects each cache skipped because they do not decode.");
  out.Family("gpu_controller_cache_ignored_changes_total", "counter",
             "Changes each cache took without waking a pass: nothing its readers read "
             "changed (a status heartbeat, a pod that asks for no extended resource).");
  for (const auto& [name, cachePointer] : caches) {
    const kube::CacheBase& cache = *cachePointer;
    const std::string label = runtime::Label("cache", name);
    out.Sample("gpu_controller_cache_synced", label, cache.Synced() ? 1 : 0);
    out.Sample("gpu_controller_cache_objects", label, static_cast<double>(cache.Size()));
    out.Sample("gpu_controller_cache_failures_total", label,
               static_cast<double>(cache.Stats().failures));
    out.Sample("gpu_controller_cache_decode_failures_total", label,
               static_cast<double>(cache.DecodeFailures()));
    out.Sample("gpu_controller_cache_ignored_changes_total", label,
               static_cast<double>(cache.IgnoredChanges()));
  }
  out.Family("gpu_controller_loop_callback_failures_total", "counter",
             "Event-loop callbacks that threw (logged with their source).");
  out.Sample("gpu_controller_loop_callback_failures_total", "",
             static_cast<double>(loopCallbackFailures));
}

}  // namespace cozy::controller
