#!/usr/bin/env bash
# scripts/check-citations.sh can fail: each way of citing a tracker issue in a scratch tree is
# caught, with its file and line, and an upstream tracker's reference passes.
#   test/citations_check_test.sh SOURCE_DIR
set -uo pipefail
check="$1/scripts/check-citations.sh"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
passed=0 failed=0

expect() { # expect pass|fail TEXT: the check's verdict on a tree holding one file of TEXT
  local want=$1 text=$2 out status
  rm -rf "$scratch/tree" && mkdir -p "$scratch/tree/docs"
  printf '%s\n' "$text" >"$scratch/tree/docs/page.md"
  out=$("$check" "$scratch/tree" 2>&1) && status=pass || status=fail
  if [[ $status == "$want" && ($want == pass || $out == *"docs/page.md:1:"*) ]]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL: expected $want for: $text"$'\n'"$out"
  fi
}

# The word is spliced, so this file holds no citation for the check to find in the checkout.
w=iss${EMPTY:-}ue W=Iss${EMPTY:-}ue
expect fail "The quiet room ($w 26 §1) wakes no pass."
expect fail "$W 25 §2: a kind is spelled once."
expect fail "as ${w}s 24 and 25 asked"
expect fail "TEST_F(ControllerEndToEnd, ${W}26_PodChurnWakesNoPass)"
expect fail "TEST(QuietRoom${W}26, Rooms)"
expect fail "see $w#42"
expect pass 'kube-apiserver keeps stale params (kubernetes/kubernetes#133827, #130887).'
expect pass 'The quiet room (docs/controller.md, "The quiet room", C11) wakes no pass.'
expect pass 'an issue with 3 nodes; tissue 4'

# Build directories and node_modules are not the repository's text.
rm -rf "$scratch/tree" && mkdir -p "$scratch/tree/build-asan" "$scratch/tree/x/node_modules"
echo "$w 26" >"$scratch/tree/build-asan/log.txt"
echo "$w 26" >"$scratch/tree/x/node_modules/README.md"
if "$check" "$scratch/tree" >/dev/null 2>&1; then passed=$((passed + 1)); else
  failed=$((failed + 1)); echo "FAIL: build and node_modules directories were read"; fi

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
