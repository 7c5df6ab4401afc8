#!/usr/bin/env bash
# Keeps the behaviour catalog (docs/behaviours.md) and the code honest with each other (run by
# ctest as behaviours_check):
#  1. every behaviour ID the code, the chart and the tests cite, anywhere (comments, file
#     headers, messages), is defined in the catalog;
#  2. every ID the catalog defines is cited by a test under test/ (a *_test.cpp, a *.test.mjs or
#     a *_test.sh), unless its row says "not tested yet": those are printed as a warning, and
#     a row so marked that a test does cite fails, so the mark cannot go stale.
# A citation is an ID (a letter A-H and one or two digits) standing alone in a comment, a test
# name or a message (`// E13: ...`, `# H5: ...`, `(D3)`, `C7, C8`, `"C8 stale taint"`), a
# suite name ending in IDs (`PlacementD10`, `NodeEligibilityC7C8C9`), a test name starting with
# them (`D3_...`, `E6_E8_...`), or a range (`E1-E4`).
# Only a test cites for rule 2: a test file's header (all that stands before its first test)
# says what the file is about and proves nothing. A test runs from the comment lines right above
# it up to those of the next test, or the file's end (its name, its body, and whatever helpers
# stand between it and the next, an approximation of where its body ends): in a *_test.cpp from
# a TEST, TEST_F or TEST_P macro, in a *.test.mjs from a test(...) or it(...) call. A *_test.sh
# is one test, the script after its opening comment (its checks' messages and its comments).
# Hardware and hex names are not IDs: a token glued to `-`, `/`, `.`, `:` or `[` is skipped
# (`A2-4Q`, `10DE:20F1`, `ESC8000A-E12`), as are the phrases in `not_ids` below (the NVIDIA A2).
#   scripts/check-behaviours.sh [--list] [ROOT]
# ROOT is the tree to check (the checkout by default; test/behaviours_check_test.sh passes a
# scratch one). `--list` prints the citations it found ("FILE:LINE ID [range] [header]"), a
# test file's citation before its first test marked header.
set -euo pipefail
list=0
if [[ ${1:-} == --list ]]; then
  list=1
  shift
fi
cd "${1:-$(dirname "$0")/..}"

catalog=docs/behaviours.md
self=scripts/check-behaviours.sh
dirs=()
for dir in agent api controller runtime kube sysfs podresources test charts scripts; do
  [[ -d $dir ]] && dirs+=("$dir")
done
includes=(--include='*.cpp' --include='*.h' --include='*.sh' --include='*.yaml' --include='*.tpl'
  --include='*.mjs' --include=CMakeLists.txt)
excludes=(--exclude-dir=node_modules --exclude-dir=corpus)
# Phrases that look like IDs and are not (removed from a line before its IDs are read).
not_ids=('A2 host' 'A2 PF' '[A2 / A16]')

id='[A-H][0-9]{1,2}'
# An ID with what may stand before and after it; the chars after are not consumed by the match.
standalone="(^|[^A-Za-z0-9_./:[-])(${id})([^A-Za-z0-9_/.:-]|[.:]([^A-Za-z0-9]|$)|$)"
range="(^|[^A-Za-z0-9_./:[-])([A-H])([0-9]{1,2})-([A-H])([0-9]{1,2})([^A-Za-z0-9_/-]|$)"
testmacro="TEST(_F|_P)?\(\s*([A-Za-z0-9_]+)\s*,\s*([A-Za-z0-9_]+)"

[[ -f $catalog ]] || { echo "behaviours_check: $catalog is missing" >&2; exit 1; }

# ---- the catalog: `| ID | what it guarantees | where it is tested |` rows ----
declare -A defined=() untested=()
while IFS= read -r row; do
  [[ $row =~ ^\|\ *(${id})\ *\| ]] || continue
  ref=${BASH_REMATCH[1]}
  if [[ -n ${defined[$ref]:-} ]]; then
    echo "behaviours_check: $catalog defines $ref twice" >&2
    exit 1
  fi
  defined[$ref]=1
  [[ $row == *"not tested yet"* ]] && untested[$ref]=1
done <"$catalog"
(( ${#defined[@]} > 0 )) || { echo "behaviours_check: $catalog defines no ID" >&2; exit 1; }

# ---- the citations: "FILE:LINE ID" lines ----
is_test_file() { [[ $1 == test/* && ( $1 == *_test.cpp || $1 == *.test.mjs || $1 == *_test.sh ) ]]; }
# first_test FILE: the line its first test starts on, with the comment lines right above it
# (0 where it has none, so every line of it is header).
first_test() {
  local start
  case $1 in
    *_test.cpp) start='^[[:space:]]*TEST(_F|_P)?[(]' ;;
    *.test.mjs) start='^[[:space:]]*(test|it)[(]' ;;
    *) start='^[^#]|^$' ;;  # a *_test.sh: the first line after its opening comment
  esac
  awk -v start="$start" -v shell="$([[ $1 == *_test.sh ]] && echo 1 || echo 0)" '
    BEGIN { above = 1 }
    shell == "1" && NR == 1 && /^#!/ { next }
    $0 ~ start { print (shell == "1" ? NR : above); found = 1; exit }
    /^[[:space:]]*\/\// { if (!comment) above = NR; comment = 1; next }
    { comment = 0; above = NR + 1 }
    END { if (!found) print 0 }' "$1"
}
declare -A first=()
citations=()
cite() { citations+=("$1 $2 ${3:-}"); }  # cite FILE:LINE ID [range]
while IFS= read -r hit; do
  file=${hit%%:*}
  rest=${hit#*:}
  line=${rest%%:*}
  text=${rest#*:}
  [[ $file == "$self" ]] && continue
  for phrase in "${not_ids[@]}"; do text=${text//"$phrase"/}; done
  # suite names ending in IDs, test names starting with them
  if [[ $text =~ $testmacro ]]; then
    suite=${BASH_REMATCH[2]} name=${BASH_REMATCH[3]}
    if [[ $suite =~ (${id})+$ ]]; then
      ids=${BASH_REMATCH[0]}
      while [[ $ids =~ ^([A-H][0-9]+)(.*)$ ]]; do  # CxCy: a letter and the digits up to the next
        cite "$file:$line" "${BASH_REMATCH[1]}"
        ids=${BASH_REMATCH[2]}
      done
    fi
    while [[ $name =~ ^(${id})_(.*)$ ]]; do
      cite "$file:$line" "${BASH_REMATCH[1]}"
      name=${BASH_REMATCH[2]}
    done
  fi
  # ranges: both ends are citations (the IDs between are checked through them)
  scan=$text
  while [[ $scan =~ $range ]]; do
    if [[ ${BASH_REMATCH[2]} == "${BASH_REMATCH[4]}" ]]; then
      cite "$file:$line" "${BASH_REMATCH[2]}${BASH_REMATCH[3]}" range
      cite "$file:$line" "${BASH_REMATCH[4]}${BASH_REMATCH[5]}" range
    fi
    scan=${scan#*"${BASH_REMATCH[0]}"}
  done
  # IDs standing alone
  scan=$text
  while [[ $scan =~ $standalone ]]; do
    cite "$file:$line" "${BASH_REMATCH[2]}"
    scan=${scan#*"${BASH_REMATCH[1]}${BASH_REMATCH[2]}"}
  done
done < <(grep -rnE "(^|[^A-Za-z0-9_./:[-])${id}([^A-Za-z0-9_/-]|$)|${id}-${id}|TEST(_F|_P)?\(" \
  "${dirs[@]}" "${includes[@]}" "${excludes[@]}" || true)

# in_test FILE LINE: a test file's line at or after the start of its first test
in_test() {
  is_test_file "$1" || return 1
  [[ -n ${first[$1]:-} ]] || first[$1]=$(first_test "$1")
  (( ${first[$1]} > 0 && $2 >= ${first[$1]} ))
}

status=0
declare -A tested=() cited=()
listed=()
for c in "${citations[@]}"; do
  read -r where ref kind <<<"$c"
  file=${where%:*} line=${where##*:}
  cited[$ref]=1
  if [[ -z ${defined[$ref]:-} ]]; then
    echo "behaviours_check: $where cites $ref, which $catalog does not define" >&2
    status=1
  fi
  if in_test "$file" "$line"; then
    # a range in a test names no test of the IDs between
    [[ $kind != range ]] && tested[$ref]=1
  elif is_test_file "$file"; then
    c="$c header"
  fi
  listed+=("$c")
done

if (( list )); then  # the citations found, for a look at what the check reads
  printf '%s\n' "${listed[@]}" | sed -E 's/ +/ /g; s/ $//'
  exit 0
fi

warned=()
for ref in $(printf '%s\n' "${!defined[@]}" | sort -V); do
  if [[ -n ${untested[$ref]:-} ]]; then
    if [[ -n ${tested[$ref]:-} ]]; then
      echo "behaviours_check: $ref is marked \"not tested yet\" in $catalog, but a test cites it: drop the mark and name the test" >&2
      status=1
    else
      warned+=("$ref")
    fi
  elif [[ -z ${tested[$ref]:-} ]]; then
    echo "behaviours_check: no test under test/ cites $ref (name it in a test, or mark its row in $catalog \"not tested yet\")" >&2
    status=1
  fi
done

# every path (or pattern) the catalog names exists
while IFS= read -r path; do
  compgen -G "$path" >/dev/null || { echo "behaviours_check: $catalog names $path, which does not exist" >&2; status=1; }
done < <(grep -oE '`(test|charts|scripts)/[^` ]+`' "$catalog" | tr -d '`' | sed -E 's/[:#].*$//' | sort -u)

if (( ${#warned[@]} > 0 )); then
  echo "behaviours_check: warning: not tested yet: ${warned[*]}"
fi
if [[ $status -eq 0 ]]; then
  echo "behaviours_check: ${#citations[@]} citations of ${#cited[@]} IDs, all in $catalog;" \
    "$(( ${#defined[@]} - ${#warned[@]} )) of ${#defined[@]} IDs cited by tests, ${#warned[@]} not tested yet"
fi
exit $status
