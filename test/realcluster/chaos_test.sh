#!/usr/bin/env bash
# Nothing lost under faults (docs/reliability.md): on a cluster of its own, the chart with GPUs on
# and two gpu-controller replicas behind a balancer of the test's own (as a Service stands in
# front of them), three real nodes of `scripts/cluster.sh node` with their agents on their own
# kubelets, KubeVirt's part played by the test (the launcher pod as virt-controller creates it,
# the VMI's status as virt-handler writes it). A workload of three tenants (orders of two
# classes, VM starts and stops, deletions) and a hoster (cordons, class edits) runs in rounds;
# in each round one fault is injected at a random moment:
#   kill-leader     kill -9 of the Lease holder in the middle of a pass, back after 1-12 s
#                   (past the 6 s lease or not): the driver holds the Lease while 20 orders of
#                   class a100-burst (node burst-1) are created, releases it, and kills the
#                   replica that takes it at the audit log's first write of its first pass
#   kill-webhook    kill -9 of the replica serving a VM start, right after the start's first write
#                   (its attachment; the audit log's User-Agent names the replica that made it)
#   apiserver       kube-apiserver restarted
#   etcd            etcd restarted
#   compaction      etcd compacted to its head, then kube-apiserver restarted: every watch
#                   resumes from a compacted resourceVersion and must list again (410 Gone)
#   kubelet         a node's kubelet stopped for 2-35 s (NotReady after 8 s; the controller's
#                   NotReady grace is 20 s, so a long stop moves the sets of VMs that are off)
#   agent           a node's agent killed (kill -9) and started again 1-5 s later
#   replicas-down   both replicas killed for longer than the attachment grace (10 s), then back
# After every round the checker (invariants.mjs, written from the API objects alone, not from the
# controller's model) runs on a snapshot of the cluster: strictly for the safety invariants (no
# unit held twice, budgets, Bound stays Bound, a running VM's GPUs and launcher never move), then
# until settled for the rest (class fit, usage records, nothing left over, every Pending order
# says why). Each fault's recovery is timed: from its injection to an order created after it
# answered and every order there before it answered again.
#   test/realcluster/chaos_test.sh SOURCE_DIR BUILD_DIR
# COZY_CHAOS_SEED (default: drawn, printed) and COZY_CHAOS_ROUNDS (default 8: each fault once, in
# an order the seed draws) replay a run; COZY_CHAOS_REPORT=FILE writes the figures there too;
# COZY_CHAOS_FAULTS="KIND..." draws from those kinds alone; a round slower than COZY_CHAOS_SLOW
# seconds keeps its logs in COZY_CHAOS_KEEP (below).
export COZY_CLUSTER_NODE_GRACE=8s
source "$(dirname "$0")/own_cluster.sh" "$1" "$2"
source "$(dirname "$0")/replicas.sh"
cluster="$source_dir/scripts/cluster.sh"
command -v jq >/dev/null || abort "jq is not installed (scripts/install-deps.sh installs it)"
rounds=${COZY_CHAOS_ROUNDS:-8}
seed=${COZY_CHAOS_SEED:-$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')}
echo "chaos: seed $seed, $rounds rounds (replay: COZY_CHAOS_SEED=$seed COZY_CHAOS_ROUNDS=$rounds)"
ns=cozy-system
gpu=nvidia.com/GA100_A100_PCIE_40GB
attachment_grace=10
check_grace=$attachment_grace
not_ready_grace=20
check_not_ready_grace=$not_ready_grace
tenants=(tenant-a tenant-a-child tenant-b)
nodes=(gpu-1 gpu-2 gpu-3)
read -ra faults <<<"${COZY_CHAOS_FAULTS:-kill-leader kill-webhook apiserver etcd compaction kubelet agent replicas-down}"

# --- the cluster -------------------------------------------------------------------------------
webhook_certs || abort "openssl could not make the webhook certificate"
replicas_ports
gpus_on_values "$work/gpu-on.yaml" "$balancer_port"
install_gpus_on "$source_dir/charts/gpu" "$ns"
replicas_up "$ns" --lease-duration 6s --renew-deadline 4s --retry-period 1s \
  --attachment-grace "${attachment_grace}s" --not-ready-grace "${not_ready_grace}s" --resync 5s

kubevirt_controller

AGENT_NS=$ns
for n in "${nodes[@]}"; do real_node "$n" a100-vfio --label pool=tenants; done # six units
# The probes' own node and class, so that a probe finds room whatever the tenants hold and its
# answer needs the binder (no fault is injected on it).
real_node probe-1 a100-vfio --label pool=probe
# kill-leader's node: the orders of its pass (class a100-burst) are admitted while it has room.
real_node burst-1 a100-vfio --label pool=burst

# Tenants: tenant-a with a budget of 3 GPUs for itself and tenant-a-child together; tenant-b
# without one; probe, where the recovery probes are ordered.
for t in "${tenants[@]}" probe; do
  create_namespace "$t"
  kc label namespace "$t" gpu.cozystack.io/tenant-namespace=true >/dev/null
done
kc label namespace tenant-a-child tenant.cozystack.io/tenant-a=true >/dev/null
kc create quota gpus -n tenant-a --hard=requests.gpu.cozystack.io/total=3 >/dev/null ||
  abort "tenant-a's budget"
tenants_pool="nodeSelector: {matchLabels: {pool: tenants}}"
{
  gpu_class a100 "$gpu" "maxCount: 2" "$tenants_pool"
  gpu_class a100-stay "$gpu" "maxCount: 2" "onCordon: Stay" "$tenants_pool"
  gpu_class probe "$gpu" "nodeSelector: {matchLabels: {pool: probe}}"
  gpu_class a100-burst "$gpu" "nodeSelector: {matchLabels: {pool: burst}}" # kill-leader's
} | kc apply -f - >/dev/null || abort "the classes"
pass "the cluster: 3 real nodes of 2 GPUs for the tenants, 1 for the probes and 1 for kill-leader's passes, 2 replicas (webhooks on $webhook0 and $webhook1) behind the balancer on $balancer_port, 3 tenants, 4 classes"

# --- the draws: from the seed, drawn in this shell only ----------------------------------------
# Each round draws from a sequence of its own (the seed and the round's number): an action's draws
# depend on what the cluster holds then, so a replay whose earlier round went otherwise still
# draws the same fault, moment and number of actions in every round.
RANDOM=$seed
draw() { r=$((RANDOM % $1)); } # draw N: r in [0, N)
pick() { # pick ARRAY-NAME: r = one of its elements
  local -n from=$1
  draw ${#from[@]}
  r=${from[$r]}
}
now() { date +%s.%N; }
kill9() { # kill9 PID...: kill -9, reaped here so the shell does not report it
  kill -9 "$@" 2>/dev/null
  local pid
  for pid; do wait "$pid" 2>/dev/null; done
}
since() { awk -v a="$(now)" -v b="$1" 'BEGIN { printf "%.1f", a - b }'; } # since T0: seconds

# answered FILE [UIDS-FILE [NAME]]: every order of the list (only those UIDS-FILE names, and the
# order NAME of namespace probe, when given) answered: Bound or Lost, or Pending with the reason in
# its condition Bound, and no bind request waiting.
answered() {
  jq -e --slurpfile only "${2:-/dev/null}" --arg probe "${3:-}" '
    ($only | if length > 0 then .[0] else null end) as $uids
    | [.items[] | select(.metadata.deletionTimestamp == null)
       | select($uids == null or (.metadata.uid | IN($uids[]))
                or (.metadata.namespace == "probe" and .metadata.name == $probe))
       | (.status // {}) as $s
       | (($s.phase == "Bound" or $s.phase == "Lost"
           or ([$s.conditions[]? | select(.type == "Bound" and .status == "False")] | length > 0))
          and ($s.bindRequest == null or $s.bindRequest.id == ($s.bindResponse.id // "")))]
    | all' "$1" >/dev/null
}

# --- the workload ------------------------------------------------------------------------------
declare -Ai refusals actions_done
starting=""
orders=0
vms=0
refused() { # refused ACTION OUTPUT-FILE: counted by the API server's reason, names and numbers out
  local why
  why=$(head -c 600 "$2" | tr '\n' ' ' | sed -E '
    s/.*failed calling webhook "([^"]*)".*/webhook \1 not reachable/
    s/.*admission webhook "([^"]*)" denied the request: /\1: /
    s/[a-z0-9-]+\/[a-z0-9.-]+/NS\/NAME/g; s/\b[0-9]+(\.[0-9]+)?\b/N/g' | cut -c1-120)
  echo "$1: $(tr '\n' ' ' <"$2")" >>"$work/refusals.log"
  refusals["$1: $why"]+=1
}
devices_json() { kc get gpudevices -A -o json; }

new_order() {
  local t class count=1
  pick tenants; t=$r
  draw 2; class=$([ "$r" = 0 ] && echo a100 || echo a100-stay)
  draw 4; [ "$r" = 0 ] && count=2
  local name="o$((++orders))"
  if printf '%s\n' "apiVersion: gpu.cozystack.io/v1alpha1" "kind: GPUDevice" \
    "metadata: {name: $name, namespace: $t}" "spec: {className: $class, count: $count}" |
    kc create -f - >"$work/out" 2>&1; then
    actions_done[order]+=1
  else
    refused order "$work/out"
  fi
}
# delete_order: an order drawn from all, attached or not (an attached one stays until its VM
# ends, D13).
delete_order() {
  local list
  mapfile -t list < <(devices_json | jq -r '.items[] | select(.metadata.namespace != "probe")
    | select(.metadata.deletionTimestamp == null) | "\(.metadata.namespace) \(.metadata.name)"')
  [ ${#list[@]} -gt 0 ] || return 0
  pick list
  read -r t name <<<"$r"
  kc delete gpudevice "$name" -n "$t" --wait=false >/dev/null 2>&1 && actions_done[delete]+=1
}
# start_vm: a VMI naming a Bound order no VM holds, admitted by the VMI webhook, and its
# launcher pod as virt-controller creates it. With BACKGROUND set, the VMI's create runs in the
# background and its name is left in $starting.
start_vm() {
  local list t device vm uid
  mapfile -t list < <(devices_json | jq -r '.items[] | select(.metadata.namespace != "probe")
    | select(.spec.className != "a100-burst")
    | select(.metadata.deletionTimestamp == null and .status.phase == "Bound"
             and .status.attachment == null) | "\(.metadata.namespace) \(.metadata.name)"')
  [ ${#list[@]} -gt 0 ] || return 1
  pick list
  read -r t device <<<"$r"
  vm="vm$((++vms))"
  vmi "$t" "$vm" "$device" >"$work/$vm.yaml"
  if [ -n "${BACKGROUND:-}" ]; then
    starting="$t $vm $device"
    kc create -f "$work/$vm.yaml" >"$work/$vm.out" 2>&1 &
    start_create_pid=$!
    return 0
  fi
  kc create -f "$work/$vm.yaml" >"$work/$vm.out" 2>&1 || { refused start "$work/$vm.out"; return 0; }
  create_launcher "$t" "$vm"
}
# create_launcher NS VM: the launcher pod of the created VMI, one GPU limit per gpus entry the
# webhook gave it.
create_launcher() {
  local t=$1 vm=$2 vmi gpus uid
  vmi=$(kc get vmi "$vm" -n "$t" -o json) || return 0
  gpus=$(jq --arg r "$gpu" '[.spec.domain.devices.gpus[]? | select(.deviceName == $r)] | length' <<<"$vmi")
  uid=$(jq -r .metadata.uid <<<"$vmi")
  actions_done[start]+=1
  cat <<EOF | KC_AS="$work/kubevirt.kubeconfig" kc create -f - -o jsonpath='{.metadata.uid}' >"$work/out" 2>&1 || { refused launcher "$work/out"; return 0; }
apiVersion: v1
kind: Pod
metadata:
  name: virt-launcher-$vm
  namespace: $t
  labels: {kubevirt.io: virt-launcher, vm.kubevirt.io/name: $vm, gpu.cozystack.io/device-references: "true"}
  ownerReferences:
  - {apiVersion: kubevirt.io/v1, kind: VirtualMachineInstance, name: $vm, uid: "$uid", controller: true, blockOwnerDeletion: true}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: compute
    image: example.invalid/virt-launcher:1
    resources: {limits: {$gpu: "$gpus"}}
EOF
  # virt-controller lists every pod it controls in the VMI's activePods on its next sync, before
  # the pod is scheduled (node ""; KubeVirt's setActivePods).
  kc patch vmi "$vm" -n "$t" --type=merge -p "{\"status\":{\"activePods\":{\"$(cat "$work/out")\":\"\"}}}" >/dev/null 2>&1
}
# virt_handler: what KubeVirt's node agent does once a launcher runs: the VMI Running on the
# launcher's node, the pod in its activePods. A launcher that runs on another node than its
# VMI's GPUs (they moved while it was scheduled) ends the VM, as its start would fail there.
virt_handler() {
  local line t vm pod node uid devices_node
  kc get pods -A -l kubevirt.io=virt-launcher -o json >"$work/launchers.json" 2>/dev/null || return 0
  kc get vmis -A -o json >"$work/vmis.json" 2>/dev/null || return 0
  devices_json >"$work/devices.json" 2>/dev/null || return 0
  while read -r t vm pod node uid; do
    devices_node=$(jq -r --arg t "$t" --arg vm "$vm" '[.items[] | select(.metadata.namespace == $t
      and .status.attachment.vmiName == $vm) | .status.nodeName // "-"] | unique | join(",")' "$work/devices.json")
    if [ "$devices_node" = "$node" ]; then
      kc patch vmi "$vm" -n "$t" --type=merge -p "{\"status\":{\"phase\":\"Running\",\"nodeName\":\"$node\",\"activePods\":{\"$uid\":\"$node\"}}}" \
        >/dev/null 2>&1 && actions_done[running]+=1
    else
      kc delete vmi "$vm" -n "$t" --wait=false >/dev/null 2>&1
      actions_done[start-raced-a-move]+=1
    fi
  done < <(jq -r --slurpfile vmis "$work/vmis.json" '.items[] | select(.status.phase == "Running")
      | . as $p | ($p.metadata.ownerReferences[0].name) as $vm
      | ($vmis[0].items[] | select(.metadata.namespace == $p.metadata.namespace and .metadata.name == $vm
          and (.status.phase // "") != "Running")) as $vmi
      | "\($p.metadata.namespace) \($vm) \($p.metadata.name) \($p.spec.nodeName) \($p.metadata.uid)"' \
    "$work/launchers.json")
}
stop_vm() {
  local list
  mapfile -t list < <(kc get vmis -A -o json | jq -r '.items[] | select(.metadata.deletionTimestamp == null)
    | "\(.metadata.namespace) \(.metadata.name)"')
  [ ${#list[@]} -gt 0 ] || return 0
  pick list
  read -r t vm <<<"$r"
  kc delete vmi "$vm" -n "$t" --wait=false >/dev/null 2>&1 && actions_done[stop]+=1
  kc delete pod "virt-launcher-$vm" -n "$t" --wait=false >/dev/null 2>&1 || true
}
# hoster: a node cordoned (at most one at a time) or uncordoned, or class a100's maxCount edited.
hoster() {
  local cordoned
  cordoned=$(kc get nodes -o jsonpath='{range .items[?(@.spec.unschedulable==true)]}{.metadata.name}{"\n"}{end}')
  draw 3
  if [ "$r" = 0 ]; then
    draw 2
    kc patch gpuclass a100 --type=merge -p "{\"spec\":{\"maxCount\":$((r + 2))}}" >/dev/null 2>&1 &&
      actions_done[class-edit]+=1
  elif [ -n "$cordoned" ]; then
    kc uncordon "$cordoned" >/dev/null 2>&1 && actions_done[uncordon]+=1
  else
    pick nodes
    kc cordon "$r" >/dev/null 2>&1 && actions_done[cordon]+=1
  fi
}
action() {
  draw 10
  case $r in
    0 | 1 | 2) new_order ;;
    3) delete_order ;;
    4 | 5 | 6) start_vm || new_order ;;
    7 | 8) stop_vm ;;
    9) hoster ;;
  esac
  virt_handler
}

# --- the faults --------------------------------------------------------------------------------
declare -Ai fault_count
restore_at=0
restore=""
audit_log="$cluster_dir/logs/audit.log"
# kill_at_write PATH-PART AGENT: in the background, the replica whose request on a path holding
# PATH-PART the audit log shows first with User-Agent "AGENT (replica-I)" (the replicas' User-Agent
# carries their identity) killed -9 there and then, its index I written to $work/killed. The API
# server writes each request's audit line before its response (--audit-log-mode=blocking), so the
# kill lands right after that write, before the replica has acted on its answer.
kill_at_write() {
  rm -f "$work/killed"
  (tail -n 0 -F "$audit_log" 2>/dev/null | grep --line-buffered -F "$1" |
    grep --line-buffered -F "\"userAgent\":\"$2 (replica-" | {
      IFS= read -r line || exit 0
      i=$(sed -nE 's/.*"userAgent":"[^"]* \(replica-([01])\)".*/\1/p' <<<"$line")
      [ -n "$i" ] && kill -9 "${replica_pids[$i]}" && echo "$i" >"$work/killed"
    }) &
  watcher=$!
  sleep 0.3 # tail is reading
}
# watcher_done: the watcher gone, fired or not.
watcher_done() {
  pkill -P "$watcher" 2>/dev/null
  kill "$watcher" 2>/dev/null
  wait "$watcher" 2>/dev/null
}
burst=20
declare -Ai webhook_kills leader_kills
# lease_held_by WHO SECONDS: the replicas' Lease taken (WHO empty: released), as another candidate
# would hold it.
lease_held_by() {
  local t
  t=$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)
  kc patch lease gpu-controller -n "$ns" --type=merge -p "{\"spec\":{\"holderIdentity\":\"$1\",
    \"leaseDurationSeconds\":$2,\"acquireTime\":\"$t\",\"renewTime\":\"$t\"}}" >/dev/null
}
stepped_down() { [ "$(grep -c 'stopped leading' "$work/replica-$1.log")" -gt "$2" ]; }
# binder_writes ID ROUND: replica-ID's binder's writes of the round's burst orders (audit log).
binder_writes() {
  grep -F "/namespaces/tenant-b/gpudevices/burst-$2-" "$audit_log" | grep -F '"verb":"patch"' |
    grep -F "\"userAgent\":\"gpu-controller (replica-$1)\"" | grep -F '"stage":"ResponseComplete"' |
    grep -c '"code":200'
}
# kill_mid_pass ID: a leader killed -9 in the middle of a pass that has $burst orders to answer. The
# driver takes the Lease, so that the holder (replica-ID) steps down and no replica places
# anything; the burst is ordered meanwhile (class a100-burst, node burst-1: the webhook admits
# each, as free units do not count orders not yet placed); the Lease is released, and the replica
# that takes it is killed at its first write of a burst order, which its first pass makes. Its
# index is left in $killed_id, how the kill landed in $mid_pass.
kill_mid_pass() {
  local id=$1 i stops
  mid_pass="not mid-pass: no pass answered the burst"
  stops=$(grep -c 'stopped leading' "$work/replica-$id.log")
  lease_held_by chaos-driver 60 || echo "  the driver could not take the Lease"
  wait_until 15 stepped_down "$id" "$stops" || echo "  replica-$id did not step down in 15 s"
  for ((i = 1; i <= burst; i++)); do
    printf '%s\n' "---" "apiVersion: gpu.cozystack.io/v1alpha1" "kind: GPUDevice" \
      "metadata: {name: burst-$round-$i, namespace: tenant-b}" "spec: {className: a100-burst, count: 1}"
  done | kc create -f - >/dev/null 2>"$work/burst.err" || echo "  the burst: $(head -c 300 "$work/burst.err")"
  kill_at_write "/namespaces/tenant-b/gpudevices/burst-$round-" gpu-controller
  lease_held_by "" 1
  wait_until 15 test -s "$work/killed" || true
  t0=$(now) # the fault's time: the kill (wait_until looks every 0.25 s)
  watcher_done
  killed_id=$id
  [ ! -s "$work/killed" ] || killed_id=$(cat "$work/killed")
  kill9 "${replica_pids[$killed_id]}" # reaped here; killed now if no pass came
  sleep 1 # the audit log holds every answer the replica had
  local wrote
  wrote=$(binder_writes "$killed_id" "$round")
  if [ -s "$work/killed" ] && [ "$wrote" -lt "$burst" ]; then
    mid_pass="mid-pass: it had written $wrote of the $burst orders of its pass"
    leader_kills[mid-pass]+=1
  else
    [ ! -s "$work/killed" ] || mid_pass="not mid-pass: it had written all $wrote orders of its pass"
    leader_kills[other]+=1
  fi
}
# burst_done: the round's burst orders deleted.
burst_done() {
  local names
  mapfile -t names < <(kc get gpudevices -n tenant-b -o name | grep "/burst-")
  [ ${#names[@]} = 0 ] || kc delete -n tenant-b --wait=false "${names[@]}" >/dev/null 2>&1
}
# inject KIND: the fault, now; what undoes it later is left in $restore, due at $restore_at.
inject() {
  case $1 in
    kill-leader)
      local id
      id=$(holder)
      id=${id#replica-}
      [[ "$id" =~ ^[01]$ ]] || id=0 # no holder now: either
      kill_mid_pass "$id"
      id=$killed_id
      ! replica_ready "$id" || fail "replica-$id still answers after kill -9"
      echo "  killed replica-$id, the Lease holder (pid ${replica_pids[$id]}), $mid_pass"
      draw 12
      restore="start_replica $id"
      restore_at=$((SECONDS + r + 1))
      ;;
    kill-webhook)
      kill_at_write "/gpudevices/" gpu-controller-webhook # a VM start's attachment: its first write
      BACKGROUND=1 start_vm || new_order
      [ -z "$starting" ] || wait_until 10 test -s "$work/killed" || true
      watcher_done
      draw 2 # the replica when no start was under way (drawn always, so a replay draws the same)
      [ ! -s "$work/killed" ] || r=$(cat "$work/killed")
      kill9 "${replica_pids[$r]}"
      restore="start_replica $r"
      restore_at=$((SECONDS + 2))
      if [ -n "$starting" ]; then
        read -r t vm device <<<"$starting"
        local served=0
        wait "$start_create_pid" && served=1
        if [ -s "$work/killed" ]; then
          echo "  killed replica-$r right after it attached $t/$device for $vm"
          # Killed before its answer, the start is refused for want of the webhook; after, it stands.
          [ "$served" = 1 ] && webhook_kills[after-answer]+=1 || webhook_kills[before-answer]+=1
        elif [ "$served" = 1 ]; then
          fail "the start of $t/$vm was allowed, yet the audit log names no replica's attachment write"
        fi
        if [ "$served" = 1 ]; then create_launcher "$t" "$vm"; else refused start "$work/$vm.out"; fi
        starting=""
      fi
      ;;
    apiserver) "$cluster" restart "$cluster_dir" kube-apiserver >>"$work/faults.log" 2>&1 ;;
    etcd) "$cluster" restart "$cluster_dir" etcd >>"$work/faults.log" 2>&1 ;;
    compaction)
      "$cluster" compact "$cluster_dir" >>"$work/faults.log" 2>&1
      "$cluster" restart "$cluster_dir" kube-apiserver >>"$work/faults.log" 2>&1
      ;;
    kubelet)
      pick nodes
      "$cluster" kubelet "$cluster_dir" "$r" stop >>"$work/faults.log" 2>&1
      restore="$cluster kubelet $cluster_dir $r start"
      draw 34
      restore_at=$((SECONDS + r + 2))
      ;;
    agent)
      pick nodes
      kill9 "${agent_pids[$r]}"
      restore="start_agent $r"
      draw 5
      restore_at=$((SECONDS + r + 1))
      ;;
    replicas-down)
      kill9 "${replica_pids[0]}" "${replica_pids[1]}"
      ! replica_ready 0 && ! replica_ready 1 || fail "a replica still answers after kill -9 of both"
      restore="start_replica 0; start_replica 1"
      restore_at=$((SECONDS + attachment_grace + 3))
      ;;
  esac
  fault_count[$1]+=1
}
restore_due() { # restore_due [now]: undo the fault once due (or now)
  [ -n "$restore" ] || return 0
  [ -n "${1:-}" ] || [ "$SECONDS" -ge "$restore_at" ] || return 0
  eval "$restore" >>"$work/faults.log" 2>&1
  restore=""
}

# probe ROUND T0: in the background, an order created as soon as the API server and the webhooks
# take it, then the time from T0 until it and every order there at T0 are answered, into
# $work/recovery-ROUND.
probe() {
  local round=$1 t0=$2 fault=$3
  (
    local created=1
    # Taken, or refused by the order webhook for a reason of its own (no room now: E2): either
    # is an answer. A webhook that cannot be called, or an API server that does not answer, is not.
    until kc create -f - >"$work/probe-$round.out" 2>&1 <<EOF
apiVersion: gpu.cozystack.io/v1alpha1
kind: GPUDevice
metadata: {name: probe-$round, namespace: probe}
spec: {className: probe, count: 1}
EOF
    do
      grep -q 'admission webhook "[^"]*" denied the request' "$work/probe-$round.out" && { created=0; break; }
      sleep 0.2
    done
    until kc get gpudevices -A -o json >"$work/probe-$round.json" 2>/dev/null &&
      answered "$work/probe-$round.json" "$work/uids-$round.json" "probe-$round" &&
      jq -e --arg n "probe-$round" --argjson created "$created" \
        '[.items[] | select(.metadata.name == $n)] | length == $created' "$work/probe-$round.json" >/dev/null; do
      sleep 0.2
    done
    local how="created and answered"
    [ "$created" = 1 ] || how="refused: $(sed -E 's/.*denied the request: //' "$work/probe-$round.out" | head -c 100)"
    echo "$(since "$t0") $fault $how" >"$work/recovery-$round"
  ) >/dev/null 2>&1 &
  probe_pid=$!
}

# --- a slow round's logs -----------------------------------------------------------------------
# A round whose recovery takes over COZY_CHAOS_SLOW seconds (default 25: the slowest faults, the
# restarts, recover in about 14) keeps what every log got from its fault on (the API server's
# audit log and its components' logs, the replicas', agents' and balancer's) and the probe's
# answers, in COZY_CHAOS_KEEP/seed-SEED-round-N (default BUILD_DIR/chaos-slow), which outlives the
# run's own directory; so does a round not answered at all.
slow=${COZY_CHAOS_SLOW:-25}
keep_root=${COZY_CHAOS_KEEP:-$build_dir/chaos-slow}
declare -A log_marks
mark_logs() { # the logs' sizes now: a kept round holds what each got from here on
  local f
  log_marks=()
  for f in "$audit_log" "$cluster_dir"/logs/*.log "$work"/replica-*.log "$work"/agent-*.log "$work/balancer.log"; do
    [ -f "$f" ] && log_marks[$f]=$(stat -c %s "$f")
  done
}
keep_logs() { # keep_logs ROUND: prints the directory
  local dir="$keep_root/seed-$seed-round-$1" f
  mkdir -p "$dir"
  for f in "${!log_marks[@]}"; do
    [ -f "$f" ] && tail -c +$((log_marks[$f] + 1)) "$f" >"$dir/$(basename "$f")"
  done
  cp "$work/probe-$1.out" "$work/probe-$1.json" "$work/recovery-$1" "$work/uids-$1.json" "$dir/" 2>/dev/null
  echo "$dir"
}

# --- the rounds --------------------------------------------------------------------------------
check "the cluster before the first round" || true
order_of_faults=()
for ((round = 1; round <= rounds; round++)); do
  RANDOM=$((seed * 1000 + round))
  if [ ${#order_of_faults[@]} -eq 0 ]; then # each kind once per cycle, in an order drawn
    order_of_faults=("${faults[@]}")
    for ((i = ${#order_of_faults[@]} - 1; i > 0; i--)); do
      draw $((i + 1))
      tmp=${order_of_faults[$i]}; order_of_faults[$i]=${order_of_faults[$r]}; order_of_faults[$r]=$tmp
    done
  fi
  fault=${order_of_faults[0]}
  order_of_faults=("${order_of_faults[@]:1}")
  draw 4
  before=$((r + 2))
  draw 4
  after=$((r + 4))
  echo "round $round: $before actions, $fault, $after actions"
  for ((i = 0; i < before; i++)); do action; done
  devices_json | jq '[.items[] | select(.metadata.deletionTimestamp == null) | .metadata.uid]' \
    >"$work/uids-$round.json"
  mark_logs
  t0=$(now)
  inject "$fault"
  probe "$round" "$t0" "$fault"
  for ((i = 0; i < after; i++)); do
    action
    restore_due
  done
  # The fault lasts as long as it was drawn, however quickly the actions went (a sleep, not more
  # actions: a replay draws the same).
  while [ -n "$restore" ] && [ "$SECONDS" -lt "$restore_at" ]; do sleep 0.5; done
  restore_due now
  check "round $round ($fault), the safety invariants" || true
  # Settled: the probe answered, every order answered, KubeVirt's part caught up.
  if ! wait_until 120 test -s "$work/recovery-$round"; then
    fail "round $round ($fault): orders not answered again 120 s after the fault; its logs kept in $(keep_logs "$round")"
    kill "$probe_pid" 2>/dev/null
  elif read -r seconds _ <"$work/recovery-$round" && awk -v s="$seconds" -v l="$slow" 'BEGIN { exit !(s > l) }'; then
    echo "  round $round ($fault) answered again after ${seconds}s, over ${slow}s: its logs kept in $(keep_logs "$round")"
  fi
  virt_handler
  check "round $round ($fault), settled" --settled || true
  kc delete gpudevice "probe-$round" -n probe --wait=false >/dev/null 2>&1
  [ "$fault" != kill-leader ] || burst_done
done

# --- the end: every VM stopped, every order deleted, nothing left ------------------------------
restore_due now
kc delete vmis --all -A --wait=false >/dev/null 2>&1
kc delete gpudevices --all -A --wait=false >/dev/null 2>&1
gone() { [ "$(kc get gpudevices -A -o name | wc -l)" = 0 ]; }
wait_until 60 gone && pass "every order deleted at the end is gone (no finalizer left, D13)" ||
  fail "orders left at the end: $(kc get gpudevices -A -o name | tr '\n' ' ')"
check "the end" --settled || true
records() { kc get workloads -A -l workloads.cozystack.io/monitor=cozy-gpu-usage -o name 2>/dev/null | grep -c gpudevice-; }
until_is 30 0 records && pass "no usage record left at the end (D16)" ||
  fail "usage records left: $(records)"

# --- the figures -------------------------------------------------------------------------------
report() {
  echo "seed $seed, $rounds rounds, $violations invariant violations"
  local k
  printf 'faults:'
  for k in "${faults[@]}"; do printf ' %s=%s' "$k" "${fault_count[$k]:-0}"; done
  echo
  echo "kill-leader: ${leader_kills[mid-pass]:-0} mid-pass, ${leader_kills[other]:-0} not;" \
    "kill-webhook on the serving replica: ${webhook_kills[before-answer]:-0} before the start's answer," \
    "${webhook_kills[after-answer]:-0} after it"
  printf 'workload:'
  for k in $(printf '%s\n' "${!actions_done[@]}" | sort); do printf ' %s=%s' "$k" "${actions_done[$k]}"; done
  echo
  while IFS= read -r k; do
    [ -n "$k" ] && echo "refused: ${refusals[$k]} x $k"
  done < <(printf '%s\n' "${!refusals[@]}" | sort)
  cat "$work"/recovery-* 2>/dev/null | awk '{ print $1 }' | sort -n >"$work/recoveries"
  local n p50 p99 max
  n=$(wc -l <"$work/recoveries")
  if [ "$n" -gt 0 ]; then
    p50=$(sed -n "$(((n + 1) / 2))p" "$work/recoveries")
    p99=$(sed -n "$(((n * 99 + 99) / 100))p" "$work/recoveries")
    max=$(tail -n 1 "$work/recoveries")
    printf 'fault to every order answered: n=%d p50=%.1fs p99=%.1fs max=%.1fs\n' "$n" "$p50" "$p99" "$max"
  fi
  for ((round = 1; round <= rounds; round++)); do
  RANDOM=$((seed * 1000 + round))
    [ -s "$work/recovery-$round" ] && read -r seconds kind how <"$work/recovery-$round" &&
      echo "  round $round: $kind, answered again after ${seconds}s (the probe order $how)"
  done
}
report | tee ${COZY_CHAOS_REPORT:+"$COZY_CHAOS_REPORT"}
[ "$violations" = 0 ] && pass "no invariant violated in $rounds rounds (seed $seed)"
summary
