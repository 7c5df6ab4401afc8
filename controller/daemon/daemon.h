// `gpu-controller run`: the controller as a daemon in a cluster. Every replica keeps warm caches
// (classes, devices, GPUNodes, the settings ConfigMap; with --enable-gpu, VMIs once their kind
// is served; Cozystack's usage-record kinds once served) and campaigns for the Lease; the
// leader runs the GPU reconciler (controller/reconciler), which always runs, GPUs on or off
// (G1). With --enable-gpu the leader's binder places orders (controller/binder) and every
// replica serves the admission webhooks (controller/webhook), all from the same caches.
//
// Threads: the event loop (signals, timers, health), the informer loop that reads every cache's
// watch (relists on its list workers), the elector's, the
// discovery refresher's and the reconciler's worker. Passes never overlap: events that arrive
// during one collapse into the next.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "api/gpuclass.h"
#include "api/gpunode_types.h"
#include "api/keys.h"
#include "controller/model/snapshot.h"
#include "kube/clock.h"

namespace cozy::controller {

struct RunOptions {
  std::string kubeconfig;  // empty: in-cluster
  std::string namespaceName{api::kDefaultControllerNamespace};
  std::string identity;  // the Lease holder identity; empty: the hostname
  bool enableGpu = false;
  std::vector<std::string> gpuResourceNames;
  bool rawNamesForbidden = false;
  std::chrono::milliseconds attachmentGrace = std::chrono::minutes(2);
  kube::Duration leaseDuration = std::chrono::seconds(15);
  kube::Duration renewDeadline = std::chrono::seconds(10);
  kube::Duration retryPeriod = std::chrono::seconds(2);
  std::string healthAddress = ":8080";
  double qps = 50;
  int burst = 100;
  // A pass at least this often, even when nothing changed: what no watch tells (a VMI's end
  // with GPUs off, read by name) is seen within it.
  std::chrono::milliseconds resync = std::chrono::seconds(30);
  kube::Duration discoveryInterval = std::chrono::seconds(30);
  // The admission webhooks (only with enableGpu): HTTPS on this address, the serving pair
  // `tls.crt` / `tls.key` read from the directory (reloaded when they change), and how long
  // the VMI webhook waits for the binder's answer (E8).
  std::string webhookAddress = ":9443";
  std::string webhookCertDir = "/tmp/k8s-webhook-server/serving-certs";
  std::string webhookClientCa;  // PEM CA the API server's client certificate chains to; "" none
  // With GPUs on and no client CA, the controller refuses to start unless this opt-out is
  // given: then it serves any TLS client, warns, exports the gauge
  // gpu_controller_webhook_callers_authenticated 0 and says so in the settings ConfigMap
  // (webhookCallers: unauthenticated), which `kubectl gpu` shows.
  bool webhookAllowUnauthenticated = false;
  // E14: the user KubeVirt's controller creates launcher pods as; the pod webhook pins no
  // other's pods.
  std::string kubevirtControllerUser = "system:serviceaccount:cozy-kubevirt:kubevirt-controller";
  std::chrono::milliseconds bindWait = std::chrono::seconds(8);
  // With enableGpu, after SIGTERM: how long the webhooks drain (the replica unready, each answer
  // closing its connection) before new connections are refused, so that the Service's endpoints
  // stop sending them here first (docs/controller.md, "How a replica starts and stops"); 0: none.
  std::chrono::milliseconds shutdownDelay = std::chrono::seconds(3);
  // model::Settings::notReadyGraceSeconds (docs/controller.md, "Placement").
  std::chrono::milliseconds notReadyGrace = std::chrono::minutes(5);
  // With enableGpu: the namespaces holding the most units that get a gpu_catalog_tenant_units_held
  // series of their own, the rest summed as "_other"; 0: no such series (docs/controller.md,
  // "Catalog metrics").
  int catalogTenantSeries = 200;
};

// Runs until SIGTERM or SIGINT; returns the exit code. Throws std::invalid_argument for options
// that cannot work (a non-positive grace, lease timings client-go refuses).
int RunController(const RunOptions& options);

}  // namespace cozy::controller
