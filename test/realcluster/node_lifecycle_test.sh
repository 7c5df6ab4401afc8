#!/usr/bin/env bash
# NotReady for real (docs/controller.md, "NotReady is not gone"; C7): on a cluster of its own
# whose node lifecycle controller waits 8 s for a silent kubelet (the shared fixture's waits an
# hour: its scenarios write Node objects no kubelet keeps alive), two real nodes of
# `scripts/cluster.sh node`, each with its agent on its own kubelet, and `gpu-controller run`
# with --not-ready-grace 10s. Node A's kubelet stops: kube-controller-manager marks A Unknown and
# taints it unreachable; the set of a VM that is off stays on A for the grace, then moves to B;
# the set of a VM running on A never moves; A comes back Ready. Then a VM starts on A (its
# launcher runs there, its VMI has no node yet) and A's kubelet stops again: its set never moves.
#   test/realcluster/node_lifecycle_test.sh SOURCE_DIR BUILD_DIR
export COZY_CLUSTER_NODE_GRACE=8s
source "$(dirname "$0")/own_cluster.sh" "$1" "$2"
cluster="$source_dir/scripts/cluster.sh"
gpu=nvidia.com/GA100_A100_PCIE_40GB
kc apply --server-side -f "$source_dir/charts/gpu/templates/crds" -f "$source_dir/test/fakes/crds" >/dev/null ||
  abort "the CRDs"
wait_crds >/dev/null || abort "the CRDs are not Established"
kc create namespace cozy-system >/dev/null
kc create namespace tenant >/dev/null
kc label namespace tenant gpu.cozystack.io/tenant-namespace=true >/dev/null

node_of() { kc get gpudevice "$1" -n tenant -o jsonpath='{.status.nodeName}'; }
phase_of() { kc get gpudevice "$1" -n tenant -o jsonpath='{.status.phase}'; }
ready() { kc get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}'; }

real_node node-a a100-vfio # the agents run as the admin here

# The controller, GPUs on, its webhooks served but registered nowhere (not under test here).
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$work/tls.key" -out "$work/tls.crt" -days 1 \
  -subj /CN=webhook -addext subjectAltName=IP:127.0.0.1 2>/dev/null || abort "openssl"
mkdir -p "$work/certs" && cp "$work/tls.crt" "$work/tls.key" "$work/certs/"
"$build_dir/controller/gpu-controller" run --kubeconfig "$admin_kubeconfig" --identity lifecycle \
  --enable-gpu --not-ready-grace 10s --resync 1s --health-addr off \
  --webhook-addr 127.0.0.1:0 --webhook-cert-dir "$work/certs" \
  --webhook-client-ca "$cluster_dir/pki/webhook-client-ca.crt" -v >"$work/controller.log" 2>&1 &
pids+=($!)

{
  gpu_class a100 "$gpu" "onCordon: Move"
  order tenant idle a100
  order tenant running a100
} | kc apply -f - >/dev/null || abort "the class and the orders"
until_is 30 node-a/node-a eval 'echo "$(node_of idle)/$(node_of running)"' ||
  abort "the orders were not bound to node-a: $(node_of idle)/$(node_of running)"
pass "both orders bound to node-a, the only node"
# vm_attached VMI ORDER: the VMI created in tenant, ORDER attached to it; $uid is the VMI's.
vm_attached() {
  printf '%s\n' "apiVersion: kubevirt.io/v1" "kind: VirtualMachineInstance" \
    "metadata: {name: $1, namespace: tenant}" "spec: {domain: {devices: {}}}" |
    kc apply -f - >/dev/null || abort "the VMI $1"
  uid=$(kc get vmi "$1" -n tenant -o jsonpath='{.metadata.uid}')
  kc patch gpudevice "$2" -n tenant --subresource=status --type=merge \
    -p "{\"status\":{\"attachment\":{\"vmiName\":\"$1\",\"vmiUID\":\"$uid\"}}}" >/dev/null ||
    abort "the attachment of $2"
}
# The VM of `running` runs on node-a (its VMI there, Running; KubeVirt's VMI has no status
# subresource); `idle`'s VM is off.
vm_attached vm-run running
kc patch vmi vm-run -n tenant --type=merge \
  -p '{"status":{"phase":"Running","nodeName":"node-a"}}' >/dev/null || abort "the VMI's status"
real_node node-b a100-vfio # room elsewhere: only the grace, or a running VM, keeps a set on node-a
sleep 2
[ "$(node_of idle)/$(node_of running)" = node-a/node-a ] && pass "a Ready node-a keeps both sets" ||
  fail "moved while node-a was Ready: $(node_of idle)/$(node_of running)"

# node-a's kubelet stops: kube-controller-manager, not the test, decides that it is NotReady.
stopped=$SECONDS
"$cluster" kubelet "$cluster_dir" node-a stop || abort "cluster.sh kubelet stop"
until_is 40 Unknown ready node-a ||
  abort "node-a is $(ready node-a) $((SECONDS - stopped)) s after its kubelet stopped"
unknown=$SECONDS
pass "kube-controller-manager marked node-a Unknown $((unknown - stopped)) s after its kubelet stopped"
taints=$(kc get node node-a -o jsonpath='{.spec.taints[*].key}')
[[ "$taints" == *node.kubernetes.io/unreachable* ]] && pass "and tainted it unreachable" ||
  fail "node-a's taints: $taints"
sleep 4
[ "$(node_of idle)" = node-a ] && pass "within the grace the idle VM's set waits on node-a" ||
  fail "the idle set moved $((SECONDS - unknown)) s into the grace: $(node_of idle)"
if until_is 30 node-b node_of idle; then
  moved=$((SECONDS - unknown))
  [ "$moved" -ge 8 ] && pass "after the grace (10 s) it moved to node-b ($moved s after Unknown)" ||
    fail "it moved to node-b only $moved s after Unknown, within the grace"
else
  # What the binder said, and what it saw of node-b, for a failure that happens only under load.
  fail "the idle set never left node-a: $(node_of idle) $(phase_of idle):" \
    "status $(kc get gpudevice idle -n tenant -o jsonpath='{.status}')," \
    "node-b Ready=$(ready node-b), its GPUNode $(kc get gpunode node-b -o jsonpath='{.status.conditions}')"
fi
[ "$(node_of running)" = node-a ] && pass "the set of the VM running on node-a never moves" ||
  fail "the running VM's set moved: $(node_of running)"

"$cluster" kubelet "$cluster_dir" node-a start || fail "cluster.sh kubelet start"
until_is 40 True ready node-a && pass "node-a Ready again once its kubelet is back" ||
  fail "node-a is $(ready node-a)"
sleep 2
[ "$(node_of running)/$(phase_of running)" = node-a/Bound ] && pass "the running VM's set is still Bound on node-a" ||
  fail "running: $(node_of running)/$(phase_of running)"

# A VM that starts: its launcher runs on node-a, but KubeVirt has not written the VMI's node yet
# (virt-controller does once the launcher is ready). node-a's kubelet stops again: the set stays,
# as a running VM's (docs/controller.md, "Placement", step 2), since the launcher is pinned there.
kc delete gpudevice idle -n tenant --wait=true --timeout=30s >/dev/null || abort "the idle order's delete"
order tenant starting a100 | kc apply -f - >/dev/null || abort "the order starting"
until_is 30 node-a node_of starting || abort "the order starting was not bound to node-a: $(node_of starting)"
vm_attached vm-start starting
pod_uid=$(cat <<EOF | kc create -f - -o jsonpath='{.metadata.uid}'
apiVersion: v1
kind: Pod
metadata:
  name: virt-launcher-vm-start
  namespace: tenant
  labels: {kubevirt.io: virt-launcher, gpu.cozystack.io/device-references: "true"}
  ownerReferences:
  - {apiVersion: kubevirt.io/v1, kind: VirtualMachineInstance, name: vm-start, uid: "$uid", controller: true}
spec:
  terminationGracePeriodSeconds: 1
  nodeSelector: {kubernetes.io/hostname: node-a}
  containers:
  - {name: compute, image: example.invalid/virt-launcher:1, resources: {limits: {$gpu: "1"}}}
EOF
) || abort "the launcher pod"
# virt-controller lists its pod in activePods before the pod is scheduled (C11).
kc patch vmi vm-start -n tenant --type=merge -p "{\"status\":{\"activePods\":{\"$pod_uid\":\"\"}}}" \
  >/dev/null || abort "the VMI's activePods"
until_is 40 node-a/Running kc get pod virt-launcher-vm-start -n tenant -o jsonpath='{.spec.nodeName}/{.status.phase}' ||
  abort "the launcher does not run on node-a: $(kc get pod virt-launcher-vm-start -n tenant -o wide 2>&1)"
pass "a starting VM: its launcher runs on node-a, its VMI has no node yet"
"$cluster" kubelet "$cluster_dir" node-a stop || abort "cluster.sh kubelet stop"
until_is 40 Unknown ready node-a || abort "node-a is $(ready node-a) after its kubelet stopped again"
unknown=$SECONDS
# The grace (10 s) and more: the idle set above moved within it. The model says why it stays.
why_starting() { "$build_dir/controller/kubectl-gpu" --kubeconfig "$admin_kubeconfig" why starting -n tenant 2>&1; }
sleep $((unknown + 16 - SECONDS > 0 ? unknown + 16 - SECONDS : 0))
if [ "$(node_of starting)" = node-a ] &&
  why_starting | grep -q 'node node-a is not Ready.*starts there (its launcher is alive), so its GPUs stay'; then
  pass "the starting VM's set never moves off node-a ($((SECONDS - unknown)) s after Unknown; kubectl gpu why: its launcher is alive)"
else
  fail "the starting VM's set: $(node_of starting) $(phase_of starting) $((SECONDS - unknown)) s after Unknown;" \
    "kubectl gpu why: $(why_starting)"
fi
summary
