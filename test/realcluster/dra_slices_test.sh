#!/usr/bin/env bash
# gpu-agent as the catalog's DRA driver publishes its node's ResourceSlice (docs/dra.md): on real
# nodes (a real kubelet 1.36 each), with the chart's service account and a token bound to its pod,
# the slice's devices are the node's vfio-bound GPUs with Kubernetes' standard PCI attributes;
# the real kube-scheduler allocates a device only to a claim that tolerates the catalog's taint,
# and exactly the one its selector names; another node's agent may not write the slice (the
# chart's policy, decided by kube-apiserver's CEL); kubelet prepares the claim of a GPUDevice
# Bound to its node through the agent's plugin (a CDI spec of the function's VFIO nodes) and
# unprepares it when the pod goes, while an admin's own claim of a catalog GPU is never prepared;
# kubelet deletes its node's slices when it starts and the agent puts its own back; a device
# leaving vfio-pci is one write.
#   test/realcluster/dra_slices_test.sh SOURCE_DIR BUILD_DIR CLUSTER_DIR
source "$(dirname "$0")/lib.sh"
command -v jq >/dev/null || abort "jq is not installed (scripts/install-deps.sh installs it)"
cluster="$source_dir/scripts/cluster.sh"
ns=cozy-system
install_chart "$ns" --set agent.resourceSlices=true || abort "helm install: $(cat "$work/helm-install.log")"
wait_crds >/dev/null || abort "the CRDs are not Established"
wait_until 60 test -n "$(kc get validatingadmissionpolicy gpu-agent-own-resourceslices \
  -o jsonpath='{.status.observedGeneration}' 2>/dev/null)" || abort "the slice policy has no status"
tenant="dra-$$"
create_namespace "$tenant"
on_exit "kc delete namespace $tenant --wait=false"
# The chart's DRA policies type-check clean on kube-apiserver against the kinds they read.
for policy in gpu-agent-own-resourceslices gpu-catalog-claims gpu-catalog-claim-templates; do
  checked() { [ -n "$(kc get validatingadmissionpolicy "$1" -o jsonpath='{.status.observedGeneration}')" ]; }
  wait_until 60 checked "$policy" || abort "policy $policy has no type-checking status"
  warnings=$(kc get validatingadmissionpolicy "$policy" -o jsonpath='{.status.typeChecking.expressionWarnings}')
  [ -z "$warnings" ] && pass "policy $policy type-checks without warnings" || fail "$policy: $warnings"
done

AGENT_NS=$ns # the agents run as the chart's: tokens bound to their pods
agent_args=(--resource-slices on)
# Each agent's kubelet plugin registers with its node's kubelet (its --root-dir) and writes the
# CDI specs of the claims it prepares into a directory of the node's own.
agent_node_args() { printf '%s\n' --kubelet-dir "${node_dirs[$1]}/root" --cdi-dir "$work/$1-cdi"; }
real_node node-a a100-vfio
real_node node-b a100-vfio
slice() { kc get resourceslice "$1-gpu.cozystack.io" -o json 2>/dev/null; }
field() { slice "$1" | jq -r "$2"; }

# --- A10: the slice ---------------------------------------------------------------------------
until_is 30 2 field node-a '.spec.devices | length' ||
  abort "node-a's slice: $(slice node-a) $(tail -n 5 "$work/agent-node-a.log")"
pass "gpu-agent on node-a published its ResourceSlice with its 2 vfio-bound GPUs (A10)"
got=$(field node-a '[.spec.driver, .spec.nodeName, .spec.pool.name, (.spec.pool.resourceSliceCount|tostring),
  .metadata.ownerReferences[0].kind, .metadata.ownerReferences[0].uid] | join(" ")')
want="gpu.cozystack.io node-a node-a 1 Node $(kc get node node-a -o jsonpath='{.metadata.uid}')"
[ "$got" = "$want" ] && pass "A10: its own pool on its node, owned by its Node" || fail "slice: '$got', want '$want'"
got=$(field node-a '.spec.devices[0] | [.name, .attributes["resource.kubernetes.io/pciBusID"].string,
  .attributes["resource.kubernetes.io/pcieRoot"].string, .attributes.id.string,
  .taints[0].key, .taints[0].effect] | join(" ")')
want="pci-0000-3b-00-0 0000:3b:00.0 pci0000:3a node-a/0000:3b:00.0 gpu.cozystack.io/catalog NoSchedule"
[ "$got" = "$want" ] && pass "A10: a device carries the standard PCI attributes, the catalog's id and taint, as stored" ||
  fail "device: '$got', want '$want'"

# --- F19: node-bound, decided by kube-apiserver ---------------------------------------------------
slice node-a | jq '.spec.devices = []' >"$work/slice-a.json"
expect_refused "node-b's agent may not update node-a's ResourceSlice (F19)" \
  'ValidatingAdmissionPolicy .gpu-agent-own-resourceslices.* may publish only ResourceSlices whose spec.nodeName is node-b' \
  as "${agent_kubeconfigs[node-b]}" kc replace -f "$work/slice-a.json"
jq 'del(.metadata.resourceVersion, .metadata.uid, .metadata.creationTimestamp, .metadata.managedFields)
  | .metadata.name = "node-a-forged"' "$work/slice-a.json" >"$work/forged.json"
expect_refused "node-b's agent may not create a ResourceSlice for node-a (F19)" \
  'ValidatingAdmissionPolicy .gpu-agent-own-resourceslices.* spec.nodeName is node-b' \
  as "${agent_kubeconfigs[node-b]}" kc create -f "$work/forged.json"

# --- kube-scheduler allocates only to the catalog's claims -----------------------------------
# Through the DeviceClass gpu-controller's reconciler keeps for a dra class of the A100's PCI ID
# (D20): kube-apiserver compiles its CEL, kube-scheduler selects the agent's devices with it.
device_class="dra-test-$$.gpu.cozystack.io"
"$build_dir/test/device_class" "dra-test-$$" 10DE:20F1 >"$work/device-class.json" &&
  kc apply -f "$work/device-class.json" >/dev/null ||
  abort "the reconciler's DeviceClass: $(kc apply -f "$work/device-class.json" 2>&1)"
on_exit "kc delete deviceclass $device_class --wait=false"
: >"$work/claims.yaml"
# The agent prepares only the binder's claim of a GPUDevice Bound to its node (A13): no controller
# runs here, so the admin stands in for the binder, with a GPUDevice Bound to node-b that owns
# the claim as the reconciler's claims are owned (test/realcluster/dra_vm_test.sh has the binder's
# own).
order "$tenant" tolerating binder-stand-in | kc apply -f - >/dev/null &&
  kc patch gpudevice tolerating -n "$tenant" --subresource=status --type=merge \
    -p '{"status":{"phase":"Bound","nodeName":"node-b"}}' >/dev/null ||
  abort "the GPUDevice standing for the binder's: $(kc get gpudevice tolerating -n "$tenant" -o json 2>&1)"
owner_uid=$(kc get gpudevice tolerating -n "$tenant" -o jsonpath='{.metadata.uid}')
# claim_yaml NAME [tolerating [ID [OWNER-UID]]]: a claim in the test's namespace for exactly the
# device of that id (node-b's 0000:af:00.0 by default), tolerating the catalog's taint or not,
# owned by GPUDevice NAME of that uid as the reconciler's claims are.
claim_yaml() {
  local toleration="" owner=""
  [ "${2:-}" = tolerating ] &&
    toleration="tolerations: [{key: gpu.cozystack.io/catalog, operator: Exists, effect: NoSchedule}]"
  [ -z "${4:-}" ] ||
    owner="ownerReferences: [{apiVersion: gpu.cozystack.io/v1alpha1, kind: GPUDevice, name: $1, uid: $4, controller: true}]"
  cat <<YAML
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: $1
  namespace: $tenant
  $owner
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: $device_class
        selectors: [{cel: {expression: 'device.attributes["gpu.cozystack.io"].id == "${3:-node-b/0000:af:00.0}"'}}]
        $toleration
YAML
}
for claim in tolerating untolerated admins; do
  case $claim in
    tolerating) claim_yaml "$claim" tolerating node-b/0000:af:00.0 "$owner_uid" ;;
    untolerated) claim_yaml "$claim" ;;
    # An admin's own claim of node-a's other GPU: allocated, and never prepared (A13).
    admins) claim_yaml "$claim" tolerating node-a/0000:3b:00.0 ;;
  esac >>"$work/claims.yaml"
  cat >>"$work/claims.yaml" <<YAML
---
apiVersion: v1
kind: Pod
metadata: {name: $claim, namespace: $tenant}
spec:
  resourceClaims: [{name: gpu, resourceClaimName: $claim}]
  containers: [{name: c, image: example.invalid/launcher:1, resources: {claims: [{name: gpu}]}}]
YAML
done
kc apply -f "$work/claims.yaml" >/dev/null || abort "the claims and their pods: $(kc apply -f "$work/claims.yaml" 2>&1)"
allocated() { kc get resourceclaim "$1" -n "$tenant" -o json | jq -r '.status.allocation.devices.results[0] | "\(.pool)/\(.device)"'; }
if until_is 30 node-b/pci-0000-af-00-0 allocated tolerating; then
  pass "kube-scheduler allocated the tolerating claim, through the reconciler's DeviceClass (D20), exactly the device its id names (node-b/pci-0000-af-00-0)"
else
  fail "the tolerating claim: $(kc get resourceclaim tolerating -n "$tenant" -o jsonpath='{.status}')"
fi
pod_node() { kc get pod "$1" -n "$tenant" -o jsonpath='{.spec.nodeName}'; }
until_is 10 node-b pod_node tolerating && pass "its pod was bound to the device's node by kube-scheduler" ||
  fail "pod tolerating on '$(pod_node tolerating)'"
sleep 3
if [ "$(allocated untolerated)" = null/null ] && [ -z "$(pod_node untolerated)" ]; then
  pass "a claim without the catalog's toleration gets no catalog device: unallocated, its pod unscheduled"
else
  fail "the untolerated claim: $(allocated untolerated), pod on '$(pod_node untolerated)'"
fi

# --- B5, C19: a dra class on kube-apiserver, counted as kubectl gpu reads the cluster ----------
# Both nodes' A100s (10de:20f1) are in their slices and advertised by the test device plugin as
# well (as KubeVirt's plugin would for a model in permittedHostDevices): each function is the
# device-plugin class's unit alone, and the two claims kube-scheduler allocated (node-b's
# 0000:af:00.0, node-a's 0000:3b:00.0) hold one each.
resource=$(kc get gpunode node-b -o jsonpath='{.status.resourceNames[0]}')
{
  gpu_class a100-plugin "$resource"
  gpu_class a100-dra unused 'source: {dra: {pciVendorSelector: "10DE:20F1"}}'
} >"$work/dra-classes.yaml"
kc apply -f "$work/dra-classes.yaml" >/dev/null && pass "kube-apiserver takes a GPUClass whose source is dra (B5)" ||
  fail "the dra class: $(kc apply -f "$work/dra-classes.yaml" 2>&1)"
on_exit "kc delete gpuclass a100-plugin a100-dra --ignore-not-found --wait=false"
gpu_class a100-dra-vgpu unused 'source: {dra: {pciVendorSelector: "10DE:20F1"}}' 'mode: vgpu' \
  >"$work/dra-vgpu.yaml"
expect_refused "nor a dra class of mode vgpu: the CRD's rule (B5)" \
  "source.dra sells whole PCI functions; its class's mode must be passthrough" kc apply -f "$work/dra-vgpu.yaml"
gpu_class a100-two "$resource" "source: {devicePlugin: {resourceName: $resource}, dra: {pciVendorSelector: \"10DE:20F1\"}}" \
  >"$work/dra-two.yaml"
expect_refused "nor a source of two members (B5)" "spec.source: Too many: 2: must have at most 1 item" \
  kc apply -f "$work/dra-two.yaml"
catalog() { "$build_dir/controller/kubectl-gpu" --kubeconfig "$admin_kubeconfig" catalog -o json; }
counted() { catalog | jq -r '[.classes[] | "\(.name)=\(.units)/\(.used)"] | join(" ")'; }
if until_is 20 "a100-dra=0/0 a100-plugin=4/2" counted; then
  pass "C19: the nodes' four A100s are the device-plugin class's units, not the dra class's too, and each allocated claim holds one"
else
  fail "kubectl gpu catalog (units/used): '$(counted)'"
fi

# --- F20: a tenant may not tolerate the catalog's taint ---------------------------------------
cert_kubeconfig "$work/alice.kubeconfig" alice tenants
kc create role claims -n "$tenant" --verb=create,get --resource=resourceclaims.resource.k8s.io >/dev/null
kc create rolebinding alice-claims -n "$tenant" --role=claims --user=alice >/dev/null
claim_yaml alices-own tolerating >"$work/alice-tolerating.yaml"
expect_refused "a tenant's claim that tolerates the catalog's taint is refused (F20)" \
  'ValidatingAdmissionPolicy .gpu-catalog-claims.* only gpu-controller .* may write a claim that tolerates the taint gpu.cozystack.io/catalog' \
  as "$work/alice.kubeconfig" kc create -f "$work/alice-tolerating.yaml"
claim_yaml alices-plain >"$work/alice-plain.yaml"
expect_refused "nor one of the catalog's DeviceClass without it: refused at once, saying how the GPU is ordered (F20)" \
  'ValidatingAdmissionPolicy .gpu-catalog-claims.* order the GPU as a GPUDevice of its GPUClass' \
  as "$work/alice.kubeconfig" kc create -f "$work/alice-plain.yaml"
sed "s/deviceClassName: $device_class/deviceClassName: gpu.example.com/" "$work/alice-plain.yaml" >"$work/alice-other.yaml"
expect_ok "a claim of another driver's DeviceClass is hers to make" \
  as "$work/alice.kubeconfig" kc create -f "$work/alice-other.yaml"

# --- A12: kubelet prepares the claim through the agent's plugin ---------------------------------
phase() { kc get pod "$1" -n "$tenant" -o jsonpath='{.status.phase}'; }
cdi="$work/node-b-cdi/gpu.cozystack.io-vfio_$(kc get resourceclaim tolerating -n "$tenant" -o jsonpath='{.metadata.uid}').json"
if until_is 30 Running phase tolerating; then
  pass "A12: node-b's kubelet prepared the claim through the agent's plugin and ran the pod"
else
  fail "pod tolerating is '$(phase tolerating)': $(kc get events -n "$tenant" --field-selector involvedObject.name=tolerating -o jsonpath='{.items[*].message}')"
fi
if [ -f "$cdi" ] && [ "$(jq -r '[.containerEdits.deviceNodes[].path, .devices[].containerEdits.deviceNodes[].path] | join(" ")' "$cdi")" = "/dev/vfio/vfio /dev/vfio/90" ]; then
  pass "A12: its CDI spec gives the container /dev/vfio/vfio and 0000:af:00.0's group node /dev/vfio/90"
else
  fail "the CDI spec $cdi: $(cat "$cdi" 2>&1 | tr '\n' ' ')"
fi
claim_uid=$(kc get resourceclaim tolerating -n "$tenant" -o jsonpath='{.metadata.uid}')
given="of pod $tenant/tolerating: CDI devices [gpu.cozystack.io/vfio=$claim_uid-pci-0000-af-00-0 gpu.cozystack.io/metadata=${claim_uid}_gpu]"
grep -qF "$given" "${node_dirs[node-b]}/logs/cri-runtime.log" &&
  pass "A12: kubelet gave the container the CDI devices the plugin named, VFIO and metadata (the runtime's record)" ||
  fail "the runtime's record: $(grep "of pod $tenant/tolerating" "${node_dirs[node-b]}/logs/cri-runtime.log" | tr '\n' ' ')"
# KEP-5304: the device metadata file virt-launcher reads the PCI address from, and where it is
# mounted in the container.
metadata="${node_dirs[node-b]}/root/plugins/gpu.cozystack.io/metadata/$claim_uid/gpu.json"
mounted=$(jq -r '.devices[0].containerEdits.mounts[0].containerPath' \
  "$work/node-b-cdi/gpu.cozystack.io-metadata_$claim_uid.json" 2>/dev/null)
if [ "$(jq -r '.requests[0].devices[0].attributes["resource.kubernetes.io/pciBusID"].string' "$metadata" 2>/dev/null)" = 0000:af:00.0 ] &&
  [ "$mounted" = /var/run/kubernetes.io/dra-device-attributes/resourceclaims/tolerating/gpu/gpu.cozystack.io-metadata.json ]; then
  pass "A12: the device metadata (KEP-5304) names 0000:af:00.0, mounted at $mounted"
else
  fail "the device metadata: $(cat "$metadata" 2>&1 | tr '\n' ' ') mounted at '$mounted'"
fi
grep -q "kubelet registered the DRA plugin" "$work/agent-node-b.log" &&
  pass "A12: kubelet registered the plugin (its NotifyRegistrationStatus)" || fail "no registration in node-b's agent log"
# --- A13: the admin's own claim of a catalog GPU is allocated, and never prepared --------------
until_is 30 node-a/pci-0000-3b-00-0 allocated admins && until_is 10 node-a pod_node admins ||
  fail "the admin's claim: $(allocated admins), its pod on '$(pod_node admins)'"
refusal="ResourceClaim $tenant/admins is no claim of the GPU catalog's binder (its controller owner is no GPUDevice)"
events() { kc get events -n "$tenant" --field-selector "involvedObject.name=$1" -o jsonpath='{.items[*].message}'; }
if wait_until 30 eval '[[ "$(events admins)" == *"$refusal"* ]]' && [ "$(phase admins)" != Running ] &&
  ! ls "$work/node-a-cdi"/*.json >/dev/null 2>&1; then
  pass "A13: node-a's agent refused to prepare the admin's own claim, kubelet says why on its pod, which does not run"
else
  fail "the admin's claim's pod is '$(phase admins)': $(events admins); CDI specs: $(ls "$work/node-a-cdi" 2>&1)"
fi
kc delete pod -n "$tenant" tolerating untolerated admins --grace-period=0 >/dev/null 2>&1
if wait_until 30 grep -q "unprepared a claim" "$work/agent-node-b.log" && [ ! -e "$cdi" ] &&
  [ ! -e "$metadata" ]; then
  pass "A12: the pod deleted, kubelet unprepared the claim: its CDI specs and metadata are gone"
else
  fail "the CDI spec stayed after the pod went: $(grep -i prepare "$work/agent-node-b.log" | tail -n 3 | tr '\n' ' ')"
fi
until_is 30 null/null allocated tolerating && pass "and kube-controller-manager deallocated the claim no pod uses" ||
  fail "the claim is still allocated $(allocated tolerating)"

# --- A11: no write without a change; kubelet's restart; a device leaving vfio-pci ---------------
before=$(field node-a .metadata.resourceVersion)
sleep 5 # two agent polls of kubelet, each a pass
[ "$(field node-a .metadata.resourceVersion)" = "$before" ] &&
  pass "A11: nothing changed, nothing written" || fail "node-a's slice written without a change"
generation=$(field node-a .spec.pool.generation)
"$cluster" kubelet "$cluster_dir" node-a stop || fail "cluster.sh kubelet stop"
"$cluster" kubelet "$cluster_dir" node-a start || fail "cluster.sh kubelet start"
if wait_until 30 grep -q "ResourceSlice deleted" "$work/agent-node-a.log" &&
  until_is 30 2 field node-a '.spec.devices | length'; then
  pass "A11: kubelet deleted node-a's slice when it started, and the agent put it back"
else
  fail "after kubelet's restart: slice $(slice node-a | jq -c .spec.pool), log: $(grep -i slice "$work/agent-node-a.log" | tail -n 3 | tr '\n' ' ')"
fi
[ "$(field node-a .spec.pool.generation)" -gt "$generation" ] &&
  pass "the pool's generation went on from $generation" || fail "generation $(field node-a .spec.pool.generation) after $generation"

before=$(field node-b .spec.pool.generation)
device="$work/node-b-root/sys/devices/pci0000:ae/0000:ae:00.0/0000:af:00.0"
mkdir -p "$work/node-b-root/sys/bus/pci/drivers/nvidia"
ln -sfn ../../../../bus/pci/drivers/nvidia "$device/driver"
kill -HUP "${agent_pids[node-b]}"
if until_is 20 1 field node-b '.spec.devices | length'; then
  pass "A10: the GPU that left vfio-pci left node-b's slice"
else
  fail "node-b's slice after the rebind: $(field node-b '[.spec.devices[].name] | join(",")')"
fi
[ "$(field node-b .spec.pool.generation)" = $((before + 1)) ] && pass "A11: in one write, at the next generation" ||
  fail "generation $(field node-b .spec.pool.generation) after $before"
summary
