# The chart's controller Deployment running for real (docs/testing.md, "Pods that run"): shared by
# chart_rollout_test.sh and upgrade_test.sh; sourced after own_cluster.sh, whose cluster runs
# Deployments (export COZY_CLUSTER_WORKLOADS=1 before sourcing it), not run.
#   service_webhook_certs NS       $work/webhook-ca.crt and the Secret gpu-controller-webhook-tls
#                                  in NS (created), naming the Service gpu-controller-webhook.NS.svc
#   previous_release               $previous_ref, $previous_version, $previous_build (its programs)
#                                  and its chart in $work/previous/charts/gpu
#   controller_images FILE         the --programs file of the nodes: $controller_image:previous and
#                                  :this, the previous release's and this build's gpu-controller
#   controller_values FILE TAG [GPU-LINES [CONTROLLER-LINES]]
#                                  the chart's values: GPUs on, the webhooks behind the Service, the
#                                  controller image TAG; GPU-LINES go on under gpu.webhook (indented
#                                  four spaces) or gpu (two), CONTROLLER-LINES under controller
#   cut_by_undrained_stop          what a review cut by the previous release's stop reads (an ERE)
#   rolled, live_replicas, replicas_run BUILD
#                                  the Deployment rolled out; its replicas not being deleted; each
#                                  of those runs BUILD's gpu-controller
controller_image=local/gpu-controller
# A review cut by a replica that stops without a drain (the previous release's): it closes every
# connection at its SIGTERM, a review in flight on a kept one included ("EOF", or a reset), and
# refuses new ones before the Service's endpoints drop it ("connection refused"). An ERE.
cut_by_undrained_stop='failed calling webhook .*(: EOF|connection reset by peer|connect: connection refused)'

service_webhook_certs() {
  webhook_certs "DNS:gpu-controller-webhook.$1.svc" gpu-controller-webhook ||
    abort "openssl could not make the webhook certificate"
  kc create namespace "$1" >/dev/null
  kc create secret tls gpu-controller-webhook-tls -n "$1" --cert "$work/tls.crt" --key "$work/tls.key" >/dev/null ||
    abort "the webhook's Secret"
}

previous_release() {
  read -r previous_ref previous_version < <(grep -v '^#' "$source_dir/test/realcluster/previous-release")
  mkdir -p "$work/previous"
  git -C "$source_dir" archive "$previous_ref" charts/gpu 2>"$work/archive.err" | tar -x -C "$work/previous" ||
    abort "the previous release's chart ($previous_ref) cannot be read from git: $(cat "$work/archive.err")" \
      "(the test needs the repository's history, not a shallow clone)"
  [ "$(sed -n 's/^version: //p' "$work/previous/charts/gpu/Chart.yaml")" = "$previous_version" ] ||
    abort "charts/gpu at $previous_ref is not version $previous_version"
  previous_build=$("$source_dir/test/realcluster/previous_programs.sh" "$source_dir") ||
    abort "the previous release's programs ($previous_ref) could not be built"
}

controller_images() {
  printf '%s\n' "$controller_image:previous $previous_build/controller/gpu-controller" \
    "$controller_image:this $build_dir/controller/gpu-controller" >"$1"
}

controller_values() {
  gpus_on_values "$1"
  [ -z "${3:-}" ] || echo "$3" >>"$1"
  printf 'controller:\n  image: {repository: %s, tag: %s, pullPolicy: IfNotPresent}\n' "$controller_image" "$2" >>"$1"
  [ -z "${4:-}" ] || echo "$4" >>"$1"
}

replicas_json() { kc get pods -n "$ns" -l app.kubernetes.io/name=gpu-controller -o json; }
rolled() { kc rollout status deployment/gpu-controller -n "$ns" --timeout=5s; }
live_replicas() {
  replicas_json | jq -r '[.items[] | select(.metadata.deletionTimestamp == null) | .metadata.name] | sort | join(" ")'
}
replicas_run() {
  local id
  for id in $(replicas_json | jq -r '.items[] | select(.metadata.deletionTimestamp == null) |
      .status.containerStatuses[0].containerID // "none" | sub("^[^:]+://"; "")'); do
    grep -qF "cri-runtime: container $id: $1/controller/gpu-controller started" \
      "$cluster_dir"/nodes/*/logs/cri-runtime.log || return 1
  done
}
