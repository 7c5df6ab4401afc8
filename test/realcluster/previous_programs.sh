#!/usr/bin/env bash
# The previous release's programs (the ref test/realcluster/previous-release names), built once per
# machine by scripts/build-ref.sh: prints their build directory. The upgrade test starts from them;
# scripts/test.sh builds them before the suite, so that the test's time is the upgrade's alone.
#   test/realcluster/previous_programs.sh SOURCE_DIR
set -euo pipefail
read -r ref _ < <(grep -v '^#' "$1/test/realcluster/previous-release")
exec "$1/scripts/build-ref.sh" "$ref" controller/gpu-controller agent/gpu-agent agent/gpu-agent-full
