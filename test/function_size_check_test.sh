#!/usr/bin/env bash
# scripts/check-function-size.sh can fail: in a scratch tree, a shipped function whose body runs
# 101 lines past its opening line is caught with its file and name, one of 100 passes (clang-tidy
# counts from the line of the opening brace to that of the closing one), and a long function
# under test/ is not shipped code.
#   test/function_size_check_test.sh SOURCE_DIR
set -uo pipefail
check="$1/scripts/check-function-size.sh"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
passed=0 failed=0

# function FILE NAME LINES: a function of that many lines, braces included.
function_of() {
  local file=$1 name=$2 lines=$3 i
  mkdir -p "$(dirname "$file")"
  {
    echo "int $name(int x) {"
    for ((i = 0; i < lines - 2; ++i)); do echo "  x += $i;"; done
    echo "  return x; }"
  } >"$file"
}

# expect pass|fail TEXT_IN_OUTPUT FILE...: the check's verdict on a tree of those files.
expect() {
  local want=$1 needle=$2 out status file entries=()
  shift 2
  mkdir -p "$scratch/tree/build"
  for file in "$@"; do
    entries+=("{\"directory\": \"$scratch/tree/build\", \"file\": \"$scratch/tree/$file\",
      \"command\": \"c++ -std=c++20 -c $scratch/tree/$file -o /dev/null\"}")
  done
  (IFS=,; echo "[${entries[*]}]") >"$scratch/tree/build/compile_commands.json"
  out=$("$check" "$scratch/tree/build" "$scratch/tree" 2>&1) && status=pass || status=fail
  if [[ $status == "$want" && $out == *"$needle"* ]]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL: expected $want with \"$needle\" for $*"$'\n'"$out"
  fi
}

function_of "$scratch/tree/runtime/long.cpp" Long 102
function_of "$scratch/tree/runtime/fits.cpp" Fits 101
function_of "$scratch/tree/controller/admission/deep.cpp" Deep 140
function_of "$scratch/tree/test/long_test.cpp" LongTest 300
expect fail "runtime/long.cpp:1:5 function 'Long' is over 100 lines" runtime/long.cpp runtime/fits.cpp
expect fail "controller/admission/deep.cpp:1:5 function 'Deep'" controller/admission/deep.cpp
expect pass "1 shipped unit(s), no function over 100 lines" runtime/fits.cpp test/long_test.cpp \
  runtime/fits.cpp
# Every unit is checked, not the first alone.
expect fail "function 'Long'" runtime/fits.cpp runtime/long.cpp

echo "function_size_check_test: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
