# Shared by the tests on the real control plane (test/realcluster/*_test.sh); sourced, not run.
#   source lib.sh SOURCE_DIR BUILD_DIR CLUSTER_DIR
# CLUSTER_DIR is a cluster `scripts/cluster.sh up` started (the ctest fixture real_cluster):
# kube-apiserver, etcd and kube-controller-manager on 127.0.0.1, DIR/kubeconfig its admin.
# Each test installs what it needs and removes it again (tests on one cluster run one at a time:
# RESOURCE_LOCK real_cluster), and ends with the plain "N passed, N failed" line.
set -uo pipefail
source_dir=$(cd "$1" && pwd)
build_dir=$(cd "$2" && pwd)
cluster_dir=$(cd "$3" && pwd)
[ -f "$cluster_dir/kubeconfig" ] || {
  echo "FAIL: $cluster_dir/kubeconfig is missing: the real_cluster fixture did not come up"
  exit 1
}
for tool in kubectl helm openssl curl; do
  command -v "$tool" >/dev/null || {
    echo "FAIL: $tool is not on PATH (scripts/cluster.sh build builds kubectl and helm;" \
      "scripts/test.sh puts them first on PATH)"
    exit 1
  }
done
admin_kubeconfig="$cluster_dir/kubeconfig"
apiserver_url=$(sed -n 's/^APISERVER_URL=//p' "$cluster_dir/env")
work=$(mktemp -d "${TMPDIR:-/tmp}/realcluster.XXXXXX")
passed=0
failed=0
pids=()
cleanups=()

finish() {
  local status=$? i pid
  for ((i = ${#cleanups[@]} - 1; i >= 0; i--)); do eval "${cleanups[$i]}" >/dev/null 2>&1 || true; done
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  # COZY_REALCLUSTER_KEEP=1 keeps the scratch directory (its logs) for a failure's reader.
  if [ -n "${COZY_REALCLUSTER_KEEP:-}" ]; then echo "kept: $work"; else rm -rf "$work"; fi
  exit "$status"
}
trap finish EXIT
on_exit() { cleanups+=("$*"); } # on_exit 'COMMAND': run at the end, last registered first

pass() {
  echo "ok: $*"
  passed=$((passed + 1))
}
fail() {
  echo "FAIL: $*"
  failed=$((failed + 1))
}
# log_tails: the last lines of each log of the test's ($work/*.log), for a failure's reader (the
# scratch directory goes at the end; CI keeps only what the test printed).
log_tails() {
  local log
  for log in "$work"/*.log; do
    [ -s "$log" ] || continue
    echo "--- ${log##*/} (last lines)"
    tail -n 15 "$log"
  done
}
# summary: the closing line, after the logs' ends when anything failed; exit 1 then.
summary() {
  [ "$failed" -eq 0 ] || log_tails
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit $?
}
# abort WHAT: a step the rest of the test needs did not happen; the logs' ends, and exit 1.
abort() {
  fail "$*"
  summary
}

# kubectl as the cluster's admin, or as the user of kubeconfig KC_AS when set.
kc() {
  kubectl --kubeconfig "${KC_AS:-$admin_kubeconfig}" --cache-dir "$work/kube-cache" \
    --request-timeout=20s "$@"
}
# create_namespace NAME...: each namespace, new. The tests share one cluster and delete their
# namespaces without waiting (--wait=false), so one of the same name may still be terminating
# (kube-controller-manager empties it first): wait for it to go, then create.
create_namespace() {
  local ns
  for ns in "$@"; do
    kc wait --for=delete "namespace/$ns" --timeout=120s >/dev/null 2>&1 || true
    kc create namespace "$ns" >/dev/null
  done
}
# as KUBECONFIG COMMAND...: COMMAND (kc ...) as that kubeconfig's user.
as() {
  local kc_file=$1
  shift
  KC_AS=$kc_file "$@"
}

# wait_until SECONDS COMMAND...: COMMAND until it succeeds; status 1 when it never did.
wait_until() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.25
  done
}

# until_is SECONDS VALUE COMMAND...: until COMMAND prints VALUE; status 1 when it never did.
until_is() {
  local deadline=$((SECONDS + $1)) value=$2
  shift 2
  until [ "$("$@" 2>/dev/null)" = "$value" ]; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.25
  done
}

# expect_ok WHAT COMMAND...: COMMAND succeeds.
expect_ok() {
  local what=$1
  shift
  if "$@" >"$work/out" 2>&1; then pass "$what"; else fail "$what: $(tr '\n' ' ' <"$work/out")"; fi
}
# expect_refused WHAT REGEX COMMAND...: COMMAND fails and what it prints matches REGEX (the
# reason the API server gave, not just any failure).
expect_refused() {
  local what=$1 regex=$2
  shift 2
  if "$@" >"$work/out" 2>&1; then
    fail "$what: allowed, expected a refusal matching /$regex/"
  elif grep -Eq -- "$regex" "$work/out"; then
    pass "$what"
  else
    fail "$what: refused, but not for /$regex/: $(tr '\n' ' ' <"$work/out")"
  fi
}

# A kubeconfig for the cluster: token_kubeconfig FILE TOKEN, or cert_kubeconfig FILE CN [O...]
# with a client certificate our CA signs (the API server's client-certificate authenticator:
# CN the user, each O a group).
kubeconfig_with() { # kubeconfig_with FILE USER-YAML-LINES
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: cozy
  cluster:
    server: $apiserver_url
    certificate-authority-data: $(base64 -w0 "$cluster_dir/pki/ca.crt")
users:
- name: user
  user:
$2
contexts:
- name: cozy
  context: {cluster: cozy, user: user}
current-context: cozy
EOF
  chmod 600 "$1"
}
token_kubeconfig() {
  kubeconfig_with "$1" "    token: $2"
  printf '%s\n' -H "Authorization: Bearer $2" >"$1.curl"
}
cert_kubeconfig() {
  local file=$1 cn=$2
  shift 2
  "$source_dir/scripts/cluster.sh" user "$cluster_dir" "$file" "$cn" "$@"
  local key="$work/$(basename "$file").key" crt="$work/$(basename "$file").crt"
  sed -n 's/^ *client-certificate-data: //p' "$file" | base64 -d >"$crt"
  sed -n 's/^ *client-key-data: //p' "$file" | base64 -d >"$key"
  printf '%s\n' --cert "$crt" --key "$key" >"$file.curl"
}

# raw_patch KUBECONFIG API-PATH MERGE-PATCH: one PATCH as that kubeconfig's user, nothing else
# (kubectl patch GETs first, which an agent may not); fails on a non-2xx answer, printing the
# API server's message.
raw_patch() {
  local -a auth=()
  mapfile -t auth <"$1.curl"
  local code
  code=$(curl -sS -o "$work/patch.out" -w '%{http_code}' --cacert "$cluster_dir/pki/ca.crt" \
    "${auth[@]}" -X PATCH -H 'Content-Type: application/merge-patch+json' --data "$3" \
    "$apiserver_url$2") || return 1
  tr '\n' ' ' <"$work/patch.out"
  [[ "$code" == 2* ]]
}

# The chart, as a hoster installs it: install_chart NAMESPACE [helm flags...]. Removed at the end,
# with its CRDs (the chart keeps them on uninstall, H5), so the next test starts clean.
install_chart() {
  local ns=$1
  shift
  on_exit "remove_chart $ns" # a failed install leaves a release behind too
  helm install gpu "$source_dir/charts/gpu" --kubeconfig "$admin_kubeconfig" -n "$ns" \
    --create-namespace "$@" >"$work/helm-install.log" 2>&1
}
remove_chart() {
  helm uninstall gpu --kubeconfig "$admin_kubeconfig" -n "$1" --wait >/dev/null 2>&1 || true
  kc delete crd gpuclasses.gpu.cozystack.io gpudevices.gpu.cozystack.io gpunodes.gpu.cozystack.io \
    --ignore-not-found --wait >/dev/null 2>&1 || true
}
# The chart's CRDs established (the API server accepted their schemas and serves them).
wait_crds() {
  kc wait --for=condition=Established --timeout=60s \
    crd/gpuclasses.gpu.cozystack.io crd/gpudevices.gpu.cozystack.io crd/gpunodes.gpu.cozystack.io
}

# GPUs on with the webhooks on a controller at 127.0.0.1 (docs/testing.md, "The real control
# plane"). webhook_certs [SAN CN]: the serving pair in $work/certs/ (and $work/tls.*) naming the
# address the API server dials, SAN (default the IP SAN of 127.0.0.1; a Service's DNS SAN where
# the webhooks are behind the chart's Service) with common name CN, signed by a CA of its own,
# $work/webhook-ca.crt, which the webhook configurations carry.
webhook_certs() {
  local san=${1:-IP:127.0.0.1} cn=${2:-127.0.0.1}
  (cd "$work" &&
    openssl req -x509 -newkey rsa:2048 -nodes -keyout webhook-ca.key -out webhook-ca.crt -days 1 \
      -subj /CN=gpu-controller-ca 2>/dev/null &&
    printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$san" >san.ext &&
    openssl req -newkey rsa:2048 -nodes -keyout tls.key -out tls.csr -subj "/CN=$cn" 2>/dev/null &&
    openssl x509 -req -in tls.csr -CA webhook-ca.crt -CAkey webhook-ca.key -CAcreateserial \
      -out tls.crt -days 1 -extfile san.ext 2>/dev/null &&
    mkdir -p certs && cp tls.crt tls.key certs/)
}
# gpus_on_values FILE [WEBHOOK_PORT]: the chart's values for GPUs on, webhooks at that port of
# 127.0.0.1 (without one, behind the chart's Service); the last block is gpu.webhook's.
gpus_on_values() {
  cat >"$1" <<EOF
gpu:
  enabled: true
  webhook:
    certManager: false
    caBundle: $(base64 -w0 "$work/webhook-ca.crt")
    existingSecret: gpu-controller-webhook-tls
${2:+    url: https://127.0.0.1:$2}
    # Dual-stack (H8): kube-apiserver accepts one ipBlock per family.
    networkPolicy: {podCIDRs: [10.244.0.0/16, "fd00:10:244::/56"]}
    # The CA of the API server's webhook client certificate (cluster.sh's admission.yaml).
    clientCA: |
$(sed 's/^/      /' "$cluster_dir/pki/webhook-client-ca.crt")
EOF
}
# start_controller NAMESPACE WEBHOOK_PORT HEALTH_PORT [FLAG...]: gpu-controller with GPUs on as
# the chart's service account (a token the API server issues: TokenRequest), its log
# $work/controller.log; status 1 when it is not ready within 60 s.
start_controller() {
  local ns=$1 webhook_port=$2 health_port=$3 token
  shift 3
  token=$(kc create token gpu-controller -n "$ns" --duration 1h) || return 1
  token_kubeconfig "$work/controller.kubeconfig" "$token"
  "$build_dir/controller/gpu-controller" run --kubeconfig "$work/controller.kubeconfig" \
    --namespace "$ns" --identity replica-0 --enable-gpu \
    --webhook-addr "127.0.0.1:$webhook_port" --webhook-cert-dir "$work/certs" \
    --webhook-client-ca "$cluster_dir/pki/webhook-client-ca.crt" \
    --health-addr "127.0.0.1:$health_port" "$@" >"$work/controller.log" 2>&1 &
  pids+=($!)
  wait_until 60 curl -fsS "http://127.0.0.1:$health_port/readyz" &&
    wait_until 45 vmis_read "127.0.0.1:$health_port"
}
# vmis_read HOST:PORT: the controller whose health server is there has listed
# VirtualMachineInstances. It follows that kind through discovery (every 30 s), so it may be ready
# before it reads them; until then a VM start is refused, as it must be (G7), which a test
# starting a VM at once would take for a bug.
vmis_read() {
  curl -fsS "http://$1/metrics" 2>/dev/null |
    grep -q '^gpu_controller_cache_synced{cache="virtualmachineinstances"} 1$'
}

source "$source_dir/scripts/lib/free-port.sh" # free_port VAR

# install_gpus_on CHART NAMESPACE: CHART (this tree's, or an older release's) with GPUs on, its
# values $work/gpu-on.yaml (gpus_on_values), its CRDs Established, and KubeVirt's and Cozystack's
# CRDs as the controller reads them (test/fakes/crds). Not install_chart: the cluster of its own
# goes at the end, chart and all (removing the chart first would wait on finalizers a controller
# without its service account can no longer remove).
install_gpus_on() {
  helm install gpu "$1" --kubeconfig "$admin_kubeconfig" -n "$2" --create-namespace \
    -f "$work/gpu-on.yaml" >"$work/helm-install.log" 2>&1 || abort "helm install: $(cat "$work/helm-install.log")"
  wait_crds >/dev/null || abort "the CRDs are not Established"
  kc apply --server-side -f "$source_dir/test/fakes/crds" >/dev/null || abort "KubeVirt's and Cozystack's CRDs"
  # Established before a controller starts: its first discovery then finds them served.
  kc wait --for=condition=Established --timeout=60s -f "$source_dir/test/fakes/crds" >/dev/null ||
    abort "KubeVirt's and Cozystack's CRDs are not Established"
}
# kubevirt_controller: KubeVirt's controller, the one user the pod webhook pins launchers for
# (E14): its service account in cozy-kubevirt and $work/kubevirt.kubeconfig.
kubevirt_controller() {
  kc create namespace cozy-kubevirt >/dev/null
  kc create serviceaccount kubevirt-controller -n cozy-kubevirt >/dev/null
  kc create clusterrolebinding test-kubevirt-controller --clusterrole=cluster-admin \
    --serviceaccount=cozy-kubevirt:kubevirt-controller >/dev/null
  token_kubeconfig "$work/kubevirt.kubeconfig" \
    "$(kc create token kubevirt-controller -n cozy-kubevirt --duration 3h)" || abort "KubeVirt's token"
}

# A fixture host's sysfs tree: fixture_root NAME HOST → $work/NAME-root. HOST is a spec of
# fixtures/sysfs/specs/ by name, or the path of a spec file the test wrote.
fixture_root() {
  local spec=$2
  [[ "$spec" == */* ]] || spec="$source_dir/fixtures/sysfs/specs/$spec.json"
  "$build_dir/fixtures/sysfs/gpu-fixture" "$spec" "$work/$1-root" >/dev/null
}

# agent_pod NAMESPACE NODE: the YAML of node's agent pod, of the chart's service account, bound
# to that node by name (its kubelet admits it; the API server issues node-bound tokens for it).
agent_pod() {
  cat <<EOF
---
apiVersion: v1
kind: Pod
metadata: {name: gpu-agent-$2, namespace: $1}
spec:
  serviceAccountName: gpu-agent
  nodeName: $2
  containers: [{name: agent, image: example.invalid/gpu-agent:1}]
EOF
}

# gpu_class NAME RESOURCE [SPEC-LINE...]: the YAML of an A100 class serving RESOURCE on the GPU
# nodes, each SPEC-LINE (YAML, indented two spaces) added to or overriding its spec.
gpu_class() {
  local name=$1 resource=$2 line
  shift 2
  echo "---"
  echo "apiVersion: gpu.cozystack.io/v1alpha1"
  echo "kind: GPUClass"
  echo "metadata: {name: $name}"
  echo "spec:"
  local -A spec=([vendor]="NVIDIA" [model]="A100 PCIe 40GB" [mode]="passthrough" [maxCount]="4"
    [source]="{devicePlugin: {resourceName: $resource}}"
    [nodeSelector]="{matchLabels: {gpu.cozystack.io/gpu-node: \"true\"}}")
  for line in "$@"; do spec[${line%%:*}]=${line#*: }; done
  for line in $(printf '%s\n' "${!spec[@]}" | sort); do echo "  $line: ${spec[$line]}"; done
}
# vmi NAMESPACE NAME DEVICE: the YAML of a VMI naming GPUDevice DEVICE as charts/vm-instance
# renders it (the label and annotation the VMI webhook selects on), no GPU of its own.
vmi() {
  cat <<EOF
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: $2
  namespace: $1
  labels: {gpu.cozystack.io/device-references: "true"}
  annotations: {gpu.cozystack.io/device-references: '{"devices":["$3"]}'}
spec: {domain: {devices: {}}}
EOF
}
# controller_up NAMESPACE [VALUES-YAML]: the chart with GPUs on (VALUES-YAML added to its values)
# and one gpu-controller serving its webhooks at 127.0.0.1:$webhook_port as the chart's service
# account (start_controller, its health at $health_port); aborts when it is not ready.
controller_up() {
  webhook_certs || abort "openssl could not make the webhook certificate"
  free_port webhook_port || abort "no free port for the webhooks"
  free_port health_port || abort "no free port for the controller's health"
  gpus_on_values "$work/gpu-on.yaml" "$webhook_port"
  [ -z "${2:-}" ] || printf '%s\n' "$2" >>"$work/gpu-on.yaml"
  install_gpus_on "$source_dir/charts/gpu" "$1"
  start_controller "$1" "$webhook_port" "$health_port" || abort "gpu-controller is not ready"
}
# order NAMESPACE NAME CLASS: the YAML of a GPUDevice ordering one unit of CLASS.
order() {
  printf '%s\n' "---" "apiVersion: gpu.cozystack.io/v1alpha1" "kind: GPUDevice" \
    "metadata: {name: $2, namespace: $1}" "spec: {className: $3, count: 1}"
}

# real_node NAME FIXTURE [scripts/cluster.sh node options...]: a real node (a kubelet and the
# test device plugin on that fixture host, docs/testing.md "Real nodes") labelled a GPU node,
# removed at the end, and its gpu-agent on its own kubelet's pod-resources socket (polled every
# 2 s; each change of its node's pods reads it at once). With AGENT_NS set the agent runs as the
# chart's would: a token bound to its pod gpu-agent-NAME in AGENT_NS on that node, which the
# node's kubelet admits; otherwise as the admin. Waits for its GPUNode; node_dirs[NAME] is the
# node's state directory.
declare -A node_dirs
real_node() {
  local name=$1 spec=$2 started=$SECONDS kubeconfig=$admin_kubeconfig
  shift 2
  fixture_root "$name" "$spec" || abort "gpu-fixture could not build $spec"
  node_dirs[$name]=$("$source_dir/scripts/cluster.sh" node "$cluster_dir" "$name" \
    --host "$work/$name-root" --label gpu.cozystack.io/gpu-node=true "$@" 2>"$work/node-$name.log") ||
    abort "scripts/cluster.sh node $name: $(cat "$work/node-$name.log")"
  on_exit "'$source_dir/scripts/cluster.sh' node-down '$cluster_dir' $name" # logs: CLUSTER_DIR/logs/nodes/
  pass "node $name Ready with its devices in $((SECONDS - started)) s"
  if [ -n "${AGENT_NS:-}" ]; then
    agent_pod "$AGENT_NS" "$name" | kc apply -f - >/dev/null || abort "the agent pod of $name"
    on_exit "kc delete pod -n $AGENT_NS gpu-agent-$name --force --grace-period=0 --wait=false"
    local token
    token=$(kc create token gpu-agent -n "$AGENT_NS" --bound-object-kind Pod \
      --bound-object-name "gpu-agent-$name" --duration 1h) || abort "TokenRequest for gpu-agent-$name"
    kubeconfig="$work/agent-$name.kubeconfig"
    token_kubeconfig "$kubeconfig" "$token"
  fi
  agent_kubeconfigs[$name]=$kubeconfig
  start_agent "$name"
  published() { kc get gpunode "$1" -o jsonpath='{.status.devices}' | grep -q pciAddress; }
  wait_until 30 published "$name" || abort "the agent of $name published no GPUNode"
}
# start_agent NAME: node NAME's gpu-agent (again), as real_node started it; agent_pids[NAME] is
# its pid, its log $work/agent-NAME.log (appended to). It runs $agent_program (default this
# build's), with the flags of the array agent_args and of agent_node_args after its own.
declare -A agent_pids agent_kubeconfigs
declare -a agent_args=()
# agent_node_args NAME: more flags for node NAME's agent, one a line (a test may define it).
agent_node_args() { :; }
start_agent() {
  local name=$1
  local -a node_args
  mapfile -t node_args < <(agent_node_args "$name")
  "${agent_program:-$build_dir/agent/gpu-agent}" run --node-name "$name" --kubeconfig "${agent_kubeconfigs[$name]}" \
    --sysfs-root "$work/$name-root" --pci-ids "$source_dir/fixtures/pci.ids" \
    --pod-resources "unix://${node_dirs[$name]}/root/pod-resources/kubelet.sock" \
    --pod-resources-interval 2s --udev-source off --dbus off --health-addr off \
    "${agent_args[@]}" "${node_args[@]}" \
    >>"$work/agent-$name.log" 2>&1 &
  agent_pids[$name]=$!
  pids+=($!)
}
