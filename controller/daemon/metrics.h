// The controller's /metrics, one writer per part: the daemon counts on its loop thread and
// hands these the numbers; what each family means is said here, once.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "controller/reconciler/apply.h"
#include "controller/reconciler/plan.h"
#include "controller/webhook/server.h"
#include "controller/webhook/webhooks.h"
#include "kube/cache.h"
#include "runtime/metrics.h"

namespace cozy::controller {

void WriteLeaderMetrics(runtime::MetricsWriter& out, bool leading, int64_t acquisitions,
                        int64_t leaseTransitions);

// The reconciler's passes and writes, as the loop thread learns of each finished pass.
class ReconcilerMetrics {
 public:
  // One pass: how long it took, whether it failed (could not plan, or skipped attachments whose
  // VMI cannot be told), what the applier wrote and what waits.
  void Pass(double seconds, bool failed, const ApplyCounts& counts, const Waiting& waiting);
  void Write(runtime::MetricsWriter& out) const;

 private:
  int64_t passes_ = 0;
  int64_t failures_ = 0;
  runtime::Histogram duration_{{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30}};
  std::map<std::pair<std::string, std::string>, int64_t> writes_;
  int64_t conflicts_ = 0;
  int queueDepth_ = 0;
  double backingOff_ = 0;  // objects held off after the last pass
  Waiting waiting_;
};

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
