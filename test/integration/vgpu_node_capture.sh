#!/bin/sh
# ctest's vgpu_node_capture: loads the recorded HPE A2 host (shared/real-sysfs/vgpu-node.umockdev)
# into one umockdev testbed and runs the whole vgpu_node_capture_test binary inside it.
#   vgpu_node_capture.sh TEST_BINARY SHARED_DIR [gtest args...]
# $COZY_SHARED_DIR overrides SHARED_DIR. Exit 77 (ctest SKIP_RETURN_CODE) with the reason when
# the capture or umockdev is absent.
#
# umockdev-run builds its testbed from every device of a dump; this one records 1188 devices
# of a whole host (CPUs, ACPI, memory, PCI) and takes minutes to load. The agent and lspci
# read only PCI functions and mdevs, so the dump is first cut, at test time and into a scratch
# directory, to its pci and mdev devices (229 of 1188, the records themselves unchanged).
# COZY_UMOCKDEV_FULL_DUMP=1 loads the dump whole instead.
set -eu
binary=$1
shared=${COZY_SHARED_DIR:-$2}
shift 2
dump=$shared/real-sysfs/vgpu-node.umockdev
if [ ! -f "$dump" ]; then
  echo "SKIP: $dump is absent: the real captures live in shared/ beside the checkout (CI has it; set COZY_SHARED_DIR or the CMake cache variable COZY_SHARED_DIR to point elsewhere)"
  exit 77
fi
if ! command -v umockdev-run >/dev/null 2>&1; then
  echo "SKIP: umockdev-run is not installed (Debian package umockdev; scripts/install-deps.sh)"
  exit 77
fi
scratch=$(mktemp -d "${TMPDIR:-/tmp}/vgpu-node.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
if [ "${COZY_UMOCKDEV_FULL_DUMP:-0}" = 1 ]; then
  load=$dump
else
  load=$scratch/vgpu-node-pci.umockdev
  # Records are blank-line separated; keep those of devices on the pci and mdev buses.
  awk 'BEGIN { RS = ""; ORS = "\n\n" } /\nE: SUBSYSTEM=(pci|mdev)\n/' "$dump" >"$load"
fi
echo "loading $(grep -c '^P: ' "$load") devices of $dump"
start=$(date +%s)
status=0
umockdev-run -d "$load" -- sh -c '
  start=$1; shift
  echo "testbed ready after $(($(date +%s) - start)) s"
  status=0; "$@" || status=$?
  echo "tests done after $(($(date +%s) - start)) s"
  exit $status' sh "$start" "$binary" "$@" || status=$?
echo "umockdev-run done after $(($(date +%s) - start)) s"
exit $status
