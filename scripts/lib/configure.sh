# Sourced by scripts/test.sh and scripts/demo.sh: the one way each build directory is configured,
# so that the README's second command (the tests) reuses what its first (the demo) built in
# build/ instead of rebuilding it with other flags (536 s for the demo, then 998 s: docs/testing.md,
# "Build time").
#   configure_build normal|sanitize|fuzz BUILD_DIR
# ccache, where installed (scripts/install-deps.sh installs it): objects are reused across the
# three build directories' equal compiles and across clones (CI builds a fresh clone each run),
# so an unchanged file is compiled once. Paths under the checkout are hashed relative to it.
configure_build() {
  local mode=$1 dir=$2
  local launcher=()
  if command -v ccache >/dev/null; then
    export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
    launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  fi
  case "$mode" in
    normal)
      # Line tables only (-g1, not -g): the code generated is the same (debug info never
      # changes it), and full debug info costs about half of each -O2 compile
      # (docs/testing.md, "Build time"). A build for a debugger is a build directory of its own.
      # Unity batches (cmake/Unity.cmake): the programs' headers parsed and their templates
      # optimised once per few files, not once per file; the sanitizer build below stays per
      # file, so a missing #include is still caught.
      cmake -S . -B "$dir" -G Ninja "${launcher[@]}" -DCOZY_WERROR=ON -DCOZY_UNITY=ON \
        "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"
      ;;
    sanitize)
      # Line tables only (-g1): the sanitizers' reports name file and line all the same, and
      # full debug info costs a seventh of the build (docs/testing.md, "Build time"). -O1, as
      # ASan's own documentation advises: the sanitized suite's CPU-bound tests took 0.57 of
      # their -O0 time. GCC 12 then reports maybe-uninitialized inside libstdc++'s <regex> under
      # -fsanitize (a known false positive); the normal -O2 build keeps that warning an error.
      cmake -S . -B "$dir" -G Ninja "${launcher[@]}" -DCOZY_WERROR=ON \
        -DCOZY_SANITIZE=address,undefined -DCOZY_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug \
        "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g1 -fno-omit-frame-pointer -Wno-maybe-uninitialized"
      ;;
    fuzz)
      CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja "${launcher[@]}" -DCOZY_FUZZ=ON \
        -DBUILD_TESTING=ON -DCOZY_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
      ;;
    *)
      echo "configure_build: unknown mode $mode" >&2
      return 2
      ;;
  esac
}
