// The controller's /metrics, one writer per part: the daemon counts on its loop thread and
// hands these the numbers; what each family means is said here, once.
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

void WriteLeaderMetrics(runtime::MetricsWriter& out, bool leading, int64_t acquisitions,
                        int64_t leaseTransitions);

// With GPUs on: the admission webhooks' answers and writes, and their server's connections.
class WebhookMetrics {
 public:
  void Take(webhook::WebhookStats stats);  // what the webhooks counted since the last Take
  void Write(runtime::MetricsWriter& out, const webhook::Server::Stats& server) const;

 private:
  webhook::WebhookStats stats_;
  runtime::Histogram latency_{{0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10}};
};

// Every cache's state by name, and the event loop's failed callbacks.
void WriteCacheMetrics(runtime::MetricsWriter& out,
                       const std::vector<std::pair<std::string, const kube::CacheBase*>>& caches,
                       int64_t loopCallbackFailures);

}  // namespace cozy::controller
