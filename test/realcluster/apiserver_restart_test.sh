#!/usr/bin/env bash
# After kube-apiserver restarts, no order is refused for want of a parameter kind the restarted
# server has not resolved yet (docs/policies.md, "After kube-apiserver restarts"; F5). On a
# cluster of its own: the chart with GPUs on (its CRDs and policies; its webhook configurations
# removed, as no controller runs here and they would refuse every order first), a class being
# deleted and one that is not. The deleting class's orders are refused by the policy before the
# restart; for 40 s after the restarted server is ready an order of the other class is sent
# again and again (server-side dry run), and none may be refused naming the parameter kind;
# then the deleting class's orders are refused by the policy again.
#   test/realcluster/apiserver_restart_test.sh SOURCE_DIR BUILD_DIR
source "$(dirname "$0")/own_cluster.sh" "$1" "$2"
cluster="$source_dir/scripts/cluster.sh"
ns=cozy-system
gpu=nvidia.com/GA100_A100_PCIE_40GB

webhook_certs || abort "openssl could not make the webhook certificate"
free_port webhook_port || abort "no free port for the webhooks"
gpus_on_values "$work/gpu-on.yaml" "$webhook_port"
helm install gpu "$source_dir/charts/gpu" --kubeconfig "$admin_kubeconfig" -n "$ns" \
  --create-namespace -f "$work/gpu-on.yaml" >"$work/helm-install.log" 2>&1 ||
  abort "helm install: $(cat "$work/helm-install.log")"
wait_crds >/dev/null || abort "the CRDs are not Established"
kc delete mutatingwebhookconfigurations,validatingwebhookconfigurations --all >/dev/null ||
  abort "the webhook configurations could not be removed"

create_namespace tenant
kc label namespace tenant gpu.cozystack.io/tenant-namespace=true >/dev/null
{
  gpu_class going "$gpu"
  gpu_class staying "$gpu"
} | kc apply -f - >/dev/null || abort "the classes"
# Kept by a finalizer of the test's own: deleted, it stays with its deletionTimestamp.
kc patch gpuclass going --type merge -p '{"metadata":{"finalizers":["test.cozystack.io/keep"]}}' \
  >/dev/null || abort "the finalizer of class going"
on_exit "kc patch gpuclass going --type merge -p '{\"metadata\":{\"finalizers\":null}}'"
kc delete gpuclass going --wait=false >/dev/null || abort "deleting class going"
order tenant o-going going >"$work/o-going.yaml"
order tenant o-staying staying >"$work/o-staying.yaml"
policy_refuses_going() {
  ! kc create --dry-run=server -f "$work/o-going.yaml" >"$work/going.out" 2>&1 &&
    grep -q "gpu-class-deleting-no-orders" "$work/going.out"
}
wait_until 60 policy_refuses_going || abort "the policy never refused the deleting class's order: $(cat "$work/going.out")"
pass "before the restart: an order of the deleting class is refused by the policy (F5)"
expect_ok "before the restart: an order of another class is allowed" \
  kc create --dry-run=server -f "$work/o-staying.yaml"

"$cluster" restart "$cluster_dir" kube-apiserver >"$work/restart.log" 2>&1 ||
  abort "scripts/cluster.sh restart: $(tail -n 3 "$work/restart.log")"
pass "kube-apiserver restarted and ready"

sent=0 refused=0 other=0
deadline=$((SECONDS + 40))
while [ "$SECONDS" -lt "$deadline" ]; do
  sent=$((sent + 1))
  if ! kc create --dry-run=server -f "$work/o-staying.yaml" >"$work/create.out" 2>&1; then
    if grep -q "paramKind" "$work/create.out"; then
      refused=$((refused + 1))
      [ "$refused" -eq 1 ] && cp "$work/create.out" "$work/first-refusal.out"
    else
      other=$((other + 1))
      cp "$work/create.out" "$work/other-failure.out"
    fi
  fi
  sleep 0.2
done
if [ "$refused" -eq 0 ]; then
  pass "for 40 s after the restart, $sent orders and none refused for an unresolved parameter kind"
else
  fail "$refused of $sent orders refused after the restart: $(tr '\n' ' ' <"$work/first-refusal.out")"
fi
if [ "$other" -eq 0 ]; then
  pass "and none failed otherwise"
else
  fail "$other of $sent orders failed otherwise: $(tr '\n' ' ' <"$work/other-failure.out")"
fi
wait_until 60 policy_refuses_going &&
  pass "after the restart the deleting class's orders are refused by the policy again" ||
  fail "after the restart the policy does not refuse the deleting class's order: $(cat "$work/going.out")"
summary
