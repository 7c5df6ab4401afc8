#!/usr/bin/env bash
# The main job on a bundled fixture host, no GPU, cluster or kubelet needed: installs the Debian
# packages, builds, then runs the agent for real against stand-ins for the node and the cluster
# and shows what it published, as `kubectl` sees it. Everything it starts stops at the end.
#
#   fixture host (sysfs tree)  ->  gpu-agent run  ->  fake API server  <-  kubectl
#   fake kubelet (pod-resources over a unix socket) ^
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh >/dev/null
cmake -S . -B build -G Ninja >/dev/null
cmake --build build -j"$(nproc)" --target gpu-agent gpu-fixture fake_kubelet fake_apiserver \
  >/dev/null

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

host=t4-vgpu-4
echo "== fixture host: $(grep -m1 '"description"' "fixtures/sysfs/specs/$host.json" | cut -d'"' -f4)"
build/fixtures/sysfs/gpu-fixture "fixtures/sysfs/specs/$host.json" "$work/root"
build/agent/gpu-agent scan --sysfs-root "$work/root" --pci-ids fixtures/pci.ids \
  --pod-resources "unix://$work/none.sock" -o table 2>/dev/null

echo
echo "== stand-ins: a kubelet whose device plugin advertises the four mdevs (two held by a VM),"
echo "   and an API server with the GPUNode CRD and the node gpu-node-1"
build/test/fakes/fake_kubelet --socket "$work/kubelet.sock" \
  --scenario fixtures/kubelet/t4-vgpu-4.json >"$work/kubelet.log" 2>&1 &
pids+=($!)
build/test/fakes/fake_apiserver --crds charts/gpu/templates/crds --kubeconfig-out "$work/kubeconfig" \
  >"$work/apiserver.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  grep -q "listening on" "$work/apiserver.log" 2>/dev/null && [ -S "$work/kubelet.sock" ] && break
  sleep 0.1
done
url=$(sed -n 's/^listening on //p' "$work/apiserver.log")
curl -fsS -X POST -H 'Content-Type: application/json' "$url/_fake/seed" \
  -d '{"apiVersion":"v1","kind":"Node","metadata":{"name":"gpu-node-1"}}' >/dev/null
# The VM that finished: kubelet 1.32/1.33 still list its device; the API says Succeeded. Its
# namespace first, as a cluster has it (seeding would not check, a create would).
curl -fsS -X POST -H 'Content-Type: application/json' "$url/_fake/seed" \
  -d '{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"tenant-b"}}' >/dev/null
curl -fsS -X POST -H 'Content-Type: application/json' "$url/_fake/seed" -d \
  '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"virt-launcher-finished","namespace":"tenant-b"},"spec":{"nodeName":"gpu-node-1"},"status":{"phase":"Succeeded"}}' \
  >/dev/null

echo
echo "== gpu-agent run --node-name gpu-node-1 --kubeconfig ... (its log)"
build/agent/gpu-agent run --node-name gpu-node-1 --kubeconfig "$work/kubeconfig" \
  --sysfs-root "$work/root" --pci-ids fixtures/pci.ids \
  --pod-resources "unix://$work/kubelet.sock" --udev-source off --health-addr 127.0.0.1:0 \
  2>"$work/agent.log" &
agent=$!
pids+=("$agent")
kubectl=(kubectl --kubeconfig "$work/kubeconfig")
for _ in $(seq 100); do
  "${kubectl[@]}" get gpunode gpu-node-1 -o jsonpath='{.status.summary.allocatable}' 2>/dev/null \
    | grep -q . && break
  sleep 0.1
done
sleep 0.5
kill -TERM "$agent"
wait "$agent" || true
sed 's/^/  /' "$work/agent.log"

echo
echo "== kubectl get gpunodes"
"${kubectl[@]}" get gpunodes
echo
echo "== kubectl get gpunode gpu-node-1 -o yaml"
"${kubectl[@]}" get gpunode gpu-node-1 -o yaml
