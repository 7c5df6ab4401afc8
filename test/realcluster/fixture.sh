#!/usr/bin/env bash
# The real control plane as a ctest fixture (test/realcluster/CMakeLists.txt): `up` starts one
# cluster in DIR for every test that requires the fixture `real_cluster`, `down` stops it.
#   test/realcluster/fixture.sh up|down SOURCE_DIR DIR
# A cluster left behind by an interrupted run (DIR/pids) is stopped and DIR removed first.
set -euo pipefail
action=$1 source_dir=$2 dir=$3
cluster="$source_dir/scripts/cluster.sh"
case "$action" in
  up)
    if [ -f "$dir/pids" ]; then "$cluster" down "$dir" || true; fi
    rm -rf "$dir"
    # Its node lifecycle controller waits an hour for a silent node: the scenarios write Node
    # objects no kubelet keeps alive (real kubelets: node_lifecycle_test, a cluster of its own).
    COZY_CLUSTER_NODE_GRACE=3600s "$cluster" up "$dir"
    ;;
  down)
    # The directory stays (its logs/ explain a failure) until the next `up`.
    if [ -f "$dir/pids" ]; then "$cluster" down "$dir"; fi
    ;;
  *)
    echo "usage: $0 up|down SOURCE_DIR DIR" >&2
    exit 2
    ;;
esac
