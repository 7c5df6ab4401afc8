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
#   scripts/demo.sh                      # installs the Debian packages, builds into build/, runs
#   scripts/demo.sh --no-setup BUILD_DIR # runs on what BUILD_DIR has built (the suite's demo_test)
#
# Everything it starts stops when it ends, whatever the outcome; it writes only under a
# temporary directory, so a second run works the same. A step that does not happen within its
# bound stops the demo with "demo: FAILED at step N: ..." and exit status 1.
set -euo pipefail
source_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

setup=1
build_dir="$source_dir/build"
if [ "${1:-}" = "--no-setup" ]; then
  [ $# -eq 2 ] || {
    echo "usage: scripts/demo.sh [--no-setup BUILD_DIR]" >&2
    exit 2
  }
  setup=0
  build_dir=$(cd "$2" && pwd)
elif [ $# -ne 0 ]; then
  echo "usage: scripts/demo.sh [--no-setup BUILD_DIR]" >&2
  exit 2
fi

if [ "$setup" -eq 1 ]; then
  cd "$source_dir"
  scripts/install-deps.sh >/dev/null
  cmake -S . -B build -G Ninja >/dev/null
  cmake --build build -j"$(nproc)" --target gpu-agent gpu-agent-full gpu-controller kubectl-gpu \
    gpu-fixture fake_kubelet fake_apiserver chart-render >/dev/null
fi

agent_bin="$build_dir/agent/gpu-agent"
controller_bin="$build_dir/controller/gpu-controller"
plugin_bin="$build_dir/controller/kubectl-gpu"
fixture_bin="$build_dir/fixtures/sysfs/gpu-fixture"
kubelet_bin="$build_dir/test/fakes/fake_kubelet"
apiserver_bin="$build_dir/test/fakes/fake_apiserver"
render_bin="$build_dir/test/chart/chart-render"
for program in "$agent_bin" "$controller_bin" "$plugin_bin" "$fixture_bin" "$kubelet_bin" "$apiserver_bin" \
  "$render_bin"; do
  [ -x "$program" ] || {
    echo "demo: $program is not built (ninja -C $build_dir gpu-agent gpu-agent-full" \
      "gpu-controller kubectl-gpu gpu-fixture fake_kubelet fake_apiserver chart-render)" >&2
    exit 2
  }
done
for tool in kubectl openssl curl; do
  command -v "$tool" >/dev/null || {
    echo "demo: $tool is not installed (scripts/install-deps.sh installs it)" >&2
    exit 2
  }
done

# A short path: the kubelet sockets live here (a unix socket path is at most 107 bytes).
work=$(mktemp -d "${TMPDIR:-/tmp}/cozy-demo.XXXXXX")
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
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step=setup
# fail WHAT: names the step and what did not happen, shows the logs' ends, exits 1.
fail() {
  echo "demo: FAILED at step $step: $*" >&2
  local log
  for log in "$work"/*.log; do
    [ -s "$log" ] || continue
    echo "--- ${log##*/} (last lines)" >&2
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
# free_port VAR: a port nothing listens on now (bash's /dev/tcp: no extra tool), none given twice,
# and below the kernel's ephemeral range, where the programs' own outgoing connections (to the
# API server, kubectl's, curl's) take their source ports and could take it before it is bound.
read -r ephemeral_low _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || ephemeral_low=32768
[ "$ephemeral_low" -gt 12000 ] || fail "the ephemeral port range starts at $ephemeral_low"
taken_ports=" "
free_port() {
  local port
  for _ in $(seq 100); do
    port=$((10000 + RANDOM % (ephemeral_low - 10000)))
    case "$taken_ports" in *" $port "*) continue ;; esac
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      taken_ports+="$port "
      printf -v "$1" '%s' "$port"
      return
    fi
  done
  fail "no free TCP port found"
}

# kubectl against the fake API server, with a discovery cache of its own (not ~/.kube/cache).
kc() {
  kubectl --kubeconfig "$work/kubeconfig" --cache-dir "$work/kube-cache" --request-timeout=20s "$@"
}
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
  PATH="$build_dir/controller:$PATH" kubectl gpu "$@" --kubeconfig "$work/kubeconfig" 2>&1 |
    sed 's/^/  /'
}
catalog() { gpu catalog --nodes; }

host=a100-vfio
class=a100
resource=nvidia.com/GA100_A100_PCIE_40GB
tenant="tenant-a"
nodes=(gpu-node-1 gpu-node-2)

echo "== cozy-gpu demo: fixture host $host ($(grep -m1 '"description"' \
  "$source_dir/fixtures/sysfs/specs/$host.json" | cut -d'"' -f4)) as ${nodes[*]}"

# --- The webhooks' serving certificate, as cert-manager would issue it: a CA and a pair for the
# Service's name, which the API server verifies.
(cd "$work" &&
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 \
    -subj /CN=gpu-controller-ca 2>/dev/null &&
  printf 'subjectAltName=DNS:gpu-controller-webhook.cozy-system.svc\n' >san.ext &&
  openssl req -newkey rsa:2048 -nodes -keyout tls.key -out tls.csr \
    -subj /CN=gpu-controller-webhook 2>/dev/null &&
  openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out tls.crt -days 1 \
    -extfile san.ext 2>/dev/null &&
  mkdir certs && cp tls.crt tls.key certs/) ||
  fail "openssl could not make the webhook certificate"

# --- The chart's webhook configurations with GPUs on and the hoster's own certificate
# (gpu.webhook.certManager false: the chart sets every webhook's caBundle from the values).
cat >"$work/values.yaml" <<EOF
gpu:
  enabled: true
  webhook:
    certManager: false
    caBundle: $(base64 -w0 "$work/ca.crt")
    existingSecret: gpu-controller-webhook-tls
EOF
"$render_bin" "$source_dir/charts/gpu" -f "$work/values.yaml" --name gpu --namespace cozy-system \
  >"$work/chart.yaml" || fail "chart-render could not render charts/gpu"
awk 'function flush() {
       if (doc ~ /\nkind: (Validating|Mutating)WebhookConfiguration/) printf "---%s\n", doc
       doc = ""
     }
     /^---/ { flush(); next } { doc = doc "\n" $0 } END { flush() }' \
  "$work/chart.yaml" >"$work/webhooks.yaml"

# --- The API server, two replicas' webhook ports (the Service sends it to the first).
webhook_ports=() health_ports=()
for i in 0 1; do
  free_port "webhook_ports[$i]"
  free_port "health_ports[$i]"
done
"$apiserver_bin" --crds "$source_dir/charts/gpu/templates/crds" \
  --crds "$source_dir/test/fakes/crds" --kubeconfig-out "$work/kubeconfig" --virt-api-mutator \
  --service-endpoint "cozy-system/gpu-controller-webhook=${webhook_ports[0]}" \
  >"$work/apiserver.log" 2>&1 &
pids+=($!)
wait_for 10 "the fake API server listening" grep -q "listening on" "$work/apiserver.log"
wait_for 10 "the fake API server answering kubectl" kc get --raw /readyz

cat >"$work/cluster.yaml" <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: cozy-system}
---
apiVersion: v1
kind: Namespace
metadata: {name: $tenant}
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
kc apply -f "$work/cluster.yaml" >/dev/null ||
  fail "kubectl could not apply the namespaces and nodes"
kc apply -f "$work/webhooks.yaml" >/dev/null || fail "kubectl could not apply the chart's webhooks"

# --- Each node: its sysfs tree, its kubelet (both A100 free), its agent.
for node in "${nodes[@]}"; do
  "$fixture_bin" "$source_dir/fixtures/sysfs/specs/$host.json" "$work/$node-root" >/dev/null ||
    fail "gpu-fixture could not build $host"
  "$kubelet_bin" --socket "$work/$node.sock" \
    --scenario "$source_dir/fixtures/kubelet/a100-kubevirt-pci-idle.json" \
    >"$work/kubelet-$node.log" 2>&1 &
  pids+=($!)
done
for node in "${nodes[@]}"; do
  wait_for 10 "the fake kubelet of $node serving" test -S "$work/$node.sock"
  "$agent_bin" run --node-name "$node" --kubeconfig "$work/kubeconfig" \
    --sysfs-root "$work/$node-root" --pci-ids "$source_dir/fixtures/pci.ids" \
    --pod-resources "unix://$work/$node.sock" --udev-source off --health-addr 127.0.0.1:0 \
    >"$work/agent-$node.log" 2>&1 &
  pids+=($!)
done

# --- Two controller replicas, GPUs on.
for i in 0 1; do
  "$controller_bin" run --kubeconfig "$work/kubeconfig" --identity "gpu-controller-$i" \
    --enable-gpu --webhook-addr "127.0.0.1:${webhook_ports[$i]}" \
    --webhook-cert-dir "$work/certs" --health-addr "127.0.0.1:${health_ports[$i]}" \
    --bind-wait 5s --resync 1s --discovery-interval 500ms \
    >"$work/controller-$i.log" 2>&1 &
  pids+=($!)
done

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
  field_set lease/gpu-controller '{.spec.holderIdentity}' cozy-system
echo "  (gpu-controller-0 and -1 ready; Lease holder: $(jp lease/gpu-controller '{.spec.holderIdentity}' cozy-system))"
catalog

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
  kc create --dry-run=server -f "$work/train.yaml"
echo "\$ kubectl create -f big.yaml        # 3 x $class: the class has 4 free, at most 2 on one node"
if kc create -f - <"$work/big.yaml" >"$work/big.out" 2>&1; then
  fail "the order of 3 was admitted; it cannot be met (2 free on each node)"
fi
sed 's/^/  /' "$work/big.out"
grep -q "denied the request" "$work/big.out" || fail "the order of 3 was not refused by the webhook"
echo "\$ kubectl create -f train.yaml      # 1 x $class"
kc create -f "$work/train.yaml" 2>&1 | sed 's/^/  /' || fail "the order of 1 was refused"
wait_for 15 "GPUDevice train Bound" field_is gpudevice/train '{.status.phase}' "$tenant" Bound
show get gpudevices -n "$tenant" -o wide
held_node=$(jp gpudevice/train '{.status.nodeName}' "$tenant")
echo "  -> train is Bound on $held_node"
wait_for 15 "the usage record of train (Workload gpudevice-train, operational)" \
  field_is workload/gpudevice-train '{.status.operational}' "$tenant" true
show get workloads -n "$tenant"

# =================================================================================================
step=3
echo
echo "== 3. The tenant starts a VMI naming its device: the webhook attaches it, the launcher is pinned"
# Labelled and annotated as charts/vm-instance renders a VM's template with gpus.devices={train}.
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
show get gpudevices -n "$tenant" -o wide
test "$(jp gpudevice/train '{.status.attachment.vmiName}' "$tenant")" = vm1 ||
  fail "train is not attached to vm1"
# The launcher pod, as virt-controller creates it for the VMI (owned by it, labelled as KubeVirt
# labels launchers and with the device-reference label the VMI carries).
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
  containers: [{name: compute, image: virt-launcher}]
EOF
echo "\$ kubectl create -f launcher.yaml   # virt-launcher-vm1-x7k2p, as virt-controller creates it"
kc create -f "$work/launcher.yaml" 2>&1 | sed 's/^/  /' || fail "the launcher pod was refused"
terms='{.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms'
echo "\$ kubectl get pod virt-launcher-vm1-x7k2p -o jsonpath='{.spec.affinity...matchExpressions[0]}'"
echo "  $(jp pod/virt-launcher-vm1-x7k2p "${terms}[0].matchExpressions[0]}" "$tenant")"
pinned=$(jp pod/virt-launcher-vm1-x7k2p \
  "${terms}[0].matchExpressions[?(@.key==\"kubernetes.io/hostname\")].values[0]}" "$tenant")
[ "$pinned" = "$held_node" ] || fail "the launcher is pinned to '$pinned', not to $held_node"
echo "  -> the launcher pod is pinned to $pinned, the node of its GPU"

# =================================================================================================
step=4
echo
echo "== 4. The node is cordoned; the VM ends; the device is released"
other_node=${nodes[0]}
[ "$held_node" != "$other_node" ] || other_node=${nodes[1]}
show cordon "$held_node"
wait_for 15 "train moving off the cordoned $held_node (class $class: onCordon Move)" \
  field_is gpudevice/train '{.status.nodeName}' "$tenant" "$other_node"
show get gpudevices -n "$tenant" -o wide
moved_event() { kc get events -n "$tenant" --field-selector reason=Moved -o name | grep -q .; }
wait_for 10 "the binder's Moved Event for train" moved_event
show get events -n "$tenant" --field-selector reason=Moved \
  -o custom-columns=REASON:.reason,OBJECT:.involvedObject.name,MESSAGE:.message
echo "  -> train moved to $other_node (a class with onCordon: Stay keeps it on $held_node)"
gpu nodes
gpu why train -n "$tenant"
show delete vmi vm1 -n "$tenant"
wait_for 15 "train detached from the ended vm1" \
  field_is gpudevice/train '{.status.attachment.vmiName}' "$tenant" ""
test -z "$(kc get pods -n "$tenant" -o name 2>/dev/null)" ||
  fail "the launcher pod outlived its VMI"
echo "  -> vm1 ended: its launcher pod went with it, train is detached (still held)"
show delete gpudevice train -n "$tenant" --timeout=20s
wait_for 15 "GPUDevice train gone" absent gpudevice/train "$tenant"
wait_for 15 "the usage record of train gone" absent workload/gpudevice-train "$tenant"
show get gpudevices,workloads -n "$tenant"
echo "  -> train released: its usage record is gone"
kc uncordon "$held_node" >/dev/null
catalog

step="the end"
echo
echo "== demo complete: stopping the 2 agents, 2 kubelets, 2 controller replicas and the API server"
