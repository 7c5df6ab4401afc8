#!/usr/bin/env bash
# A real Kubernetes control plane on this machine, for tests and the demo (docs/testing.md,
# "The real control plane"): etcd, kube-apiserver and kube-controller-manager built from the
# Go modules pinned under tools/, every port on 127.0.0.1.
#
#   scripts/cluster.sh build        # builds the tools into the cache (once per pin), prints their dir
#   scripts/cluster.sh bin          # prints the tools' directory (kube-apiserver, kubectl, helm, ...)
#   scripts/cluster.sh up DIR       # starts a cluster whose state lives in DIR (empty or absent)
#   scripts/cluster.sh down DIR     # stops exactly the processes `up DIR` started
#   scripts/cluster.sh user DIR FILE CN [GROUP...]
#                                   # writes FILE: a kubeconfig for the user CN (in each GROUP)
#                                   # with a client certificate of DIR's CA
#
# `up` writes DIR/kubeconfig (user admin, group system:masters), DIR/pki/ (the CA that signs
# client certificates, the API server's serving certificate, the service-account keys),
# DIR/env (APISERVER_URL, APISERVER_PORT, ETCD_PORT), DIR/logs/ and DIR/pids. The API server
# presents DIR/pki/webhook-client.crt to every webhook (DIR/admission.yaml), signed by a CA of its
# own, DIR/pki/webhook-client-ca.crt, for webhooks that authenticate their caller. The API server's
# audit log, DIR/logs/audit.log (JSON lines; DIR/audit-policy.yaml), is its request log: each
# request's user, URI and answer, and the body of every write. The e2e suites read it where
# they read the fake API server's request log. A port in use, a
# missing binary or a DIR with something in it is one line on stderr and exit status 2; a
# component that does not come up is one line naming its log, everything started is stopped,
# and the exit status is 1.
#
# Ports: chosen free below the ephemeral range (scripts/lib/free-port.sh), or given as COZY_CLUSTER_APISERVER_PORT,
# COZY_CLUSTER_ETCD_PORT, COZY_CLUSTER_ETCD_PEER_PORT, COZY_CLUSTER_KCM_PORT.
# The tools' cache: COZY_TOOLS_CACHE (default ~/.cache/cozy-gpu/tools).
set -euo pipefail
source_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

die() { # die STATUS MESSAGE
  echo "cluster.sh: $2" >&2
  exit "$1"
}

# --- the tools -----------------------------------------------------------------------------

# The pinned versions, as go.mod requires them (a tool's module is listed `// indirect`).
pinned() { sed -nE "s#^(require)?[[:space:]]*$1 (v[0-9][^ ]*).*#\2#p" "$source_dir/tools/$2/go.mod" | head -n1; }
kube_version=$(pinned k8s.io/kubernetes kube)
etcd_version=$(pinned go.etcd.io/etcd/server/v3 etcd)
helm_version=$(pinned helm.sh/helm/v3 helm)
[ -n "$kube_version" ] && [ -n "$etcd_version" ] && [ -n "$helm_version" ] ||
  die 2 "tools/*/go.mod pin no version of k8s.io/kubernetes, etcd or helm"

# The cache directory: the versions, and a hash of every file that decides what is built and of
# the build recipe below, so a changed pin (or go.sum, our etcd main, a flag) builds anew.
tools_dir() {
  local root=${COZY_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cozy-gpu/tools}
  local hash
  hash=$({ cd "$source_dir/tools" && cat kube/go.mod kube/go.sum etcd/go.mod etcd/go.sum etcd/main.go \
    helm/go.mod helm/go.sum && declare -f build_tools; } | sha256sum | cut -c1-12)
  echo "$root/kube-$kube_version-etcd-$etcd_version-helm-$helm_version-$hash"
}

tools=(kube-apiserver kube-controller-manager kubectl etcd helm)

tools_built() {
  local dir=$1 t
  for t in "${tools[@]}"; do [ -x "$dir/bin/$t" ] || return 1; done
}

build_tools() {
  local dir
  dir=$(tools_dir)
  tools_built "$dir" && return 0
  command -v go >/dev/null || die 2 "go is not installed: the test tools are built from Go modules (Go 1.26; scripts/install-deps.sh)"
  mkdir -p "$dir"
  # One build at a time per cache directory (parallel test runs, CI and a developer).
  exec 9>"$dir/.lock"
  flock 9
  if tools_built "$dir"; then return 0; fi
  local out="$dir/bin.partial" start=$SECONDS
  rm -rf "$out"
  mkdir -p "$out"
  echo "cluster.sh: building kube-apiserver, kube-controller-manager, kubectl $kube_version," \
    "etcd $etcd_version and helm $helm_version into $dir (once per pin; minutes)" >&2
  # Static, as upstream releases them; no PGO and no paths of this machine in the binaries.
  # GOTOOLCHAIN=auto: a Go older than go.mod's fetches the toolchain go.mod names.
  export CGO_ENABLED=0 GOFLAGS=-mod=readonly GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
  local ld="-s -w" p
  local minor=${kube_version#v1.}
  minor=${minor%%.*}
  for p in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    ld+=" -X $p.gitVersion=$kube_version -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  (cd "$source_dir/tools/kube" && go build -trimpath -pgo=off -ldflags="$ld" -o "$out/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kubectl) || die 1 "building Kubernetes $kube_version failed"
  (cd "$source_dir/tools/etcd" && go build -trimpath -ldflags="-s -w" -o "$out/etcd" .) ||
    die 1 "building etcd $etcd_version failed"
  # As helm's Makefile: its default Kubernetes version (.Capabilities.KubeVersion in `helm
  # template`, the deprecation rules of `helm lint`) is the client-go minor it is built with;
  # without these it says v1.20.0 and refuses the chart's kubeVersion.
  local client_go helm_ld
  client_go=$(pinned k8s.io/client-go helm)
  helm_ld="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version"
  for p in pkg/chartutil pkg/lint/rules; do
    helm_ld+=" -X helm.sh/helm/v3/$p.k8sVersionMajor=1"
    helm_ld+=" -X helm.sh/helm/v3/$p.k8sVersionMinor=$(cut -d. -f2 <<<"$client_go")"
  done
  (cd "$source_dir/tools/helm" && go build -trimpath -ldflags="$helm_ld" \
    -o "$out/helm" helm.sh/helm/v3/cmd/helm) || die 1 "building helm $helm_version failed"
  rm -rf "$dir/bin"
  mv "$out" "$dir/bin"
  echo "cluster.sh: built in $((SECONDS - start)) s" >&2
}

require_tools() {
  local dir
  dir=$(tools_dir)
  tools_built "$dir" || die 2 "the control plane's binaries are not built in $dir/bin (scripts/cluster.sh build)"
  bin="$dir/bin"
}

# --- ports ---------------------------------------------------------------------------------

source "$source_dir/scripts/lib/free-port.sh"

# port VAR: VAR as given (a number nothing on 127.0.0.1 listens on yet), or chosen by free_port;
# none given twice.
port() {
  local var=$1 given=${!1:-}
  if [ -z "$given" ]; then
    free_port "$var" || die 2 "no free port for $var"
    return
  fi
  [[ "$given" =~ ^[0-9]+$ ]] && [ "$given" -ge 1 ] && [ "$given" -le 65535 ] ||
    die 2 "$var=$given is not a port"
  if (exec 3<>"/dev/tcp/127.0.0.1/$given") 2>/dev/null; then die 2 "port $given ($var) is in use"; fi
  free_port_taken+="$given "
}

# --- up / down -----------------------------------------------------------------------------

# A certificate signed by the cluster's CA: cert NAME SUBJECT [EXTENSIONS]
cert() {
  local name=$1 subject=$2 ext=${3:-}
  openssl req -new -newkey rsa:2048 -nodes -keyout "$pki/$name.key" -subj "$subject" \
    -out "$pki/$name.csr" 2>/dev/null
  local extfile="$pki/$name.ext"
  printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
    ${ext:+"$ext"} >"$extfile"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 30 -extfile "$extfile" -out "$pki/$name.crt" 2>/dev/null
  rm -f "$pki/$name.csr" "$extfile"
}

kubeconfig() { # kubeconfig FILE USER [CERTIFICATE-PATH-WITHOUT-.crt/.key]
  local file=$1 user=$2 certs=${3:-$pki/$2}
  cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: cozy
  cluster:
    server: https://127.0.0.1:$COZY_CLUSTER_APISERVER_PORT
    certificate-authority-data: $(base64 -w0 "$pki/ca.crt")
users:
- name: $user
  user:
    client-certificate-data: $(base64 -w0 "$certs.crt")
    client-key-data: $(base64 -w0 "$certs.key")
contexts:
- name: cozy
  context:
    cluster: cozy
    user: $user
current-context: cozy
EOF
  chmod 600 "$file"
}

# Stops the pids listed in DIR/pids whose command line still names DIR (a pid reused by another
# process since is left alone), in the reverse of their start order: kube-controller-manager and
# kube-apiserver before etcd, which a server still serving would wait for. Each: SIGTERM, up to
# 10 s, then SIGKILL.
stop_pids() {
  local dir=$1 pid name i cmdline
  [ -f "$dir/pids" ] || return 0
  local -a listed=()
  while read -r name pid; do
    [ -n "$pid" ] && listed+=("$pid")
  done <"$dir/pids"
  for ((i = ${#listed[@]} - 1; i >= 0; i--)); do
    pid=${listed[$i]}
    # A pid already gone: its /proc entry too (the braces take the redirection's own error).
    cmdline=$({ tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null) || continue
    [[ "$cmdline" == *"$dir/"* ]] || continue
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 100); do
      alive "$pid" || break
      sleep 0.1
    done
    if alive "$pid"; then
      kill -KILL "$pid" 2>/dev/null
      for _ in $(seq 50); do
        alive "$pid" || break
        sleep 0.1
      done
    fi
  done
  rm -f "$dir/pids"
}
# alive PID: running (a zombie, exited and not yet reaped by whoever inherited it, is not).
alive() {
  local state
  state=$(sed -E 's/^[0-9]+ \(.*\) ([A-Za-z]).*/\1/' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

# wait_for WHAT LOG SECONDS COMMAND...: COMMAND until it succeeds, or fail naming LOG.
wait_for() {
  local what=$1 log=$2 seconds=$3
  shift 3
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      stop_pids "$dir"
      echo "cluster.sh: $what did not come up within $seconds s; last lines of $log:" >&2
      tail -n 5 "$log" >&2 || true
      exit 1
    fi
    sleep 0.2
  done
}

# start NAME COMMAND...: in its own session, logging to DIR/logs/NAME.log, pid into DIR/pids.
start() {
  local name=$1
  shift
  setsid "$@" >"$dir/logs/$name.log" 2>&1 </dev/null &
  echo "$name $!" >>"$dir/pids"
}

up() {
  dir=$1
  require_tools
  if [ -e "$dir" ]; then
    [ -d "$dir" ] || die 2 "$dir is not a directory"
    [ -z "$(ls -A "$dir")" ] || die 2 "$dir is not empty (a cluster's state? scripts/cluster.sh down $dir, then remove it)"
  fi
  command -v openssl >/dev/null || die 2 "openssl is not installed (scripts/install-deps.sh)"
  command -v curl >/dev/null || die 2 "curl is not installed (scripts/install-deps.sh)"
  port COZY_CLUSTER_APISERVER_PORT
  port COZY_CLUSTER_ETCD_PORT
  port COZY_CLUSTER_ETCD_PEER_PORT
  port COZY_CLUSTER_KCM_PORT
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  pki="$dir/pki"
  mkdir -p "$pki" "$dir/logs" "$dir/etcd"

  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$pki/ca.key" -out "$pki/ca.crt" -days 30 \
    -subj "/CN=cozy-gpu-test-ca" 2>/dev/null
  cert apiserver "/CN=kube-apiserver" \
    "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc"$'\n'"extendedKeyUsage=serverAuth"
  cert admin "/O=system:masters/CN=admin" "extendedKeyUsage=clientAuth"
  cert kube-controller-manager "/CN=system:kube-controller-manager" "extendedKeyUsage=clientAuth"
  # The API server's client certificate for webhooks, from a CA of its own (webhook-client-ca):
  # a webhook trusting that CA (gpu-controller --webhook-client-ca) admits the API server and no
  # user of the cluster's CA. docs/install.md, "Who may call the webhooks".
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$pki/webhook-client-ca.key" \
    -out "$pki/webhook-client-ca.crt" -days 30 -subj "/CN=cozy-gpu-test-webhook-client-ca" 2>/dev/null
  openssl req -new -newkey rsa:2048 -nodes -keyout "$pki/webhook-client.key" \
    -subj "/CN=kube-apiserver-webhook-client" -out "$pki/webhook-client.csr" 2>/dev/null
  printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
    "extendedKeyUsage=clientAuth" >"$pki/webhook-client.ext"
  openssl x509 -req -in "$pki/webhook-client.csr" -CA "$pki/webhook-client-ca.crt" \
    -CAkey "$pki/webhook-client-ca.key" -CAcreateserial -days 30 -extfile "$pki/webhook-client.ext" \
    -out "$pki/webhook-client.crt" 2>/dev/null
  rm -f "$pki/webhook-client.csr" "$pki/webhook-client.ext"
  printf '%s\n' "apiVersion: v1" "kind: Config" "users:" "- name: '*'" "  user:" \
    "    client-certificate: $pki/webhook-client.crt" "    client-key: $pki/webhook-client.key" \
    >"$dir/webhook-client.kubeconfig"
  {
    echo "apiVersion: apiserver.config.k8s.io/v1"
    echo "kind: AdmissionConfiguration"
    echo "plugins:"
    for plugin in ValidatingAdmissionWebhook MutatingAdmissionWebhook; do
      printf '%s\n' "- name: $plugin" "  configuration:" "    apiVersion: apiserver.config.k8s.io/v1" \
        "    kind: WebhookAdmissionConfiguration" "    kubeConfigFile: $dir/webhook-client.kubeconfig"
    done
  } >"$dir/admission.yaml"
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  kubeconfig "$dir/kubeconfig" admin
  kubeconfig "$dir/kube-controller-manager.kubeconfig" kube-controller-manager
  local url="https://127.0.0.1:$COZY_CLUSTER_APISERVER_PORT"
  cat >"$dir/env" <<EOF
APISERVER_URL=$url
APISERVER_PORT=$COZY_CLUSTER_APISERVER_PORT
ETCD_PORT=$COZY_CLUSTER_ETCD_PORT
KUBECONFIG=$dir/kubeconfig
EOF

  local etcd_url="http://127.0.0.1:$COZY_CLUSTER_ETCD_PORT"
  local peer_url="http://127.0.0.1:$COZY_CLUSTER_ETCD_PEER_PORT"
  start etcd "$bin/etcd" --name cozy --data-dir "$dir/etcd" --unsafe-no-fsync \
    --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
    --listen-peer-urls "$peer_url" --initial-advertise-peer-urls "$peer_url" \
    --initial-cluster "cozy=$peer_url" --log-level warn
  wait_for etcd "$dir/logs/etcd.log" 30 curl -fsS "$etcd_url/health"

  # The request log: reads as metadata (user, URI, answer), writes with their bodies.
  printf '%s\n' "apiVersion: audit.k8s.io/v1" "kind: Policy" "omitStages: [RequestReceived]" \
    "rules:" "- level: Metadata" "  verbs: [get, list, watch]" "- level: Request" \
    >"$dir/audit-policy.yaml"

  # envtest's defaults (docs/testing.md): RBAC, client certificates of our CA, service-account
  # tokens signed with our key, the ServiceAccount admission plugin off (no token controller
  # here), and on a machine without a default route the loopback address with no endpoint
  # reconciler.
  start kube-apiserver "$bin/kube-apiserver" \
    --advertise-address=127.0.0.1 --bind-address=127.0.0.1 \
    --secure-port="$COZY_CLUSTER_APISERVER_PORT" --endpoint-reconciler-type=none \
    --etcd-servers="$etcd_url" --cert-dir="$pki" \
    --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
    --client-ca-file="$pki/ca.crt" --authorization-mode=RBAC \
    --service-account-issuer="$url" --service-account-key-file="$pki/sa.pub" \
    --service-account-signing-key-file="$pki/sa.key" \
    --api-audiences="$url" \
    --service-cluster-ip-range=10.0.0.0/24 --allow-privileged=true \
    --disable-admission-plugins=ServiceAccount \
    --audit-policy-file="$dir/audit-policy.yaml" --audit-log-path="$dir/logs/audit.log" \
    --audit-log-format=json --audit-log-mode=blocking --audit-log-maxsize=500 \
    --admission-control-config-file="$dir/admission.yaml"
  wait_for kube-apiserver "$dir/logs/kube-apiserver.log" 90 \
    curl -fsS --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" "$url/readyz"

  # Namespace deletion, ownerReference garbage collection, each namespace's default
  # ServiceAccount, and the policies' type-checking status. Each controller with its own
  # service account's token (TokenRequest) and the bootstrap role RBAC gives it, as kubeadm
  # runs them: the manager's own user has none of those rights.
  start kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig="$dir/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig="$dir/kube-controller-manager.kubeconfig" \
    --authorization-kubeconfig="$dir/kube-controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$COZY_CLUSTER_KCM_PORT" \
    --leader-elect=false --use-service-account-credentials=true \
    --controllers=namespace-controller,garbage-collector-controller,serviceaccount-controller,validatingadmissionpolicy-status-controller
  wait_for kube-controller-manager "$dir/logs/kube-controller-manager.log" 60 \
    curl -fsSk "https://127.0.0.1:$COZY_CLUSTER_KCM_PORT/healthz"
  wait_for "the default namespace" "$dir/logs/kube-apiserver.log" 30 \
    "$bin/kubectl" --kubeconfig "$dir/kubeconfig" get namespace default
  echo "$url"
}

# user DIR FILE CN [GROUP...]: a kubeconfig for a user of DIR's cluster, by client certificate.
user() {
  local dir=$1 file=$2 cn=$3
  shift 3
  [ -f "$dir/env" ] && [ -f "$dir/pki/ca.key" ] || die 2 "$dir is not a cluster's directory"
  pki=$(cd "$dir/pki" && pwd)
  COZY_CLUSTER_APISERVER_PORT=$(sed -n 's/^APISERVER_PORT=//p' "$dir/env")
  local subject="" group work
  for group in "$@"; do subject+="/O=$group"; done
  work=$(mktemp -d)
  openssl req -new -newkey rsa:2048 -nodes -keyout "$work/user.key" -subj "$subject/CN=$cn" \
    -out "$work/user.csr" 2>/dev/null
  printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
    "extendedKeyUsage=clientAuth" >"$work/user.ext"
  openssl x509 -req -in "$work/user.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
    -CAserial "$work/ca.srl" -CAcreateserial -days 30 -extfile "$work/user.ext" \
    -out "$work/user.crt" 2>/dev/null || { rm -rf "$work"; die 1 "cannot sign a certificate for $cn"; }
  kubeconfig "$file" "$cn" "$work/user"
  rm -rf "$work"
}

down() {
  local dir=$1
  [ -d "$dir" ] || die 2 "$dir is not a cluster's directory"
  dir=$(cd "$dir" && pwd)
  [ -f "$dir/pids" ] || die 2 "$dir has no pids file (nothing started there, or already down)"
  stop_pids "$dir"
}

case "${1:-}" in
  build)
    [ $# -eq 1 ] || die 2 "usage: scripts/cluster.sh build"
    build_tools
    echo "$(tools_dir)/bin"
    ;;
  bin)
    [ $# -eq 1 ] || die 2 "usage: scripts/cluster.sh bin"
    echo "$(tools_dir)/bin"
    ;;
  up)
    [ $# -eq 2 ] || die 2 "usage: scripts/cluster.sh up DIR"
    up "$2"
    ;;
  down)
    [ $# -eq 2 ] || die 2 "usage: scripts/cluster.sh down DIR"
    down "$2"
    ;;
  user)
    [ $# -ge 4 ] || die 2 "usage: scripts/cluster.sh user DIR FILE CN [GROUP...]"
    shift
    user "$@"
    ;;
  *)
    die 2 "usage: scripts/cluster.sh build | bin | up DIR | down DIR | user DIR FILE CN [GROUP...]"
    ;;
esac
