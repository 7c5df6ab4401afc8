#!/bin/bash
# Growth of the shared model when the cluster doubles, counted rather than timed: runs one
# evaluation and one placement pass of gpu-controller-model-bench (--once) under callgrind at
# the base size and at twice it, and prints the instructions each took and, from callgrind's
# cache simulation, the data reads that missed a last-level cache of the given size. Counts do
# not depend on the machine's load or its neighbours, which in a shared VM move wall-clock
# ratios by tenths; the timed benchmark prints those, against a linear peer.
#
#   controller/bench/model_growth.sh [bench binary] [nodes] [tenants] [LL cache bytes]
#
# Needs valgrind (Debian package valgrind). Takes about two minutes at the default size.
set -euo pipefail

bench=${1:-build/controller/gpu-controller-model-bench}
nodes=${2:-5000}
tenants=${3:-2000}
ll=${4:-16777216}

command -v valgrind >/dev/null || { echo "model_growth.sh: valgrind is not installed" >&2; exit 2; }
[ -x "$bench" ] || { echo "model_growth.sh: no benchmark binary at $bench" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Instructions and last-level read misses of one step at one size: callgrind counts only while
# inside the functions named (its "Collected" line: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw).
count() {
  local n=$1 t=$2 log="$work/valgrind.log"
  shift 2
  local toggles=()
  for function in "$@"; do
    toggles+=("--toggle-collect=$function")
  done
  valgrind --tool=callgrind --cache-sim=yes --LL="$ll,16,64" "${toggles[@]}" \
    --callgrind-out-file="$work/callgrind.out" "$bench" --once "$n" "$t" >/dev/null 2>"$log" ||
    { cat "$log" >&2; exit 1; }
  awk '/Collected :/ { print $4, $11 }' "$log"
}

measure() {
  local n=$1 t=$2
  read -r walkIr walkMiss < <(count "$n" "$t" '*ReferenceWalk*')
  read -r evalIr evalMiss < <(count "$n" "$t" 'cozy::model::Model::Model*' 'cozy::model::Model::View*')
  read -r passIr passMiss < <(count "$n" "$t" 'cozy::model::Model::PlanPass*')
  echo "$walkIr $walkMiss $evalIr $evalMiss $passIr $passMiss"
}

read -r w1 wm1 e1 em1 p1 pm1 < <(measure "$nodes" "$tenants")
read -r w2 wm2 e2 em2 p2 pm2 < <(measure "$((nodes * 2))" "$((tenants * 2))")

printf '%s nodes, %s tenants, then doubled; last-level cache simulated at %s bytes\n' \
  "$nodes" "$tenants" "$ll"
printf '%-30s %15s %15s %8s\n' "" "base" "doubled" "growth"
row() { awk -v w="$1" -v a="$2" -v b="$3" 'BEGIN { printf "%-30s %15d %15d %7.2fx\n", w, a, b, b / a }'; }
row "reference walk, instructions" "$w1" "$w2"
row "reference walk, LL read misses" "$wm1" "$wm2"
row "evaluation, instructions" "$e1" "$e2"
row "evaluation, LL read misses" "$em1" "$em2"
row "placement pass, instructions" "$p1" "$p2"
row "placement pass, LL read misses" "$pm1" "$pm2"
