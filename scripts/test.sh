#!/usr/bin/env bash
# Configures, builds (warnings as errors) and runs the whole test suite with ctest.
#   scripts/test.sh                 # build/ , RelWithDebInfo
#   scripts/test.sh --sanitize      # build-asan/ , AddressSanitizer + UndefinedBehaviorSanitizer
#   scripts/test.sh --fuzz SECONDS  # build-fuzz/ with clang, runs every fuzz target that long
# ctest counts a skipped test as passed, so every skip is listed at the end; under CI=true (or 1)
# a skip that test/skip-allowlist.txt does not name fails the run, and a tool the suite needs
# is a configure error (cmake/TestTools.cmake). docs/testing.md, "Skips".
set -euo pipefail
cd "$(dirname "$0")/.."

ci_value=${CI:-}
case "${ci_value,,}" in # as cmake/TestTools.cmake reads it
  true | 1) ci=1 ;;
  *) ci=0 ;;
esac

# run_ctest LOG BUILD_DIR [ctest arguments]: ctest into LOG (and onto stdout, unless quiet=1),
# then its skips against the allowlist.
run_ctest() {
  local log=$1 dir=$2
  shift 2
  local status=0
  if [ "${quiet:-0}" = 1 ]; then
    ctest --test-dir "$dir" --output-on-failure -j"$jobs" "$@" >"$log" 2>&1 || status=$?
    check_skips "$dir" "$log" >>"$log" 2>&1 || status=1
  else
    ctest --test-dir "$dir" --output-on-failure -j"$jobs" "$@" 2>&1 | tee "$log" || status=$?
    check_skips "$dir" "$log" || status=1
  fi
  return "$status"
}

# run_suite BUILD_DIR [LABELS]: the whole suite but the tests labelled LABELS (a ctest regex): the
# serial tests alone, then two ctest runs at once: the real-cluster tier (control planes,
# kubelets) and the rest, whose tests wait on timers and processes more than they compute and
# so fill what the tier leaves of the CPUs (docs/testing.md, "CI's time"). The rest's log goes
# to stdout as it runs, the tier's when both have ended.
run_suite() {
  local dir=$1 exclude=${2:-} serial=0 tier=0 rest=0
  seed_costs "$dir"
  # First the tests that must run with nothing beside them (RUN_SERIAL: timing assertions on
  # real sockets), which a second ctest run would not know to wait for.
  echo "== the tests run alone (label serial)"
  run_ctest "$dir/ctest-serial.log" "$dir" -L serial ${exclude:+-LE "$exclude"} || serial=$?
  # The tier at -j$jobs+1: its two shared clusters' chains of tests (one test at a time on each)
  # and the tests with clusters of their own share its slots; at -j$jobs the clusters of their
  # own queued behind the chains (the tier took 1008 s, docs/testing.md "CI's time").
  jobs=$((jobs + 1)) quiet=1 run_ctest "$dir/ctest-real-cluster.log" "$dir" -L real-cluster ${exclude:+-LE "$exclude"} &
  local tier_pid=$!
  echo "== the tests outside the real-cluster tier (the tier runs beside them: its log follows)"
  run_ctest "$dir/ctest-rest.log" "$dir" -LE "real-cluster|serial${exclude:+|$exclude}" || rest=$?
  wait "$tier_pid" || tier=$?
  echo "== the real-cluster tier"
  cat "$dir/ctest-real-cluster.log"
  [ "$serial" -eq 0 ] && [ "$rest" -eq 0 ] && [ "$tier" -eq 0 ]
}

# seed_costs BUILD_DIR: ctest's cost data from test/ctest-costs.txt where the directory has none
# (a fresh clone), so the longest tests start first.
seed_costs() {
  local data="$1/Testing/Temporary/CTestCostData.txt"
  [ -e "$data" ] && return 0
  mkdir -p "$(dirname "$data")"
  { grep -v '^#' test/ctest-costs.txt | awk 'NF == 2 {print $1, 1, $2}'; echo ---; } >"$data"
}

# check_skips BUILD_DIR CTEST_LOG: the log's skips against the allowlist, whose entries must name
# tests of the build (of any label: each run of run_suite selects a part).
check_skips() {
  local dir=$1 log=$2
  local allowlist=test/skip-allowlist.txt
  local -A allowed=()
  local name reason
  while read -r name reason; do
    [[ -z "$name" || "$name" == \#* ]] && continue
    if [[ -z "$reason" ]]; then
      echo "$allowlist: $name gives no reason" >&2
      return 1
    fi
    allowed[$name]=1
  done <"$allowlist"
  # ctest's summary: "The following tests did not run:" then "<tab>  12 - NAME (Skipped)".
  local -a skipped=() unexpected=()
  mapfile -t skipped < <(sed -n '/^The following tests did not run:/,/^$/p' "$log" |
    sed -nE 's/^[[:space:]]+[0-9]+ - (.+) \((Skipped|Disabled)\)$/\1/p')
  for name in "${skipped[@]}"; do
    [[ -n "${allowed[$name]:-}" ]] || unexpected+=("$name")
  done
  # An entry naming no test hides nothing today but would excuse a test added under that name.
  local -a known=() stale=()
  mapfile -t known < <(ctest --test-dir "$dir" -N |
    sed -nE 's/^[[:space:]]*Test[[:space:]]+#[0-9]+: (.+)$/\1/p')
  local -A exists=()
  for name in "${known[@]}"; do exists[$name]=1; done
  for name in "${!allowed[@]}"; do
    [[ -n "${exists[$name]:-}" ]] || stale+=("$name")
  done
  if [[ ${#skipped[@]} -gt 0 ]]; then
    echo "== ${#skipped[@]} test(s) skipped (ctest counts them as passed): ${skipped[*]}"
  fi
  local failed=0
  if [[ ${#unexpected[@]} -gt 0 ]]; then
    echo "== skipped and not in $allowlist: ${unexpected[*]}" >&2
    [[ $ci -eq 1 ]] && failed=1
  fi
  if [[ ${#stale[@]} -gt 0 ]]; then
    echo "== $allowlist names tests this build does not have: ${stale[*]}" >&2
    [[ $ci -eq 1 ]] && failed=1
  fi
  if [[ $failed -eq 1 ]]; then
    echo "== failing: under CI=$CI a test may skip only for a reason $allowlist gives" >&2
  fi
  return "$failed"
}

mode=normal
fuzz_seconds=0
case "${1:-}" in
  --sanitize) mode=sanitize ;;
  --fuzz) mode=fuzz; fuzz_seconds="${2:-30}" ;;
  "") ;;
  *) echo "usage: $0 [--sanitize | --fuzz SECONDS]" >&2; exit 2 ;;
esac

jobs=$(nproc)

# The test control plane and its clients (kubectl, helm) from the pinned Go modules: built once
# into a cache (scripts/cluster.sh build), first on PATH so every test, the demo and the suite's
# kubectl are the pinned ones, never the machine's (docs/testing.md, "The real control plane").
tools_bin=$(scripts/cluster.sh build)
export PATH="$tools_bin:$PATH"

# The previous release's programs, which the upgrade test starts from, built once per machine
# into a cache, here, after this tree's build has filled ccache with the files the two share.
previous_release_programs() { test/realcluster/previous_programs.sh . >/dev/null; }

# One configuration per build directory, shared with scripts/demo.sh (ccache included).
# shellcheck source=scripts/lib/configure.sh
source scripts/lib/configure.sh

case "$mode" in
  normal)
    configure_build normal build
    cmake --build build -j"$jobs"
    previous_release_programs
    run_suite build
    ;;
  sanitize)
    configure_build sanitize build-asan
    cmake --build build-asan -j"$jobs"
    previous_release_programs
    # Without the umockdev test: its LD_PRELOAD and ASan each need to come first, and the
    # testbed's load would cost CI minutes twice; without the tests labelled tooling, which
    # run no program of ours (scripts/cluster.sh itself, the policy cases replayed by node on
    # kube-apiserver): a sanitizer has nothing to see there; and without the packaging test:
    # the .debs of sanitized programs are nobody's, and lintian on them is a minute for nothing
    # (docs/testing.md).
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      run_suite build-asan "umockdev-slow|tooling|packaging"
    ;;
  fuzz)
    configure_build fuzz build-fuzz
    cmake --build build-fuzz -j"$jobs" --target fuzz_targets
    # One target a CPU at a time (libFuzzer runs one process each), each its own output, printed
    # when it ends; any target's crash fails the run, after every target has run.
    fuzz_one() {
      local target=$1 name corpus scratch status=0
      name=$(basename "$target")
      corpus="test/fuzz/corpus/${name#fuzz_}"
      scratch=$(mktemp -d)
      "$target" "$scratch" "$corpus" -max_total_time="$fuzz_seconds" -print_final_stats=1 \
        >"$scratch.log" 2>&1 || status=$?
      echo "fuzzed $name for ${fuzz_seconds}s (seeds: $corpus): exit $status"
      tail -n 5 "$scratch.log"
      [ "$status" -eq 0 ] || cat "$scratch.log" # the crash, its input and stack
      rm -rf "$scratch" "$scratch.log"
      return "$status"
    }
    export -f fuzz_one
    export fuzz_seconds
    printf '%s\0' build-fuzz/fuzz/bin/* | xargs -0 -n 1 -P "$jobs" bash -c 'fuzz_one "$1"' _
    ;;
esac
