#!/usr/bin/env bash
# No function of the shipped code is longer than 100 lines (clang-tidy's
# readability-function-size, LineThreshold 100; docs/testing.md, "Function size"): a function a
# reader cannot hold is split into steps that each have a name. Run by ctest as
# function_size_check over the build's compile_commands.json: every translation unit of the
# shipped directories (a unity batch counts as the sources it includes), never test/, benchmarks,
# fuzz targets or generated code.
#   scripts/check-function-size.sh BUILD_DIR [SOURCE_DIR]
set -euo pipefail
[[ $# -ge 1 ]] || { echo "usage: $0 BUILD_DIR [SOURCE_DIR]" >&2; exit 2; }
build=$(cd "$1" && pwd)
source_dir=$(cd "${2:-$(dirname "$0")/..}" && pwd)
limit=100
shipped='api|sysfs|podresources|kube|runtime|agent|controller|fixtures'

command -v clang-tidy >/dev/null || { echo "function_size_check: clang-tidy not found" >&2; exit 1; }
command -v jq >/dev/null || { echo "function_size_check: jq not found" >&2; exit 1; }
[[ -f $build/compile_commands.json ]] || {
  echo "function_size_check: $build/compile_commands.json is missing" >&2
  exit 1
}

# The shipped units: sources under a shipped directory, and the unity batches built from them.
mapfile -t units < <(jq -r '.[].file' "$build/compile_commands.json" | sort -u |
  grep -E "^($source_dir/($shipped)/|$build/($shipped)/cozy_unity/)" |
  grep -vE '(_test|_bench|bench_[^/]*|fuzz_[^/]*)\.(cpp|cc)$|/(bench|fuzz|generated)/|\.pb\.cc$')
if [[ ${#units[@]} -eq 0 ]]; then
  echo "function_size_check: no shipped translation unit in $build/compile_commands.json" >&2
  exit 1
fi

config="{Checks: '-*,readability-function-size', WarningsAsErrors: '*',
  CheckOptions: [{key: readability-function-size.LineThreshold, value: $limit}]}"
filter="^$source_dir/($shipped)/"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
printf '%s\0' "${units[@]}" |
  xargs -0 -n 4 -P "$(nproc)" clang-tidy -p "$build" --quiet --config="$config" \
    --header-filter="$filter" >"$log" 2>&1 || status=$?
# What is over, once each (a header's function is seen by every unit that includes it).
over=$(grep -E "(warning|error): function '.*' exceeds recommended size" "$log" | sort -u || true)
if [[ -n $over ]]; then
  echo "$over" | sed -E "s|^$source_dir/||; s/: (warning|error): / /; s| exceeds recommended size/complexity thresholds.*| is over $limit lines|"
  echo "function_size_check: $(echo "$over" | wc -l) function(s) above are over $limit lines;" \
    "split them into named steps" >&2
  exit 1
fi
if [[ $status -ne 0 ]]; then
  cat "$log" >&2
  echo "function_size_check: clang-tidy failed (above)" >&2
  exit 1
fi
echo "function_size_check: ${#units[@]} shipped unit(s), no function over $limit lines"
