#!/usr/bin/env bash
# No file of the repository cites this project's tracker ("issue 25 §3", "(issue 23)",
# `QuietRoomIssue26`): a reader of the repository cannot open the tracker, so code, tests, docs
# and scripts cite behaviour IDs (docs/behaviours.md) and docs/ sections instead. Run by ctest as
# citations_check. Upstream trackers keep their own form and pass: `kubernetes/kubernetes#133827`.
#   scripts/check-citations.sh [DIR]     DIR: the tree to read, the checkout by default
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"

# Build directories, git's own, installed npm packages and fuzz corpora are not the repository's
# text. This file names the patterns it looks for, so it is left out too.
excludes=(--exclude-dir='build*' --exclude-dir=.git --exclude-dir=node_modules
  --exclude-dir=corpus --exclude-dir=.cache --exclude=check-citations.sh)
prose='(^|[^A-Za-z0-9_])[Ii][Ss][Ss][Uu][Ee][Ss]?[ _#-]{0,2}[0-9]+'
identifier='Issue[0-9]+'

found=$(grep -r -n -I -E "${excludes[@]}" -e "$prose" -e "$identifier" . || true)
if [[ -n $found ]]; then
  echo "$found" | sed 's|^\./||'
  echo "citations_check: $(echo "$found" | wc -l) line(s) above cite a tracker issue; cite a" \
    "behaviour ID (docs/behaviours.md) or a docs/ section instead" >&2
  exit 1
fi
echo "citations_check: no tracker issue cited"
