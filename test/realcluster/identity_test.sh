#!/usr/bin/env bash
# Identities as in a cluster: the agents run as the chart's service account with
# tokens the real API server issues, bound to a Pod on a Node, so the node-bound policy
# (F1, F2; docs/gpunode.md) is decided by kube-apiserver's own CEL on the user extras its
# authenticator sets; bare-metal agents are client-certificate users; a tenant is a
# client-certificate user in a tenant group with the role docs/install.md recommends.
#   test/realcluster/identity_test.sh SOURCE_DIR BUILD_DIR CLUSTER_DIR
source "$(dirname "$0")/lib.sh"

ns=cozy-system
install_chart "$ns" || abort "helm install: $(cat "$work/helm-install.log")"
wait_crds >/dev/null || abort "the CRDs are not Established"
# The policies are enforced once the API server's policy informer has them: wait until the
# type-checking status names them, then a little for the admission plugin's own informer.
wait_until 60 test -n "$(kc get validatingadmissionpolicy gpu-agent-own-gpunode \
  -o jsonpath='{.status.observedGeneration}' 2>/dev/null)" || abort "the node-bound policy has no status"

# Two real nodes (scripts/cluster.sh node: a kubelet and the test device plugin on the fixture
# host a100-vfio; docs/testing.md, "Real nodes"), and on each an agent pod of the DaemonSet's
# service account, admitted by that node's kubelet: the API server issues node-bound tokens for it.
declare -A node_dirs
for node in node-a node-b; do
  fixture_root "$node" a100-vfio || abort "gpu-fixture could not build a100-vfio"
  node_dirs[$node]=$("$source_dir/scripts/cluster.sh" node "$cluster_dir" "$node" \
    --host "$work/$node-root" --label gpu.cozystack.io/gpu-node=true 2>"$work/node-$node.log") ||
    abort "scripts/cluster.sh node $node: $(cat "$work/node-$node.log")"
  on_exit "'$source_dir/scripts/cluster.sh' node-down '$cluster_dir' $node"
  agent_pod "$ns" "$node"
done >"$work/pods.yaml"
kc apply -f "$work/pods.yaml" >/dev/null || abort "kubectl could not create the agent pods"
on_exit "kc delete -f '$work/pods.yaml' --force --grace-period=0 --wait=false"

# A token for node's agent pod: what kubelet mounts into it (TokenRequest bound to the Pod).
for node in node-a node-b; do
  token=$(kc create token gpu-agent -n "$ns" --bound-object-kind Pod \
    --bound-object-name "gpu-agent-$node" --duration 1h) || abort "TokenRequest for gpu-agent-$node"
  token_kubeconfig "$work/agent-$node.kubeconfig" "$token"
done
whoami_extra() { as "$1" kc auth whoami -o jsonpath='{.status.userInfo.extra.authentication\.kubernetes\.io/node-name}'; }
extra=$(whoami_extra "$work/agent-node-b.kubeconfig")
if [ "$extra" = '["node-b"]' ] || [ "$extra" = node-b ]; then
  pass "the pod-bound token of node-b's agent carries the node name as a user extra"
else
  fail "node-b's token's node-name extra is '$extra'"
fi

# agent_publishes NODE KUBECONFIG WHAT: the real `gpu-agent run` for NODE (fixture host
# a100-vfio, its node's kubelet) with those credentials publishes GPUNode NODE with its 2 GPUs,
# each 1 unit kubelet lists allocatable.
agent_publishes() {
  local node=$1 kubeconfig=$2 what=$3
  "$build_dir/agent/gpu-agent" run --node-name "$node" --kubeconfig "$kubeconfig" \
    --sysfs-root "$work/$node-root" --pci-ids "$source_dir/fixtures/pci.ids" \
    --pod-resources "unix://${node_dirs[$node]}/root/pod-resources/kubelet.sock" \
    --udev-source off --dbus off --health-addr off >"$work/agent-$node.log" 2>&1 &
  pids+=($!)
  gpus_published() {
    [ "$(kc get gpunode "$1" -o jsonpath='{.status.summary.gpus} {.status.devices[*].allocatable}' 2>/dev/null)" = "2 1 1" ]
  }
  if wait_until 30 gpus_published "$node"; then
    pass "$what published GPUNode $node: 2 GPUs, 1 unit each from its kubelet"
  else
    fail "GPUNode $node not published by $what: $(tail -n 5 "$work/agent-$node.log" | tr '\n' ' ')"
  fi
}

# The real agent on node-a, with node-a's token: it creates and publishes its own GPUNode (F1).
agent_publishes node-a "$work/agent-node-a.kubeconfig" "gpu-agent on node-a (its pod-bound token, F1)"
owner=$(kc get gpunode node-a -o jsonpath='{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}')
[ "$owner" = Node/node-a ] && pass "GPUNode node-a is owned by its Node" || fail "owner: $owner"

patch='{"status":{"summary":{"gpus":7}}}'
# F2: another node's credentials are refused by the policy, with its message.
expect_refused "node-b's agent may not patch GPUNode node-a's status (F2)" \
  'ValidatingAdmissionPolicy .gpu-agent-own-gpunode.* may write only GPUNode node-b, not node-a' \
  raw_patch "$work/agent-node-b.kubeconfig" /apis/gpu.cozystack.io/v1alpha1/gpunodes/node-a/status "$patch"
cat >"$work/gpunode-a.yaml" <<EOF
apiVersion: gpu.cozystack.io/v1alpha1
kind: GPUNode
metadata: {name: node-a2}
EOF
expect_refused "node-b's agent may not create another node's GPUNode" \
  'may write only GPUNode node-b' as "$work/agent-node-b.kubeconfig" kc create -f "$work/gpunode-a.yaml"
expect_ok "node-a's agent may patch its own GPUNode's status" \
  raw_patch "$work/agent-node-a.kubeconfig" /apis/gpu.cozystack.io/v1alpha1/gpunodes/node-a/status '{"status":{"summary":{"gpus":2}}}'
expect_refused "node-a's agent may not change status.conditions (the binder's)" \
  'may not change status.conditions' \
  raw_patch "$work/agent-node-a.kubeconfig" /apis/gpu.cozystack.io/v1alpha1/gpunodes/node-a/status '{"status":{"conditions":[{"type":"Schedulable","status":"False","reason":"X","message":"x","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}'

# A token of the service account not bound to a pod carries no node name: refused (fail closed).
token=$(kc create token gpu-agent -n "$ns" --duration 1h) || abort "TokenRequest for gpu-agent"
token_kubeconfig "$work/agent-unbound.kubeconfig" "$token"
expect_refused "an agent token bound to no pod is refused: no node name" \
  "credentials carry no node name" \
  raw_patch "$work/agent-unbound.kubeconfig" /apis/gpu.cozystack.io/v1alpha1/gpunodes/node-a/status "$patch"

# Bare-metal agents: a client certificate, CN gpu.cozystack.io:agent:<node>, O the agents' group.
cert_kubeconfig "$work/bm-node-b.kubeconfig" gpu.cozystack.io:agent:node-b gpu.cozystack.io:agents
expect_refused "a bare-metal agent of node-b may not patch GPUNode node-a" \
  'may write only GPUNode node-b, not node-a' \
  raw_patch "$work/bm-node-b.kubeconfig" /apis/gpu.cozystack.io/v1alpha1/gpunodes/node-a/status "$patch"
agent_publishes node-b "$work/bm-node-b.kubeconfig" "a bare-metal gpu-agent (client certificate)"
# Someone in the agents' group whose name is no agent's: no node name, refused.
cert_kubeconfig "$work/bm-other.kubeconfig" mallory gpu.cozystack.io:agents
expect_refused "a member of the agents' group without an agent's name is refused" \
  "credentials carry no node name" \
  raw_patch "$work/bm-other.kubeconfig" /apis/gpu.cozystack.io/v1alpha1/gpunodes/node-b/status "$patch"

# --- a tenant ------------------------------------------------------------------------------
# alice, in the group tenants; the chart's gpu-tenant ClusterRole bound in her namespace (orders)
# and cluster-wide (the catalog), as docs/install.md recommends.
create_namespace tenant-a tenant-b
on_exit "kc delete namespace tenant-a tenant-b --wait=false"
kc create rolebinding gpu-tenant -n tenant-a --clusterrole gpu-tenant --group tenants >/dev/null
kc create clusterrolebinding gpu-tenant-catalog --clusterrole gpu-catalog-reader --group tenants >/dev/null
on_exit "kc delete clusterrolebinding gpu-tenant-catalog"
cert_kubeconfig "$work/alice.kubeconfig" alice tenants
cat >"$work/order.yaml" <<EOF
apiVersion: gpu.cozystack.io/v1alpha1
kind: GPUDevice
metadata: {name: train}
spec: {className: a100, count: 1}
EOF
expect_ok "the tenant may read the catalog (GPU classes)" as "$work/alice.kubeconfig" kc get gpuclasses
expect_ok "the tenant may order in her namespace" \
  as "$work/alice.kubeconfig" kc create -n tenant-a -f "$work/order.yaml"
expect_refused "the tenant may not order in another tenant's namespace" \
  'forbidden: User "alice" cannot create resource "gpudevices"' \
  as "$work/alice.kubeconfig" kc create -n tenant-b -f "$work/order.yaml"
expect_refused "the tenant may not write her order's status (the binder's)" \
  'User \\"alice\\" cannot patch resource \\"gpudevices/status\\"' \
  raw_patch "$work/alice.kubeconfig" /apis/gpu.cozystack.io/v1alpha1/namespaces/tenant-a/gpudevices/train/status \
  '{"status":{"phase":"Bound"}}'
expect_refused "the tenant may not write GPUNodes" 'User \\"alice\\" cannot patch' \
  raw_patch "$work/alice.kubeconfig" /apis/gpu.cozystack.io/v1alpha1/gpunodes/node-a/status "$patch"
expect_ok "the tenant may delete her order" as "$work/alice.kubeconfig" kc delete gpudevice train -n tenant-a
summary
