#!/usr/bin/env bash
# The agent on real kubelets (docs/testing.md, "Real nodes"; docs/pod-resources.md): nodes of
# `scripts/cluster.sh node` (a real kubelet 1.36, its device manager, the test device plugin on a
# fixture host), pods placed by the real kube-scheduler and admitted by kubelet, and each node's
# `gpu-agent run` reading its own kubelet's pod-resources socket as the chart's agent would (a
# token bound to its pod on that node). What kubelet says is the oracle: its node allocatable,
# its device checkpoint (which device it gave which pod), and the pods' phases.
#   test/realcluster/real_node_test.sh SOURCE_DIR BUILD_DIR CLUSTER_DIR
source "$(dirname "$0")/lib.sh"
command -v jq >/dev/null || abort "jq is not installed (scripts/install-deps.sh installs it)"
cluster="$source_dir/scripts/cluster.sh"
ns=cozy-system
install_chart "$ns" || abort "helm install: $(cat "$work/helm-install.log")"
wait_crds >/dev/null || abort "the CRDs are not Established"
create_namespace "rn-$$"
tenant="rn-$$"
on_exit "kc delete namespace $tenant --wait=false"

gpu_a100=nvidia.com/GA100_A100_PCIE_40GB
gpu_t4=nvidia.com/GRID_T4-2Q

AGENT_NS=$ns # the agents run as the chart's: tokens bound to their pods
# dev NODE ADDRESS FIELD: one field of a GPUNode device.
dev() { kc get gpunode "$1" -o jsonpath="{.status.devices[?(@.pciAddress==\"$2\")].$3}" 2>/dev/null; }
# expect_dev WHAT NODE ADDRESS FIELD VALUE [SECONDS]: the field reaches VALUE (the agent polls
# kubelet every 2 s here, and reads it again on each change of its node's pods).
expect_dev() {
  local what=$1 node=$2 address=$3 field=$4 value=$5 seconds=${6:-15}
  if until_is "$seconds" "$value" dev "$node" "$address" "$field"; then
    pass "$what"
  else
    fail "$what: $node $address $field is '$(dev "$node" "$address" "$field")', expected $value"
  fi
}
# kubelet's own record of which devices it gave a pod: its device manager's checkpoint.
checkpoint_devices() { # checkpoint_devices NODE POD-UID
  jq -r --arg uid "$2" '[.Data.PodDeviceEntries[] | select(.PodUID == $uid) | .DeviceIDs[]
    | .[]] | unique | join(" ")' "${node_dirs[$1]}/device-plugins/kubelet_internal_checkpoint"
}
# pod NAME NODE-SELECTOR RESOURCE COUNT [IMAGE]: a pod limiting COUNT of RESOURCE, as a launcher
# asks for its GPUs, for kube-scheduler to place.
pod() {
  cat <<EOF | kc apply -f - >/dev/null
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: $tenant}
spec:
  restartPolicy: Never
  nodeSelector: {kubernetes.io/hostname: $2}
  containers:
  - name: compute
    image: ${5:-example.invalid/virt-launcher:1}
    resources: {limits: {$3: "$4"}}
EOF
}
phase() { kc get pod "$1" -n "$tenant" -o jsonpath='{.status.phase}' 2>/dev/null; }

a=rn-a100-$$ b=rn-t4-$$ c=rn-group-$$
real_node "$a" a100-vfio
real_node "$b" t4-mdev
real_node "$c" a100-vfio --ids iommu-group
# The tenant's pods go while their kubelets still run (first thing at the end).
on_exit "kc delete pods --all -n $tenant --timeout=30s"

# --- what the plugins advertise, resolved (A1, A2, A6) -----------------------------------
for address in 0000:3b:00.0 0000:af:00.0; do
  expect_dev "A2: PCI-address ID $address resolves to its function on $a" "$a" "$address" allocatable 1
  expect_dev "A2: IOMMU-group ID of $address (vfio-bound) resolves to its function on $c" "$c" "$address" allocatable 1
done
expect_dev "A5: a device kubelet lists allocatable is Healthy" "$a" 0000:3b:00.0 health Healthy
names=$(kc get gpunode "$a" -o jsonpath='{.status.resourceNames}')
[ "$names" = "[\"$gpu_a100\"]" ] && pass "A1: the resource the plugin registered is the node's resource name" ||
  fail "resourceNames of $a: $names"
expect_dev "A6: the mdev parent counts both of its mdevs (UUID IDs)" "$b" 0000:5e:00.0 allocatable 2
node_units=$(kc get node "$a" -o jsonpath="{.status.allocatable.nvidia\.com/GA100_A100_PCIE_40GB}")
summed=$(kc get gpunode "$a" -o json | jq '[.status.devices[].allocatable] | add')
[ "$node_units" = "$summed" ] && pass "the GPUNode's units are kubelet's node allocatable ($summed)" ||
  fail "kubelet's allocatable $node_units, the GPUNode's $summed"

# --- a pod placed by kube-scheduler and admitted by kubelet --------------------------------
pod vm-1 "$a" "$gpu_a100" 1
until_is 20 Running phase vm-1 || abort "vm-1 is not Running: $(kc get pod vm-1 -n "$tenant" -o jsonpath='{.status}')"
bound=$(kc get pod vm-1 -n "$tenant" -o jsonpath='{.spec.nodeName}')
by=$(kc get events -n "$tenant" --field-selector involvedObject.name=vm-1,reason=Scheduled \
  -o jsonpath='{.items[0].reportingComponent}{.items[0].source.component}')
[ "$bound" = "$a" ] && [[ "$by" == *default-scheduler* ]] &&
  pass "kube-scheduler bound vm-1 to $a" || fail "vm-1 bound to '$bound' by '$by'"
uid=$(kc get pod vm-1 -n "$tenant" -o jsonpath='{.metadata.uid}')
held=$(checkpoint_devices "$a" "$uid")
other=0000:3b:00.0
[ "$held" = 0000:3b:00.0 ] && other=0000:af:00.0
[[ "$held" =~ ^0000:(3b|af):00\.0$ ]] && pass "kubelet's device manager gave vm-1 $held" ||
  fail "kubelet's checkpoint for vm-1: '$held'"
expect_dev "A1: the device kubelet gave vm-1 is allocated on the GPUNode" "$a" "$held" allocated 1
expect_dev "the other device stays free" "$a" "$other" allocated 0 1
# No room for two more: the scheduler's own reason, and the pod stays Pending.
pod vm-2 "$a" "$gpu_a100" 2
unschedulable() {
  kc get pod vm-2 -n "$tenant" -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}' |
    grep -q "Insufficient $gpu_a100"
}
wait_until 20 unschedulable && [ "$(phase vm-2)" = Pending ] &&
  pass "a pod asking for more than the node has free stays Pending: Insufficient $gpu_a100" ||
  fail "vm-2: $(kc get pod vm-2 -n "$tenant" -o jsonpath='{.status}')"
kc delete pod vm-2 -n "$tenant" --wait=false >/dev/null

# A6: two mdevs of one parent in one pod.
pod vgpu "$b" "$gpu_t4" 2
until_is 20 Running phase vgpu || fail "vgpu is not Running"
expect_dev "A6: a pod holding both mdevs: their parent has 2 units allocated" "$b" 0000:5e:00.0 allocated 2
# Group IDs: the unit kubelet gave is counted on the group's function.
pod grp "$c" "$gpu_a100" 1
until_is 20 Running phase grp || fail "grp is not Running"
group=$(checkpoint_devices "$c" "$(kc get pod grp -n "$tenant" -o jsonpath='{.metadata.uid}')")
group_fn=$(ls "$work/$c-root/sys/kernel/iommu_groups/$group/devices" 2>/dev/null)
expect_dev "A2: IOMMU group $group given to a pod: its function $group_fn is allocated" "$c" "$group_fn" allocated 1

# --- deleted and finished pods free their units (A7) -------------------------------------
kc delete pod vm-1 -n "$tenant" --wait=true --timeout=30s >/dev/null
expect_dev "a deleted pod's unit is free again" "$a" "$held" allocated 0
pod job-ok "$a" "$gpu_a100" 1 example.invalid/job:exit-0
pod job-failed "$a" "$gpu_a100" 1 example.invalid/job:exit-1
jobs_phases() { echo "$(phase job-ok)/$(phase job-failed)"; }
until_is 30 Succeeded/Failed jobs_phases ||
  fail "the jobs did not end: $(phase job-ok)/$(phase job-failed)"
for job in job-ok job-failed; do
  [ -n "$(checkpoint_devices "$a" "$(kc get pod "$job" -n "$tenant" -o jsonpath='{.metadata.uid}')")" ] ||
    fail "kubelet's checkpoint holds no device for $job"
done
expect_dev "A7: pods in a final phase (Succeeded, Failed) hold nothing: 0000:3b:00.0 free" "$a" 0000:3b:00.0 allocated 0
expect_dev "A7: pods in a final phase hold nothing: 0000:af:00.0 free" "$a" 0000:af:00.0 allocated 0
# kubelet 1.36 itself gives a finished pod's device to the next pod (docs/pod-resources.md).
pod vm-3 "$a" "$gpu_a100" 2
until_is 20 Running phase vm-3 &&
  pass "kubelet admits a pod taking both devices the finished pods still hold in its checkpoint" ||
  fail "vm-3: $(kc get pod vm-3 -n "$tenant" -o jsonpath='{.status}')"
expect_dev "both devices allocated to vm-3" "$a" 0000:af:00.0 allocated 1
kc delete pod vm-3 job-ok job-failed -n "$tenant" --wait=true --timeout=30s >/dev/null
expect_dev "vm-3 deleted: free again" "$a" 0000:af:00.0 allocated 0

# A7 with kubelet's older List: the gate KubeletPodResourcesListUseActivePods off makes 1.36 list
# every pod it knows, finished ones too, as 1.32 and 1.33 did (docs/pod-resources.md). Even then
# kubelet 1.36 frees a finished pod's devices before it answers (its device manager's
# UpdateAllocatedDevices), so no device of a Succeeded or Failed pod is listed: a scan that
# counts every listed pod as active finds none, and the agent counts both devices free.
d=rn-legacy-$$
real_node "$d" a100-vfio --feature-gates KubeletPodResourcesListUseActivePods=false
pod old-ok "$d" "$gpu_a100" 1 example.invalid/job:exit-0
pod old-failed "$d" "$gpu_a100" 1 example.invalid/job:exit-1
old_phases() { echo "$(phase old-ok)/$(phase old-failed)"; }
until_is 30 Succeeded/Failed old_phases || fail "the jobs on $d did not end: $(old_phases)"
listed() {
  "$build_dir/agent/gpu-agent" scan --sysfs-root "$work/$d-root" --pci-ids "$source_dir/fixtures/pci.ids" \
    --pod-resources "unix://${node_dirs[$d]}/root/pod-resources/kubelet.sock" 2>/dev/null |
    jq '[.status.devices[].allocated] | add'
}
[ "$(listed)" = 0 ] && pass "kubelet 1.36 with the old List lists no device of a finished pod either" ||
  fail "List with the gate off: $(listed) devices held by finished pods"
expect_dev "A7: a Succeeded pod's device is free (old List)" "$d" 0000:3b:00.0 allocated 0
expect_dev "A7: a Failed pod's device is free (old List)" "$d" 0000:af:00.0 allocated 0
kc delete pod old-ok old-failed -n "$tenant" --wait=false >/dev/null

# --- health (A5) -------------------------------------------------------------------------
echo 0000:af:00.0 >"${node_dirs[$a]}/unhealthy"
expect_dev "A5: a device its plugin calls Unhealthy leaves allocatable" "$a" 0000:af:00.0 allocatable 0
expect_dev "A5: and is Unhealthy (advertised before on this run)" "$a" 0000:af:00.0 health Unhealthy 1
# kubelet's node status follows at its next update (every 2 s here).
until_is 10 1 kc get node "$a" -o jsonpath="{.status.allocatable.nvidia\.com/GA100_A100_PCIE_40GB}" &&
  pass "kubelet's node allocatable agrees: 1" || fail "node allocatable after Unhealthy"
: >"${node_dirs[$a]}/unhealthy"
expect_dev "A5: healthy again: back in allocatable" "$a" 0000:af:00.0 health Healthy

# --- a plugin restart: its devices all gone from kubelet for seconds, then back -------------
# kubelet lists none of the resource's devices while its plugin is away; the agent keeps them
# for its grace (10 s) rather than publish zeros the binder would take for failed GPUs.
node_units() { kc get node "$a" -o jsonpath="{.status.allocatable.nvidia\.com/GA100_A100_PCIE_40GB}"; }
before=$(kc get gpunode "$a" -o jsonpath='{.metadata.resourceVersion}')
plugin_pid=$(awk '$1 == "gpu-device-plugin" {p = $2} END {print p}' "${node_dirs[$a]}/pids")
mapfile -d '' plugin_args <"/proc/$plugin_pid/cmdline"
kill -TERM "$plugin_pid"
until_is 15 0 node_units && pass "its plugin stopped: kubelet lists none of the resource's devices" ||
  fail "kubelet's allocatable with the plugin stopped: $(node_units)"
sleep 3 # at least one agent read of kubelet meanwhile (every 2 s)
setsid "${plugin_args[@]}" >>"${node_dirs[$a]}/logs/gpu-device-plugin.log" 2>&1 </dev/null &
echo "gpu-device-plugin $!" >>"${node_dirs[$a]}/pids"
until_is 15 2 node_units && pass "the plugin is back: kubelet lists both devices again" ||
  fail "kubelet's allocatable with the plugin back: $(node_units)"
sleep 3
after=$(kc get gpunode "$a" -o jsonpath='{.metadata.resourceVersion}')
[ "$before" = "$after" ] && pass "the agent published no zeros while the plugin was away (it held the counts)" ||
  fail "GPUNode $a written while the plugin was away: $(grep -i "published" "$work/agent-$a.log" | tail -n 3)"

# --- a kubelet restart: socket gone and back, the plugin registers again ------------------
before=$(kc get gpunode "$a" -o jsonpath='{.metadata.resourceVersion}')
"$cluster" kubelet "$cluster_dir" "$a" stop || fail "cluster.sh kubelet stop"
sleep 3
[ ! -S "${node_dirs[$a]}/root/pod-resources/kubelet.sock" ] || [ -n "$(pgrep -f "${node_dirs[$a]}/kubelet.yaml")" ] &&
  fail "the kubelet still runs" || pass "kubelet stopped"
"$cluster" kubelet "$cluster_dir" "$a" start || fail "cluster.sh kubelet start"
wait_until 20 grep -q "registering again" "${node_dirs[$a]}/logs/gpu-device-plugin.log" &&
  pass "the plugin registered again with the restarted kubelet" ||
  fail "the plugin did not register again: $(tail -n 3 "${node_dirs[$a]}/logs/gpu-device-plugin.log")"
sleep 6 # three agent polls of the restarted kubelet
after=$(kc get gpunode "$a" -o jsonpath='{.metadata.resourceVersion}')
[ "$before" = "$after" ] && pass "the agent wrote nothing across the kubelet restart (nothing changed)" ||
  fail "GPUNode $a written across the restart: $(grep -i "publish\|wrote" "$work/agent-$a.log" | tail -n 3)"
pod vm-4 "$a" "$gpu_a100" 1
until_is 20 Running phase vm-4 || fail "vm-4 on the restarted kubelet is not Running"
held=$(checkpoint_devices "$a" "$(kc get pod vm-4 -n "$tenant" -o jsonpath='{.metadata.uid}')")
expect_dev "the agent reads the restarted kubelet: vm-4's device allocated" "$a" "$held" allocated 1
kill -0 "${pids[0]}" 2>/dev/null && pass "the agent survived the restart" || fail "the agent of $a exited"
summary
