#!/usr/bin/env bash
# A VM's GPU through DRA, end to end on a real node (docs/dra.md, "A VM on DRA GPUs"; C19, D20,
# D21, E15, A12, A13): on a cluster of its own, the chart with GPUs on and agent.resourceSlices,
# gpu-controller at 127.0.0.1 as the chart's service account, and one real node gpu-1 with two
# GPUs of two models on vfio-pci: an A100 40GB that the test device plugin advertises (as
# KubeVirt's plugin advertises a model listed in permittedHostDevices: the plugin is shown a view
# of the host where the other GPU is on another driver) and an A100 80GB that no plugin
# advertises; the agent publishes both in its ResourceSlice. A device-plugin class and a dra class
# side by side on that node, one unit each, none counted twice (C19). An order of the dra class
# Bound by the binder, its DeviceClass and ResourceClaim written by the reconciler (D20, D21), a
# second order refused at apply for want of room; the VMI naming the order given KubeVirt's DRA
# form (E15); its launcher pod, as virt-controller renders it from the VMI, pinned to gpu-1,
# kube-scheduler allocating the binder's claim exactly the bound GPU, kubelet preparing it through
# the agent (the binder's claim of a device Bound here, A13) and the container given that
# function's CDI devices (A12, the test runtime's record); the pod deleted, the claim unprepared
# and deallocated; gpu-1's slice gone a while, held still Bound there (D22); the order deleted,
# its claim gone.
#   test/realcluster/dra_vm_test.sh SOURCE_DIR BUILD_DIR
source "$(dirname "$0")/own_cluster.sh" "$1" "$2"
command -v jq >/dev/null || abort "jq is not installed (scripts/install-deps.sh installs it)"
ns=cozy-system
gpu=nvidia.com/GA100_A100_PCIE_40GB

controller_up "$ns" "agent: {resourceSlices: true}"
kubevirt_controller

# gpu-1: 0000:3b:00.0 an A100 40GB, 0000:af:00.0 an A100 80GB, both on vfio-pci (the agent's
# view, which its slice publishes); the device plugin's view has the 80GB on nvidia.
two_models() { # two_models DRIVER-OF-THE-80GB
  cat <<EOF
{"description": "an A100 40GB and an A100 80GB, the 80GB on $1",
 "functions": [
  {"address": "0000:3a:00.0", "id": "8086:2030", "class": "060400", "driver": "pcieport", "iommuGroup": 39, "numaNode": 0},
  {"address": "0000:3b:00.0", "parent": "0000:3a:00.0", "id": "10de:20f1", "subsystem": "10de:145f",
   "class": "030200", "revision": "a1", "driver": "vfio-pci", "iommuGroup": 40, "numaNode": 0},
  {"address": "0000:ae:00.0", "id": "8086:2030", "class": "060400", "driver": "pcieport", "iommuGroup": 89, "numaNode": 1},
  {"address": "0000:af:00.0", "parent": "0000:ae:00.0", "id": "10de:20b5", "subsystem": "10de:1533",
   "class": "030200", "revision": "a1", "driver": "$1", "iommuGroup": 90, "numaNode": 1}]}
EOF
}
two_models vfio-pci >"$work/two-models.json"
two_models nvidia >"$work/plugin-view.json"
fixture_root gpu-1-plugin "$work/plugin-view.json" || abort "gpu-fixture could not build the plugin's view"
AGENT_NS=$ns # the agent runs as the chart's: a token bound to its pod
agent_args=(--resource-slices on)
agent_node_args() { printf '%s\n' --kubelet-dir "${node_dirs[$1]}/root" --cdi-dir "$work/$1-cdi"; }
real_node gpu-1 "$work/two-models.json" --host "$work/gpu-1-plugin-root"
slice_devices() { kc get resourceslice gpu-1-gpu.cozystack.io -o json 2>/dev/null | jq -r '[.spec.devices[].name] | join(" ")'; }
until_is 30 "pci-0000-3b-00-0 pci-0000-af-00-0" slice_devices ||
  abort "gpu-1's slice: '$(slice_devices)' $(tail -n 5 "$work/agent-gpu-1.log")"
resources=$(kc get gpunode gpu-1 -o json | jq -r '[.status.devices[] | "\(.pciAddress)=\([.resources[]?.name] | join(","))"] | join(" ")')
[ "$resources" = "0000:3b:00.0=$gpu 0000:af:00.0=" ] &&
  pass "gpu-1: the plugin advertises the 40GB alone, the agent's slice has both GPUs" ||
  fail "gpu-1's GPUNode resources: '$resources'"

create_namespace tenant
kc label namespace tenant gpu.cozystack.io/tenant-namespace=true >/dev/null
{
  gpu_class a100 "$gpu"
  gpu_class a100-80 unused "model: A100 PCIe 80GB" 'source: {dra: {pciVendorSelector: "10DE:20B5"}}'
} | kc apply -f - >/dev/null || abort "the classes"
catalog() { "$build_dir/controller/kubectl-gpu" --kubeconfig "$admin_kubeconfig" catalog -o json; }
counted() { catalog | jq -r '[.classes[] | "\(.name)=\(.units)/\(.used)"] | join(" ")'; }
until_is 20 "a100=1/0 a100-80=1/0" counted &&
  pass "C19: on one node, the plugin's GPU is the device-plugin class's unit and the other the dra class's, none counted twice" ||
  fail "kubectl gpu catalog (units/used): '$(counted)'"
# D20: the class's DeviceClass, as the reconciler keeps it.
until_is 20 a100-80 kc get deviceclass a100-80.gpu.cozystack.io -o jsonpath='{.metadata.labels.gpu\.cozystack\.io/class}' &&
  pass "D20: the reconciler keeps DeviceClass a100-80.gpu.cozystack.io for the dra class" ||
  fail "no DeviceClass for a100-80: $(kc get deviceclass -o name 2>&1)"

# --- an order of the dra class, Bound; its claim; a second refused --------------------------------
order tenant held a100-80 | kc apply -f - >/dev/null || abort "the order held was refused"
node_of() { kc get gpudevice "$1" -n tenant -o jsonpath='{.status.phase}/{.status.nodeName}'; }
until_is 30 Bound/gpu-1 node_of held && pass "the binder placed held (class a100-80, through DRA) on gpu-1" ||
  abort "held is '$(node_of held)'"
claim_owner() { kc get resourceclaim held -n tenant -o jsonpath='{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].uid}' 2>/dev/null; }
until_is 20 "GPUDevice/$(kc get gpudevice held -n tenant -o jsonpath='{.metadata.uid}')" claim_owner &&
  pass "D21: the reconciler wrote ResourceClaim tenant/held, owned by its GPUDevice" ||
  fail "the claim of held: $(kc get resourceclaim held -n tenant -o json 2>&1 | head -c 600)"
order tenant second a100-80 >"$work/second.yaml"
expect_refused "a second order of the dra class is refused at apply: gpu-1's one A100 80GB is held" \
  "GPUDevice tenant/second orders 1 GPU of class a100-80, but only 0 are free" kc apply -f "$work/second.yaml"

# --- the VM: KubeVirt's DRA form, its launcher, the claim allocated and prepared ------------------
vmi tenant vm held | kc create -f - >/dev/null || abort "the VMI was refused"
kc get vmi vm -n tenant -o json >"$work/vmi.json"
form=$(jq -c '[.spec.resourceClaims, [.spec.domain.devices.gpus[] | {name, claimName, requestName, deviceName}]]' "$work/vmi.json")
want='[[{"name":"cozy-gpu-held","resourceClaimName":"held"}],[{"name":"cozy-gpu-held-0","claimName":"cozy-gpu-held","requestName":"gpu-0","deviceName":null}]]'
[ "$form" = "$want" ] && pass "E15: the VMI webhook gave the VM KubeVirt's DRA form for held's claim" ||
  fail "the VMI's DRA form: $form"
# The launcher pod as virt-controller renders it from the VMI: its claims, the compute
# container's claims by request.
uid=$(jq -r .metadata.uid "$work/vmi.json")
jq --arg uid "$uid" '{apiVersion: "v1", kind: "Pod",
  metadata: {name: "virt-launcher-vm", namespace: "tenant",
    labels: {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": "vm", "gpu.cozystack.io/device-references": "true"},
    ownerReferences: [{apiVersion: "kubevirt.io/v1", kind: "VirtualMachineInstance", name: "vm", uid: $uid,
      controller: true, blockOwnerDeletion: true}]},
  spec: {terminationGracePeriodSeconds: 1, resourceClaims: .spec.resourceClaims,
    containers: [{name: "compute", image: "example.invalid/virt-launcher:1",
      resources: {claims: [.spec.domain.devices.gpus[] | {name: .claimName, request: .requestName}]}}]}}' \
  "$work/vmi.json" >"$work/launcher.json"
KC_AS="$work/kubevirt.kubeconfig" kc create -f "$work/launcher.json" >/dev/null ||
  abort "the launcher pod was refused: $(KC_AS="$work/kubevirt.kubeconfig" kc create --dry-run=server -f "$work/launcher.json" 2>&1)"
pod_field() { kc get pod virt-launcher-vm -n tenant -o jsonpath="$1" 2>/dev/null; }
pinned=$(pod_field '{.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchFields[0].values[0]}')
[ "$pinned" = gpu-1 ] && pass "the pod webhook pinned the launcher to gpu-1, its GPU's node (E13)" ||
  fail "the launcher is pinned to '$pinned'"
allocated() { kc get resourceclaim held -n tenant -o json | jq -r '(.status.allocation.devices.results // []) | map("\(.request)=\(.pool)/\(.device)") | join(" ")'; }
until_is 30 gpu-0=gpu-1/pci-0000-af-00-0 allocated &&
  pass "kube-scheduler allocated the binder's claim exactly the bound GPU, gpu-1's A100 80GB" ||
  fail "the claim of held: $(allocated) $(kc get resourceclaim held -n tenant -o jsonpath='{.status}')"
if until_is 30 Running pod_field '{.status.phase}' && [ "$(pod_field '{.spec.nodeName}')" = gpu-1 ]; then
  pass "A13: gpu-1's kubelet had the agent prepare the binder's claim and runs the launcher"
else
  fail "the launcher is '$(pod_field '{.status.phase}')' on '$(pod_field '{.spec.nodeName}')': $(kc get events -n tenant --field-selector involvedObject.name=virt-launcher-vm -o jsonpath='{.items[*].message}')"
fi
claim_uid=$(kc get resourceclaim held -n tenant -o jsonpath='{.metadata.uid}')
given="of pod tenant/virt-launcher-vm: CDI devices [gpu.cozystack.io/vfio=$claim_uid-pci-0000-af-00-0 gpu.cozystack.io/metadata=${claim_uid}_gpu-0]"
grep -qF "$given" "${node_dirs[gpu-1]}/logs/cri-runtime.log" &&
  pass "A12: the compute container was given the 80GB's VFIO and metadata CDI devices (the runtime's record)" ||
  fail "the runtime's record: $(grep "of pod tenant/virt-launcher-vm" "${node_dirs[gpu-1]}/logs/cri-runtime.log" | tr '\n' ' ')"
cdi="$work/gpu-1-cdi/gpu.cozystack.io-vfio_$claim_uid.json"
[ "$(jq -r '[.devices[].containerEdits.deviceNodes[].path] | join(" ")' "$cdi" 2>/dev/null)" = /dev/vfio/90 ] &&
  pass "A12: its CDI spec names 0000:af:00.0's group node /dev/vfio/90" || fail "the CDI spec $cdi: $(cat "$cdi" 2>&1)"
until_is 20 "a100=1/0 a100-80=1/1" counted &&
  pass "C19: the catalog counts the 80GB used once, by its order and its allocated claim together" ||
  fail "kubectl gpu catalog (units/used): '$(counted)'"

# --- the VM gone: unprepared, deallocated; the order gone: its claim gone -------------------------
kc delete pod virt-launcher-vm -n tenant --grace-period=0 --force >/dev/null 2>&1
if wait_until 30 grep -q "unprepared a claim" "$work/agent-gpu-1.log" && wait_until 10 eval '[ ! -e "$cdi" ]'; then
  pass "A12: the launcher deleted, kubelet had the agent unprepare the claim"
else
  fail "the claim's CDI spec stayed: $(grep -i prepare "$work/agent-gpu-1.log" | tail -n 3 | tr '\n' ' ')"
fi
until_is 30 "" allocated && pass "kube-controller-manager deallocated the claim no pod uses" ||
  fail "the claim is still allocated: $(allocated)"

# --- D22: gpu-1's slice gone a while (kubelet deletes its node's slices when it starts) ----------
# The agent is stopped first, so the slice stays away while the binder passes: held must stay
# Bound on gpu-1 (its unit is not known, which is not "none"), and an order is told why it waits.
kill -TERM "${agent_pids[gpu-1]}" && wait "${agent_pids[gpu-1]}" 2>/dev/null
"$source_dir/scripts/cluster.sh" kubelet "$cluster_dir" gpu-1 stop >/dev/null &&
  "$source_dir/scripts/cluster.sh" kubelet "$cluster_dir" gpu-1 start >/dev/null || fail "cluster.sh kubelet restart"
no_slice() { ! kc get resourceslice gpu-1-gpu.cozystack.io >/dev/null 2>&1; }
wait_until 30 no_slice || fail "kubelet did not delete gpu-1's slice when it started"
sleep 3 # the slice's delete wakes the binder: its passes see gpu-1 without a slice
[ "$(node_of held)" = Bound/gpu-1 ] && pass "D22: with gpu-1's slice gone, held stays Bound on gpu-1" ||
  fail "D22: held is '$(node_of held)' while gpu-1's slice is gone: $(kc get gpudevice held -n tenant -o jsonpath='{.status}')"
expect_refused "D22: an order meanwhile is told gpu-1's units are not counted, not only that none is free" \
  "node gpu-1 publishes no ResourceSlice of gpu-agent now: its units there are not counted" kc apply -f "$work/second.yaml"
start_agent gpu-1
until_is 30 "pci-0000-3b-00-0 pci-0000-af-00-0" slice_devices && [ "$(node_of held)" = Bound/gpu-1 ] &&
  pass "the agent put the slice back, and held is Bound on gpu-1 still" ||
  fail "after the agent's restart: slice '$(slice_devices)', held '$(node_of held)'"

kc delete vmi vm -n tenant --wait=false >/dev/null
kc delete gpudevice held -n tenant --wait=false >/dev/null
gone() { ! kc get resourceclaim held -n tenant >/dev/null 2>&1 && ! kc get gpudevice held -n tenant >/dev/null 2>&1; }
wait_until 30 gone && pass "D21: the order deleted, its finalizer released and its claim gone" ||
  fail "after the order's delete: $(kc get resourceclaim,gpudevice -n tenant 2>&1 | tr '\n' ' ')"
until_is 20 "a100=1/0 a100-80=1/0" counted && pass "and its unit is free again" ||
  fail "kubectl gpu catalog (units/used): '$(counted)'"
summary
