#!/usr/bin/env bash
# scripts/build-ref.sh builds what a commit holds, once: on a scratch repository of its own (a
# one-file CMake project with this repository's build-ref.sh), each commit's program prints that
# commit's text, uncommitted changes play no part, a second call builds nothing, and an unknown
# ref or a commit that does not compile fails with a message that names it. A commit is built under
# CI=true as well: only its programs are built, and its test tools (which CI requires of this tree)
# may be other pins than a fresh machine has, so its configuration does not see CI.
#   test/build_ref_test.sh SOURCE_DIR
set -uo pipefail
source_dir=$1
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export COZY_REFS_CACHE="$scratch/cache"
passed=0 failed=0
pass() { passed=$((passed + 1)); }
fail() { failed=$((failed + 1)) && echo "FAIL: $*"; }

repo="$scratch/repo"
mkdir -p "$repo/scripts/lib"
cp "$source_dir/scripts/build-ref.sh" "$repo/scripts/"
# As cmake/TestTools.cmake does when a pinned test tool is missing: under CI, configuring fails.
cat >"$repo/scripts/lib/configure.sh" <<'EOF'
configure_build() { [ -z "${CI:-}" ] || { echo "test tools missing under CI" >&2; return 1; }; cmake -S . -B "$2" -G Ninja; }
EOF
cat >"$repo/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.20)
project(tiny CXX)
add_executable(hello hello.cpp)
EOF
commit() { # commit TEXT: hello.cpp printing TEXT, committed
  printf '#include <cstdio>\nint main() { std::puts("%s"); }\n' "$1" >"$repo/hello.cpp"
  git -C "$repo" add -A && git -C "$repo" -c user.name=t -c user.email=t@t commit -qm "$1"
}
git -C "$repo" init -q
commit one
commit two
printf 'int main() { return 3; }\n' >"$repo/hello.cpp" # uncommitted

build_ref="$repo/scripts/build-ref.sh"
dir=$(CI=true "$build_ref" HEAD~1 hello 2>"$scratch/err") && [ "$("$dir/hello")" = one ] && grep -q "built hello" "$scratch/err" &&
  pass || fail "HEAD~1's program (built under CI=true) does not print its commit's text: dir=$dir $(cat "$scratch/err")"
again=$("$build_ref" HEAD~1 hello 2>"$scratch/err") && [ "$again" = "$dir" ] && [ ! -s "$scratch/err" ] &&
  pass || fail "a second call built again or moved: $again vs $dir, $(cat "$scratch/err")"
head=$("$build_ref" HEAD hello 2>/dev/null) && [ "$head" != "$dir" ] && [ "$("$head/hello")" = two ] &&
  pass || fail "HEAD's program is not the committed one (the uncommitted change must play no part)"

"$build_ref" no-such-ref hello >/dev/null 2>"$scratch/err" && fail "an unknown ref was built" ||
  { grep -q "no-such-ref is not a commit" "$scratch/err" && pass || fail "unknown ref: $(cat "$scratch/err")"; }
printf 'int main() { return undeclared; }\n' >"$repo/hello.cpp"
git -C "$repo" -c user.name=t -c user.email=t@t commit -qam broken
"$build_ref" HEAD hello >/dev/null 2>"$scratch/err" && fail "a commit that does not compile was built" ||
  { grep -q "building hello at .* failed" "$scratch/err" && grep -q undeclared "$scratch/err" && pass ||
    fail "a broken commit's message: $(cat "$scratch/err")"; }

echo "build-ref.sh: $passed passed, $failed failed"
[ "$failed" = 0 ] && [ "$passed" = 5 ]
