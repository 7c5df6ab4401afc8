#!/usr/bin/env bash
# The README's two commands share one build (docs/testing.md, "Build time"): scripts/demo.sh
# configures build/ exactly as scripts/test.sh does, so the tests that follow the demo reuse every
# object it built. Both configure through scripts/lib/configure.sh; here the demo's configure step
# runs into a scratch directory, then the tests' into the same one, and the second must change
# nothing that decides how a file is compiled (before, the demo configured without -DCOZY_WERROR and
# the -g1 flags, and the tests' configure then rebuilt everything).
#   build_config_test.sh SOURCE_DIR
set -euo pipefail
source_dir=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$source_dir"

# The lines the demo and the test script use to configure, as they stand in each script: the
# command alone, without what its script does with its output or its failure.
command_of() { sed -E 's/^ *//; s/ *(>|2>|\|\||&&|\|).*$//'; }
demo_configure=$(grep -E '^\s*(configure_build|cmake -S)' scripts/demo.sh | head -1 | command_of)
tests_configure=$(grep -E '^\s*(configure_build normal|cmake -S \. -B build )' scripts/test.sh | head -1 |
  command_of)
[ -n "$demo_configure" ] || { echo "scripts/demo.sh configures no build" >&2; exit 1; }
[ -n "$tests_configure" ] || { echo "scripts/test.sh configures no normal build" >&2; exit 1; }

cache_flags() {
  grep -E '^(CMAKE_BUILD_TYPE|CMAKE_CXX_FLAGS[A-Z_]*|CMAKE_C_FLAGS[A-Z_]*|COZY_[A-Z_]*|CMAKE_CXX_COMPILER_LAUNCHER|CMAKE_C_COMPILER_LAUNCHER|CMAKE_GENERATOR)(:[A-Z]+)?=' \
    "$1/CMakeCache.txt" | sort
}

# Each line runs as its script runs it: with scripts/lib/configure.sh sourced, build/ replaced
# by the scratch directory.
run_configure() {
  local line=${1//" build"/" $work/build"}
  line=${line//"-B build"/"-B $work/build"}
  bash -c "set -euo pipefail; source scripts/lib/configure.sh; $line" >/dev/null
}

run_configure "$demo_configure"
before=$(cache_flags "$work/build")
run_configure "$tests_configure"
after=$(cache_flags "$work/build")
if [ "$before" != "$after" ]; then
  echo "scripts/test.sh configures build/ otherwise than scripts/demo.sh: the tests would rebuild" >&2
  diff <(echo "$before") <(echo "$after") >&2 || true
  exit 1
fi
grep -q '^COZY_WERROR:BOOL=ON' "$work/build/CMakeCache.txt" || {
  echo "the shared configuration builds without warnings as errors" >&2
  exit 1
}
echo "demo and tests configure build/ alike: $demo_configure / $tests_configure"
