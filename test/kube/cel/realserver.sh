#!/usr/bin/env bash
# real_cluster_policies_test (test/realcluster/CMakeLists.txt; docs/policies.md, "On a real API
# server"): the policy tests run with recording on, on the chart as `helm template` renders it
# with GPUs off and on, then every recorded case sent to the real API server of CLUSTER_DIR.
#   test/kube/cel/realserver.sh HELM NODE SOURCE_DIR WORK_DIR CLUSTER_DIR
# Prints node's test summary of each of the three runs; fails when any of them fails.
set -uo pipefail
helm=$1 node=$2 source_dir=$3 work_dir=$4 cluster_dir=$5
cel="$source_dir/test/kube/cel"
ns=gpu-system
mkdir -p "$work_dir"
[ -f "$cluster_dir/kubeconfig" ] || {
  echo "FAIL: $cluster_dir/kubeconfig is missing: the real_cluster fixture did not come up"
  exit 1
}
off="$work_dir/rendered-chart-gpu-off.yaml" on="$work_dir/rendered-chart-gpu-on.yaml"
cases="$work_dir/policy-cases.jsonl"
"$helm" template gpu "$source_dir/charts/gpu" --namespace "$ns" >"$off" || exit 1
"$helm" template gpu "$source_dir/charts/gpu" -f "$cel/gpu-on-values.yaml" --namespace "$ns" >"$on" || exit 1
rm -f "$cases"

status=0
echo "=== policy.test.mjs (recording the cases into $cases)"
COZY_RECORD_POLICY_CASES="$cases" COZY_RENDERED_CHART="$off" COZY_RELEASE_NAMESPACE="$ns" \
  "$node" --test "$cel/policy.test.mjs" || status=1
echo "=== policies.test.mjs (recording the cases into $cases)"
COZY_RECORD_POLICY_CASES="$cases" COZY_RENDERED_CHART_GPU_OFF="$off" COZY_RENDERED_CHART_GPU_ON="$on" \
  COZY_RELEASE_NAMESPACE="$ns" COZY_CHART_YAML="$source_dir/charts/gpu/Chart.yaml" \
  COZY_KEYS_H="$source_dir/api/keys.h" "$node" --test "$cel/policies.test.mjs" || status=1
echo "=== realserver.test.mjs (the recorded cases on the API server of $cluster_dir)"
COZY_RECORDED_POLICY_CASES="$cases" COZY_REAL_CLUSTER_DIR="$cluster_dir" COZY_HELM="$helm" \
  COZY_RELEASE_NAMESPACE="$ns" "$node" --test "$cel/realserver.test.mjs" || status=1
exit "$status"
