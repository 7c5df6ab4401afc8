#!/usr/bin/env bash
# The main job on bundled fixture hosts, no GPU, cluster or kubelet needed: installs the Debian
# packages, builds, builds fixture hosts into a temporary directory, and runs `gpu-agent scan`
# on them as a hoster would on a real node.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cmake -S . -B build -G Ninja >/dev/null
cmake --build build -j"$(nproc)" --target gpu-agent gpu-fixture

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for host in l40s-vendor-vfio t4-mdev hgx-h100; do
  build/fixtures/sysfs/gpu-fixture "fixtures/sysfs/specs/$host.json" "$work/$host"
  echo
  echo "== $host: $(grep -m1 '"description"' "fixtures/sysfs/specs/$host.json" | cut -d'"' -f4)"
  echo "\$ gpu-agent scan --sysfs-root <fixture> -o table"
  build/agent/gpu-agent scan --sysfs-root "$work/$host" --pci-ids fixtures/pci.ids -o table
done
echo
echo "== t4-mdev as the GPUNode the agent would publish"
echo "\$ gpu-agent scan --sysfs-root <fixture> --node-name gpu-node-1 -o yaml"
build/agent/gpu-agent scan --sysfs-root "$work/t4-mdev" --pci-ids fixtures/pci.ids \
  --node-name gpu-node-1 -o yaml
