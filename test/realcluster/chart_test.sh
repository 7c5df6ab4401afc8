#!/usr/bin/env bash
# The chart installed for real: real helm into a real kube-apiserver.
#   test/realcluster/chart_test.sh SOURCE_DIR BUILD_DIR CLUSTER_DIR
# - `helm lint --strict` with GPUs off and on;
# - `helm install` with GPUs off: the CRDs are accepted (structural schemas, CEL rules and their
#   cost, selectableFields) and Established; every ValidatingAdmissionPolicy type-checks against
#   them without a warning (kube-controller-manager's validatingadmissionpolicy-status
#   controller); each has its binding; the service accounts' rights are what docs/install.md says
#   (kubectl auth can-i, decided by the API server's RBAC authorizer);
# - `helm upgrade` with GPUs on and the webhooks pointed at a controller on 127.0.0.1
#   (gpu.webhook.url): the webhook configurations are accepted, every policy still type-checks,
#   and `gpu-controller run --enable-gpu`, authenticated as the chart's service account, answers
#   the API server's admission calls: an order for a class that does not exist is refused at
#   `kubectl apply` with the webhook's reason (H2: fail closed, and its reason reaches the user);
# - installed into gpu-system, not cozy-system: the controller, running as the chart's
#   service account, is the platform caller the device platform-fields policy trusts (F7): a VMI
#   with a template device is admitted, the webhook's marked device is created and the
#   reconciler's finalizer patches are accepted; another service account of the same namespace
#   is not the platform; only the controller writes a GPUDevice's status (B2,
#   gpu-device-status-writer): a user and a service account whose RBAC grants it are refused;
#   `kubectl gpu` finds the controller's settings there and names a namespace with orders but
#   without the tenant label;
# - `helm uninstall` keeps the CRDs (H5).
source "$(dirname "$0")/lib.sh"

# Any namespace works (docs/install.md): deliberately not cozy-system, the default the
# controller and `kubectl gpu` fall back to, so nothing passes by naming it.
ns=gpu-system
on_values="$work/gpu-on.yaml"

# --- lint ------------------------------------------------------------------------------------
expect_ok "helm lint --strict, GPUs off" helm lint --strict "$source_dir/charts/gpu"
cat >"$work/lint-on.yaml" <<EOF
gpu:
  enabled: true
  webhook:
    certManager: false
    caBundle: Q0E=
    existingSecret: gpu-controller-webhook-tls
    networkPolicy: {podCIDRs: [10.244.0.0/16]}
    clientCA: |
$(sed 's/^/      /' "$cluster_dir/pki/webhook-client-ca.crt")
EOF
expect_ok "helm lint --strict, GPUs on" helm lint --strict "$source_dir/charts/gpu" -f "$work/lint-on.yaml"

# --- GPUs off ----------------------------------------------------------------------------------
# KubeVirt's and Cozystack's CRDs as the controller reads them (test/fakes/crds: the fields it
# uses), so the RBAC on them and the VMI webhook are as in a cluster with KubeVirt.
kc apply -f "$source_dir/test/fakes/crds" >"$work/out" 2>&1 || abort "the KubeVirt test CRDs: $(cat "$work/out")"
on_exit "kc delete -f '$source_dir/test/fakes/crds' --ignore-not-found --wait=false"
install_chart "$ns" || abort "helm install (GPUs off): $(cat "$work/helm-install.log")"
pass "helm install, GPUs off"
if wait_crds >"$work/out" 2>&1; then pass "the CRDs are Established"; else fail "CRDs: $(cat "$work/out")"; fi
# The GPUDevice CRD refuses what the model refuses (docs/security.md, "Hardening done"): the class
# name "total".
printf '%s\n' "apiVersion: gpu.cozystack.io/v1alpha1" "kind: GPUDevice" \
  "metadata: {name: budget, namespace: default}" "spec: {className: total, count: 1}" >"$work/total.yaml"
expect_refused "a GPUDevice ordering the class \"total\" is refused by its CRD" \
  'reserved for the budget over all classes' kc create --dry-run=server -f "$work/total.yaml"
# The GPUClass CRD refuses a toleration no scheduler would honour, as the controller's decoder
# does (C9), and takes one that works.
class_with_toleration() { # class_with_toleration FILE TOLERATION-FLOW-MAP
  printf '%s\n' "apiVersion: gpu.cozystack.io/v1alpha1" "kind: GPUClass" \
    "metadata: {name: tolerating}" \
    "spec: {vendor: NVIDIA, model: A100, mode: passthrough," \
    "  source: {devicePlugin: {resourceName: nvidia.com/GA100}}, tolerations: [$2]}" >"$1"
}
class_with_toleration "$work/gt.yaml" '{key: gpu, operator: Gt, value: "1"}'
expect_refused "a class toleration with operator Gt is refused by its CRD" \
  'Unsupported value: "Gt"' kc create --dry-run=server -f "$work/gt.yaml"
class_with_toleration "$work/exists-value.yaml" '{key: gpu, operator: Exists, value: x}'
expect_refused "a class toleration with Exists and a value is refused by its CRD" \
  'operator Exists takes no value' kc create --dry-run=server -f "$work/exists-value.yaml"
class_with_toleration "$work/empty-key.yaml" '{operator: Equal, value: x}'
expect_refused "a class toleration with an empty key and Equal is refused by its CRD" \
  'needs operator Exists' kc create --dry-run=server -f "$work/empty-key.yaml"
class_with_toleration "$work/seconds.yaml" '{key: gpu, effect: NoSchedule, tolerationSeconds: 5}'
expect_refused "a class tolerationSeconds without NoExecute is refused by its CRD" \
  'only valid with effect NoExecute' kc create --dry-run=server -f "$work/seconds.yaml"
class_with_toleration "$work/good.yaml" \
  '{key: gpu, operator: Equal, value: x, effect: NoExecute, tolerationSeconds: 60}'
if kc create --dry-run=server -f "$work/good.yaml" >"$work/out" 2>&1; then
  pass "a class toleration that works is accepted by its CRD"
else
  fail "a class toleration that works was refused: $(tr '\n' ' ' <"$work/out")"
fi

# policies_type_check: every policy's status is for its current generation and has no warning.
policy_status() {
  kc get validatingadmissionpolicies -o \
    'jsonpath={range .items[*]}{.metadata.name}{" "}{.metadata.generation}{" "}{.status.observedGeneration}{" "}{.status.typeChecking.expressionWarnings}{"\n"}{end}'
}
policies_checked() { # every policy's status names its current generation
  local name gen observed rest
  while read -r name gen observed rest; do
    [ -n "$name" ] || continue
    [ "$gen" = "$observed" ] || return 1
  done < <(policy_status)
}
check_policies() { # check_policies WHAT EXPECTED-COUNT
  local what=$1 expected=$2 count
  count=$(kc get validatingadmissionpolicies -o name | grep -c .)
  [ "$count" -eq "$expected" ] || fail "$what: $count policies, expected $expected"
  if ! wait_until 60 policies_checked; then
    fail "$what: the type-checking status did not reach every policy: $(policy_status | tr '\n' ';')"
    return
  fi
  local name gen observed warnings bad=""
  while read -r name gen observed warnings; do
    [ -z "$warnings" ] || bad+="$name: $warnings; "
  done < <(policy_status)
  if [ -z "$bad" ]; then pass "$what: $count policies type-check without warnings"; else fail "$what: $bad"; fi
  # Each policy has a binding naming it.
  local policies bound missing=""
  policies=$(kc get validatingadmissionpolicies -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
  bound=$(kc get validatingadmissionpolicybindings -o jsonpath='{range .items[*]}{.spec.policyName}{"\n"}{end}')
  for name in $policies; do grep -qx "$name" <<<"$bound" || missing+="$name "; done
  if [ -z "$missing" ]; then pass "$what: every policy is bound"; else fail "$what: unbound: $missing"; fi
}
expected_off=$(helm template gpu "$source_dir/charts/gpu" -n "$ns" | grep -c '^kind: ValidatingAdmissionPolicy$')
check_policies "GPUs off" "$expected_off"

# can ACCOUNT VERB RESOURCE [yes|no]: the RBAC authorizer's answer for the service account.
can() {
  local who=$1 verb=$2 resource=$3 want=$4 got may=may
  local -a sub=()
  # RESOURCE/SUBRESOURCE: kubectl takes the subresource as a flag.
  if [[ "$resource" == */* ]]; then sub=(--subresource "${resource#*/}"); fi
  got=$(kc auth can-i "$verb" "${resource%%/*}" "${sub[@]}" --as "system:serviceaccount:$ns:$who" 2>/dev/null)
  [ "$want" = yes ] || may="may not"
  if [ "$got" = "$want" ]; then pass "$who $may $verb $resource"
  else fail "$who: can-i $verb $resource is '$got', expected $want"; fi
}
can gpu-agent patch gpunodes/status yes
can gpu-agent create gpunodes yes
can gpu-agent patch gpunodes no
can gpu-agent delete gpunodes no
can gpu-agent list pods yes
can gpu-agent patch nodes no
can gpu-agent list gpudevices.gpu.cozystack.io no
can gpu-controller list gpunodes yes
can gpu-controller patch gpunodes/status no
can gpu-controller delete nodes no
can gpu-controller create secrets no

# --- GPUs on, webhooks on a controller at 127.0.0.1 -----------------------------------------
webhook_certs || abort "openssl could not make the webhook certificate"
free_port webhook_port || abort "no free port for the webhooks"
free_port health_port || abort "no free port for the controller's health"
gpus_on_values "$on_values" "$webhook_port"
if helm upgrade gpu "$source_dir/charts/gpu" --kubeconfig "$admin_kubeconfig" -n "$ns" \
  -f "$on_values" >"$work/out" 2>&1; then
  pass "helm upgrade, GPUs on, webhooks at https://127.0.0.1:$webhook_port, the NetworkPolicy of dual-stack pod CIDRs accepted (H8)"
else
  abort "helm upgrade (GPUs on): $(cat "$work/out")"
fi
urls=$(kc get validatingwebhookconfiguration/cozy-gpu mutatingwebhookconfiguration/cozy-gpu \
  -o jsonpath='{range .items[*].webhooks[*]}{.clientConfig.url}{"\n"}{end}')
if [ "$(grep -c "^https://127.0.0.1:$webhook_port/" <<<"$urls")" -eq 3 ]; then
  pass "the three webhooks call https://127.0.0.1:$webhook_port"
else
  fail "webhook URLs: $urls"
fi
expected_on=$(helm template gpu "$source_dir/charts/gpu" -n "$ns" -f "$on_values" |
  grep -c '^kind: ValidatingAdmissionPolicy$')
check_policies "GPUs on" "$expected_on"
can gpu-controller patch gpudevices.gpu.cozystack.io/status yes
can gpu-controller patch gpunodes/status yes
can gpu-controller create gpudevices.gpu.cozystack.io yes
can gpu-controller list virtualmachineinstances.kubevirt.io yes
if kc get networkpolicy gpu-controller-webhook-callers -n "$ns" >/dev/null 2>&1 &&
  [ "$(kc get configmap gpu-controller-webhook-client-ca -n "$ns" -o jsonpath='{.data.ca\.crt}')" = \
    "$(cat "$cluster_dir/pki/webhook-client-ca.crt")" ]; then
  pass "the webhook callers' NetworkPolicy and client CA ConfigMap are accepted"
else
  fail "no NetworkPolicy gpu-controller-webhook-callers or client CA ConfigMap"
fi

start_controller "$ns" "$webhook_port" "$health_port" ||
  abort "gpu-controller (as the service account gpu-controller) did not become ready"
pass "gpu-controller runs as the chart's service account (a TokenRequest token) and is ready"

# A tenant namespace, labelled as the hoster labels every one (docs/install.md, "Tenant namespaces").
create_namespace tenant-a
kc label namespace tenant-a gpu.cozystack.io/tenant-namespace=true >/dev/null
cat >"$work/order.yaml" <<EOF
apiVersion: gpu.cozystack.io/v1alpha1
kind: GPUDevice
metadata: {name: train, namespace: tenant-a}
spec: {className: no-such-class, count: 1}
EOF
# The API server calls the webhook over loopback; the controller's reason is what kubectl prints.
expect_refused "an order for a class that does not exist is refused at kubectl apply, with the reason" \
  'admission webhook "gpudevices.gpu.cozystack.io" denied the request: .*no-such-class' \
  kc apply -f "$work/order.yaml"
expect_refused "... and on a server-side dry run" \
  'admission webhook "gpudevices.gpu.cozystack.io" denied the request' \
  kc apply --dry-run=server -f "$work/order.yaml"
# Anyone else who reaches the port, even with a user certificate of the cluster's own CA, is
# refused in the TLS handshake (H9): only the API server's webhook client certificate gets in.
review='{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"forged"}}'
for who in nobody admin; do
  credentials=()
  [ "$who" = admin ] && credentials=(--cert "$cluster_dir/pki/admin.crt" --key "$cluster_dir/pki/admin.key")
  code=$(curl -s --max-time 10 --cacert "$work/webhook-ca.crt" "${credentials[@]}" -o /dev/null \
    -w '%{http_code}' -H 'Content-Type: application/json' -d "$review" \
    "https://127.0.0.1:$webhook_port/validate/gpudevices" || true)
  if [ "$code" = "000" ]; then
    pass "a caller with $who's certificate, not the API server's, is refused in the TLS handshake"
  else
    fail "a caller with $who's certificate got HTTP $code"
  fi
done

# --- The controller in gpu-system is the platform (F7) and the one status writer (B2) ----------
# A VMI with a template device: the VMI webhook creates the marked device (a CREATE the
# platform-fields policy allows only platform callers), the binder places it (a status patch
# only the controller may make), the reconciler adds the device finalizer (a platform-only
# patch). The VMI's namespace is not labelled a tenant namespace: the platform-fields policy
# applies in every namespace, while the raw-name bindings a tenant namespace brings in need the
# settings parameter, which kube-apiserver cannot find after an earlier test on this cluster
# uninstalled the chart (kubernetes/kubernetes#133827, docs/policies.md); those are
# real_cluster_policies_test's.
vm_ns=tenant-vm
# The finalizers a stopped controller cannot remove (the class's, a device's), stripped as admin
# (a platform caller), or the CRDs' deletion at the end would wait on them forever.
strip_finalizers() {
  local object
  for object in $(kc get gpuclasses -o name 2>/dev/null); do
    kc patch "$object" --type=merge -p '{"metadata":{"finalizers":null}}'
  done
  for object in $(kc get gpudevices -n "$vm_ns" -o name 2>/dev/null); do
    kc patch "$object" -n "$vm_ns" --type=merge -p '{"metadata":{"finalizers":null}}'
  done
}
on_exit "kc delete namespace $vm_ns --wait=false"
on_exit strip_finalizers
on_exit "kc delete node gpu-n1 --wait=false"
cat >"$work/gpu-cluster.yaml" <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: $vm_ns}
---
apiVersion: v1
kind: Node
metadata:
  name: gpu-n1
  labels: {kubernetes.io/hostname: gpu-n1}
status:
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: gpu.cozystack.io/v1alpha1
kind: GPUClass
metadata: {name: a100}
spec:
  vendor: nvidia
  model: A100
  mode: passthrough
  source: {devicePlugin: {resourceName: nvidia.com/GA100}}
---
apiVersion: gpu.cozystack.io/v1alpha1
kind: GPUNode
metadata: {name: gpu-n1}
EOF
kc apply -f "$work/gpu-cluster.yaml" >"$work/out" 2>&1 || abort "the node, class and GPUNode: $(cat "$work/out")"
# The node's status as its agent publishes it (as admin here: the node-bound policy is the agent's).
kc patch gpunode gpu-n1 --subresource=status --type=merge -p '{"status":{
  "resourceNames":["nvidia.com/GA100"],"summary":{"gpus":1},
  "devices":[{"pciAddress":"0000:3b:00.0","vendorID":"10de","deviceID":"20b5","classCode":"030200",
  "health":"Healthy","allocatable":2,"allocated":0,
  "resources":[{"name":"nvidia.com/GA100","allocatable":2,"allocated":0}]}]}}' >"$work/out" 2>&1 ||
  abort "the GPUNode's status: $(cat "$work/out")"
cat >"$work/vmi.yaml" <<EOF
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: vm1
  namespace: $vm_ns
  labels: {gpu.cozystack.io/device-references: "true"}
  annotations:
    gpu.cozystack.io/device-references: '{"templates":[{"name":"scratch","className":"a100","count":1}]}'
spec:
  domain:
    devices: {}
EOF
# The webhooks answer from their caches: a dry run until they have the class and the GPUNode.
wait_until 30 kc create --dry-run=server -f "$work/vmi.yaml"
if kc create -f "$work/vmi.yaml" >"$work/out" 2>&1; then
  pass "a VMI with a template device is admitted with the chart in $ns"
else
  fail "the VMI with a template device was refused: $(tr '\n' ' ' <"$work/out")"
fi
device_field() { kc get gpudevice vm1-scratch -n "$vm_ns" -o jsonpath="$1" 2>/dev/null; }
if [ "$(device_field '{.metadata.labels.gpu\.cozystack\.io/template-device}')" = true ] &&
  [ "$(device_field '{.status.phase}')" = Bound ] &&
  [ "$(device_field '{.status.attachment.vmiName}')" = vm1 ]; then
  pass "... its template device vm1-scratch was created by the controller, marked, bound and attached"
else
  fail "template device vm1-scratch: $(kc get gpudevice vm1-scratch -n "$vm_ns" -o json 2>&1 | tr '\n' ' ')"
fi
gpus=$(kc get vmi vm1 -n "$vm_ns" -o jsonpath='{.spec.domain.devices.gpus[*].deviceName}' 2>/dev/null)
if [ "$gpus" = nvidia.com/GA100 ]; then
  pass "... and the VMI got its gpus entry"
else
  fail "vm1's gpus: '$gpus'"
fi
protected() { device_field '{.metadata.finalizers}' | grep -q 'gpu.cozystack.io/device-protection'; }
if wait_until 20 protected; then
  pass "the controller's finalizer patch on the template device is accepted (F7)"
else
  fail "no device finalizer on vm1-scratch: $(grep -iE 'device-protection|forbidden|denied' \
    "$work/controller.log" | tail -n 3 | tr '\n' ' ')"
fi

# Another service account of the release's namespace and a user, both with RBAC on GPUDevices
# and their status (a hoster's broad role): neither is the platform nor the status writer.
cat >"$work/broad-rbac.yaml" <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: gpu-test-broad}
rules:
- apiGroups: [gpu.cozystack.io]
  resources: [gpudevices, gpudevices/status]
  verbs: [get, list, patch, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: gpu-test-broad}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: gpu-test-broad}
subjects:
- {kind: ServiceAccount, name: default, namespace: $ns}
- {kind: User, apiGroup: rbac.authorization.k8s.io, name: ops}
EOF
on_exit "kc delete -f '$work/broad-rbac.yaml' --ignore-not-found"
kc apply -f "$work/broad-rbac.yaml" >"$work/out" 2>&1 || abort "the broad RBAC: $(cat "$work/out")"
token=$(kc create token default -n "$ns" --duration 1h) || abort "TokenRequest for $ns/default"
token_kubeconfig "$work/neighbour.kubeconfig" "$token"
cert_kubeconfig "$work/ops.kubeconfig" ops operators
token=$(kc create token gpu-controller -n "$ns" --duration 1h) || abort "TokenRequest for gpu-controller"
token_kubeconfig "$work/controller-dry.kubeconfig" "$token"
device_path="/apis/gpu.cozystack.io/v1alpha1/namespaces/$vm_ns/gpudevices/vm1-scratch"
status_why="only gpu-controller \\(system:serviceaccount:$ns:gpu-controller\\) may write the status of a GPUDevice"
for who in neighbour ops; do
  expect_ok "$who's RBAC grants patching gpudevices/status" \
    test "$(as "$work/$who.kubeconfig" kc auth can-i patch gpudevices.gpu.cozystack.io \
      --subresource status -n "$vm_ns" 2>/dev/null)" = yes
  expect_refused "$who may not write a device's status: gpu-device-status-writer (B2)" \
    "ValidatingAdmissionPolicy 'gpu-device-status-writer' .*denied request: $status_why" \
    raw_patch "$work/$who.kubeconfig" "$device_path/status?dryRun=All" '{"status":{"nodeName":"elsewhere"}}'
done
expect_ok "the controller's service account may write a device's status (a dry run)" \
  raw_patch "$work/controller-dry.kubeconfig" "$device_path/status?dryRun=All" '{"status":{"nodeName":"gpu-n1"}}'
expect_refused "another service account of $ns is not the platform: it may not drop the device finalizer (F7)" \
  "ValidatingAdmissionPolicy 'gpu-device-platform-fields' .*denied request: only the platform may remove the finalizer" \
  raw_patch "$work/neighbour.kubeconfig" "$device_path?dryRun=All" '{"metadata":{"finalizers":null}}'
expect_ok "the controller's service account may drop it (a dry run)" \
  raw_patch "$work/controller-dry.kubeconfig" "$device_path?dryRun=All" '{"metadata":{"finalizers":null}}'

# `kubectl gpu` finds the settings the controller published in gpu-system without being told,
# and names the namespace that has orders but not the tenant label.
settings_published() { kc get configmap cozy-gpu-settings -n "$ns"; }
wait_until 20 settings_published || fail "the controller published no cozy-gpu-settings in $ns"
kubectl_gpu() { "$build_dir/controller/kubectl-gpu" --kubeconfig "$admin_kubeconfig" "$@"; }
label_warning="warning: namespace $vm_ns has GPU orders but not the label gpu.cozystack.io/tenant-namespace"
if kubectl_gpu catalog >"$work/gpu.out" 2>"$work/gpu.err" && grep -q "^a100 " "$work/gpu.out" &&
  ! grep -q cozy-gpu-settings "$work/gpu.err" && grep -q "$label_warning" "$work/gpu.err"; then
  pass "kubectl gpu reads the settings in $ns unasked and warns of $vm_ns's missing tenant label"
else
  fail "kubectl gpu catalog: $(cat "$work/gpu.out" "$work/gpu.err" | tr '\n' ' ')"
fi
kc label namespace "$vm_ns" gpu.cozystack.io/tenant-namespace=true >/dev/null
if kubectl_gpu catalog --controller-namespace "$ns" >"$work/gpu.out" 2>"$work/gpu.err" &&
  [ ! -s "$work/gpu.err" ]; then
  pass "... and says nothing once the namespace is labelled (--controller-namespace $ns)"
else
  fail "kubectl gpu catalog --controller-namespace $ns: $(tr '\n' ' ' <"$work/gpu.err")"
fi
kc label namespace "$vm_ns" gpu.cozystack.io/tenant-namespace- >/dev/null

# The VMI ends: the controller detaches and deletes its template device, removing the finalizer
# (another platform-only patch).
kc delete vmi vm1 -n "$vm_ns" >/dev/null 2>&1
device_gone() { ! kc get gpudevice vm1-scratch -n "$vm_ns"; }
if wait_until 30 device_gone; then
  pass "the VMI ended: the controller removed the finalizer and deleted its template device"
else
  fail "vm1-scratch is still there: $(kc get gpudevice vm1-scratch -n "$vm_ns" -o json 2>&1 | tr '\n' ' ')"
fi

# The controller stopped: the webhooks fail closed (H2).
kill -TERM "${pids[-1]}" 2>/dev/null
wait "${pids[-1]}" 2>/dev/null
expect_refused "with the controller down, the order is refused (failurePolicy Fail), not let through" \
  'failed calling webhook "gpudevices.gpu.cozystack.io"' kc apply -f "$work/order.yaml"
kc delete namespace tenant-a --wait=false >/dev/null 2>&1

# --- uninstall keeps the CRDs (H5) -------------------------------------------------------------
helm uninstall gpu --kubeconfig "$admin_kubeconfig" -n "$ns" --wait >/dev/null 2>&1
if kc get crd gpudevices.gpu.cozystack.io gpuclasses.gpu.cozystack.io gpunodes.gpu.cozystack.io \
  >/dev/null 2>&1; then
  pass "helm uninstall keeps the CRDs (H5)"
else
  fail "helm uninstall removed a CRD"
fi
if [ -z "$(kc get validatingadmissionpolicies -o name 2>/dev/null)" ]; then
  pass "helm uninstall removes the policies"
else
  fail "policies left after uninstall: $(kc get validatingadmissionpolicies -o name | tr '\n' ' ')"
fi
summary
