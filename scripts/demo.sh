#!/usr/bin/env bash
# The whole system on bundled fixture hosts, no GPU, cluster or kubelet needed: a tenant's VM
# gets a GPU, end to end, and kubectl shows each step (docs/demo.md).
#
#   two GPU nodes: fixture host a100-vfio (two A100 on vfio-pci) under gpu-node-1 and gpu-node-2,
#                  each with a fake kubelet (KubeVirt's PCI device plugin) and `gpu-agent run`
#   two `gpu-controller run --enable-gpu` replicas: the binder (on the Lease holder) and the
#                  admission webhooks (every replica; HTTPS, a certificate made by openssl)
#   the fake API server: the chart's CRDs and KubeVirt's, the admission chain calling the
#                  chart's webhook configurations, and a stand-in for virt-api's VMI mutator
#   kubectl:       the hoster's and the tenant's client
#
#   scripts/demo.sh                      # installs the Debian packages its build needs, builds
#                                        # into build/ and the Go tools its mode needs, runs
#   scripts/demo.sh --no-setup BUILD_DIR # runs on what BUILD_DIR has built (the suite's demo_test)
#
# The same four steps on a real API server instead of the fake (either combines with --no-setup):
#   scripts/demo.sh --real-cluster       # brings a control plane and two real nodes up
#                                        # (scripts/cluster.sh up, node), runs, takes them down
#   scripts/demo.sh --kubeconfig FILE    # an existing cluster whose API server reaches this
#                                        # machine's 127.0.0.1 (the webhooks are served here)
# There the chart is installed with helm (release gpu in cozy-system, GPUs on, the webhooks at
# https://127.0.0.1:PORT of the first replica), KubeVirt's and Cozystack's test CRDs applied, the
# agents and controller replicas run as the chart's service accounts with tokens the API server
# issues (TokenRequest), and the tenant is a client-certificate user bound to the chart's tenant
# roles (docs/install.md, "Tenants"). With --real-cluster the nodes are real kubelets (on an
# image-less container runtime) with a device plugin advertising the fixture's GPUs: each agent
# reads its kubelet's pod-resources, kube-scheduler places the launcher pod and kubelet allocates
# its GPU. With --kubeconfig the Nodes are objects the demo writes, beside fake kubelets, and
# everything the demo created in the cluster is removed again when it ends.
#
# Setup pays only for what the mode uses: of the Go tools pinned in tools/, kubectl alone on the
# fake API server, helm too on a real one, and the control plane's and nodes' programs with
# --real-cluster (scripts/cluster.sh build, once per pin); of the Debian packages, the build's
# (scripts/install-deps.sh --demo). The test suite's own are scripts/install-deps.sh's
# (docs/testing.md, "The first command's time").
#
# For monitoring tests (test/e2e/monitoring_queries_test.sh; docs/operations.md, "Tests"): with
# COZY_DEMO_SCRAPE_TARGETS=FILE the demo writes its controller replicas' and agents' /metrics
# addresses to FILE as Prometheus file-based discovery reads them, and with COZY_DEMO_HOOK=CMD it
# runs CMD STEP at the end of each step (and once while a node is cordoned), the demo failing if
# CMD does.
#
# Everything it starts stops when it ends, whatever the outcome; it writes only under a
# temporary directory, so a second run works the same. A step that does not happen within its
# bound stops the demo with "demo: FAILED at step N: ..." and exit status 1.
set -euo pipefail
source_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

usage() {
  echo "usage: scripts/demo.sh [--no-setup BUILD_DIR] [--kubeconfig FILE | --real-cluster]" >&2
  exit 2
}
setup=1
build_dir="$source_dir/build"
mode=fake # fake | real-cluster | kubeconfig
given_kubeconfig=""
while [ $# -gt 0 ]; do
  case "$1" in
    --no-setup)
      [ $# -ge 2 ] && [ -d "$2" ] || usage
      setup=0
      build_dir=$(cd "$2" && pwd)
      shift 2
      ;;
    --kubeconfig)
      [ $# -ge 2 ] && [ "$mode" = fake ] || usage
      [ -r "$2" ] || {
        echo "demo: $2 is not a readable kubeconfig" >&2
        exit 2
      }
      mode=kubeconfig
      given_kubeconfig=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
      shift 2
      ;;
    --real-cluster)
      [ "$mode" = fake ] || usage
      mode=real-cluster
      shift
      ;;
    *) usage ;;
  esac
done

# What this mode runs. Programs of the build: the fake API server only on itself, the fake kubelets
# where no real kubelet runs. Go tools pinned in tools/ (built by scripts/cluster.sh): kubectl
# everywhere; helm, which installs the chart, on a real API server only (the fake one takes the
# chart's webhook configurations as test/fakes/gpu-webhooks.yaml holds them rendered); with
# --real-cluster the control plane and the nodes' programs (kubelet, its container runtime, the
# test device plugin).
targets=(gpu-agent gpu-agent-full gpu-controller kubectl-gpu gpu-fixture)
mode_tools=()
case "$mode" in
  fake) targets+=(fake_apiserver fake_kubelet) ;;
  kubeconfig)
    targets+=(fake_kubelet)
    mode_tools+=(helm)
    ;;
  real-cluster)
    mode_tools+=(helm etcd kube-apiserver kube-controller-manager kube-scheduler kubelet
      cri-runtime gpu-device-plugin)
    ;;
esac

if [ "$setup" -eq 1 ]; then
  cd "$source_dir"
  # The Debian packages of the build alone (--demo): not the test suite's tools, nor its Go
  # tools, which scripts/install-deps.sh adds for the tests (docs/testing.md, "The first
  # command's time").
  echo "demo: installing the Debian packages the build needs (scripts/install-deps.sh --demo)" >&2
  scripts/install-deps.sh --demo >/dev/null
  # Configured as scripts/test.sh configures build/, so the tests reuse what this builds. Its
  # warnings name what the test suite would miss (installed by scripts/install-deps.sh): shown
  # only when the configuration fails.
  # shellcheck source=scripts/lib/configure.sh
  source scripts/lib/configure.sh
  configure_log=$(mktemp)
  configure_build normal build >"$configure_log" 2>&1 || {
    cat "$configure_log" >&2
    rm -f "$configure_log"
    echo "demo: configuring build/ failed" >&2
    exit 1
  }
  rm -f "$configure_log"
  # The Go tools build beside the programs (docs/testing.md, "The first command's time"): the
  # C++ build keeps one of two cores busy on average, the tools' module downloads wait on the
  # network. kubectl first, on its own (every mode runs it), then the rest of this mode's; each
  # is built once per pin and says so on stderr, a cache hit costs nothing. In a process group
  # of its own, stopped as one if the demo ends first.
  set -m
  {
    scripts/cluster.sh build kubectl >/dev/null &&
      if [ "${#mode_tools[@]}" -gt 0 ]; then scripts/cluster.sh build "${mode_tools[@]}" >/dev/null; fi
  } &
  tools_pid=$!
  set +m
  trap 'kill -TERM -- -"$tools_pid" 2>/dev/null || true' EXIT
  trap 'exit 130' INT TERM
  echo "demo: building ${targets[*]} into build/" >&2
  cmake --build build -j"$(nproc)" --target "${targets[@]}" >/dev/null ||
    { echo "demo: building the programs failed" >&2; exit 1; }
  wait "$tools_pid" || { echo "demo: building the Go tools failed (scripts/cluster.sh build)" >&2; exit 1; }
  trap - EXIT
fi

agent_bin="$build_dir/agent/gpu-agent"
controller_bin="$build_dir/controller/gpu-controller"
plugin_bin="$build_dir/controller/kubectl-gpu"
fixture_bin="$build_dir/fixtures/sysfs/gpu-fixture"
kubelet_bin="$build_dir/test/fakes/fake_kubelet"
apiserver_bin="$build_dir/test/fakes/fake_apiserver"
programs=("$agent_bin" "$controller_bin" "$plugin_bin" "$fixture_bin")
[ "$mode" = real-cluster ] || programs+=("$kubelet_bin")
[ "$mode" != fake ] || programs+=("$apiserver_bin")
for program in "${programs[@]}"; do
  [ -x "$program" ] || {
    echo "demo: $program is not built (ninja -C $build_dir ${targets[*]})" >&2
    exit 2
  }
done
# kubectl and helm as pinned in tools/ (kube/go.mod, helm/go.mod), built by scripts/cluster.sh:
# first on PATH, so the demo prints what kubectl 1.36 prints whatever else is installed, and the
# real modes have `kubectl create token` and `auth whoami`.
tools_bin=$("$source_dir/scripts/cluster.sh" bin)
helm_bin="$tools_bin/helm"
for tool in kubectl "${mode_tools[@]}"; do
  [ -x "$tools_bin/$tool" ] || {
    echo "demo: $tools_bin/$tool is not built (scripts/cluster.sh build kubectl ${mode_tools[*]};" \
      "scripts/demo.sh without --no-setup builds them)" >&2
    exit 2
  }
done
PATH="$tools_bin:$PATH"
for tool in kubectl openssl curl; do
  command -v "$tool" >/dev/null || {
    echo "demo: $tool is not installed (scripts/install-deps.sh --demo installs it)" >&2
    exit 2
  }
done

# A short path: the kubelet sockets live here (a unix socket path is at most 107 bytes).
work=$(mktemp -d "${TMPDIR:-/tmp}/cozy-demo.XXXXXX")
# helm's cache, configuration and data there too, not under $HOME.
export HELM_CACHE_HOME="$work/helm/cache" HELM_CONFIG_HOME="$work/helm/config" \
  HELM_DATA_HOME="$work/helm/data"
pids=()
cleanup() {
  local pid alive
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 50); do # up to 5 s for SIGTERM, then SIGKILL
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" -eq 1 ] || break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  [ "$mode" != kubeconfig ] || undo_cluster
  if [ "$mode" = real-cluster ] && [ -f "$work/cluster/pids" ]; then
    "$source_dir/scripts/cluster.sh" down "$work/cluster" >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step=setup
# fail WHAT: names the step and what did not happen, shows the logs' ends, exits 1.
fail() {
  echo "demo: FAILED at step $step: $*" >&2
  local log
  for log in "$work"/*.log "$work"/cluster/logs/*.log "$work"/cluster/nodes/*/logs/*.log; do
    [ -s "$log" ] || continue
    echo "--- ${log#"$work"/} (last lines)" >&2
    tail -n 8 "$log" >&2
  done
  exit 1
}
# wait_for SECONDS WHAT COMMAND...: runs COMMAND until it succeeds, at most SECONDS.
wait_for() {
  local seconds=$1 what=$2
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || fail "$what (waited ${seconds}s)"
    sleep 0.2
  done
}
source "$source_dir/scripts/lib/free-port.sh" # free_port VAR

# The hoster's kubeconfig: the fake API server's, the cluster's admin of `cluster.sh up`, or FILE.
# The tenant's is the same in the fake mode, a client-certificate user's on a real API server.
case "$mode" in
  fake) kubeconfig="$work/kubeconfig" ;;
  real-cluster) kubeconfig="$work/cluster/kubeconfig" ;;
  kubeconfig) kubeconfig="$given_kubeconfig" ;;
esac
tenant_kubeconfig=$kubeconfig
# kubectl as the hoster, or as the user of kubeconfig KC_AS when set (as_tenant), with a discovery
# cache of its own (not ~/.kube/cache).
kc() {
  kubectl --kubeconfig "${KC_AS:-$kubeconfig}" --cache-dir "$work/kube-cache" --request-timeout=20s "$@"
}
as_tenant() { KC_AS=$tenant_kubeconfig "$@"; } # as_tenant COMMAND...: kc in COMMAND is the tenant
# KubeVirt's controller, the one user the pod webhook takes launcher pods from (E14): its
# kubeconfig is made with the API server's other identities below.
kubevirt_user=system:serviceaccount:kubevirt:kubevirt-controller
kubevirt_kubeconfig=$kubeconfig
as_kubevirt() { KC_AS=$kubevirt_kubeconfig "$@"; }
show() { # show ARGS...: prints "$ kubectl ARGS" and its output, indented (checked after)
  echo "\$ kubectl $*"
  kc "$@" 2>&1 | sed 's/^/  /' || true
}
jp() { kc get "$1" ${3:+-n "$3"} -o "jsonpath=$2" 2>/dev/null; } # jp WHAT JSONPATH [NS]
field_is() { [ "$(jp "$1" "$2" "$3")" = "$4" ]; }                # field_is WHAT JSONPATH NS VALUE
field_set() { [ -n "$(jp "$1" "$2" "$3")" ]; }                   # field_set WHAT JSONPATH NS
absent() { ! kc get "$1" ${2:+-n "$2"} >/dev/null 2>&1; }        # absent WHAT [NS]
# The catalog as the controller's model sees it, through kubectl's plugin discovery: kubectl finds
# kubectl-gpu on PATH (docs/kubectl-gpu.md). Plugins take kubectl's flags after their name.
gpu() { # gpu ARGS...: prints "$ kubectl gpu ARGS" and its output, indented
  echo "\$ kubectl gpu $*"
  PATH="$build_dir/controller:$PATH" kubectl gpu "$@" --kubeconfig "$kubeconfig" 2>&1 |
    sed 's/^/  /'
}
catalog() { gpu catalog --nodes; }

host=a100-vfio
class=a100
resource=nvidia.com/GA100_A100_PCIE_40GB
tenant="tenant-a"
nodes=(gpu-node-1 gpu-node-2)
declare -A pod_resources=() # each node's kubelet pod-resources socket
declare -A agent_health_ports=() # each node's agent's /healthz, /readyz and /metrics
build_tree() {              # build_tree NODE: the fixture host's sysfs tree, the node's root
  "$fixture_bin" "$source_dir/fixtures/sysfs/specs/$host.json" "$work/$1-root" >/dev/null ||
    fail "gpu-fixture could not build $host"
}
ns=cozy-system
chart_crds=(gpuclasses.gpu.cozystack.io gpudevices.gpu.cozystack.io gpunodes.gpu.cozystack.io)
# KubeVirt's and Cozystack's test CRDs (test/fakes/crds), by name.
test_crds=()
for file in "$source_dir"/test/fakes/crds/*.yaml; do
  test_crds+=("$(awk '/^metadata:/ { m = 1; next } m && /^  name:/ { print $2; exit }' "$file")")
done

# --- On a cluster given by --kubeconfig: what the demo created there, removed when it ends
# (undo_cluster, after the agents and replicas have stopped), and nothing that was there before.
own_release=0 own_rbac=0 own_agent_pods=0 own_nodes=0 own_kubevirt_sa=0
own_namespaces=() own_crds=()
# strip_finalizers NAMESPACE|-A RESOURCE...: from every object of them there (no controller runs
# any more to remove them, and they would hold their namespace and CRD).
strip_finalizers() {
  local scope=(-n "$1") resource in_ns name
  [ "$1" != -A ] || scope=(-A)
  shift
  for resource in "$@"; do
    while IFS=/ read -r in_ns name; do
      [ -n "$name" ] || continue
      kc patch "$resource" "$name" ${in_ns:+-n "$in_ns"} --type=merge \
        -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
    done < <(kc get "$resource" "${scope[@]}" -o \
      'jsonpath={range .items[?(@.metadata.finalizers)]}{.metadata.namespace}/{.metadata.name}{"\n"}{end}' \
      2>/dev/null)
  done
}
undo_cluster() {
  local left="" node
  KC_AS=
  if [ "$own_rbac" -eq 1 ]; then
    kc delete clusterrolebinding gpu-tenants-catalog --ignore-not-found >/dev/null 2>&1 ||
      left+=" clusterrolebinding/gpu-tenants-catalog"
  fi
  if [ "$own_kubevirt_sa" -eq 1 ]; then
    kc delete serviceaccount kubevirt-controller -n kubevirt --ignore-not-found >/dev/null 2>&1 ||
      left+=" serviceaccount/kubevirt-controller"
  fi
  if [ "$own_agent_pods" -eq 1 ]; then # bound to a node no kubelet runs: gone at once
    for node in "${nodes[@]}"; do
      kc delete pod "gpu-agent-$node" -n "$ns" --ignore-not-found --force --grace-period=0 \
        >/dev/null 2>&1 || left+=" pod/gpu-agent-$node"
    done
  fi
  if [ "$own_release" -eq 1 ]; then # first: its webhooks and policies, before namespaces go
    "$helm_bin" uninstall gpu --kubeconfig "$kubeconfig" -n "$ns" --timeout 60s >/dev/null 2>&1 ||
      left+=" release/gpu"
    strip_finalizers -A "${chart_crds[@]}"
  fi
  if [ "${#own_namespaces[@]}" -gt 0 ]; then
    case " ${own_namespaces[*]} " in
      *" $tenant "*) strip_finalizers "$tenant" virtualmachineinstances.kubevirt.io workloads.cozystack.io ;;
    esac
    kc delete namespace "${own_namespaces[@]}" --ignore-not-found --timeout=60s >/dev/null 2>&1 ||
      left+=" namespaces"
  fi
  if [ "$own_nodes" -eq 1 ]; then
    kc delete node "${nodes[@]}" --ignore-not-found >/dev/null 2>&1 || left+=" nodes"
  fi
  # The chart keeps its CRDs on uninstall (docs/install.md); KubeVirt's and Cozystack's test CRDs
  # go only where the demo created them.
  if [ "$own_release" -eq 1 ]; then
    kc delete crd "${chart_crds[@]}" --ignore-not-found --timeout=60s >/dev/null 2>&1 ||
      left+=" the chart's CRDs"
  fi
  if [ "${#own_crds[@]}" -gt 0 ]; then
    kc delete crd "${own_crds[@]}" --ignore-not-found --timeout=60s >/dev/null 2>&1 ||
      left+=" the test CRDs"
  fi
  [ -z "$left" ] || echo "demo: could not remove from the cluster:$left" >&2
}

echo "== cozy-gpu demo: fixture host $host ($(grep -m1 '"description"' \
  "$source_dir/fixtures/sysfs/specs/$host.json" | cut -d'"' -f4)) as ${nodes[*]}"

# --- The API server. Two replicas' webhook ports: the fake maps the Service to the first; on a
# real one the chart's webhook configurations call the first's URL (gpu.webhook.url).
webhook_ports=() health_ports=()
for i in 0 1; do
  free_port "webhook_ports[$i]" || fail "no free TCP port"
  free_port "health_ports[$i]" || fail "no free TCP port"
done
case "$mode" in
  fake)
    # The API server's webhook client certificate, as an admission kubeconfig gives it to
    # kube-apiserver: the replicas answer only callers its CA signed.
    (cd "$work" &&
      openssl req -x509 -newkey rsa:2048 -nodes -keyout webhook-client-ca.key \
        -out webhook-client-ca.crt -days 1 -subj /CN=webhook-client-ca 2>/dev/null &&
      printf 'extendedKeyUsage=clientAuth\n' >client.ext &&
      openssl req -newkey rsa:2048 -nodes -keyout webhook-client.key -out webhook-client.csr \
        -subj /CN=kube-apiserver-webhook-client 2>/dev/null &&
      openssl x509 -req -in webhook-client.csr -CA webhook-client-ca.crt \
        -CAkey webhook-client-ca.key -CAcreateserial -out webhook-client.crt -days 1 \
        -extfile client.ext 2>/dev/null) ||
      fail "openssl could not make the API server's webhook client certificate"
    webhook_client_ca="$work/webhook-client-ca.crt"
    "$apiserver_bin" --crds "$source_dir/charts/gpu/templates/crds" \
      --crds "$source_dir/test/fakes/crds" --kubeconfig-out "$work/kubeconfig" --virt-api-mutator \
      --service-endpoint "$ns/gpu-controller-webhook=${webhook_ports[0]}" \
      --webhook-client-cert "$work/webhook-client.crt" --webhook-client-key "$work/webhook-client.key" \
      >"$work/apiserver.log" 2>&1 &
    pids+=($!)
    wait_for 10 "the fake API server listening" grep -q "listening on" "$work/apiserver.log"
    # kubectl sends no token over the fake's plain HTTP, so every kubectl command here is the
    # fake's one user, system:admin: on the fake, that is the user KubeVirt's controller runs
    # as. (On a real control plane it is a service account of its own, below.)
    kubevirt_user=system:admin
    wait_for 10 "the fake API server answering kubectl" kc get --raw /readyz
    ;;
  real-cluster)
    # etcd, kube-apiserver, kube-controller-manager (namespaces, garbage collection, the node
    # lifecycle) and kube-scheduler, their state and pids under $work/cluster; cleanup's
    # `cluster.sh down` stops them and the nodes. Their ports are chosen here with the replicas'
    # (none given twice: those are not bound yet).
    cluster_apiserver_port="" cluster_etcd_port="" cluster_etcd_peer_port="" cluster_kcm_port=""
    cluster_scheduler_port=""
    for port in apiserver etcd etcd_peer kcm scheduler; do
      free_port "cluster_${port}_port" || fail "no free TCP port"
    done
    COZY_CLUSTER_APISERVER_PORT=$cluster_apiserver_port COZY_CLUSTER_ETCD_PORT=$cluster_etcd_port \
      COZY_CLUSTER_ETCD_PEER_PORT=$cluster_etcd_peer_port COZY_CLUSTER_KCM_PORT=$cluster_kcm_port \
      COZY_CLUSTER_SCHEDULER_PORT=$cluster_scheduler_port \
      "$source_dir/scripts/cluster.sh" up "$work/cluster" >"$work/cluster-up.log" 2>&1 ||
      fail "scripts/cluster.sh up: $(tail -n 3 "$work/cluster-up.log")"
    # The two nodes: a real kubelet each (scripts/cluster.sh node: an image-less container
    # runtime, the test device plugin advertising the tree's vfio-bound GPUs by IOMMU group, as
    # KubeVirt's PCI plugin does) registering the Node, labelled for the class; each returns once
    # its Node is Ready with both GPUs in its allocatable, and prints the node's directory, where
    # its kubelet's root holds the pod-resources socket.
    for node in "${nodes[@]}"; do
      build_tree "$node"
      node_dir=$("$source_dir/scripts/cluster.sh" node "$work/cluster" "$node" \
        --host "$work/$node-root" --ids iommu-group --label gpu.cozystack.io/gpu-node=true \
        2>"$work/node-$node.log") || fail "scripts/cluster.sh node $node: $(tail -n 3 "$work/node-$node.log")"
      pod_resources[$node]="$node_dir/root/pod-resources/kubelet.sock"
    done
    # The kubelets chose their ports themselves: a replica's port one of them took since it was
    # chosen above is chosen again.
    for i in 0 1; do
      for var in "webhook_ports[$i]" "health_ports[$i]"; do
        if (exec 3<>"/dev/tcp/127.0.0.1/${!var}") 2>/dev/null; then
          free_port "$var" || fail "no free TCP port"
        fi
      done
    done
    # cluster.sh gives kube-apiserver a webhook client certificate of a CA of its own.
    webhook_client_ca="$work/cluster/pki/webhook-client-ca.crt"
    ;;
  kubeconfig)
    kc get --raw /version >/dev/null 2>&1 || fail "the API server of $kubeconfig does not answer"
    # Nothing the demo would create may be there already: it removes what it created.
    ! "$helm_bin" status gpu --kubeconfig "$kubeconfig" -n "$ns" >/dev/null 2>&1 ||
      fail "the cluster already has a release gpu in $ns"
    for what in "${chart_crds[@]/#/crd/}" "${nodes[@]/#/node/}" "namespace/$tenant" \
      clusterrolebinding/gpu-tenants-catalog; do
      absent "$what" || fail "the cluster already has $what"
    done
    absent kubevirt/kubevirt kubevirt ||
      fail "the cluster runs KubeVirt (kubevirt/kubevirt): the demo would change its configuration"
    # The CA of that API server's webhook client certificate, if the caller names it; without
    # it the replicas answer any caller (the opt-out), and say so.
    webhook_client_ca=${COZY_DEMO_WEBHOOK_CLIENT_CA:-}
    [ -n "$webhook_client_ca" ] ||
      echo "demo: COZY_DEMO_WEBHOOK_CLIENT_CA not set: the webhooks answer any TLS client" \
        "(--webhook-allow-unauthenticated-callers; docs/install.md, \"Who may call the webhooks\")"
    ;;
esac

# --- The webhooks' serving certificate, as cert-manager would issue it: a CA and a pair for the
# Service's name, which the API server verifies; and for 127.0.0.1, which kube-apiserver dials
# when the chart's gpu.webhook.url points there.
(cd "$work" &&
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 \
    -subj /CN=gpu-controller-ca 2>/dev/null &&
  printf 'subjectAltName=DNS:gpu-controller-webhook.%s.svc,IP:127.0.0.1\n' "$ns" >san.ext &&
  openssl req -newkey rsa:2048 -nodes -keyout tls.key -out tls.csr \
    -subj /CN=gpu-controller-webhook 2>/dev/null &&
  openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out tls.crt -days 1 \
    -extfile san.ext 2>/dev/null &&
  mkdir certs && cp tls.crt tls.key certs/) ||
  fail "openssl could not make the webhook certificate"

# --- The chart with GPUs on and the hoster's own certificate (gpu.webhook.certManager false: the
# chart sets every webhook's caBundle from the values).
cat >"$work/values.yaml" <<EOF
gpu:
  enabled: true
  webhook:
    certManager: false
    caBundle: $(base64 -w0 "$work/ca.crt")
    existingSecret: gpu-controller-webhook-tls
    # The pod network the NetworkPolicy keeps off the webhook port (required: never guessed)
    networkPolicy: {podCIDRs: [10.244.0.0/16]}
EOF
# Only the API server's webhook client certificate gets in (H9).
if [ -n "$webhook_client_ca" ]; then
  { echo "    clientCA: |"; sed 's/^/      /' "$webhook_client_ca"; } >>"$work/values.yaml"
  webhook_client_flags=(--webhook-client-ca "$webhook_client_ca")
else
  echo "    allowUnauthenticatedCallers: true" >>"$work/values.yaml"
  webhook_client_flags=(--webhook-allow-unauthenticated-callers)
fi
if [ "$mode" = fake ]; then
  # The fake has no helm client behind it: the chart's webhook configurations, applied with
  # kubectl, as `helm template` renders them with GPUs on and no cert-manager
  # (test/fakes/gpu-webhooks.yaml, written by test/fakes/render-gpu-webhooks.sh and checked
  # against the chart by demo_test), so this mode needs no helm; the demo's CA as caBundle.
  sed "s|CA_BUNDLE|$(base64 -w0 "$work/ca.crt")|" "$source_dir/test/fakes/gpu-webhooks.yaml" \
    >"$work/webhooks.yaml" || fail "could not write the chart's webhook configurations"
else
  # Installed with helm. The webhooks call the first replica on this machine; the chart's own
  # workloads stay empty (no replicas, the agents' DaemonSet on no node): the demo runs the
  # replicas and agents here, as those identities.
  cat >>"$work/values.yaml" <<EOF
    url: https://127.0.0.1:${webhook_ports[0]}
controller:
  replicas: 0
agent:
  nodeSelector: {gpu.cozystack.io/demo-no-node: "true"}
EOF
  for crd_name in "${test_crds[@]}"; do
    absent "crd/$crd_name" && own_crds+=("$crd_name")
  done
  kc apply -f "$source_dir/test/fakes/crds" >"$work/kubectl-crds.log" 2>&1 ||
    fail "kubectl could not apply test/fakes/crds: $(tail -n 2 "$work/kubectl-crds.log")"
  for name in "$ns" kubevirt; do
    absent "namespace/$name" && own_namespaces+=("$name")
  done
  own_release=1 # a failed install leaves a release behind too
  "$helm_bin" install gpu "$source_dir/charts/gpu" --kubeconfig "$kubeconfig" -n "$ns" \
    --create-namespace -f "$work/values.yaml" --set policies.kubevirtControllerUser="$kubevirt_user" \
    >"$work/helm-install.log" 2>&1 ||
    fail "helm install: $(tail -n 3 "$work/helm-install.log")"
  kc wait --for=condition=Established --timeout=60s "${chart_crds[@]/#/crd/}" \
    "${test_crds[@]/#/crd/}" >/dev/null 2>&1 || fail "the CRDs are not Established"
fi

cat >"$work/cluster.yaml" <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: $ns}
---
apiVersion: v1
kind: Namespace
metadata:
  name: $tenant
  # Set by the hoster on every tenant namespace (Cozystack's tenant chart does): the chart's
  # raw-name and usage-monitor policies select tenant namespaces by it (docs/install.md).
  labels: {gpu.cozystack.io/tenant-namespace: "true"}
EOF
# KubeVirt's own table of the host devices it passes through (what virt-handler's device plugin
# advertises on the nodes; the controller reads it as a GPU resource name).
cat >>"$work/cluster.yaml" <<EOF
---
apiVersion: v1
kind: Namespace
metadata: {name: kubevirt}
---
apiVersion: kubevirt.io/v1
kind: KubeVirt
metadata: {name: kubevirt, namespace: kubevirt}
spec:
  configuration:
    developerConfiguration: {featureGates: [HostDevices]}
    permittedHostDevices:
      pciHostDevices: [{pciVendorSelector: "10DE:20F1", resourceName: $resource}]
EOF
# The Nodes, Ready, where no real kubelet registers them (with --real-cluster each node's
# kubelet does, below).
if [ "$mode" != real-cluster ]; then
  for node in "${nodes[@]}"; do
    cat >>"$work/cluster.yaml" <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: $node
  labels: {kubernetes.io/hostname: $node, gpu.cozystack.io/gpu-node: "true"}
status:
  conditions: [{type: Ready, status: "True"}]
EOF
  done
fi
[ "$mode" = fake ] || own_namespaces+=("$tenant")
[ "$mode" != kubeconfig ] || own_nodes=1
kc apply -f "$work/cluster.yaml" >"$work/kubectl-apply.log" 2>&1 ||
  fail "kubectl could not apply the namespaces, KubeVirt's configuration and the Nodes: $(tail -n 2 "$work/kubectl-apply.log")"
if [ "$mode" = fake ]; then
  kc apply -f "$work/webhooks.yaml" >/dev/null || fail "kubectl could not apply the chart's webhooks"
fi

# --- Identities. The fake API server takes every caller as its admin. On a real one, as in a
# cluster: each agent runs with a token of the service account gpu-agent bound to a Pod on its
# Node (what kubelet mounts into the DaemonSet's pod; the node-bound policy reads the node name
# the API server puts in it), each replica with a token of gpu-controller, both issued by the API
# server (TokenRequest); the tenant is a user of a client certificate, group tenants (the catalog)
# and tenant-a-users (orders in tenant-a), bound to the chart's roles as docs/install.md says.
agent_kubeconfig() { echo "$kubeconfig"; }
controller_kubeconfig() { echo "$kubeconfig"; }
if [ "$mode" != fake ]; then
  server=$(kc config view --minify --flatten --raw -o 'jsonpath={.clusters[0].cluster.server}') ||
    fail "kubectl config view could not read $kubeconfig"
  ca_data=$(kc config view --minify --flatten --raw \
    -o 'jsonpath={.clusters[0].cluster.certificate-authority-data}')
  # kubeconfig_for FILE USER-YAML: the hoster's cluster, another user.
  kubeconfig_for() {
    local cluster_tls="    insecure-skip-tls-verify: true"
    [ -z "$ca_data" ] || cluster_tls="    certificate-authority-data: $ca_data"
    cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: demo
  cluster:
    server: $server
$cluster_tls
users:
- name: demo
  user:
$2
contexts:
- name: demo
  context: {cluster: demo, user: demo}
current-context: demo
EOF
    chmod 600 "$1"
  }
  for node in "${nodes[@]}"; do
    cat <<EOF
---
apiVersion: v1
kind: Pod
metadata:
  name: gpu-agent-$node
  namespace: $ns
  labels: {app.kubernetes.io/name: gpu-agent}
spec:
  serviceAccountName: gpu-agent
  nodeName: $node
  containers: [{name: agent, image: gpu-agent}]
EOF
  done >"$work/agent-pods.yaml"
  own_agent_pods=1
  kc apply -f "$work/agent-pods.yaml" >/dev/null || fail "kubectl could not create the agents' pods"
  for node in "${nodes[@]}"; do
    token=$(kc create token gpu-agent -n "$ns" --bound-object-kind Pod \
      --bound-object-name "gpu-agent-$node" --duration 1h) || fail "TokenRequest for gpu-agent-$node"
    kubeconfig_for "$work/agent-$node.kubeconfig" "    token: $token"
  done
  for i in 0 1; do
    token=$(kc create token gpu-controller -n "$ns" --duration 1h) ||
      fail "TokenRequest for gpu-controller"
    kubeconfig_for "$work/controller-$i.kubeconfig" "    token: $token"
  done
  # KubeVirt's controller: a service account of the kubevirt namespace that may create pods in
  # the tenant's namespace, as KubeVirt's own RBAC lets it.
  own_kubevirt_sa=1
  kc create serviceaccount kubevirt-controller -n kubevirt >/dev/null ||
    fail "kubectl could not create the service account kubevirt/kubevirt-controller"
  # (a Role of its own: the aggregated ClusterRoles such as edit have rules only where
  # kube-controller-manager runs its aggregation controller)
  kc create role demo-kubevirt-controller -n "$tenant" --verb create,get,list,delete \
    --resource pods >/dev/null &&
    kc create rolebinding demo-kubevirt-controller -n "$tenant" --role demo-kubevirt-controller \
      --serviceaccount kubevirt:kubevirt-controller >/dev/null ||
    fail "kubectl could not let kubevirt-controller create pods in $tenant"
  token=$(kc create token kubevirt-controller -n kubevirt --duration 1h) ||
    fail "TokenRequest for kubevirt-controller"
  kubevirt_kubeconfig="$work/kubevirt-controller.kubeconfig"
  kubeconfig_for "$kubevirt_kubeconfig" "    token: $token"
  agent_kubeconfig() { echo "$work/agent-$1.kubeconfig"; }
  controller_kubeconfig() { echo "$work/controller-$1.kubeconfig"; }

  own_rbac=1
  kc create rolebinding gpu-tenant -n "$tenant" --clusterrole gpu-tenant \
    --group "$tenant-users" >/dev/null || fail "kubectl could not bind gpu-tenant in $tenant"
  kc create clusterrolebinding gpu-tenants-catalog --clusterrole gpu-catalog-reader \
    --group tenants >/dev/null || fail "kubectl could not bind gpu-catalog-reader"
  # The tenant's certificate is signed by the cluster's client CA: scripts/cluster.sh's
  # DIR/pki/ca.key beside DIR/kubeconfig. Elsewhere there may be no key to sign with: then the
  # tenant's commands run as the kubeconfig's user, and the header says so.
  pki="$(dirname "$kubeconfig")/pki"
  tenant_user="alice"
  tenant_line="the kubeconfig's own user (no client CA key in $pki, as scripts/cluster.sh writes it, to sign a tenant's certificate)"
  if [ -r "$pki/ca.key" ] && [ -r "$pki/ca.crt" ] &&
    (cd "$work" &&
      openssl req -new -newkey rsa:2048 -nodes -keyout tenant.key -out tenant.csr \
        -subj "/O=tenants/O=$tenant-users/CN=$tenant_user" 2>/dev/null &&
      printf 'extendedKeyUsage=clientAuth\n' >tenant.ext &&
      openssl x509 -req -in tenant.csr -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
        -CAserial tenant.srl -CAcreateserial -days 1 -extfile tenant.ext -out tenant.crt 2>/dev/null) &&
    kubeconfig_for "$work/tenant.kubeconfig" "    client-certificate-data: $(base64 -w0 "$work/tenant.crt")
    client-key-data: $(base64 -w0 "$work/tenant.key")" &&
    [ "$(KC_AS="$work/tenant.kubeconfig" kc auth whoami -o jsonpath='{.status.userInfo.username}' \
      2>/dev/null)" = "$tenant_user" ]; then
    tenant_kubeconfig="$work/tenant.kubeconfig"
    tenant_line="the user $tenant_user (a client certificate of the cluster's CA), groups tenants and $tenant-users: ClusterRoles gpu-catalog-reader and gpu-tenant in $tenant"
  elif [ -r "$pki/ca.key" ]; then
    tenant_line="the kubeconfig's own user (a certificate signed with $pki/ca.key is not taken by the API server)"
  fi
  if [ "$mode" = real-cluster ]; then
    echo "== on a real control plane (scripts/cluster.sh up): kube-apiserver" \
      "$(kc version -o json 2>/dev/null | sed -nE 's/^ *"gitVersion": "(.*)",$/\1/p' | tail -n1) at $server"
  else
    echo "== on the cluster of $given_kubeconfig: $server"
  fi
  echo "== chart gpu installed by helm in $ns, webhooks at https://127.0.0.1:${webhook_ports[0]};" \
    "agents and replicas as the service accounts gpu-agent and gpu-controller (TokenRequest)"
  echo "== the tenant: $tenant_line"
fi

# --- Each node: its sysfs tree, its kubelet (both A100 free), its agent. With --real-cluster the
# real kubelets started with the control plane (above); elsewhere a fake kubelet serves
# pod-resources from a scenario: KubeVirt's PCI plugin advertising both GPUs, none in use.
if [ "$mode" != real-cluster ]; then
  for node in "${nodes[@]}"; do
    build_tree "$node"
    "$kubelet_bin" --socket "$work/$node.sock" \
      --scenario "$source_dir/fixtures/kubelet/a100-kubevirt-pci-idle.json" \
      >"$work/kubelet-$node.log" 2>&1 &
    pids+=($!)
    pod_resources[$node]="$work/$node.sock"
  done
fi
for node in "${nodes[@]}"; do
  wait_for 10 "the kubelet of $node serving pod-resources" test -S "${pod_resources[$node]}"
  free_port "agent_health_ports[$node]" || fail "no free TCP port"
  "$agent_bin" run --node-name "$node" --kubeconfig "$(agent_kubeconfig "$node")" \
    --sysfs-root "$work/$node-root" --pci-ids "$source_dir/fixtures/pci.ids" \
    --pod-resources "unix://${pod_resources[$node]}" --udev-source off --health-addr "127.0.0.1:${agent_health_ports[$node]}" \
    >"$work/agent-$node.log" 2>&1 &
  pids+=($!)
done
if [ "$mode" = real-cluster ]; then
  echo "== nodes: real kubelets (scripts/cluster.sh node) with a device plugin advertising each" \
    "node's two A100 as $resource; each agent reads its kubelet's pod-resources"
fi

# --- Two controller replicas, GPUs on.
for i in 0 1; do
  "$controller_bin" run --kubeconfig "$(controller_kubeconfig "$i")" --namespace "$ns" \
    --identity "gpu-controller-$i" --enable-gpu --webhook-addr "127.0.0.1:${webhook_ports[$i]}" \
    "${webhook_client_flags[@]}" --kubevirt-controller-user "$kubevirt_user" \
    --webhook-cert-dir "$work/certs" --health-addr "127.0.0.1:${health_ports[$i]}" \
    --bind-wait 5s --resync 1s --discovery-interval 500ms \
    >"$work/controller-$i.log" 2>&1 &
  pids+=($!)
done
# Their /metrics for a Prometheus (file_sd_configs), labelled as the chart's ServiceMonitors label
# them: job (the metrics Service), namespace, pod and, for an agent, its node.
if [ -n "${COZY_DEMO_SCRAPE_TARGETS:-}" ]; then
  {
    echo "["
    for i in 0 1; do
      printf '{"targets": ["127.0.0.1:%s"], "labels": {"job": "gpu-controller-metrics", "namespace": "%s", "pod": "gpu-controller-%s"}},\n' \
        "${health_ports[$i]}" "$ns" "$i"
    done
    separator=","
    for node in "${nodes[@]}"; do
      [ "$node" = "${nodes[-1]}" ] && separator=""
      printf '{"targets": ["127.0.0.1:%s"], "labels": {"job": "gpu-agent-metrics", "namespace": "%s", "pod": "gpu-agent-%s", "node": "%s"}}%s\n' \
        "${agent_health_ports[$node]}" "$ns" "$node" "$node" "$separator"
    done
    echo "]"
  } >"$COZY_DEMO_SCRAPE_TARGETS.tmp" && mv "$COZY_DEMO_SCRAPE_TARGETS.tmp" "$COZY_DEMO_SCRAPE_TARGETS" ||
    fail "could not write the scrape targets to $COZY_DEMO_SCRAPE_TARGETS"
fi
# The catalog as the Lease holder exports it on /metrics (docs/controller.md, "Catalog metrics").
leader_catalog() {
  local holder
  holder=$(jp lease/gpu-controller '{.spec.holderIdentity}' "$ns")
  [ -n "$holder" ] || return 1
  curl -sf "http://127.0.0.1:${health_ports[${holder##*-}]}/metrics" | grep '^gpu_catalog_'
}
# hook WHAT: COZY_DEMO_HOOK's command, when set, at this point of the demo.
hook() {
  [ -z "${COZY_DEMO_HOOK:-}" ] || "$COZY_DEMO_HOOK" "$1" || fail "COZY_DEMO_HOOK $1 failed"
}

# =================================================================================================
step=1
echo
echo "== 1. The nodes publish their GPUNodes; the hoster applies a GPUClass; the catalog shows free units"
for node in "${nodes[@]}"; do
  wait_for 20 "gpu-agent on $node publishing 2 allocatable GPUs" \
    field_is "gpunode/$node" '{.status.summary.allocatable}' "" 2
done
show get gpunodes -o wide
cat >"$work/class.yaml" <<EOF
apiVersion: gpu.cozystack.io/v1alpha1
kind: GPUClass
metadata: {name: $class}
spec:
  vendor: NVIDIA
  model: A100 PCIe 40GB
  mode: passthrough
  maxCount: 4
  source:
    devicePlugin: {resourceName: $resource}
  nodeSelector:
    matchLabels: {gpu.cozystack.io/gpu-node: "true"}
  onCordon: Move
EOF
echo "\$ kubectl apply -f class.yaml   # the hoster: class $class, onCordon Move"
kc apply -f "$work/class.yaml" 2>&1 | sed 's/^/  /' || fail "kubectl could not apply the class"
show get gpuclasses
for i in 0 1; do
  wait_for 30 "gpu-controller-$i ready (caches synced, webhooks serving)" \
    curl -sf "http://127.0.0.1:${health_ports[$i]}/readyz"
done
wait_for 30 "a gpu-controller replica holding the Lease" \
  field_set lease/gpu-controller '{.spec.holderIdentity}' "$ns"
echo "  (gpu-controller-0 and -1 ready; Lease holder: $(jp lease/gpu-controller '{.spec.holderIdentity}' "$ns"))"
catalog
hook 1

# =================================================================================================
step=2
echo
echo "== 2. A tenant orders GPUDevices: one that cannot be met is refused at once, one that can is bound"
order() { # order NAME COUNT: the GPUDevice's YAML
  printf '%s\n' "apiVersion: gpu.cozystack.io/v1alpha1" "kind: GPUDevice" \
    "metadata: {name: $1, namespace: $tenant}" "spec: {className: $class, count: $2}"
}
order big 3 >"$work/big.yaml"
order train 1 >"$work/train.yaml"
# The webhooks answer from their caches: wait until they have the class and the GPUNodes (a dry
# run of the order that fits goes through the same webhook and writes nothing).
wait_for 20 "the GPUDevice webhook admitting a dry run of an order of 1 $class" \
  as_tenant kc create --dry-run=server -f "$work/train.yaml"
echo "\$ kubectl create -f big.yaml        # 3 x $class: the class has 4 free, at most 2 on one node"
if as_tenant kc create -f - <"$work/big.yaml" >"$work/big.out" 2>&1; then
  fail "the order of 3 was admitted; it cannot be met (2 free on each node)"
fi
sed 's/^/  /' "$work/big.out"
grep -q "denied the request" "$work/big.out" || fail "the order of 3 was not refused by the webhook"
echo "\$ kubectl create -f train.yaml      # 1 x $class"
as_tenant kc create -f "$work/train.yaml" 2>&1 | sed 's/^/  /' || fail "the order of 1 was refused"
wait_for 15 "GPUDevice train Bound" field_is gpudevice/train '{.status.phase}' "$tenant" Bound
as_tenant show get gpudevices -n "$tenant" -o wide
held_node=$(jp gpudevice/train '{.status.nodeName}' "$tenant")
echo "  -> train is Bound on $held_node"
wait_for 15 "the usage record of train (Workload gpudevice-train, operational)" \
  field_is workload/gpudevice-train '{.status.operational}' "$tenant" true
show get workloads -n "$tenant"

hook 2

# =================================================================================================
step=3
echo
echo "== 3. The tenant starts a VMI naming its device: the webhook attaches it, the launcher is pinned"
# Labelled and annotated as charts/vm-instance renders a VM's template with gpus.devices={train}.
# KubeVirt creates the VMI from the tenant's VM, and the launcher pod below from the VMI: both with
# the hoster's kubeconfig here (the tenant's roles are the chart's, for orders only).
cat >"$work/vmi.yaml" <<EOF
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: vm1
  namespace: $tenant
  labels: {gpu.cozystack.io/device-references: "true"}
  annotations: {gpu.cozystack.io/device-references: '{"devices":["train"]}'}
spec:
  domain:
    devices: {}
EOF
echo "\$ kubectl create -f vmi.yaml        # vm1, annotation {\"devices\":[\"train\"]}"
kc create -f "$work/vmi.yaml" 2>&1 | sed 's/^/  /' || fail "the VMI vm1 was refused"
kc get vmi vm1 -n "$tenant" >/dev/null 2>&1 || fail "the VMI vm1 was not admitted"
echo "\$ kubectl get vmi vm1 -o jsonpath='{.spec.domain.devices.gpus}'"
gpus=$(jp vmi/vm1 '{range .spec.domain.devices.gpus[*]}{.name}={.deviceName}{"\n"}{end}' "$tenant")
while read -r entry; do echo "  gpus entry: $entry"; done <<<"$gpus"
echo "$gpus" | grep -q "=$resource" || fail "vm1 has no gpus entry for $resource"
as_tenant show get gpudevices -n "$tenant" -o wide
test "$(jp gpudevice/train '{.status.attachment.vmiName}' "$tenant")" = vm1 ||
  fail "train is not attached to vm1"
# The launcher pod, as virt-controller creates it for the VMI (owned by it, labelled as KubeVirt
# labels launchers and with the device-reference label the VMI carries). On real nodes it also
# asks for its GPU as virt-controller renders a gpus entry, a limit of the entry's resource
# name, so that kube-scheduler places it where that resource is free and kubelet allocates it
# one; where no kubelet runs (the fake API server, --kubeconfig's Node objects) nothing would
# place or allocate it.
launcher_limits=""
if [ "$mode" = real-cluster ]; then
  launcher_limits=", resources: {limits: {$resource: \"$(grep -c "=$resource" <<<"$gpus")\"}}"
fi
cat >"$work/launcher.yaml" <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: virt-launcher-vm1-x7k2p
  namespace: $tenant
  labels:
    kubevirt.io: virt-launcher
    vm.kubevirt.io/name: vm1
    gpu.cozystack.io/device-references: "true"
  ownerReferences:
  - apiVersion: kubevirt.io/v1
    kind: VirtualMachineInstance
    name: vm1
    uid: $(jp vmi/vm1 '{.metadata.uid}' "$tenant")
    controller: true
    blockOwnerDeletion: true
spec:
  containers: [{name: compute, image: virt-launcher$launcher_limits}]
EOF
echo "\$ kubectl create -f launcher.yaml   # virt-launcher-vm1-x7k2p, as virt-controller creates it ($kubevirt_user)"
as_kubevirt kc create -f "$work/launcher.yaml" 2>&1 | sed 's/^/  /' || fail "the launcher pod was refused"
terms='{.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms'
echo "\$ kubectl get pod virt-launcher-vm1-x7k2p -o jsonpath='{.spec.affinity...matchFields[0]}'"
echo "  $(jp pod/virt-launcher-vm1-x7k2p "${terms}[0].matchFields[0]}" "$tenant")"
pinned=$(jp pod/virt-launcher-vm1-x7k2p \
  "${terms}[0].matchFields[?(@.key==\"metadata.name\")].values[0]}" "$tenant")
[ "$pinned" = "$held_node" ] || fail "the launcher is pinned to '$pinned', not to $held_node"
echo "  -> the launcher pod is pinned to $pinned, the node of its GPU"
if [ "$mode" = real-cluster ]; then
  # kube-scheduler places it (the pin leaves it one node), kubelet admits it, its device manager
  # has the plugin allocate the GPU, and the image-less runtime "runs" it. The agent re-reads
  # pod-resources when its watch sees the node's pods change (else every 10 s), and publishes.
  wait_for 30 "kube-scheduler placing the launcher pod on $held_node" \
    field_is pod/virt-launcher-vm1-x7k2p '{.spec.nodeName}' "$tenant" "$held_node"
  wait_for 30 "kubelet on $held_node running the launcher pod" \
    field_is pod/virt-launcher-vm1-x7k2p '{.status.phase}' "$tenant" Running
  show get pod virt-launcher-vm1-x7k2p -n "$tenant" -o wide
  wait_for 20 "gpu-agent on $held_node publishing the launcher's GPU as allocated" \
    field_is "gpunode/$held_node" '{.status.summary.allocated}' "" 1
  show get gpunodes
  allocated=$(jp "gpunode/$held_node" '{.status.devices[?(@.allocated==1)].pciAddress}')
  echo "  -> on real nodes: kube-scheduler placed the launcher on $held_node, kubelet allocated it" \
    "the GPU $allocated, and the GPUNode shows it allocated"
fi

hook 3

# =================================================================================================
step=4
echo
echo "== 4. The node is cordoned; the VM ends; the device is released"
other_node=${nodes[0]}
[ "$held_node" != "$other_node" ] || other_node=${nodes[1]}
show cordon "$held_node"
wait_for 15 "train moving off the cordoned $held_node (class $class: onCordon Move)" \
  field_is gpudevice/train '{.status.nodeName}' "$tenant" "$other_node"
as_tenant show get gpudevices -n "$tenant" -o wide
moved_event() { kc get events -n "$tenant" --field-selector reason=Moved -o name | grep -q .; }
wait_for 10 "the binder's Moved Event for train" moved_event
# The leader's catalog metrics are taken as the pass that moved train ends, which may be after its
# Event: the cordon shows there once that pass is through.
leader_cordon_shown() {
  leader_catalog | grep -qx "gpu_catalog_node_not_taking_binds{node=\"$held_node\",reason=\"cordoned\"} 1"
}
wait_for 15 "the leader's catalog metrics showing $held_node cordoned" leader_cordon_shown
hook 4-cordoned
show get events -n "$tenant" --field-selector reason=Moved \
  -o custom-columns=REASON:.reason,OBJECT:.involvedObject.name,MESSAGE:.message
echo "  -> train moved to $other_node (a class with onCordon: Stay keeps it on $held_node)"
if [ "$mode" = real-cluster ]; then
  # A cordon evicts nothing: the running VM keeps its GPU where it runs; the move is where train
  # starts its next VM. The GPUNode keeps counting the unit, and the model with it.
  if ! field_is pod/virt-launcher-vm1-x7k2p '{.status.phase}' "$tenant" Running ||
    ! field_is pod/virt-launcher-vm1-x7k2p '{.spec.nodeName}' "$tenant" "$held_node"; then
    fail "the launcher pod no longer runs on the cordoned $held_node"
  fi
  field_is "gpunode/$held_node" '{.status.summary.allocated}' "" 1 ||
    fail "the GPUNode of the cordoned $held_node no longer counts the launcher's GPU"
  echo "  -> on real nodes: the cordon evicts nothing: vm1's launcher still runs on $held_node" \
    "with its GPU (1 allocated there) until the VM ends; train's next VM starts on $other_node"
fi
gpu nodes
gpu why train -n "$tenant"
show delete vmi vm1 -n "$tenant"
wait_for 15 "train detached from the ended vm1" \
  field_is gpudevice/train '{.status.attachment.vmiName}' "$tenant" ""
# The launcher pod goes by its owner reference: the garbage collector deletes it (the fake's own,
# or kube-controller-manager's, which sees a kind whose CRD came after it started only at its
# next discovery resync, every 30 s; on a loaded machine some seconds later still).
no_pods() { [ -z "$(kc get pods -n "$tenant" -o name 2>/dev/null)" ]; }
wait_for 75 "the launcher pod gone with its VMI (garbage collection)" no_pods
echo "  -> vm1 ended: its launcher pod went with it, train is detached (still held)"
if [ "$mode" = real-cluster ]; then
  wait_for 20 "gpu-agent on $held_node publishing the launcher's GPU as free again" \
    field_is "gpunode/$held_node" '{.status.summary.allocated}' "" 0
  echo "  -> on real nodes: kubelet freed the launcher's GPU, the GPUNode of $held_node shows 0 allocated"
fi
as_tenant show delete gpudevice train -n "$tenant" --timeout=20s
wait_for 15 "GPUDevice train gone" absent gpudevice/train "$tenant"
wait_for 15 "the usage record of train gone" absent workload/gpudevice-train "$tenant"
show get gpudevices,workloads -n "$tenant"
echo "  -> train released: its usage record is gone"
kc uncordon "$held_node" >/dev/null
catalog
# The same catalog as the leader exports it on /metrics for alerts and dashboards (only the Lease
# holder does: docs/controller.md, "Catalog metrics"), once a pass has seen the uncordon.
leader=$(jp lease/gpu-controller '{.spec.holderIdentity}' "$ns")
leader_port=${health_ports[${leader##*-}]}
catalog_settled() { leader_catalog | grep -qx "gpu_catalog_class_units_free{class=\"$class\"} 4"; }
wait_for 15 "the leader's catalog metrics showing the 4 units free again" catalog_settled
echo "\$ curl -s http://127.0.0.1:$leader_port/metrics | grep '^gpu_catalog_'   # $leader, the leader"
leader_catalog | sed 's/^/  /' || fail "no gpu_catalog_ metrics on the leader's /metrics"
hook 4

step="the end"
echo
case "$mode" in
  fake) stopping="2 kubelets, 2 controller replicas and the API server" ;;
  real-cluster) stopping="2 controller replicas, the 2 nodes (kubelet, runtime, device plugin) and the control plane" ;;
  kubeconfig) stopping="2 kubelets, 2 controller replicas and removing what the demo created in the cluster" ;;
esac
echo "== demo complete: stopping the 2 agents, $stopping"
