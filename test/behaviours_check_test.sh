#!/usr/bin/env bash
# scripts/check-behaviours.sh can fail: in a scratch tree whose catalog defines X1 and X2 (the
# letters A-H with a digit, spliced below so this file cites nothing in the checkout), only a
# test cites for the catalog: its name or its body, never the file's header comment.
#   test/behaviours_check_test.sh SOURCE_DIR
set -uo pipefail
check="$1/scripts/check-behaviours.sh"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
passed=0 failed=0

# The IDs of the scratch catalog, spliced so that the checkout's check reads none of them here.
X1=A${EMPTY:-}1 X2=A${EMPTY:-}2 X3=A${EMPTY:-}3

# expect pass|fail WHAT FILE TEXT [ROW2]: the check's verdict on a tree whose catalog defines X1
# and X2 (X2's row is ROW2, "tested" by default) and holds FILE with TEXT; a failure must say
# why (X2 untested, or the undefined X3).
expect() {
  local want=$1 what=$2 file=$3 text=$4 row2=${5:-tested} out status
  rm -rf "$scratch/tree" && mkdir -p "$scratch/tree/docs" "$scratch/tree/$(dirname "$file")"
  printf '| ID | what | where |\n|----|------|-------|\n| %s | one | a test |\n| %s | two | %s |\n' \
    "$X1" "$X2" "$row2" >"$scratch/tree/docs/behaviours.md"
  printf '%s\n' "$text" >"$scratch/tree/$file"
  out=$("$check" "$scratch/tree" 2>&1) && status=pass || status=fail
  if [[ $status == "$want" && ($want == pass || $out == *"$X2"* || $out == *"$X3"*) ]]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL: expected $want: $what"$'\n'"$out"
  fi
}

# Every file below cites X1 in a test, so only X2 decides the verdict.
cpp_test() { # cpp_test HEADER BODY-BEFORE-THE-SECOND-TEST
  printf '%s\n#include <gtest/gtest.h>\n\nTEST(Suite%s, Holds) { EXPECT_TRUE(true); }\n\n%s\n%s\n' \
    "$1" "$X1" "$2" "TEST(Other, Holds) { EXPECT_TRUE(true); }"
}

# C++: a header comment is no evidence; a suite name, a test name, a body and the comment right
# above a test are.
expect fail "a *_test.cpp citing X2 only in its header comment" test/a_test.cpp \
  "$(cpp_test "// Tests of one and two ($X1, $X2)." "")"
expect fail "a *_test.cpp citing X2 only on a helper before its first test" test/a_test.cpp \
  "$(printf '// The file.\n#include <gtest/gtest.h>\n\n// %s: a helper\nint One() { return 1; }\n\nTEST(Suite%s, Holds) {}\n' \
    "$X2" "$X1")"
expect pass "a suite name ending in X2" test/a_test.cpp \
  "$(cpp_test "// The file." "TEST(Placement$X2, Holds) { EXPECT_TRUE(true); }")"
expect pass "a test name starting with X2" test/a_test.cpp \
  "$(cpp_test "// The file." "TEST_F(Fixture, ${X2}_Holds) { EXPECT_TRUE(true); }")"
expect pass "a comment in a test's body" test/a_test.cpp \
  "$(cpp_test "// The file." $'TEST(Body, Holds) {\n  // '"$X2"$': the second one\n  EXPECT_TRUE(true);\n}')"
expect pass "the comment right above the first test" test/a_test.cpp \
  "$(printf '// The file.\n#include <gtest/gtest.h>\n\n// %s: the second one\nTEST(Suite%s, Holds) {}\n' \
    "$X2" "$X1")"
expect fail "a range in a test names no test of its IDs" test/a_test.cpp \
  "$(cpp_test "// The file." "// $X1-$X2 (a range)")"
# A file that is not a test proves nothing, whatever it says.
expect fail "a source file citing X2" controller/a.cpp "// $X2: implemented here"

# node --test: the header is no evidence, a test's title and body are.
mjs_test() { printf '%s\nimport { test } from "node:test";\n\n%s\n' "$1" "$2"; }
expect fail "a *.test.mjs citing X2 only in its header" test/kube/a.test.mjs \
  "$(mjs_test "// Covers $X1 and $X2." "test(\"$X1: one\", () => {});")"
expect pass "a *.test.mjs test titled with X2" test/kube/a.test.mjs \
  "$(mjs_test "// Covers the policy." "test(\"$X1 $X2: both\", () => {});")"
expect pass "a *.test.mjs test citing X2 in its body" test/kube/a.test.mjs \
  "$(mjs_test "// Covers the policy." $'test("'"$X1"$': one", () => {\n  // '"$X2"$': and two\n});')"

# A shell test is the script after its opening comment.
expect fail "a *_test.sh citing X2 only in its opening comment" test/a_test.sh \
  "$(printf '#!/usr/bin/env bash\n# Covers %s and %s.\nset -eu\npass "one (%s)"\n' "$X1" "$X2" "$X1")"
expect pass "a *_test.sh citing X2 in a check's message" test/a_test.sh \
  "$(printf '#!/usr/bin/env bash\n# Covers both.\nset -eu\npass "%s, %s: both"\n' "$X1" "$X2")"

# Rule 1 reads every citation, a header's too: an ID the catalog does not define fails.
expect fail "a header comment citing the undefined X3" test/a_test.cpp \
  "$(cpp_test "// Tests of $X1, $X2 and $X3." "TEST(Both$X2, Holds) {}")"
# "not tested yet": a header citation leaves the mark standing, a test's makes it stale.
expect pass "X2 not tested yet, cited only in a header" test/a_test.cpp \
  "$(cpp_test "// Tests of $X2 to come." "")" "not tested yet"
expect fail "X2 not tested yet, yet a test cites it" test/a_test.cpp \
  "$(cpp_test "// The file." "TEST(Stale$X2, Holds) {}")" "not tested yet"

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
