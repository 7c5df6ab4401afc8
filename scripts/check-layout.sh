#!/usr/bin/env bash
# Fails when a component reaches into one it must not (run by ctest as layout_check):
# runtime/ knows neither program; agent/ never includes controller/ and the reverse.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
check() {  # check DIR PATTERN WHY
  local hits
  hits=$(grep -rnE "#include \"($2)/" "$1" --include='*.cpp' --include='*.h' || true)
  if [[ -n "$hits" ]]; then
    echo "layout_check: $1 must not include $2/ ($3):" >&2
    echo "$hits" >&2
    status=1
  fi
}
check runtime 'agent|controller' "the runtime knows neither program"
check agent 'controller' "the agent and the controller share only runtime/, api/ and kube/"
check controller 'agent' "the agent and the controller share only runtime/, api/ and kube/"
[[ $status -eq 0 ]] && echo "layout_check: runtime/, agent/ and controller/ keep to their own"
exit $status
