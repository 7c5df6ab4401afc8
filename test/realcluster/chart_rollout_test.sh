#!/usr/bin/env bash
# The chart's own rollout keeps the webhooks up (H4; docs/reliability.md, "The chart's rollout"):
# on a cluster of its own that runs Deployments (COZY_CLUSTER_WORKLOADS=1: kube-controller-manager's
# deployment, replicaset, endpoints and disruption controllers, the ServiceAccount admission
# plugin, the API server calling a Service's endpoints), two real nodes whose container runtime
# runs the chart's controller image as a real gpu-controller (scripts/cluster.sh node --programs:
# tag `previous`, the previous release's; tag `this`, this build's), each pod in a network
# namespace with an address of its own. The previous release's chart goes in with GPUs on and its
# webhooks behind the Service gpu-controller-webhook, as on a hoster's cluster; its Deployment's
# two replicas start, pass kubelet's probes and serve the webhooks. Then `helm upgrade` to this
# tree's chart, an upgrade within it, drains against the PodDisruptionBudget and `helm rollback`
# to the previous release, each while a tenant creates orders without pause: every one answered by
# the order webhook, none refused for want of one (upgrading from the previous release, at most one
# review cut by each of its undrained stops), never fewer than two replicas available in a
# rollout (maxSurge 1, maxUnavailable 0) nor than one in the drains; this release's replicas end on
# SIGTERM with status 0 (their drain).
#   test/realcluster/chart_rollout_test.sh SOURCE_DIR BUILD_DIR
export COZY_CLUSTER_WORKLOADS=1
source "$(dirname "$0")/own_cluster.sh" "$1" "$2"
source "$(dirname "$0")/deployment.sh"
cluster="$source_dir/scripts/cluster.sh"
command -v jq >/dev/null || abort "jq is not installed (scripts/install-deps.sh installs it)"
ns=cozy-system
image=$controller_image
previous_release
controller_images "$work/programs"
for node in ctl-1 ctl-2; do
  "$cluster" node "$cluster_dir" "$node" --programs "$work/programs" >"$work/node-$node.out" 2>&1 ||
    abort "node $node: $(cat "$work/node-$node.out")"
  on_exit "'$cluster' node-down '$cluster_dir' $node"
done
pass "nodes ctl-1 and ctl-2 Ready, their runtime running $image:previous and $image:this as those builds' gpu-controller"

service_webhook_certs "$ns"
controller_values "$work/values-previous.yaml" previous
# This release's replicas drain for 3 s after SIGTERM (the chart's default is longer, for real
# endpoints' propagation): the rollout here takes seconds per replica.
controller_values "$work/values.yaml" this "    shutdownDelay: 3s"
helm install gpu "$work/previous/charts/gpu" --kubeconfig "$admin_kubeconfig" -n "$ns" \
  -f "$work/values-previous.yaml" >"$work/helm.log" 2>&1 || abort "helm install: $(cat "$work/helm.log")"
wait_crds >/dev/null || abort "the CRDs are not Established"
kc apply --server-side -f "$source_dir/test/fakes/crds" >/dev/null || abort "KubeVirt's and Cozystack's CRDs"

# exits: how many replica containers the runtimes saw end, and with which statuses.
exits() { cat "$cluster_dir"/nodes/ctl-*/logs/cri-runtime.log | sed -n 's/.* exited \([0-9]*\)$/\1/p'; }
if wait_until 150 rolled; then
  placed=$(replicas_json | jq -r '[.items[] | select(.metadata.deletionTimestamp == null) |
    "\(.metadata.name) on \(.spec.nodeName) at \(.status.podIP)"] | join(", ")')
  pass "the previous release ($previous_version) installed; its two replicas Ready (kubelet's readiness probe on their own addresses): $placed"
  replicas_run "$previous_build" && pass "... each running the previous release's gpu-controller" ||
    fail "the replicas do not run the previous release's gpu-controller ($previous_build)"
else
  kc get pods -n "$ns" -o wide >"$work/pods.out" 2>&1
  abort "the Deployment did not become available: $(cat "$work/pods.out")"
fi

# A tenant; an order of a class that does not exist is refused by the order webhook itself (its
# reason), through the Service: the API server reaches the replicas at their endpoints.
create_namespace tenant
kc label namespace tenant gpu.cozystack.io/tenant-namespace=true >/dev/null
gpu_class a100 nvidia.com/GA100 "maxCount: 100" | kc apply -f - >/dev/null || abort "the class"
expect_refused "an order of a class that does not exist is refused by the webhook behind the Service" \
  'admission webhook "gpudevices.gpu.cozystack.io" denied the request: .*none' \
  kc create -f - <<<"$(order tenant no-class none)"

# orders_stream FILE: orders created one after the other until $work/stop exists, each answer a
# line of FILE: "ok NAME", or "refused NAME: WHY".
orders_stream() {
  local n=0 out
  while [ ! -e "$work/stop" ]; do
    n=$((n + 1))
    if out=$(order tenant "o$n" none | kc create -f - 2>&1); then
      echo "ok o$n" >>"$1"
    else
      echo "refused o$n: $(tr '\n' ' ' <<<"$out")" >>"$1"
    fi
  done
}
# available_floor FILE: the Deployment's available replicas, sampled until $work/stop exists; the
# least seen into FILE.
available_floor() {
  local least=99 now
  while [ ! -e "$work/stop" ]; do
    now=$(kc get deployment gpu-controller -n "$ns" -o jsonpath='{.status.availableReplicas}' 2>/dev/null) &&
      [ -n "$now" ] && [ "$now" -lt "$least" ] && least=$now
    sleep 0.2
  done
  echo "$least" >"$1"
}

# watch_begin / watch_end WHAT FLOOR [CUT]: the stream of orders and the sampler of available
# replicas run between the two; watch_end says what they saw: every order answered by the
# webhook, never fewer than FLOOR replicas available. CUT: how many reviews may be cut by a
# replica that stops without a drain ($cut_by_undrained_stop), at most one each.
watch_begin() {
  rm -f "$work/stop" "$work/answers" "$work/floor"
  orders_stream "$work/answers" &
  stream=$!
  available_floor "$work/floor" &
  sampler=$!
  sleep 2
}
watch_end() {
  local what=$1 floor=$2 cut_allowed=${3:-0} answered unreachable by_webhook cut
  sleep 2
  touch "$work/stop"
  wait "$stream" "$sampler"
  answered=$(grep -c . "$work/answers")
  cut=$(grep -Ec "$cut_by_undrained_stop" "$work/answers")
  unreachable=$(grep -Eic 'failed calling webhook|no endpoints|connection refused|not reachable|context deadline|timeout' "$work/answers")
  by_webhook=$(grep -c '^refused .*admission webhook "gpudevices.gpu.cozystack.io" denied the request' "$work/answers")
  if [ "$answered" -gt 0 ] && [ "$cut" -le "$cut_allowed" ] && [ "$((unreachable - cut))" = 0 ] &&
    [ "$((by_webhook + cut))" = "$answered" ]; then
    pass "$what: all $answered orders created meanwhile answered by the order webhook (each refused for its missing class), none for want of one${3:+ ($cut cut by an undrained stop, at most $cut_allowed)}"
  else
    fail "$what: $answered orders, $by_webhook answered by the webhook, $unreachable without one ($cut cut by a stop, at most $cut_allowed): $(grep -v 'denied the request' "$work/answers" | head -n 3)"
  fi
  if [ "$(cat "$work/floor")" -ge "$floor" ]; then
    pass "$what: the Deployment never had fewer than $floor available replica(s)"
  else
    fail "$what: the Deployment's available replicas fell to $(cat "$work/floor"), under $floor"
  fi
}

# roll WHAT CUT COMMAND...: COMMAND (helm) rolls the Deployment under watch (CUT: watch_end's);
# both replicas replaced.
roll() {
  local what=$1 cut=$2 before after
  shift 2
  before=$(live_replicas)
  watch_begin
  "$@" >"$work/helm.log" 2>&1 || fail "$what: $(cat "$work/helm.log")"
  wait_until 150 rolled || fail "$what: the rollout did not finish: $(kc get pods -n "$ns" -o wide 2>&1)"
  watch_end "$what (maxSurge 1, maxUnavailable 0)" 2 "$cut"
  after=$(live_replicas)
  if [ -n "$after" ] && [ -z "$(comm -12 <(tr ' ' '\n' <<<"$before") <(tr ' ' '\n' <<<"$after"))" ]; then
    pass "$what: both replicas replaced ($before -> $after)"
  else
    fail "$what: the replicas were not replaced ($before -> $after)"
  fi
}

# The previous release's replicas stop with no drain: a review in flight on one may be cut.
roll "helm upgrade from $previous_version" 2 helm upgrade gpu "$source_dir/charts/gpu" \
  --kubeconfig "$admin_kubeconfig" -n "$ns" -f "$work/values.yaml"
wait_crds >/dev/null || fail "the CRDs are not Established after the upgrade"
replicas_run "$build_dir" && pass "... both replicas running this build's gpu-controller" ||
  fail "the replicas do not run this build's gpu-controller"
# This release's replicas drain: no review cut, each ending on SIGTERM with status 0.
ended_before=$(exits | wc -l)
roll "helm upgrade within this release" "" helm upgrade gpu "$source_dir/charts/gpu" \
  --kubeconfig "$admin_kubeconfig" -n "$ns" -f "$work/values.yaml" --set-string controller.podAnnotations.rollout=2
two_ended() { [ "$(exits | tail -n +"$((ended_before + 1))" | wc -l)" -ge 2 ]; }
if wait_until 30 two_ended && [ -z "$(exits | tail -n +"$((ended_before + 1))" | grep -v '^0$')" ]; then
  pass "this release's two replicas ended on SIGTERM with status 0 (their drain)"
else
  fail "this release's replicas' exit statuses: $(exits | tail -n +"$((ended_before + 1))" | tr '\n' ' ')"
fi

# --- drains: the PodDisruptionBudget keeps one replica (minAvailable 1) -------------------------
# ctl-1 drained: the budget allows its replica's eviction, and the Deployment starts another on
# ctl-2. Then ctl-2 drained with ctl-1 still cordoned: one of its two replicas may go, whose
# replacement has nowhere to run; the budget refuses the last one's eviction (kubectl drain retries
# until its timeout), so the webhooks keep a replica through both.
budget_allows() { [ "$(kc get pdb gpu-controller -n "$ns" -o jsonpath='{.status.disruptionsAllowed}')" = 1 ]; }
wait_until 30 budget_allows || fail "the PodDisruptionBudget does not allow one disruption: $(kc get pdb -n "$ns" -o wide 2>&1)"
watch_begin
kc drain ctl-1 --ignore-daemonsets --timeout=60s >"$work/drain-1.out" 2>&1 ||
  fail "kubectl drain ctl-1: $(tail -n 3 "$work/drain-1.out")"
wait_until 90 rolled || fail "no second replica after ctl-1's drain: $(kc get pods -n "$ns" -o wide 2>&1)"
if kc drain ctl-2 --ignore-daemonsets --timeout=20s >"$work/drain-2.out" 2>&1; then
  fail "kubectl drain ctl-2 evicted every replica: the budget did not hold"
elif grep -q "disruption budget" "$work/drain-2.out"; then
  pass "kubectl drain of the last node is refused by the budget: $(grep -m1 -o "Cannot evict pod as it would violate the pod's disruption budget" "$work/drain-2.out")"
else
  fail "kubectl drain ctl-2 failed, not for the budget: $(tail -n 3 "$work/drain-2.out")"
fi
ready=$(kc get deployment gpu-controller -n "$ns" -o jsonpath='{.status.readyReplicas}')
[ "$ready" = 1 ] && pass "one replica still ready on ctl-2" || fail "$ready replicas ready after the drains"
watch_end "the drains" 1
kc uncordon ctl-1 ctl-2 >/dev/null
wait_until 90 rolled && pass "uncordoned, both replicas ready again" ||
  fail "not both replicas ready after the uncordon: $(kc get pods -n "$ns" -o wide 2>&1)"

# Back to the previous release: this release's replicas stop, draining.
roll "helm rollback to $previous_version" "" helm rollback gpu 1 --kubeconfig "$admin_kubeconfig" -n "$ns"
replicas_run "$previous_build" && pass "... both replicas running the previous release's gpu-controller again" ||
  fail "the replicas do not run the previous release's gpu-controller after the rollback"

if [ "$failed" -gt 0 ]; then # the replicas' own logs, for a failure's reader
  for log in "$cluster_dir"/nodes/ctl-*/pod-logs/*/gpu-controller/*.log; do
    echo "--- ${log#"$cluster_dir"/nodes/} (last lines)"
    tail -n 10 "$log"
  done
fi
summary
