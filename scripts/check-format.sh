#!/usr/bin/env bash
# Fails when a C++ source is not formatted as .clang-format says (run by ctest as format_check).
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.cpp' '*.h' 2>/dev/null || find . -name '*.cpp' -o -name '*.h')
clang-format --dry-run --Werror "${files[@]}"
echo "format_check: ${#files[@]} files formatted"
