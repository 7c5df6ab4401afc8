#!/usr/bin/env bash
# Configures, builds (warnings as errors) and runs the whole test suite with ctest.
#   scripts/test.sh                 # build/ , RelWithDebInfo
#   scripts/test.sh --sanitize      # build-asan/ , AddressSanitizer + UndefinedBehaviorSanitizer
#   scripts/test.sh --fuzz SECONDS  # build-fuzz/ with clang, runs every fuzz target that long
set -euo pipefail
cd "$(dirname "$0")/.."

mode=normal
fuzz_seconds=0
case "${1:-}" in
  --sanitize) mode=sanitize ;;
  --fuzz) mode=fuzz; fuzz_seconds="${2:-30}" ;;
  "") ;;
  *) echo "usage: $0 [--sanitize | --fuzz SECONDS]" >&2; exit 2 ;;
esac

jobs=$(nproc)
case "$mode" in
  normal)
    cmake -S . -B build -G Ninja -DCOZY_WERROR=ON
    cmake --build build -j"$jobs"
    ctest --test-dir build --output-on-failure -j"$jobs"
    ;;
  sanitize)
    cmake -S . -B build-asan -G Ninja -DCOZY_WERROR=ON -DCOZY_SANITIZE=address,undefined \
      -DCOZY_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug
    cmake --build build-asan -j"$jobs"
    # Without the umockdev test: its LD_PRELOAD and ASan each need to come first, and the
    # testbed's load would cost CI minutes twice (docs/testing.md).
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      ctest --test-dir build-asan --output-on-failure -j"$jobs" -LE umockdev-slow
    ;;
  fuzz)
    CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCOZY_FUZZ=ON -DBUILD_TESTING=ON \
      -DCOZY_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
    cmake --build build-fuzz -j"$jobs" --target fuzz_targets
    for target in build-fuzz/fuzz/bin/*; do
      name=$(basename "$target")
      corpus="test/fuzz/corpus/${name#fuzz_}"
      scratch=$(mktemp -d)
      echo "fuzzing $name for ${fuzz_seconds}s (seeds: $corpus)"
      "$target" "$scratch" "$corpus" -max_total_time="$fuzz_seconds" -print_final_stats=1 2>&1 | tail -n 5
      rm -rf "$scratch"
    done
    ;;
esac
