#!/usr/bin/env bash
# Launchers placed by kube-scheduler (docs/testing.md, "Real nodes"; E6, E14, C7): on a cluster
# of its own, the chart with GPUs on and its webhooks on a controller at 127.0.0.1 (as the
# chart's service account), three real nodes of `scripts/cluster.sh node` (gpu-1; pool-1, a pool
# tainted dedicated=gpu:NoSchedule; plain-1 with no GPU), each GPU node's agent on its own
# kubelet. A tenant's VMI names its order; the launcher pod, as virt-controller creates it (its
# service account, the GPU limits it renders from the VMI), is pinned by the pod webhook and
# bound by kube-scheduler to the GPU's node; kubelet's device manager gives it the GPU and the
# agent's GPUNode shows the unit allocated. Then test/support/node_fit.h (which the e2e suites use
# on the fake API server) is checked against kube-scheduler's own decisions on the same pods and
# nodes: the pin with and without the cordon's and the class's tolerations, elsewhere.
#   test/realcluster/launcher_placement_test.sh SOURCE_DIR BUILD_DIR
source "$(dirname "$0")/own_cluster.sh" "$1" "$2"
cluster="$source_dir/scripts/cluster.sh"
command -v jq >/dev/null || abort "jq is not installed (scripts/install-deps.sh installs it)"
node_fit="$build_dir/test/node_fit"
[ -x "$node_fit" ] || abort "$node_fit is not built"
ns=cozy-system
gpu=nvidia.com/GA100_A100_PCIE_40GB

controller_up "$ns"

kubevirt_controller

AGENT_NS=$ns # the agents run as the chart's: tokens bound to their pods
real_node gpu-1 a100-vfio
real_node pool-1 a100-vfio --label pool=dedicated --taint dedicated=gpu:NoSchedule
"$cluster" node "$cluster_dir" plain-1 >"$work/plain-1.out" 2>&1 || abort "node plain-1: $(cat "$work/plain-1.out")"
pass "node plain-1 (no GPU) Ready"

create_namespace tenant probe
kc label namespace tenant gpu.cozystack.io/tenant-namespace=true >/dev/null
{
  gpu_class a100 "$gpu" "maxCount: 2" "onCordon: Stay"
  gpu_class a100-pool "$gpu" "maxCount: 2" "nodeSelector: {matchLabels: {pool: dedicated}}" \
    "tolerations: [{key: dedicated, operator: Equal, value: gpu, effect: NoSchedule}]"
  order tenant train a100
  order tenant pooled a100-pool
} | kc apply -f - >/dev/null || abort "the classes and the orders"
node_of() { kc get gpudevice "$1" -n tenant -o jsonpath='{.status.nodeName}'; }
until_is 30 gpu-1 node_of train || abort "train is on '$(node_of train)', not gpu-1"
until_is 30 pool-1 node_of pooled || abort "pooled is on '$(node_of pooled)', not pool-1"
pass "the binder placed train on gpu-1 and pooled on the pool it tolerates, pool-1"

# start_vm VM DEVICE: the VMI naming DEVICE (as charts/vm-instance renders it), admitted by the
# VMI webhook, then its launcher pod as virt-controller creates it: owned by the VMI, labelled as
# KubeVirt labels launchers, one GPU limit per gpus entry the webhook gave the VMI.
start_vm() {
  local vm=$1 device=$2
  vmi tenant "$vm" "$device" | kc create -f - >/dev/null || abort "the VMI $vm was refused"
  local gpus uid
  gpus=$(kc get vmi "$vm" -n tenant -o json | jq --arg r "$gpu" '[.spec.domain.devices.gpus[]? | select(.deviceName == $r)] | length')
  [ "$gpus" = 1 ] || abort "the VMI webhook gave $vm $gpus gpus entries for $gpu"
  uid=$(kc get vmi "$vm" -n tenant -o jsonpath='{.metadata.uid}')
  cat <<EOF | KC_AS="$work/kubevirt.kubeconfig" kc create -f - >/dev/null || abort "the launcher of $vm was refused"
apiVersion: v1
kind: Pod
metadata:
  name: virt-launcher-$vm
  namespace: tenant
  labels: {kubevirt.io: virt-launcher, vm.kubevirt.io/name: $vm, gpu.cozystack.io/device-references: "true"}
  ownerReferences:
  - {apiVersion: kubevirt.io/v1, kind: VirtualMachineInstance, name: $vm, uid: "$uid", controller: true, blockOwnerDeletion: true}
spec:
  containers:
  - name: compute
    image: example.invalid/virt-launcher:1
    resources: {limits: {$gpu: "1"}}
EOF
}
pod_field() { kc get pod "$1" -n "${3:-tenant}" -o jsonpath="$2" 2>/dev/null; }
checkpoint_devices() { # checkpoint_devices NODE POD-UID: what kubelet's device manager gave it
  jq -r --arg uid "$2" '[.Data.PodDeviceEntries[] | select(.PodUID == $uid) | .DeviceIDs[]
    | .[]] | unique | join(" ")' "${node_dirs[$1]}/device-plugins/kubelet_internal_checkpoint"
}
allocated() { kc get gpunode "$1" -o json | jq '[.status.devices[].allocated] | add'; }

for case in "vm1 train gpu-1" "vm2 pooled pool-1"; do
  read -r vm device node <<<"$case"
  start_vm "$vm" "$device"
  pod=virt-launcher-$vm
  pinned=$(pod_field "$pod" '{.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchFields[0].values[0]}')
  [ "$pinned" = "$node" ] && pass "the pod webhook pinned $pod to $node, its GPU's node (E6)" ||
    fail "$pod pinned to '$pinned'"
  until_is 20 Running pod_field "$pod" '{.status.phase}' || fail "$pod is not Running: $(pod_field "$pod" '{.status}')"
  bound=$(pod_field "$pod" '{.spec.nodeName}')
  by=$(kc get events -n tenant --field-selector "involvedObject.name=$pod,reason=Scheduled" \
    -o jsonpath='{.items[0].reportingComponent}{.items[0].source.component}')
  [ "$bound" = "$node" ] && [[ "$by" == *default-scheduler* ]] &&
    pass "kube-scheduler bound $pod to $node and kubelet runs it" || fail "$pod bound to '$bound' by '$by'"
  given=$(checkpoint_devices "$node" "$(pod_field "$pod" '{.metadata.uid}')")
  [[ "$given" =~ ^0000:(3b|af):00\.0$ ]] && pass "kubelet's device manager gave $pod $given" ||
    fail "kubelet's checkpoint for $pod: '$given'"
  until_is 15 1 allocated "$node" && pass "GPUNode $node shows the launcher's unit allocated" ||
    fail "GPUNode $node allocated $(allocated "$node")"
done

# --- node_fit.h against kube-scheduler, on the same pods and nodes ---------------------------
kc cordon gpu-1 >/dev/null
until_is 10 true kc get node gpu-1 -o jsonpath='{.spec.unschedulable}' || abort "gpu-1 not cordoned"
# probe NAME FROM-POD [JQ-FILTER]: a pod in namespace probe with FROM-POD's affinity and
# tolerations (the filter edits them), asking for no GPU (node_fit.h looks at no resources); the
# scheduler's decision (bound or Unschedulable, with its message) against node_fit's on the
# node the pin names.
probe() {
  local name=$1 from=$2 filter=${3:-.} target verdict decision message
  kc get pod "$from" -n tenant -o json | jq --arg n "$name" "{apiVersion: \"v1\", kind: \"Pod\",
    metadata: {name: \$n, namespace: \"probe\"}, spec: {affinity: .spec.affinity,
    tolerations: (.spec.tolerations // []), containers: [{name: \"c\", image: \"example.invalid/probe:1\"}]}}
    | $filter" >"$work/$name.json"
  target=$(jq -r '.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchFields[0].values[0]' "$work/$name.json")
  kc get node "$target" -o json >"$work/$target.node.json"
  verdict=$("$node_fit" "$work/$name.json" "$work/$target.node.json")
  kc create -f "$work/$name.json" >/dev/null || { fail "probe $name was refused"; return; }
  decided() {
    [ -n "$(pod_field "$1" '{.spec.nodeName}' probe)" ] ||
      [ "$(pod_field "$1" '{.status.conditions[?(@.type=="PodScheduled")].reason}' probe)" = Unschedulable ]
  }
  wait_until 20 decided "$name" || { fail "kube-scheduler did not decide on $name"; return; }
  message=$(pod_field "$name" '{.status.conditions[?(@.type=="PodScheduled")].message}' probe)
  decision=fits
  [ -n "$(pod_field "$name" '{.spec.nodeName}' probe)" ] || decision="Pending: $message"
  if [ "$verdict" = fits ] && [ "$decision" = fits ]; then
    pass "$name on $target: kube-scheduler binds it, node_fit.h says it fits"
  elif [ "$verdict" != fits ] && [ "$decision" != fits ]; then
    pass "$name on $target: kube-scheduler leaves it $decision; node_fit.h: $verdict"
  else
    fail "$name on $target: kube-scheduler: $decision; node_fit.h: $verdict"
  fi
  echo "$decision" >"$work/$name.decision"
}
no_cordon='.spec.tolerations |= map(select(.key != "node.kubernetes.io/unschedulable"))'
no_pool='.spec.tolerations |= map(select(.key != "dedicated"))'
elsewhere='.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchFields[0].values = ["pool-1"]'
on_plain='.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchFields[0].values = ["plain-1"]'
probe cordoned-pin virt-launcher-vm1
probe cordoned-no-toleration virt-launcher-vm1 "$no_cordon"
grep -q "unschedulable" "$work/cordoned-no-toleration.decision" &&
  pass "a launcher without the cordon's toleration stays Pending for the scheduler's own reason" ||
  fail "cordoned, no toleration: $(cat "$work/cordoned-no-toleration.decision")"
probe pool-pin virt-launcher-vm2
probe pool-no-class-toleration virt-launcher-vm2 "$no_pool"
grep -q "untolerated taint" "$work/pool-no-class-toleration.decision" &&
  pass "a launcher without the class's tolerations stays Pending on the tainted pool: untolerated taint" ||
  fail "pool, no class toleration: $(cat "$work/pool-no-class-toleration.decision")"
probe pinned-elsewhere virt-launcher-vm1 "$elsewhere"
probe pinned-plain virt-launcher-vm1 "$on_plain"
# A node without the GPU: the launcher's GPU limit decides (node_fit.h does not look at
# resources; the scheduler does).
kc get pod virt-launcher-vm1 -n tenant -o json | jq "{apiVersion: \"v1\", kind: \"Pod\",
  metadata: {name: \"no-gpu-here\", namespace: \"probe\"}, spec: {affinity: .spec.affinity,
  tolerations: .spec.tolerations, containers: .spec.containers}} | $on_plain" | kc create -f - >/dev/null
insufficient() {
  pod_field no-gpu-here '{.status.conditions[?(@.type=="PodScheduled")].message}' probe |
    grep -q "Insufficient $gpu"
}
wait_until 20 insufficient && [ -z "$(pod_field no-gpu-here '{.spec.nodeName}' probe)" ] &&
  pass "a launcher pinned to a node without the GPU stays Pending: Insufficient $gpu" ||
  fail "no-gpu-here: $(pod_field no-gpu-here '{.status}' probe)"
kc delete pods --all -n probe --force --grace-period=0 >/dev/null 2>&1
kc delete pods --all -n tenant --timeout=30s >/dev/null 2>&1
summary
