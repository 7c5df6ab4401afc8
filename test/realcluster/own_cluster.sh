# Sourced, instead of lib.sh, by a test that needs a cluster of its own (its node lifecycle
# timing, or a chart that must never have been uninstalled on it): `scripts/cluster.sh up` into a
# scratch directory (COZY_CLUSTER_NODE_GRACE as the caller exports it), then lib.sh on it; the
# cluster goes down at the end, whatever happened.
#   source own_cluster.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
own_scratch=$(mktemp -d "${TMPDIR:-/tmp}/own-cluster.XXXXXX")
if ! "$1/scripts/cluster.sh" up "$own_scratch/c" >"$own_scratch/up.log" 2>&1; then
  echo "FAIL: scripts/cluster.sh up: $(tail -n 3 "$own_scratch/up.log")"
  [ -f "$own_scratch/c/pids" ] && "$1/scripts/cluster.sh" down "$own_scratch/c" >/dev/null 2>&1
  rm -rf "$own_scratch"
  echo "0 passed, 1 failed"
  exit 1
fi
# Down even when lib.sh stops before it takes over (a tool missing from PATH): its own EXIT
# trap replaces this one, and the two cleanups below go with it.
trap "$(printf '%q down %q >/dev/null 2>&1; rm -rf %q' "$1/scripts/cluster.sh" "$own_scratch/c" "$own_scratch")" EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$1" "$2" "$own_scratch/c"
on_exit "rm -rf '$own_scratch'"
on_exit "'$source_dir/scripts/cluster.sh' down '$own_scratch/c'"
