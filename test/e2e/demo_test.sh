#!/usr/bin/env bash
# demo_test: runs scripts/demo.sh on what the build has built (--no-setup BUILD_DIR): twice on the
# fake API server and once on a real control plane of its own with two real nodes
# (--real-cluster: scripts/cluster.sh up, node and down), and checks each step's outcome in what
# each run prints, that it stopped everything it started, that the second run did the same as
# the first, that the real API server's run showed the same steps, and what only real nodes show
# (the launcher placed by kube-scheduler, its GPU allocated by kubelet, the GPUNode saying so).
# Before the runs: the chart's webhook configurations the fake mode applies
# (test/fakes/gpu-webhooks.yaml) are what helm renders from the chart now.
#   test/e2e/demo_test.sh SOURCE_DIR BUILD_DIR
# Exit 0 passed, 1 failed, 77 skipped (a tool the demo calls is missing, or not root: real
# kubelets need it).
set -uo pipefail
source_dir=$1
build_dir=$2

for tool in kubectl helm openssl curl ip unshare; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIP: $tool is not installed (scripts/install-deps.sh installs it)"
    exit 77
  fi
done
tools_bin=$("$source_dir/scripts/cluster.sh" bin)
for tool in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet cri-runtime \
  gpu-device-plugin; do
  if [ ! -x "$tools_bin/$tool" ]; then
    echo "SKIP: $tools_bin/$tool is not built (scripts/cluster.sh build)"
    exit 77
  fi
done
if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: not root: the --real-cluster run's kubelets need mount namespaces and sysctls"
  exit 77
fi

scratch=$(mktemp -d "${TMPDIR:-/tmp}/demo-test.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

# The fake mode's webhook configurations, rendered once and committed so that the demo's first
# run needs no helm: still what the chart renders?
if ! "$source_dir/test/fakes/render-gpu-webhooks.sh" >"$scratch/webhooks.yaml" ||
  ! diff -u "$source_dir/test/fakes/gpu-webhooks.yaml" "$scratch/webhooks.yaml"; then
  echo "FAIL: test/fakes/gpu-webhooks.yaml is not what the chart renders now" \
    "(test/fakes/render-gpu-webhooks.sh > test/fakes/gpu-webhooks.yaml)"
  exit 1
fi
failures=0
check() { # check RUN WHAT EXTENDED-REGEX: the run's output has a line matching it
  if ! grep -Eq -- "$3" "$scratch/run$1.out"; then
    echo "FAIL (run $1): $2: no line matches /$3/"
    failures=$((failures + 1))
  fi
}
value() { sed -nE "s/$2/\\1/p" "$scratch/run$1.out" | head -n1; } # value RUN SED-REGEX-WITH-GROUP

# Runs 1 and 2 on the fake API server (about 7 s each), run 3 on a real control plane with real
# nodes (about 60 s: its start, the two kubelets', helm, and the garbage collector's 30 s
# discovery of the CRDs the demo applies).
modes=("" fake fake real-cluster)
bounds=(0 90 90 180)
for run in 1 2 3; do
  mkdir "$scratch/tmp$run"
  args=(--no-setup "$build_dir")
  [ "${modes[$run]}" = fake ] || args+=(--real-cluster)
  started=$SECONDS
  TMPDIR="$scratch/tmp$run" bash "$source_dir/scripts/demo.sh" "${args[@]}" \
    >"$scratch/run$run.out" 2>&1
  status=$?
  took=$((SECONDS - started))
  echo "run $run (${modes[$run]}): exit $status in ${took}s"
  if [ "$status" -ne 0 ]; then
    echo "FAIL (run $run): the demo exited $status; its output:"
    cat "$scratch/run$run.out"
    exit 1
  fi
  if [ "$took" -gt "${bounds[$run]}" ]; then
    echo "FAIL (run $run): took ${took}s, over the ${bounds[$run]} s bound of the ${modes[$run]} mode"
    failures=$((failures + 1))
  fi

  # 1. Both nodes published; the class is served; the catalog shows its 4 free units.
  check $run "GPUNode gpu-node-1 listed" '^  gpu-node-1 +2 +2 +2 +0 '
  check $run "GPUNode gpu-node-2 listed" '^  gpu-node-2 +2 +2 +2 +0 '
  check $run "the class applied" 'gpuclass\.gpu\.cozystack\.io/a100 created'
  check $run "kubectl gpu catalog: a100, 4 units, 0 used, 4 free" '^  a100 +\(all\) +- +4 +0 +4$'
  check $run "kubectl gpu catalog: each node takes binds, 2 free" '^  a100 +gpu-node-1 +yes +2 +0 +2$'
  # 2. The order of 3 refused at once with its reason, the order of 1 bound.
  check $run "the order of 3 refused by the webhook" 'denied the request: .*no single node has that many free'
  check $run "train Bound" '^  -> train is Bound on gpu-node-[12]$'
  check $run "train's usage record" '^  gpudevice-train +gpu +a100 +true'
  # 3. The VMI got its gpus entry; the launcher is pinned to the GPU's node.
  check $run "vm1's gpus entry" '^  gpus entry: cozy-gpu-train-0=nvidia\.com/GA100_A100_PCIE_40GB$'
  check $run "train attached to vm1" '^  train +a100 +1 +Bound +gpu-node-[12] +vm1 '
  check $run "the launcher pinned" '^  -> the launcher pod is pinned to gpu-node-[12], the node of its GPU$'
  bound=$(value $run '^  -> train is Bound on (gpu-node-[12])$')
  pinned=$(value $run '^  -> the launcher pod is pinned to (gpu-node-[12]),.*')
  if [ -z "$bound" ] || [ "$bound" != "$pinned" ]; then
    echo "FAIL (run $run): bound on '$bound', launcher pinned to '$pinned'"
    failures=$((failures + 1))
  fi
  # 4. Cordoned: the set moved (class onCordon Move) with its Event; the VM ended; released.
  check $run "the node cordoned" "^  node/$bound cordoned$"
  moved=$(value $run '^  -> train moved to (gpu-node-[12]) .*')
  if [ -z "$moved" ] || [ "$moved" = "$bound" ]; then
    echo "FAIL (run $run): train did not move off the cordoned $bound (moved to '$moved')"
    failures=$((failures + 1))
  fi
  check $run "the Moved event" "^  Moved +train +.*cordoned"
  # (On real nodes the running launcher keeps its GPU on the cordoned node: 1 allocated there.)
  if [ "${modes[$run]}" = fake ]; then
    check $run "kubectl gpu nodes: the cordoned node takes no binds" "^  $bound +2 +2 +0 +a100 2/2 free +no +cordoned$"
  else
    check $run "kubectl gpu nodes: the cordoned node takes no binds, its GPU still the launcher's" \
      "^  $bound +2 +2 +1 +a100 1/2 free +no +cordoned$"
  fi
  check $run "kubectl gpu why: train kept where it moved" "^  DECISION: +keep on $moved: held$"
  check $run "vm1 deleted" 'virtualmachineinstance\.kubevirt\.io "vm1" deleted'
  check $run "the launcher went with vm1, train detached" '^  -> vm1 ended: its launcher pod went with it'
  check $run "train deleted" 'gpudevice\.gpu\.cozystack\.io "train" deleted'
  check $run "nothing left of train" '^  No resources found in tenant-a namespace\.$'
  check $run "train released" '^  -> train released: its usage record is gone$'
  # 5. The leader's catalog metrics, printed last: the catalog above, every node taking binds.
  check $run "the leader's /metrics read" \
    "^\\\$ curl -s http://127\\.0\\.0\\.1:[0-9]+/metrics \\| grep '\\^gpu_catalog_' +# gpu-controller-[01], the leader$"
  check $run "gpu_catalog_class_units: 4" '^  gpu_catalog_class_units\{class="a100"\} 4$'
  check $run "gpu_catalog_class_units_held: 0" '^  gpu_catalog_class_units_held\{class="a100"\} 0$'
  check $run "gpu_catalog_class_units_free: 4" '^  gpu_catalog_class_units_free\{class="a100"\} 4$'
  check $run "gpu_catalog_class_orders_pending: 0" '^  gpu_catalog_class_orders_pending\{class="a100"\} 0$'
  check $run "gpu_catalog_class_oldest_pending_seconds: 0" \
    '^  gpu_catalog_class_oldest_pending_seconds\{class="a100"\} 0$'
  for node in gpu-node-1 gpu-node-2; do
    check $run "gpu_catalog_node_takes_binds: $node" "^  gpu_catalog_node_takes_binds\\{node=\"$node\"\\} 1$"
    check $run "gpu_catalog_node_orders_bound: $node" "^  gpu_catalog_node_orders_bound\\{node=\"$node\"\\} 0$"
  done
  if grep -Eq '^  gpu_catalog_node_not_taking_binds' "$scratch/run$run.out"; then
    echo "FAIL (run $run): a node not taking binds in the leader's catalog metrics"
    failures=$((failures + 1))
  fi
  check $run "the end" '^== demo complete'

  # Everything it started has stopped and its files are gone. (scripts/cluster.sh node's lock
  # of the host's sysctls, an empty file in $TMPDIR, stays, as lock files do.)
  left=""
  for file in "$scratch/tmp$run"/* "$scratch/tmp$run"/.[!.]*; do
    [ -e "$file" ] && [ "${file##*/}" != cozy-kubelet-sysctls.lock ] && left+=" ${file##*/}"
  done
  if [ -n "$left" ]; then
    echo "FAIL (run $run): left files behind: $left"
    failures=$((failures + 1))
  fi
  for cmdline in /proc/[0-9]*/cmdline; do
    # A process may end between the glob and the read: its file is gone, and so is it.
    if { tr '\0' ' ' <"$cmdline"; } 2>/dev/null | grep -q -- "$scratch/tmp$run/"; then
      echo "FAIL (run $run): a process it started still runs: $(tr '\0' ' ' <"$cmdline")"
      failures=$((failures + 1))
    fi
  done
done

# The second run showed the same steps (node names may swap: the binder picks among equals), and
# the real API server's run the same steps as the fake's (its header lines name the cluster and
# the identities, its last line the control plane).
# Lines only real nodes print ("  -> on real nodes: ...") are checked below, not compared.
normalize() {
  sed -E 's/gpu-node-[12]/gpu-node-N/g; s/[0-9]+(s|m[0-9]+s)\b/AGE/g; s/(uid|Lease holder): .*/\1: X/' "$1" |
    grep -E "$2" | grep -v '^  -> on real nodes: '
}
if ! diff <(normalize "$scratch/run1.out" '^(==|  ->)') <(normalize "$scratch/run2.out" '^(==|  ->)') \
  >"$scratch/diff"; then
  echo "FAIL: the second run's steps differ from the first's:"
  cat "$scratch/diff"
  failures=$((failures + 1))
fi
if ! diff <(normalize "$scratch/run1.out" '^(== [0-9]\.|  ->)') \
  <(normalize "$scratch/run3.out" '^(== [0-9]\.|  ->)') >"$scratch/diff"; then
  echo "FAIL: the real API server's run's steps differ from the fake's:"
  cat "$scratch/diff"
  failures=$((failures + 1))
fi
check 3 "the real control plane named" '^== on a real control plane \(scripts/cluster\.sh up\): kube-apiserver v1\.'
check 3 "the tenant a client-certificate user" '^== the tenant: the user alice \(a client certificate'
# What real nodes add: real kubelets, the launcher placed by kube-scheduler on the GPU's node and
# given a GPU by kubelet, the GPUNode counting it, and kubelet freeing it when the VM ends.
check 3 "the nodes real kubelets" '^== nodes: real kubelets \(scripts/cluster\.sh node\)'
bound=$(value 3 '^  -> train is Bound on (gpu-node-[12])$')
check 3 "the launcher placed on $bound and running" "^  virt-launcher-vm1-x7k2p +1/1 +Running +0 +[0-9a-z]+ +[^ ]+ +$bound "
check 3 "the GPUNode of $bound counting the launcher's GPU" "^  $bound +2 +2 +2 +1 "
check 3 "kube-scheduler placed it, kubelet allocated a GPU" \
  "^  -> on real nodes: kube-scheduler placed the launcher on $bound, kubelet allocated it the GPU 0000:[0-9a-f:.]+, and the GPUNode shows it allocated$"
check 3 "the cordon evicting nothing" \
  "^  -> on real nodes: the cordon evicts nothing: vm1's launcher still runs on $bound with its GPU"
check 3 "kubelet freed the GPU when vm1 ended" \
  "^  -> on real nodes: kubelet freed the launcher's GPU, the GPUNode of $bound shows 0 allocated$"

if [ "$failures" -ne 0 ]; then
  for run in 1 3; do
    echo "--- run $run's output"
    cat "$scratch/run$run.out"
  done
  exit 1
fi
for run in 1 3; do
  echo "--- run $run's output"
  cat "$scratch/run$run.out"
done
echo "PASS: all three runs showed every step"
