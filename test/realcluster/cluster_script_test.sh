#!/usr/bin/env bash
# scripts/cluster.sh itself (issue 22 §2): a cluster of its own in a scratch directory.
#   test/realcluster/cluster_script_test.sh SOURCE_DIR
# up: the API server answers the admin kubeconfig and reports the pinned release; the namespace
# and garbage-collector controllers run (a deleted namespace goes away, an owned object follows
# its owner). One line and exit 2 for a dirty DIR, a port in use, binaries not built. down: the
# processes are gone, a pid in the file that is no longer ours is left alone, a second down is
# refused.
set -uo pipefail
source_dir=$(cd "$1" && pwd)
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

# Refusals: one line, exit 2.
expect_exit2 "up into a directory with a cluster in it" "is not empty" "$cluster" up "$dir"
port=$(sed -n 's/^APISERVER_PORT=//p' "$dir/env")
COZY_CLUSTER_APISERVER_PORT=$port expect_exit2 "up on a port in use" "port $port .* is in use" \
  "$cluster" up "$scratch/other"
[ ! -e "$scratch/other" ] && pass "... and it left no directory behind" || fail "$scratch/other created"
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
[ -z "$alive" ] && pass "down stopped etcd, kube-apiserver and kube-controller-manager" || fail "still alive: $alive"
kill -0 "$bystander" 2>/dev/null && pass "down left a pid that is not the cluster's alone" ||
  fail "down killed an unrelated process"
expect_exit2 "a second down" "no pids file" "$cluster" down "$dir"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
