#!/usr/bin/env bash
# Upgrades with VMs running (docs/install.md, "Upgrading"; docs/reliability.md): on a cluster of
# its own that runs Deployments, the previous release (the git ref test/realcluster/previous-release
# names): its chart (charts/gpu there, taken with `git archive`) installed with GPUs on, its
# Deployment's two replicas running its gpu-controller in pods of the two real nodes (their runtime
# maps the chart's controller image to a real program: scripts/cluster.sh node --programs), the
# webhooks behind their Service, its gpu-agent on both nodes (built from that ref by
# scripts/build-ref.sh, once per machine), a tenant holding orders and a VM running. Then, while an
# order is sent every 0.25 s (server-side dry run, through the order webhook): `helm upgrade` to
# this tree's chart, whose Deployment rolls its replicas to this build's one at a time (held midway,
# while the two releases lead and serve side by side), and the agents replaced one node at a time.
# No order may be refused for want of a webhook (a review in flight may be cut once by each of the
# previous release's replicas, which stop without a drain), no agent may write its GPUNode when
# nothing changed, the objects stored under the old CRDs must be valid under the new ones, and
# every invariant of the checker must hold before, midway, after the upgrade and after `helm
# rollback`, whose rollout brings the previous release's replicas back (this build's drain: none
# cut) and its agents the same way.
#   test/realcluster/upgrade_test.sh SOURCE_DIR BUILD_DIR
export COZY_CLUSTER_WORKLOADS=1
source "$(dirname "$0")/own_cluster.sh" "$1" "$2"
source "$(dirname "$0")/replicas.sh"
source "$(dirname "$0")/deployment.sh"
command -v jq >/dev/null || abort "jq is not installed (scripts/install-deps.sh installs it)"
ns=cozy-system
replicas_ns=$ns # the Lease's, for holder
gpu=nvidia.com/GA100_A100_PCIE_40GB

# --- the previous release -----------------------------------------------------------------------
previous_release
old_chart="$work/previous/charts/gpu"
agent_program=$previous_build/agent/gpu-agent
controller_images "$work/programs"
# runs BUILD PID...: every PID runs a program of build directory BUILD (its executable, as the
# kernel names it: `gpu-agent run` is gpu-agent-full, which the light gpu-agent executes).
runs() {
  local build pid exe
  build=$(readlink -f "$1")
  shift
  for pid in "$@"; do
    exe=$(readlink -f "/proc/$pid/exe")
    [[ $exe == "$build"/* ]] || { echo "pid $pid runs $exe, not a program of $build" >&2 && return 1; }
  done
}

service_webhook_certs "$ns"
# The replicas as the chart runs them, with the test's short lease and resync (as chaos_test's),
# on the nodes labelled for them (midway below takes the label away, to hold the rollout there).
controller_lines='  nodeSelector: {cozy-test/controllers: "true"}
  extraArgs: [--lease-duration=6s, --renew-deadline=4s, --retry-period=1s, --resync=5s]'
controller_values "$work/gpu-on-previous.yaml" previous "  attachmentGrace: 10s" "$controller_lines"
controller_values "$work/gpu-on.yaml" this "  attachmentGrace: 10s" "$controller_lines"
helm install gpu "$old_chart" --kubeconfig "$admin_kubeconfig" -n "$ns" -f "$work/gpu-on-previous.yaml" \
  >"$work/helm-install.log" 2>&1 || abort "helm install: $(cat "$work/helm-install.log")"
wait_crds >/dev/null || abort "the CRDs are not Established"
kc apply --server-side -f "$source_dir/test/fakes/crds" >/dev/null || abort "KubeVirt's and Cozystack's CRDs"
pass "the chart of the previous release ($previous_version, $previous_ref) installed"
kubevirt_controller
AGENT_NS=$ns
real_node gpu-1 a100-vfio --programs "$work/programs" --label cozy-test/controllers=true
real_node gpu-2 a100-vfio --programs "$work/programs" --label cozy-test/controllers=true
wait_until 150 rolled || abort "the previous release's Deployment is not available: $(kc get pods -n "$ns" -o wide 2>&1)"
replicas_read() { # both replicas list VirtualMachineInstances (their metrics, at their pod addresses)
  local ip
  for ip in $(replicas_json | jq -r '.items[] | select(.metadata.deletionTimestamp == null) | .status.podIP'); do
    vmis_read "$ip:8080" || return 1
  done
}
wait_until 45 replicas_read || abort "the replicas do not read VirtualMachineInstances"
replicas_run "$previous_build" && runs "$previous_build" "${agent_pids[@]}" &&
  pass "the previous release's programs run: both replicas (the Deployment's pods) and both agents" ||
  abort "the replicas and agents do not run the previous release's programs ($previous_build)"

# --- a tenant holding orders, a VM running -------------------------------------------------------
create_namespace tenant
kc label namespace tenant gpu.cozystack.io/tenant-namespace=true >/dev/null
{
  gpu_class a100 "$gpu"
  for o in run idle-1 idle-2; do order tenant "$o" a100; done
} | kc apply -f - >/dev/null || abort "the class and the orders"
bound() { [ "$(kc get gpudevices -n tenant -o json | jq '[.items[] | select(.status.phase == "Bound")] | length')" = 3 ]; }
wait_until 30 bound || abort "the orders were not bound: $(kc get gpudevices -n tenant -o wide)"
vmi tenant vm run | kc create -f - >/dev/null || abort "the VMI was refused"
uid=$(kc get vmi vm -n tenant -o jsonpath='{.metadata.uid}')
node=$(kc get gpudevice run -n tenant -o jsonpath='{.status.nodeName}')
# The launcher, listed in the VMI's status.activePods before it can be scheduled, as
# virt-controller lists a launcher it creates: the previous release counts the GPU of a launcher
# its VMI does not list as another pod's, and on a node its orders fill (gpu-1 holds run and
# idle-1) moved the VM's own order away for it (this tree's model never lets a pod move a held
# set: docs/controller.md, "Placement", step 2). A scheduling gate holds the pod until the VMI
# lists it.
pod_uid=$(cat <<EOF | KC_AS="$work/kubevirt.kubeconfig" kc create -f - -o jsonpath='{.metadata.uid}'
apiVersion: v1
kind: Pod
metadata:
  name: virt-launcher-vm
  namespace: tenant
  labels: {kubevirt.io: virt-launcher, vm.kubevirt.io/name: vm, gpu.cozystack.io/device-references: "true"}
  ownerReferences:
  - {apiVersion: kubevirt.io/v1, kind: VirtualMachineInstance, name: vm, uid: "$uid", controller: true, blockOwnerDeletion: true}
spec:
  terminationGracePeriodSeconds: 1
  schedulingGates: [{name: gpu.cozystack.io/test-active-pods}]
  containers:
  - {name: compute, image: example.invalid/virt-launcher:1, resources: {limits: {$gpu: "1"}}}
EOF
) || abort "the launcher pod was refused"
kc patch vmi vm -n tenant --type=merge -p "{\"status\":{\"phase\":\"Scheduling\",\"activePods\":{\"$pod_uid\":\"\"}}}" >/dev/null &&
  KC_AS="$work/kubevirt.kubeconfig" kc patch pod virt-launcher-vm -n tenant --type=json \
    -p '[{"op": "remove", "path": "/spec/schedulingGates"}]' >/dev/null ||
  abort "the VMI's activePods, the launcher's gate"
until_is 30 Running kc get pod virt-launcher-vm -n tenant -o jsonpath='{.status.phase}' ||
  abort "the launcher does not run: $(kc get pod virt-launcher-vm -n tenant -o jsonpath='{.status}')"
kc patch vmi vm -n tenant --type=merge \
  -p "{\"status\":{\"phase\":\"Running\",\"nodeName\":\"$node\",\"activePods\":{\"$pod_uid\":\"$node\"}}}" >/dev/null ||
  abort "the VMI's status"
pass "tenant holds 3 orders; VM vm runs on $node with its GPU"
check "before the upgrade" --settled && pass "every invariant holds before the upgrade"

# --- the upgrade, under a stream of orders -------------------------------------------------------
printf '%s\n' "apiVersion: gpu.cozystack.io/v1alpha1" "kind: GPUDevice" \
  "metadata: {name: stream, namespace: tenant}" "spec: {className: a100, count: 1}" >"$work/stream.yaml"
# stream_start NAME: an order every 0.25 s (dry run), each answer a line of $stream_log
# (stream-NAME.log): ok, or the refusal. stream_end WHAT: the stream stopped; none may have been
# refused.
stream_start() {
  stream_log=$work/stream-$1.log
  rm -f "$work/stream.stop"
  (
    while [ ! -e "$work/stream.stop" ]; do
      [ ! -e "$work/stream.pause" ] || { sleep 0.1 && continue; }
      if kc create --dry-run=server -f "$work/stream.yaml" >"$work/stream.out" 2>&1; then echo ok
      else echo "refused: $(tr '\n' ' ' <"$work/stream.out")"; fi
      sleep 0.25
    done >"$stream_log"
  ) &
  stream_pid=$!
  pids+=($stream_pid)
}
# with_stream_paused COMMAND...: COMMAND while the stream sends nothing (its order in flight
# answered first).
with_stream_paused() {
  touch "$work/stream.pause"
  sleep 0.5
  "$@"
  rm -f "$work/stream.pause"
}
# stream_end WHAT [CUT]: the stream stopped; none may have been refused, but for at most CUT
# reviews cut by a replica that stops without a drain ($cut_by_undrained_stop).
stream_end() {
  local sent refusals cut
  touch "$work/stream.stop"
  wait "$stream_pid" 2>/dev/null
  sent=$(wc -l <"$stream_log")
  refusals=$(grep -c '^refused' "$stream_log")
  cut=$(grep -Ec "^refused: .*$cut_by_undrained_stop" "$stream_log")
  [ "$sent" -gt 20 ] && [ "$((refusals - cut))" = 0 ] && [ "$cut" -le "${2:-0}" ] &&
    pass "$sent orders sent through $1, none refused${2:+ ($cut cut by an undrained stop, at most $2)}" ||
    fail "$refusals of $sent orders refused through $1 ($cut cut by a stop, at most ${2:-0}): $(grep '^refused' "$stream_log" | sort | uniq -c | head -n 3)"
}
stream_start upgrade
# agent_writes: the agents' writes of their GPUNodes so far, from the API server's audit log.
agent_writes() {
  jq -c 'select(.user.username == "system:serviceaccount:'"$ns"':gpu-agent" and .objectRef.resource == "gpunodes"
    and (.verb == "patch" or .verb == "update" or .verb == "create")) | .auditID' \
    "$cluster_dir/logs/audit.log" 2>/dev/null | sort -u | wc -l
}
sleep 2
old_replicas=$(live_replicas)
helm upgrade gpu "$source_dir/charts/gpu" --kubeconfig "$admin_kubeconfig" -n "$ns" -f "$work/gpu-on.yaml" \
  >"$work/helm-upgrade.log" 2>&1 && pass "helm upgrade to this tree's chart" ||
  fail "helm upgrade: $(cat "$work/helm-upgrade.log")"
wait_crds >/dev/null || fail "the CRDs are not Established after the upgrade"
# roll_deployment OLD BUILD WHOSE WHEN [MIDWAY...]: the Deployment's rollout that a helm upgrade or
# rollback began, from the replicas OLD (their names) to BUILD's gpu-controller (WHOSE names it),
# held midway while the two releases serve side by side: once a replica of the new ReplicaSet is
# bound to a node, the nodes lose the label the replicas select, so the rollout (maxSurge 1,
# maxUnavailable 0) stops with one replica of each release, both ready, the next new one Pending.
# There MIDWAY, a command, runs, and then the checker, settled; the label back, the rollout ends.
roll_deployment() {
  local old=$1 build=$2 whose=$3 when=$4
  shift 4
  new_bound() {
    replicas_json | jq -e --arg old "$old" '[.items[] | select(.metadata.deletionTimestamp == null and
      .spec.nodeName != null) | .metadata.name as $n | select(($old | split(" ") | index($n)) == null)]
      | length >= 1' >/dev/null
  }
  side_by_side() {
    replicas_json | jq -e --arg old "$old" '[.items[] | select(.metadata.deletionTimestamp == null) |
      {old: (.metadata.name as $n | ($old | split(" ") | index($n)) != null),
       ready: ([.status.conditions[]? | select(.type == "Ready" and .status == "True")] | length == 1)}]
      | ([.[] | select(.old)] | length) == 1 and ([.[] | select((.old | not) and .ready)] | length) == 1' >/dev/null
  }
  wait_until 60 new_bound || fail "no replica of the new ReplicaSet $when: $(kc get pods -n "$ns" -o wide 2>&1)"
  kc label node gpu-1 gpu-2 cozy-test/controllers- >/dev/null
  if wait_until 90 side_by_side; then
    [ $# -eq 0 ] || "$@"
    check "midway, $whose replica beside the other release's" --settled &&
      pass "every invariant holds midway, $whose replica beside the other release's (holder: $(holder))"
  else
    fail "the rollout $when did not stop with one replica of each release ready: $(kc get pods -n "$ns" -o wide 2>&1)"
  fi
  kc label node gpu-1 gpu-2 cozy-test/controllers=true --overwrite >/dev/null
  wait_until 150 rolled || fail "the rollout $when did not finish: $(kc get pods -n "$ns" -o wide 2>&1)"
  replicas_run "$build" && pass "both replicas run $whose gpu-controller $when (the Deployment's pods)" ||
    fail "the replicas do not run $whose gpu-controller ($build) $when"
}
# roll_agents BUILD: the agents replaced by BUILD's gpu-agent one node at a time, as the DaemonSet
# rolls.
roll_agents() {
  local n
  agent_program=$1/agent/gpu-agent
  for n in gpu-1 gpu-2; do
    kill -TERM "${agent_pids[$n]}" && wait "${agent_pids[$n]}" 2>/dev/null
    start_agent "$n"
    sleep 5 # its first reads and what it would write
  done
  runs "$1" "${agent_pids[@]}" || fail "the agents do not run the gpu-agent of $1"
}
# midway_order: an order placed while the two releases serve side by side, whichever leads, then
# deleted (its finalizer released). It takes the stream's room while it lives: the stream waits
# (roll_deployment runs it with_stream_paused).
midway_order() {
  order tenant midway a100 | kc apply -f - >/dev/null || fail "the order midway was refused"
  placed() { [ "$(kc get gpudevice midway -n tenant -o jsonpath='{.status.phase}')" = Bound ]; }
  wait_until 30 placed && pass "an order midway through the rollout is Bound" ||
    fail "the order midway: $(kc get gpudevice midway -n tenant -o jsonpath='{.status}')"
  kc delete gpudevice midway -n tenant --wait=false >/dev/null
  gone() { ! kc get gpudevice midway -n tenant >/dev/null 2>&1; }
  wait_until 30 gone && pass "and once deleted it is gone (its finalizer released midway)" ||
    fail "the order midway was not released: $(kc get gpudevice midway -n tenant -o jsonpath='{.metadata}')"
  released() { kc create --dry-run=server -f "$work/stream.yaml" >/dev/null 2>&1; } # the webhooks see it free
  wait_until 30 released || fail "the midway order's unit was not free again in 30 s"
}
roll_deployment "$old_replicas" "$build_dir" "this build's" "after the upgrade" with_stream_paused midway_order
writes_before=$(agent_writes)
# The count reads what it should: the agents' first publications are there.
[ "$writes_before" -ge 2 ] || fail "the audit log shows $writes_before writes of the agents, not their first publications"
roll_agents "$build_dir"
sleep 2
stream_end "the upgrade and the rollout" 2
writes=$(($(agent_writes) - writes_before))
[ "$writes" -le 0 ] && pass "the agents restarted node by node wrote nothing: nothing had changed" ||
  fail "the agents wrote their GPUNodes $writes times across their restarts, nothing having changed"

check "after the upgrade" --settled && pass "every invariant holds after the upgrade (the VM's GPU unmoved)"
# CRDs change only compatibly: every object stored under the old ones is valid under the new.
compatible() { # compatible WHEN: each stored object of our kinds replaced, server-side dry run
  local kind bad=0
  for kind in gpuclasses gpudevices gpunodes; do
    kc get "$kind" -A -o json | jq -c '.items[]' | while read -r object; do
      kc replace --dry-run=server -f - <<<"$object" >/dev/null 2>"$work/replace.err" ||
        echo "$kind: $(cat "$work/replace.err")"
    done
  done >"$work/incompatible"
  [ ! -s "$work/incompatible" ] && pass "every object stored is valid under the CRDs $1" ||
    fail "objects refused under the CRDs $1: $(head -n 3 "$work/incompatible")"
}
compatible "of this tree"

# --- and back, under the stream again -------------------------------------------------------------
stream_start rollback
old_replicas=$(live_replicas)
helm rollback gpu 1 --kubeconfig "$admin_kubeconfig" -n "$ns" >"$work/helm-rollback.log" 2>&1 &&
  pass "helm rollback to $previous_version" || fail "helm rollback: $(cat "$work/helm-rollback.log")"
roll_deployment "$old_replicas" "$previous_build" "the previous release's" "after the rollback"
stream_end "the rollback and its rollout"
writes_before=$(agent_writes)
roll_agents "$previous_build"
writes=$(($(agent_writes) - writes_before))
[ "$writes" -le 0 ] && pass "the previous release's agents, rolled back node by node, wrote nothing" ||
  fail "the agents wrote their GPUNodes $writes times across the rollback, nothing having changed"
compatible "of the previous release, after the rollback"
check "after the rollback" --settled && pass "every invariant holds after the rollback"
[ "$(kc get gpudevice run -n tenant -o jsonpath='{.status.phase}/{.status.nodeName}/{.status.attachment.vmiName}')" = "Bound/$node/vm" ] &&
  pass "the running VM's order is Bound on $node and attached to it throughout" ||
  fail "the running VM's order: $(kc get gpudevice run -n tenant -o jsonpath='{.status}')"
summary
