#!/usr/bin/env bash
# Fails when a component reaches into one it must not (run by ctest as layout_check):
# runtime/ knows neither program; agent/ never includes controller/ and the reverse; the
# libraries both programs share (api/, kube/) and the agent's readers (sysfs/, podresources/)
# know neither program nor each other's subject (docs/runtime.md).
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
check api 'agent|controller|runtime|kube|sysfs|podresources' \
  "the gpu.cozystack.io types are plain values: no I/O, no client, no program"
check kube 'agent|controller|api|sysfs|podresources' \
  "the Kubernetes client knows no GPU type and neither program"
check sysfs 'agent|controller|kube|api|podresources' "the sysfs reader knows only sysfs"
check podresources 'agent|controller|kube|api|sysfs' \
  "the pod-resources client knows only kubelet's API"
# A kind's plural is spelled once, in controller/kinds.h; the rest of the controller names the
# constant (docs/controller.md, "Keys").
plurals=$(grep -rnE '"(gpuclasses|gpudevices|virtualmachineinstances|kubevirts|workloadmonitors|resourcequotas)"' \
  controller --include='*.cpp' --include='*.h' | grep -v '^controller/kinds.h:' || true)
if [[ -n "$plurals" ]]; then
  echo "layout_check: spell a kind's plural only in controller/kinds.h (use its Kind constant):" >&2
  echo "$plurals" >&2
  status=1
fi
[[ $status -eq 0 ]] &&
  echo "layout_check: runtime/, agent/, controller/, api/, kube/, sysfs/ and podresources/ keep to their own"
exit $status
