#!/usr/bin/env bash
# Another commit's programs, for a test or a benchmark that compares against them: the upgrade
# test runs the previous release's gpu-controller and gpu-agent (docs/reliability.md, "Upgrades"),
# a before/after benchmark runs the commit before a change (docs/benchmarks.md).
#   scripts/build-ref.sh REF TARGET...    e.g. scripts/build-ref.sh 3d7758e controller/gpu-controller
# REF's tree is taken with `git archive` (the repository's history is needed, not a shallow clone)
# and built with REF's own build configuration (its scripts/lib/configure.sh, the normal build), only
# the TARGETs named (paths in the build directory). Prints the build directory, which holds them.
# Only what is committed at REF is built: uncommitted changes play no part.
# Built once per machine: the tree and build are kept under COZY_REFS_CACHE (default
# ~/.cache/cozy-gpu/refs), by commit; a later call finds its TARGETs there and builds nothing. With
# ccache, a file REF shares with this tree is not compiled again (paths are hashed relative to the
# tree, scripts/lib/configure.sh).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: scripts/build-ref.sh REF TARGET..." >&2; exit 2; }
repo=$(cd "$(dirname "$0")/.." && pwd)
ref=$1
shift
sha=$(git -C "$repo" rev-parse --verify --quiet "$ref^{commit}") || {
  echo "build-ref.sh: $ref is not a commit of $repo (a shallow clone lacks the history)" >&2
  exit 1
}
root=${COZY_REFS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cozy-gpu/refs}
out="$root/$sha"
# The build directory inside the tree, as build/ is in a checkout: every path ccache hashes is then
# the same as this tree's.
build="$out/src/build"
built() {
  local target
  for target in "$@"; do [ -x "$build/$target" ] || return 1; done
}
mkdir -p "$root"
# One build per commit at a time (parallel test runs, CI and a developer).
exec 9>"$root/$sha.lock"
flock 9
if ! built "$@"; then
  started=$(date +%s)
  if [ ! -f "$out/src/CMakeLists.txt" ]; then
    rm -rf "$out"
    mkdir -p "$out/src"
    git -C "$repo" archive "$sha" | tar -x -C "$out/src"
  fi
  (
    cd "$out/src"
    # Only REF's programs are built, never its tests: CI's rule that every test tool be found
    # (cmake/TestTools.cmake) is this tree's, and REF's pinned test tools may be others than this
    # tree's, which are all a fresh machine has.
    unset CI
    if [ ! -f "$build/build.ninja" ]; then
      [ -f scripts/lib/configure.sh ] || {
        echo "build-ref.sh: $sha has no scripts/lib/configure.sh to build it with" >&2
        exit 1
      }
      # shellcheck source=lib/configure.sh
      source scripts/lib/configure.sh
      configure_build normal build >"$out/configure.log" 2>&1 || {
        echo "build-ref.sh: configuring $sha failed; $out/configure.log:" >&2
        tail -n 20 "$out/configure.log" >&2
        exit 1
      }
    fi
    export CCACHE_BASEDIR="$out/src" CCACHE_NOHASHDIR=1
    ninja -C build "$@" >"$out/build.log" 2>&1 || {
      echo "build-ref.sh: building $* at $sha failed; $out/build.log:" >&2
      tail -n 30 "$out/build.log" >&2
      exit 1
    }
  )
  echo "build-ref.sh: built $* at ${sha:0:12} in $(($(date +%s) - started)) s" >&2
fi
echo "$build"
