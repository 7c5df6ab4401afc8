// The controller's /metrics: each part's families declared once on the daemon's registry
// (Declare*: name, type, help, label names), and filled at each scrape on the loop thread from
// the numbers the daemon counts (Write*).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "controller/webhook/server.h"
#include "controller/webhook/webhooks.h"
#include "kube/cache.h"
#include "runtime/metrics.h"

namespace cozy::controller {

void DeclareLeaderMetrics(runtime::MetricsRegistry& registry);
void WriteLeaderMetrics(runtime::MetricsScrape& out, bool leading, int64_t acquisitions,
                        int64_t leaseTransitions);

// With GPUs on: the admission webhooks' answers and writes, and their server's connections.
class WebhookMetrics {
 public:
  static void Declare(runtime::MetricsRegistry& registry);
  void Take(webhook::WebhookStats stats);  // what the webhooks counted since the last Take
  // `authenticated`: the webhooks answer only callers with a certificate of --webhook-client-ca.
  void Write(runtime::MetricsScrape& out, const webhook::Server::Stats& server,
             bool authenticated) const;

 private:
  webhook::WebhookStats stats_;
  runtime::Histogram latency_{{0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10}};
};

// Every cache's state by name, and the event loop's failed callbacks.
void DeclareCacheMetrics(runtime::MetricsRegistry& registry);
void WriteCacheMetrics(runtime::MetricsScrape& out,
                       const std::vector<std::pair<std::string, const kube::CacheBase*>>& caches,
                       int64_t loopCallbackFailures);

}  // namespace cozy::controller
