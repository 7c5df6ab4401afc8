#!/usr/bin/env bash
# scripts/cluster.sh itself (docs/testing.md, "The real control plane"): a cluster of its own in a
# scratch directory.
#   test/realcluster/cluster_script_test.sh SOURCE_DIR GPU_FIXTURE
# up: the API server answers the admin kubeconfig and reports the pinned release; the namespace
# and garbage-collector controllers run (a deleted namespace goes away, an owned object follows
# its owner), and kube-scheduler. restart: etcd again from its saved command, its data kept,
# its pid replaced in place; kube-apiserver's restart is real_cluster_apiserver_restart_test's.
# compact: etcd's history compacted, a read at an older revision refused.
# node (docs/testing.md, "Real nodes"): a real kubelet on a
# fixture host (GPU_FIXTURE builds it) Ready with the device plugin's resource, its label and
# taint, the host sysctls put back, its mounts private; kubelet stop makes it NotReady, start
# Ready again with the plugin registered again. One line and exit 2 for a dirty DIR, a port in
# use, binaries not built, a node twice. down: the processes are gone (the nodes' too), a pid in
# the file that is no longer ours is left alone, a second down is refused.
set -uo pipefail
source_dir=$(cd "$1" && pwd)
gpu_fixture=$2
cluster="$source_dir/scripts/cluster.sh"
scratch=$(mktemp -d "${TMPDIR:-/tmp}/cluster-test.XXXXXX")
dir="$scratch/c"
passed=0 failed=0
pass() { echo "ok: $*"; passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }
bystander=""
finish() {
  [ -f "$dir/pids" ] && "$cluster" down "$dir" >/dev/null 2>&1
  [ -n "$bystander" ] && kill "$bystander" 2>/dev/null
  rm -rf "$scratch"
}
trap finish EXIT
bin=$("$cluster" bin)
kc() { "$bin/kubectl" --kubeconfig "$dir/kubeconfig" --request-timeout=20s "$@"; }
wait_until() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do [ "$SECONDS" -lt "$deadline" ] || return 1; sleep 0.25; done
}
# expect_exit2 WHAT REGEX COMMAND...: exit status 2 and one line on stderr matching REGEX.
expect_exit2() {
  local what=$1 regex=$2 status
  shift 2
  "$@" >"$scratch/out" 2>"$scratch/err"
  status=$?
  if [ "$status" -eq 2 ] && [ "$(wc -l <"$scratch/err")" -eq 1 ] && grep -Eq -- "$regex" "$scratch/err"; then
    pass "$what"
  else
    fail "$what: exit $status, stderr: $(cat "$scratch/err")"
  fi
}

started=$SECONDS
if url=$("$cluster" up "$dir" 2>"$scratch/up.err"); then
  pass "up in $((SECONDS - started)) s: $url"
else
  fail "up failed: $(cat "$scratch/up.err")"
  echo "$passed passed, $failed failed"
  exit 1
fi
[[ "$url" =~ ^https://127\.0\.0\.1:[0-9]+$ ]] && pass "the API server is on 127.0.0.1" || fail "URL $url"
pinned=$(sed -nE 's#^[[:space:]]*k8s\.io/kubernetes (v[0-9.]+).*#\1#p' "$source_dir/tools/kube/go.mod" | head -n1)
version=$(kc version -o json 2>/dev/null | grep -o '"gitVersion": *"[^"]*"' | sed 's/.*"\(v[^"]*\)"/\1/' | tr '\n' ' ')
[ "$version" = "$pinned $pinned " ] && pass "kubectl and kube-apiserver are the pinned $pinned" ||
  fail "versions (client, server): $version, pinned $pinned"
kc get namespace default >/dev/null 2>&1 && pass "the admin kubeconfig reads the default namespace" ||
  fail "kubectl get namespace default"
for port in $(sed -n 's/^\(APISERVER\|ETCD\)_PORT=//p' "$dir/env"); do
  listeners=$(grep -c ":$(printf '%04X' "$port") .* 0A " /proc/net/tcp)
  [ "$listeners" -ge 1 ] && pass "port $port listens on 127.0.0.1 only" || fail "port $port: no IPv4 listener"
  grep -q "$(printf '%04X' "$port") .* 0A " /proc/net/tcp6 && fail "port $port listens on IPv6"
  grep -E " 00000000:$(printf '%04X' "$port") .* 0A " /proc/net/tcp >/dev/null && fail "port $port on 0.0.0.0"
done

# kube-controller-manager: namespace deletion and garbage collection are real.
kc create namespace doomed >/dev/null && kc create configmap owner -n default >/dev/null
uid=$(kc get configmap owner -n default -o jsonpath='{.metadata.uid}')
kc apply -f - >/dev/null <<EOT
apiVersion: v1
kind: ConfigMap
metadata:
  name: dependent
  namespace: default
  ownerReferences: [{apiVersion: v1, kind: ConfigMap, name: owner, uid: "$uid"}]
EOT
kc delete namespace doomed --wait=false >/dev/null
gone() { ! kc get "$@" >/dev/null 2>&1; }
wait_until 60 gone namespace doomed && pass "a deleted namespace is finalized (namespace controller)" ||
  fail "namespace doomed still there: $(kc get namespace doomed -o jsonpath='{.status.conditions}')"
kc delete configmap owner -n default >/dev/null
wait_until 60 gone configmap dependent -n default &&
  pass "an object owned by a deleted one is collected (garbage collector)" || fail "dependent still there"

# Another user: a client certificate of the cluster's CA; the audit log names who did what.
"$cluster" user "$dir" "$scratch/bob.kubeconfig" bob team-a >/dev/null 2>"$scratch/err" ||
  fail "user: $(cat "$scratch/err")"
whoami=$("$bin/kubectl" --kubeconfig "$scratch/bob.kubeconfig" auth whoami -o jsonpath='{.status.userInfo.username} {.status.userInfo.groups[0]}' 2>&1)
[ "$whoami" = "bob team-a" ] && pass "user writes a kubeconfig the API server takes as bob in team-a" ||
  fail "whoami as bob: $whoami"
"$bin/kubectl" --kubeconfig "$scratch/bob.kubeconfig" create configmap bobs -n default >/dev/null 2>&1 &&
  fail "bob, with no role, created a configmap"
grep '"username":"bob"' "$dir/logs/audit.log" | grep -q '"verb":"create".*"code":403' &&
  pass "the audit log has bob's refused create" || fail "no audit line for bob's create"
kc create configmap audited -n default --from-literal=k=v >/dev/null
grep '"username":"admin"' "$dir/logs/audit.log" | grep -q '"verb":"create".*"requestObject":{.*"name":"audited"' &&
  pass "the audit log has the admin's create with its body" || fail "no audit line with the create's body"
expect_exit2 "user on a directory that is no cluster's" "is not a cluster's directory" \
  "$cluster" user "$scratch" "$scratch/x.kubeconfig" x

# restart: etcd stopped and started again from its saved command, the data kept; its pid replaced
# in place (down below still finds it); a component restart does not know is refused.
etcd_pid=$(awk '$1 == "etcd" { print $2 }' "$dir/pids")
if "$cluster" restart "$dir" etcd >"$scratch/restart.out" 2>&1; then
  new_pid=$(awk '$1 == "etcd" { print $2 }' "$dir/pids")
  old_state=$(awk '{ print $3 }' "/proc/$etcd_pid/stat" 2>/dev/null)  # gone, or a zombie
  [ "$new_pid" != "$etcd_pid" ] && { [ -z "$old_state" ] || [ "$old_state" = Z ]; } &&
    [ "$(awk '{ print $1 }' "$dir/pids" | head -n 1)" = etcd ] &&
    pass "restart etcd: a new process, first in the pids file as before" ||
    fail "restart etcd: pids $etcd_pid -> $new_pid: $(tr '\n' ' ' <"$dir/pids")"
  wait_until 30 kc get configmap audited -n default &&
    pass "after etcd's restart the API server serves what was stored" ||
    fail "configmap audited not read after etcd's restart"
else
  fail "restart etcd: $(cat "$scratch/restart.out")"
fi
expect_exit2 "restart of a component it does not restart" "etcd or kube-apiserver, not kube-scheduler" \
  "$cluster" restart "$dir" kube-scheduler

# compact: etcd's history gone up to now: a read of etcd at a revision before it is refused as
# compacted (kube-apiserver answers what it must serve from there 410 Gone).
old_rv=$(kc get configmap audited -n default -o jsonpath='{.metadata.resourceVersion}')
kc create configmap after-compact -n default >/dev/null
if revision=$("$cluster" compact "$dir" 2>"$scratch/compact.err") && [ "$revision" -gt "$old_rv" ]; then
  pass "compact: etcd compacted to revision $revision"
  etcd_url="http://127.0.0.1:$(sed -n 's/^ETCD_PORT=//p' "$dir/env")/v3/kv/range"
  curl -sS -X POST "$etcd_url" -d "{\"key\":\"AA==\",\"limit\":1,\"revision\":\"$old_rv\"}" \
    >"$scratch/old-read.out" 2>&1
  grep -q "compacted" "$scratch/old-read.out" &&
    pass "a read of etcd at revision $old_rv, before the compaction, is refused as compacted" ||
    fail "etcd read at $old_rv after compaction: $(cat "$scratch/old-read.out")"
else
  fail "compact: '$revision' $(cat "$scratch/compact.err")"
fi

# kube-scheduler runs: a pod with no node is bound by it.
kc run placed -n default --image=example.invalid/x:1 --restart=Never >/dev/null
scheduled() { [ -n "$(kc get pod placed -n default -o jsonpath='{.spec.nodeName}')" ]; }
unschedulable() {
  kc get pod placed -n default -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].reason}' |
    grep -q Unschedulable
}
wait_until 30 unschedulable && pass "kube-scheduler runs: with no node a pod is Unschedulable" ||
  fail "the scheduler did not decide on pod placed"

# Real nodes: a kubelet on the fixture host a100-vfio with the test device plugin.
sysctls_before=$(cat /proc/sys/kernel/panic /proc/sys/kernel/panic_on_oops /proc/sys/vm/overcommit_memory | tr '\n' ' ')
"$gpu_fixture" "$source_dir/fixtures/sysfs/specs/a100-vfio.json" "$scratch/host" >/dev/null ||
  fail "gpu-fixture could not build a100-vfio"
started=$SECONDS
if node_dir=$("$cluster" node "$dir" gpu-1 --host "$scratch/host" --label pool=gpu \
  --taint dedicated=gpu:NoSchedule 2>"$scratch/err"); then
  pass "node gpu-1 Ready with its devices in $((SECONDS - started)) s"
else
  fail "node: $(cat "$scratch/err")"
fi
[ "$(kc get node gpu-1 -o jsonpath='{.status.allocatable.nvidia\.com/GA100_A100_PCIE_40GB}')" = 2 ] &&
  pass "the device plugin's resource is in the node's allocatable: 2" ||
  fail "allocatable: $(kc get node gpu-1 -o jsonpath='{.status.allocatable}')"
[ "$(kc get node gpu-1 -o jsonpath='{.metadata.labels.pool} {.spec.taints[*].key}')" = "gpu dedicated" ] &&
  pass "the node has its label and taint, and no not-ready taint (node lifecycle controller)" ||
  fail "labels/taints: $(kc get node gpu-1 -o jsonpath='{.metadata.labels} {.spec.taints}')"
[ -S "$node_dir/root/pod-resources/kubelet.sock" ] && pass "kubelet serves pod-resources at $node_dir" ||
  fail "no pod-resources socket in $node_dir"
sysctls_now=$(cat /proc/sys/kernel/panic /proc/sys/kernel/panic_on_oops /proc/sys/vm/overcommit_memory | tr '\n' ' ')
[ "$sysctls_now" = "$sysctls_before" ] && pass "the host sysctls kubelet sets are put back ($sysctls_now)" ||
  fail "sysctls were '$sysctls_before', are '$sysctls_now'"
grep -q "/var/lib/kubelet/device-plugins" /proc/mounts && fail "kubelet's bind mount leaked into the host" ||
  pass "kubelet's mounts stay in its own namespace"
wait_until 30 scheduled && fail "the pod went to the tainted node" || pass "the scheduler keeps off a NoSchedule taint"
expect_exit2 "a second node of the same name" "exists in .* already" "$cluster" node "$dir" gpu-1
expect_exit2 "node on a directory that is no cluster's" "not a running cluster's directory" \
  "$cluster" node "$scratch" gpu-2
expect_exit2 "node with a bad taint" "is not K=V:EFFECT" "$cluster" node "$dir" gpu-2 --taint x:Sometimes
kubelet_pid=$(awk '$1 == "kubelet" {print $2}' "$node_dir/pids")
running() { # running PID: alive, not a zombie (exited, not yet reaped by whoever inherited it)
  local state
  state=$(sed -E 's/^[0-9]+ \(.*\) ([A-Za-z]).*/\1/' "/proc/$1/stat" 2>/dev/null) && [ "$state" != Z ]
}
"$cluster" kubelet "$dir" gpu-1 stop && ! running "$kubelet_pid" &&
  pass "kubelet stop stops that kubelet alone" || fail "kubelet stop"
not_ready() { [ "$(kc get node gpu-1 -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = Unknown ]; }
wait_until 40 not_ready && pass "its node goes NotReady (Unknown) under the node lifecycle controller" ||
  fail "node gpu-1 stays $(kc get node gpu-1 -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')"
"$cluster" kubelet "$dir" gpu-1 start && pass "kubelet start" || fail "kubelet start"
ready() { [ "$(kc get node gpu-1 -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]; }
wait_until 40 ready && pass "Ready again after the restart" || fail "not Ready after the restart"
wait_until 20 grep -q "registering again" "$node_dir/logs/gpu-device-plugin.log" &&
  pass "the device plugin registered again" || fail "the plugin did not register again"
mapfile -t node_pids < <(awk '{print $2}' "$node_dir/pids")

# Refusals: one line, exit 2.
expect_exit2 "up into a directory with a cluster in it" "is not empty" "$cluster" up "$dir"
port=$(sed -n 's/^APISERVER_PORT=//p' "$dir/env")
COZY_CLUSTER_APISERVER_PORT=$port expect_exit2 "up on a port in use" "port $port .* is in use" \
  "$cluster" up "$scratch/other"
[ ! -e "$scratch/other" ] && pass "... and it left no directory behind" || fail "$scratch/other created"
expect_exit2 "a node whose --programs file does not exist" "--programs .*: no such file" \
  "$cluster" node "$dir" no-programs --programs "$scratch/no-such-file"
mkdir "$scratch/empty-cache"
COZY_TOOLS_CACHE="$scratch/empty-cache" expect_exit2 "up without the binaries built" \
  "binaries are not built in .*scripts/cluster.sh build" "$cluster" up "$scratch/other"

# down: a pid in the file that is not ours (reused since) is left alone.
sleep 300 &
bystander=$!
echo "bystander $bystander" >>"$dir/pids"
mapfile -t ours < <(awk '$1 != "bystander" { print $2 }' "$dir/pids")
if "$cluster" down "$dir" 2>"$scratch/err"; then pass "down"; else fail "down: $(cat "$scratch/err")"; fi
alive=""
for pid in "${ours[@]}"; do # running: a zombie (exited, not yet reaped) is not
  state=$(sed -E 's/^[0-9]+ \(.*\) ([A-Za-z]).*/\1/' "/proc/$pid/stat" 2>/dev/null) || continue
  [ "$state" = Z ] || alive+="$pid($state) "
done
[ -z "$alive" ] && pass "down stopped etcd, kube-apiserver, kube-controller-manager and kube-scheduler" || fail "still alive: $alive"
alive=""
for pid in "${node_pids[@]}"; do
  state=$(sed -E 's/^[0-9]+ \(.*\) ([A-Za-z]).*/\1/' "/proc/$pid/stat" 2>/dev/null) || continue
  [ "$state" = Z ] || alive+="$pid($state) "
done
[ -z "$alive" ] && [ ${#node_pids[@]} -eq 3 ] && pass "down stopped the node's kubelet, runtime and plugin" ||
  fail "node processes (${#node_pids[@]}) still alive: $alive"
[ ! -e "$node_dir" ] && [ -f "$dir/logs/nodes/gpu-1/kubelet.log" ] &&
  pass "down removed the node's state and kept its logs" || fail "node state after down: $(ls "$dir/logs")"
sysctls_now=$(cat /proc/sys/kernel/panic /proc/sys/kernel/panic_on_oops /proc/sys/vm/overcommit_memory | tr '\n' ' ')
[ "$sysctls_now" = "$sysctls_before" ] && pass "the host sysctls are as before after down" ||
  fail "sysctls were '$sysctls_before', are '$sysctls_now' after down"
kill -0 "$bystander" 2>/dev/null && pass "down left a pid that is not the cluster's alone" ||
  fail "down killed an unrelated process"
expect_exit2 "a second down" "no pids file" "$cluster" down "$dir"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
