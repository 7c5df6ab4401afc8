#!/usr/bin/env bash
# A real Kubernetes cluster on this machine, for tests and the demo (docs/testing.md,
# "The real control plane" and "Real nodes"): etcd, kube-apiserver, kube-controller-manager and
# kube-scheduler built from the Go modules pinned under tools/, every port on 127.0.0.1, and
# real kubelets with a test device plugin as its nodes.
#
#   scripts/cluster.sh build [TOOL...]
#                                   # builds the tools (all, or those named) into the cache
#                                   # (once per pin), prints their dir
#   scripts/cluster.sh bin          # prints the tools' directory (kube-apiserver, kubectl, helm, ...)
#   scripts/cluster.sh up DIR       # starts a cluster whose state lives in DIR (empty or absent)
#   scripts/cluster.sh node DIR NAME [--host FIXTURE_ROOT] [--ids address|iommu-group]
#                                   [--label K=V]... [--taint K=V:EFFECT]...
#                                   [--feature-gates GATE=BOOL,...] [--programs FILE]
#                                   # starts a real kubelet registering node NAME, its container
#                                   # runtime and, with --host, the test device plugin advertising
#                                   # that fixture host's GPUs; returns once the node is Ready
#   scripts/cluster.sh node-down DIR NAME
#                                   # stops node NAME's processes, deletes its Node object and
#                                   # its state (its logs kept in DIR/logs/nodes/NAME/)
#   scripts/cluster.sh kubelet DIR NAME stop|start
#                                   # stops or starts node NAME's kubelet alone (the runtime and
#                                   # the plugin stay, as on a host whose kubelet restarts)
#   scripts/cluster.sh restart DIR etcd|kube-apiserver
#                                   # stops that process of DIR's control plane (SIGTERM, then
#                                   # SIGKILL after 10 s) and starts it again as `up` did; returns
#                                   # once it serves again (its log goes on in DIR/logs/)
#   scripts/cluster.sh compact DIR  # compacts etcd's history to its current revision: what
#                                   # lists and watches from before it get is 410 Gone
#   scripts/cluster.sh down DIR     # stops exactly the processes `up DIR` and `node DIR` started,
#                                   # and puts back the host sysctls kubelet changes
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
# `node` keeps node NAME's state in a directory under $TMPDIR (short: its sockets' paths must
# fit a unix socket address), linked as DIR/nodes/NAME and printed: its kubelet's root directory
# (root/, whose pod-resources/kubelet.sock the agent dials), device-plugins/ (kubelet's
# registration socket and the plugins'), unhealthy (device IDs the plugin advertises Unhealthy;
# it reads the file again every 250 ms), logs/ and pids. `node-down` and `down` remove it, its
# logs kept in DIR/logs/nodes/NAME/. Each kubelet runs in a mount namespace of its own, where its
# fixed paths (/var/lib/kubelet/device-plugins, /var/log/containers) are that node's directories.
#
# Ports: chosen free below the ephemeral range (scripts/lib/free-port.sh), or given as COZY_CLUSTER_APISERVER_PORT,
# COZY_CLUSTER_ETCD_PORT, COZY_CLUSTER_ETCD_PEER_PORT, COZY_CLUSTER_KCM_PORT,
# COZY_CLUSTER_SCHEDULER_PORT; a node's kubelet ports are chosen free the same way, when `node`
# runs (a port a caller chose and has not bound yet may be taken). COZY_CLUSTER_NODE_GRACE
# (default 10s): how long the node lifecycle controller waits for a silent kubelet before it
# marks the node NotReady. COZY_CLUSTER_WORKLOADS=1 (at `up`) runs what a Deployment needs too:
# the ServiceAccount admission plugin (each pod's token volume) and kube-controller-manager's
# deployment, replicaset, endpoints, endpointslice, disruption and root-CA publisher controllers,
# with the API server reaching a Service's webhook at its endpoints (--enable-aggregator-routing:
# there is no kube-proxy). A node started with `--programs FILE` (lines IMAGE PROGRAM) runs those
# images' containers as processes, each pod in a network namespace with an address of its own
# (tools/kube/cri-runtime/programs.go).
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
# the build recipe below, so a changed pin (or go.sum, our Go mains, a flag) builds anew.
tools_dir() {
  local root=${COZY_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cozy-gpu/tools}
  local hash
  hash=$({ cd "$source_dir/tools" && cat kube/go.mod kube/go.sum kube/*/*.go etcd/go.mod \
    etcd/go.sum etcd/main.go helm/go.mod helm/go.sum && declare -f build_tools build_one; } |
    sha256sum | cut -c1-12)
  echo "$root/kube-$kube_version-etcd-$etcd_version-helm-$helm_version-$hash"
}

# What each use needs: the control plane of `up`, a node of `node`, the clients.
control_plane_tools=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl)
node_tools=(kubelet cri-runtime gpu-device-plugin)
tools=(kubectl helm etcd kube-apiserver kube-controller-manager kube-scheduler "${node_tools[@]}")

tools_built() { # tools_built DIR TOOL...
  local dir=$1 t
  shift
  for t in "$@"; do [ -x "$dir/bin/$t" ] || return 1; done
}

# build_one DIR TOOL: one binary into DIR/bin (written aside, then renamed: a reader never sees
# half of one).
build_one() {
  local dir=$1 tool=$2 out="$dir/bin.partial"
  mkdir -p "$out" "$dir/bin"
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
  case $tool in
    kube-apiserver | kube-controller-manager | kube-scheduler | kubectl | kubelet)
      (cd "$source_dir/tools/kube" && go build -trimpath -pgo=off -ldflags="$ld" -o "$out/$tool" \
        "k8s.io/kubernetes/cmd/$tool") || die 1 "building $tool $kube_version failed"
      ;;
    cri-runtime | gpu-device-plugin) # test tooling of `node`, our own mains (tools/kube/)
      (cd "$source_dir/tools/kube" && go build -trimpath -ldflags="-s -w" -o "$out/$tool" \
        "./$tool") || die 1 "building $tool failed"
      ;;
    etcd)
      (cd "$source_dir/tools/etcd" && go build -trimpath -ldflags="-s -w" -o "$out/etcd" .) ||
        die 1 "building etcd $etcd_version failed"
      ;;
    helm)
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
      ;;
    *) die 2 "no tool $tool (one of: ${tools[*]})" ;;
  esac
  mv "$out/$tool" "$dir/bin/$tool"
}

# build_tools [TOOL...]: those not built yet (all by default), one at a time, each timed on
# stderr. A use builds what it needs: the demo on the fake API server kubectl alone.
build_tools() {
  local dir t start
  dir=$(tools_dir)
  local -a wanted=("$@")
  [ ${#wanted[@]} -gt 0 ] || wanted=("${tools[@]}")
  for t in "${wanted[@]}"; do
    [[ " ${tools[*]} " == *" $t "* ]] || die 2 "no tool $t (one of: ${tools[*]})"
  done
  tools_built "$dir" "${wanted[@]}" && return 0
  command -v go >/dev/null || die 2 "go is not installed: the test tools are built from Go modules (Go 1.26; scripts/install-deps.sh)"
  mkdir -p "$dir"
  # One build at a time per cache directory (parallel test runs, CI and a developer).
  exec 9>"$dir/.lock"
  flock 9
  for t in "${wanted[@]}"; do
    tools_built "$dir" "$t" && continue
    start=$SECONDS
    echo "cluster.sh: building $t (Kubernetes $kube_version, etcd $etcd_version, helm" \
      "$helm_version) into $dir (once per pin)" >&2
    build_one "$dir" "$t"
    echo "cluster.sh: built $t in $((SECONDS - start)) s" >&2
  done
  rm -rf "$dir/bin.partial"
}

require_tools() { # require_tools WHAT TOOL...: sets bin
  local dir what=$1
  shift
  dir=$(tools_dir)
  tools_built "$dir" "$@" || die 2 "the $what's binaries are not built in $dir/bin (scripts/cluster.sh build)"
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
    stop_pid "$dir" "${listed[$i]}"
  done
  rm -f "$dir/pids"
}
# stop_pid DIR PID: SIGTERM, up to 10 s, then SIGKILL; only while its command line names DIR.
stop_pid() {
  local dir=$1 pid=$2 cmdline
  # A pid already gone: its /proc entry too (the braces take the redirection's own error).
  cmdline=$({ tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null) || return 0
  [[ "$cmdline" == *"$dir/"* ]] || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 100); do
    alive "$pid" || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null
  for _ in $(seq 50); do
    alive "$pid" || return 0
    sleep 0.1
  done
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

# start NAME COMMAND...: in its own session, logging to DIR/logs/NAME.log, pid into DIR/pids,
# the command into DIR/cmd/NAME, NUL-separated (for `restart`).
start() {
  local name=$1
  shift
  mkdir -p "$dir/cmd"
  printf '%s\0' "$@" >"$dir/cmd/$name"
  setsid "$@" >"$dir/logs/$name.log" 2>&1 </dev/null &
  echo "$name $!" >>"$dir/pids"
}

# restart DIR NAME: NAME's process of the control plane stopped and started again from
# DIR/cmd/NAME, its pid replaced in place in DIR/pids (the stop order stays the start order
# reversed); returns once it serves again.
restart() {
  local name=$2 pid new url
  [ -d "$1" ] && [ -f "$1/env" ] || die 2 "$1 is not a cluster's directory"
  dir=$(cd "$1" && pwd)
  case "$name" in etcd | kube-apiserver) ;; *) die 2 "restart: etcd or kube-apiserver, not $name" ;; esac
  [ -f "$dir/cmd/$name" ] && [ -f "$dir/pids" ] || die 2 "$dir has no $name started by up"
  pid=$(awk -v n="$name" '$1 == n { p = $2 } END { print p }' "$dir/pids")
  [ -n "$pid" ] || die 2 "$dir/pids names no $name"
  stop_pid "$dir" "$pid"
  alive "$pid" && die 1 "$name ($pid) did not stop"
  echo "--- restarted by scripts/cluster.sh restart at $(date -u +%FT%TZ)" >>"$dir/logs/$name.log"
  local -a command
  mapfile -d '' command <"$dir/cmd/$name"
  setsid "${command[@]}" >>"$dir/logs/$name.log" 2>&1 </dev/null &
  new=$!
  sed -i "s/^$name $pid\$/$name $new/" "$dir/pids"
  pki="$dir/pki"
  case "$name" in
    etcd)
      url="http://127.0.0.1:$(sed -n 's/^ETCD_PORT=//p' "$dir/env")/health"
      wait_for etcd "$dir/logs/etcd.log" 30 curl -fsS "$url"
      ;;
    kube-apiserver)
      url="$(sed -n 's/^APISERVER_URL=//p' "$dir/env")/readyz"
      wait_for kube-apiserver "$dir/logs/kube-apiserver.log" 90 \
        curl -fsS --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" "$url"
      ;;
  esac
}

# compact DIR: etcd's history compacted up to its current revision (what etcd's own periodic
# compaction, or kube-apiserver's every 5 minutes, does): a watch or a list continued from a
# resourceVersion before it is answered 410 Gone and must list again. Prints the revision.
compact() {
  [ -d "$1" ] && [ -f "$1/env" ] || die 2 "$1 is not a cluster's directory"
  local url revision
  url="http://127.0.0.1:$(sed -n 's/^ETCD_PORT=//p' "$1/env")/v3/kv"
  revision=$(curl -fsS -X POST "$url/range" -d '{"key":"AA==","limit":1}' |
    sed -n 's/.*"revision":"\([0-9]*\)".*/\1/p') || die 1 "etcd at $url did not answer"
  [ -n "$revision" ] || die 1 "etcd at $url gave no revision"
  curl -fsS -X POST "$url/compaction" -d "{\"revision\":\"$revision\",\"physical\":true}" >/dev/null ||
    die 1 "etcd at $url refused to compact to $revision"
  echo "$revision"
}

up() {
  dir=$1
  require_tools "control plane" "${control_plane_tools[@]}"
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
  port COZY_CLUSTER_SCHEDULER_PORT
  local grace=${COZY_CLUSTER_NODE_GRACE:-10s}
  [[ "$grace" =~ ^[0-9]+s$ ]] || die 2 "COZY_CLUSTER_NODE_GRACE=$grace is not a number of seconds (like 10s)"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  pki="$dir/pki"
  mkdir -p "$pki" "$dir/logs" "$dir/etcd"
  local workload_controllers="" workload_kcm_flags=() workload_apiserver_flags=(--disable-admission-plugins=ServiceAccount)
  if [ "${COZY_CLUSTER_WORKLOADS:-}" = 1 ]; then
    workload_controllers=",deployment-controller,replicaset-controller,endpoints-controller,endpointslice-controller,disruption-controller,root-ca-certificate-publisher-controller"
    workload_kcm_flags=(--root-ca-file="$pki/ca.crt")
    workload_apiserver_flags=(--enable-aggregator-routing=true)
  fi

  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$pki/ca.key" -out "$pki/ca.crt" -days 30 \
    -subj "/CN=cozy-gpu-test-ca" 2>/dev/null
  cert apiserver "/CN=kube-apiserver" \
    "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc"$'\n'"extendedKeyUsage=serverAuth"
  cert admin "/O=system:masters/CN=admin" "extendedKeyUsage=clientAuth"
  cert kube-controller-manager "/CN=system:kube-controller-manager" "extendedKeyUsage=clientAuth"
  cert kube-scheduler "/CN=system:kube-scheduler" "extendedKeyUsage=clientAuth"
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
  kubeconfig "$dir/kube-scheduler.kubeconfig" kube-scheduler
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
    "${workload_apiserver_flags[@]}" \
    --audit-policy-file="$dir/audit-policy.yaml" --audit-log-path="$dir/logs/audit.log" \
    --audit-log-format=json --audit-log-mode=blocking --audit-log-maxsize=500 \
    --admission-control-config-file="$dir/admission.yaml"
  wait_for kube-apiserver "$dir/logs/kube-apiserver.log" 90 \
    curl -fsS --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" "$url/readyz"

  # Namespace deletion, ownerReference garbage collection, each namespace's default
  # ServiceAccount, the policies' type-checking status, and the node lifecycle: a new node's
  # not-ready taint cleared once its kubelet reports Ready, a node whose kubelet went silent
  # marked NotReady and tainted (no taint-eviction controller: nothing is evicted); and DRA's
  # resource-claim controller, which deallocates a claim no pod uses any more (docs/dra.md). Each
  # controller with its own service account's token (TokenRequest) and the bootstrap role RBAC
  # gives it, as kubeadm runs them: the manager's own user has none of those rights.
  start kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig="$dir/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig="$dir/kube-controller-manager.kubeconfig" \
    --authorization-kubeconfig="$dir/kube-controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$COZY_CLUSTER_KCM_PORT" \
    --leader-elect=false --use-service-account-credentials=true \
    --controllers=namespace-controller,garbage-collector-controller,serviceaccount-controller,validatingadmissionpolicy-status-controller,node-lifecycle-controller,resourceclaim-controller$workload_controllers \
    "${workload_kcm_flags[@]}" \
    --node-monitor-period=1s --node-monitor-grace-period="$grace"
  wait_for kube-controller-manager "$dir/logs/kube-controller-manager.log" 60 \
    curl -fsSk "https://127.0.0.1:$COZY_CLUSTER_KCM_PORT/healthz"
  # Pods are bound by the real scheduler, as its own bootstrap user (system:kube-scheduler).
  start kube-scheduler "$bin/kube-scheduler" --kubeconfig="$dir/kube-scheduler.kubeconfig" \
    --leader-elect=false --bind-address=127.0.0.1 --secure-port="$COZY_CLUSTER_SCHEDULER_PORT"
  wait_for kube-scheduler "$dir/logs/kube-scheduler.log" 60 \
    curl -fsSk "https://127.0.0.1:$COZY_CLUSTER_SCHEDULER_PORT/healthz"
  wait_for "the default namespace" "$dir/logs/kube-apiserver.log" 30 \
    "$bin/kubectl" --kubeconfig "$dir/kubeconfig" get namespace default
  echo "$url"
}

# --- nodes ---------------------------------------------------------------------------------

# The host sysctls kubelet sets when its container manager starts, with no flag to stop it
# (docs/testing.md, "Real nodes"): saved once per cluster before the first kubelet, put back as
# soon as each kubelet answers its health check, and by `down` whatever happened. Left at
# kubelet's values, kernel.panic_on_oops=1 turns any oops on a test machine into a reboot.
kubelet_sysctls=(kernel/panic kernel/panic_on_oops vm/overcommit_memory)
save_sysctls() {
  local dir=$1 key
  [ -f "$dir/sysctls" ] && return 0
  for key in "${kubelet_sysctls[@]}"; do
    echo "$key $(cat "/proc/sys/$key")"
  done >"$dir/sysctls.partial"
  mv "$dir/sysctls.partial" "$dir/sysctls"
}
restore_sysctls() {
  local dir=$1 key value
  [ -f "$dir/sysctls" ] || return 0
  while read -r key value; do
    [ "$(cat "/proc/sys/$key" 2>/dev/null)" = "$value" ] && continue
    echo "$value" >"/proc/sys/$key" 2>/dev/null ||
      echo "cluster.sh: cannot put /proc/sys/$key back to $value" >&2
  done <"$dir/sysctls"
}

# The node's address: kubelet refuses a loopback one. The first global IPv4 address; on a
# machine with none, a dummy interface of the cluster's own (removed by `down`).
node_ip() {
  local dir=$1 ip
  ip=$(ip -4 -o addr show scope global 2>/dev/null | awk '{split($4, a, "/"); print a[1]; exit}')
  if [ -z "$ip" ]; then
    ip link add cozy-nodes type dummy 2>/dev/null && ip addr add 198.18.0.1/32 dev cozy-nodes &&
      ip link set cozy-nodes up || die 1 "no global IPv4 address for kubelet's node IP, and no dummy interface could be added"
    echo cozy-nodes >"$dir/dummy-interface"
    ip=198.18.0.1
  fi
  echo "$ip"
}

# start_in NODEDIR NAME COMMAND...: as start, with the node's logs and pids.
start_in() {
  local node_dir=$1 name=$2
  shift 2
  setsid "$@" >>"$node_dir/logs/$name.log" 2>&1 </dev/null 8>&- 9>&- &
  echo "$name $!" >>"$node_dir/pids"
}

# The kubelet of NODEDIR, in a private mount namespace where the paths it never takes from its
# flags are the node's own: the device manager's /var/lib/kubelet/device-plugins and
# /var/log/containers. Two kubelets never meet; nothing outlives the namespace.
start_kubelet() {
  local node_dir=$1
  mkdir -p /var/lib/kubelet/device-plugins /var/log/containers
  # One kubelet start at a time on this machine, whatever its cluster: the values saved are the
  # host's own, never another kubelet's not yet put back.
  local lock_dir=/run/lock
  [ -d "$lock_dir" ] && [ -w "$lock_dir" ] || lock_dir=/tmp
  exec 8>"$lock_dir/cozy-kubelet-sysctls.lock"
  flock 8
  save_sysctls "$dir"
  # Its working directory is an empty one of the node's own: kubelet 1.36 removes what it finds
  # in its working directory as it starts (seen removing a ctest directory's files).
  mkdir -p "$node_dir/cwd"
  start_in "$node_dir" kubelet unshare --mount --propagation private -- bash -c \
    'mount --bind "$1" /var/lib/kubelet/device-plugins && mount --bind "$2" /var/log/containers &&
     cd "$3" && shift 3 && exec "$@"' kubelet-namespace "$node_dir/device-plugins" \
    "$node_dir/containers" "$node_dir/cwd" \
    "$bin/kubelet" --config="$node_dir/kubelet.yaml" --kubeconfig="$node_dir/kubeconfig" \
    --root-dir="$node_dir/root" --cert-dir="$node_dir/root/pki" \
    --hostname-override="$(cat "$node_dir/name")" --node-ip="$(cat "$node_dir/ip")" \
    $(cat "$node_dir/flags")
  local port deadline=$((SECONDS + 60))
  port=$(sed -n 's/^healthzPort: //p' "$node_dir/kubelet.yaml")
  until curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      restore_sysctls "$dir"
      echo "cluster.sh: kubelet of $node_dir did not come up within 60 s; last lines of $node_dir/logs/kubelet.log:" >&2
      tail -n 5 "$node_dir/logs/kubelet.log" >&2 || true
      exit 1
    fi
    sleep 0.2
  done
  # kubelet sets them a moment after it answers (its container manager starts after the health
  # server): wait for the change, then put them back.
  local key value changed deadline_set=$((SECONDS + 20))
  while [ "$SECONDS" -lt "$deadline_set" ]; do
    changed=no
    while read -r key value; do
      [ "$(cat "/proc/sys/$key")" = "$value" ] || changed=yes
    done <"$dir/sysctls"
    [ "$changed" = yes ] && break
    # Already kubelet's values (10, 1, 1) before it started: nothing will change.
    [ "$(cut -d' ' -f2 "$dir/sysctls" | tr '\n' ' ')" = "10 1 1 " ] && break
    sleep 0.1
  done
  restore_sysctls "$dir"
  exec 8>&-
}

# node DIR NAME [--host ROOT] [--ids address|iommu-group] [--label K=V]... [--taint K=V:EFFECT]...
node() {
  dir=$1
  local name=$2 host="" ids=address labels="" taints="" gates="" programs="" arg
  shift 2
  while [ $# -gt 0 ]; do
    arg=$1
    [ $# -ge 2 ] || die 2 "$arg needs a value"
    case $arg in
      --host) host=$(cd "$2" 2>/dev/null && pwd) || die 2 "--host $2: no such directory" ;;
      --ids) [[ "$2" =~ ^(address|iommu-group)$ ]] || die 2 "--ids $2: address or iommu-group"
        ids=$2 ;;
      --label) [[ "$2" =~ ^[^=]+=[^,]*$ ]] || die 2 "--label $2 is not K=V"
        labels+="${labels:+,}$2" ;;
      --taint) [[ "$2" =~ ^([^=:]+)(=([^:]*))?:(NoSchedule|PreferNoSchedule|NoExecute)$ ]] ||
          die 2 "--taint $2 is not K=V:EFFECT (NoSchedule, PreferNoSchedule or NoExecute)"
        taints+="- {key: \"${BASH_REMATCH[1]}\", value: \"${BASH_REMATCH[3]}\", effect: ${BASH_REMATCH[4]}}"$'\n' ;;
      --feature-gates) [[ "$2" =~ ^[A-Za-z0-9]+=(true|false)(,[A-Za-z0-9]+=(true|false))*$ ]] ||
          die 2 "--feature-gates $2 is not GATE=true|false,..."
        gates=$2 ;;
      --programs) programs=$(readlink -f "$2") && [ -f "$programs" ] || die 2 "--programs $2: no such file"
        command -v ip >/dev/null && command -v nsenter >/dev/null && command -v setpriv >/dev/null ||
          die 2 "--programs needs ip (iproute2), nsenter and setpriv (util-linux)" ;;
      *) die 2 "unknown option $arg (--host, --ids, --label, --taint, --feature-gates, --programs)" ;;
    esac
    shift 2
  done
  [[ "$name" =~ ^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$ ]] || die 2 "$name is not a node name"
  [ -f "$dir/env" ] && [ -f "$dir/pids" ] || die 2 "$dir is not a running cluster's directory (scripts/cluster.sh up)"
  dir=$(cd "$dir" && pwd)
  pki="$dir/pki"
  [ ! -e "$dir/nodes/$name" ] || die 2 "node $name exists in $dir already"
  require_tools node "${node_tools[@]}" kubectl
  # The node's state lives under a short path (DIR/nodes/NAME links to it): its sockets' paths
  # must fit a unix socket address (107 bytes) wherever DIR is.
  local node_dir
  mkdir -p "$dir/nodes"
  node_dir=$(mktemp -d "${TMPDIR:-/tmp}/cozy-node.XXXXXX")
  ln -s "$node_dir" "$dir/nodes/$name"
  local kubelet_port healthz_port
  free_port kubelet_port || die 2 "no free port for kubelet"
  free_port healthz_port || die 2 "no free port for kubelet's health check"
  COZY_CLUSTER_APISERVER_PORT=$(sed -n 's/^APISERVER_PORT=//p' "$dir/env")
  mkdir -p "$node_dir/root/pki" "$node_dir/device-plugins" "$node_dir/containers" \
    "$node_dir/pod-logs" "$node_dir/volume-plugins" "$node_dir/logs"
  echo "$name" >"$node_dir/name"
  node_ip "$dir" >"$node_dir/ip"
  : >"$node_dir/unhealthy"
  echo "${labels:+--node-labels=$labels} ${gates:+--feature-gates=$gates}" >"$node_dir/flags"
  # Its own identity, system:node:NAME in system:nodes, with the rights RBAC's system:node role
  # gives (this API server runs no Node authorizer: the binding stands in for it).
  cert "node-$name" "/O=system:nodes/CN=system:node:$name" "extendedKeyUsage=clientAuth"
  mv "$pki/node-$name.crt" "$pki/node-$name.key" "$node_dir/"
  kubeconfig "$node_dir/kubeconfig" "system:node:$name" "$node_dir/node-$name"
  "$bin/kubectl" --kubeconfig "$dir/kubeconfig" create clusterrolebinding cozy-test-nodes \
    --clusterrole=system:node --group=system:nodes >/dev/null 2>&1 ||
    "$bin/kubectl" --kubeconfig "$dir/kubeconfig" get clusterrolebinding cozy-test-nodes >/dev/null ||
    die 1 "cannot bind the system:node role for the nodes"
  local taint_yaml="registerWithTaints: []"
  [ -z "$taints" ] || taint_yaml="registerWithTaints:"$'\n'"${taints%$'\n'}"
  # No images, no cgroups of its own, no host limits (../shared/research/real-node.md).
  cat >"$node_dir/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: ["none"]
failSwapOn: false
containerRuntimeEndpoint: unix://$node_dir/cri.sock
address: 127.0.0.1
port: $kubelet_port
healthzBindAddress: 127.0.0.1
healthzPort: $healthz_port
readOnlyPort: 0
podLogsDir: $node_dir/pod-logs
volumePluginDir: $node_dir/volume-plugins
resolvConf: ""
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
nodeStatusUpdateFrequency: 2s
nodeLeaseDurationSeconds: 10
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%"}
$taint_yaml
YAML
  local runtime_flags=()
  if [ -n "$programs" ]; then
    local subnet
    subnet=$(take_pod_subnet "$node_dir") || die 1 "no pod subnet free on this machine (/run/cozy-pod-subnets)"
    runtime_flags=(--programs "$programs" --pod-subnet "$subnet"
      --apiserver "127.0.0.1:$COZY_CLUSTER_APISERVER_PORT" --kubelet-pids "$node_dir/pids")
  fi
  start_in "$node_dir" cri-runtime "$bin/cri-runtime" --endpoint "unix://$node_dir/cri.sock" \
    "${runtime_flags[@]}"
  local deadline=$((SECONDS + 20))
  until [ -S "$node_dir/cri.sock" ]; do
    [ "$SECONDS" -lt "$deadline" ] || die 1 "the container runtime of $name did not come up; see $node_dir/logs/cri-runtime.log"
    sleep 0.1
  done
  start_kubelet "$node_dir"
  if [ -n "$host" ]; then
    start_in "$node_dir" gpu-device-plugin "$bin/gpu-device-plugin" --sysfs-root "$host" \
      --plugin-dir "$node_dir/device-plugins" --ids "$ids" --unhealthy-file "$node_dir/unhealthy"
  fi
  # Ready, with the not-ready taint gone (the node lifecycle controller's), and every resource
  # the plugin registered in the node's allocatable.
  local kc=("$bin/kubectl" --kubeconfig "$dir/kubeconfig" --request-timeout=10s) want got
  deadline=$((SECONDS + 90))
  while :; do
    got=$("${kc[@]}" get node "$name" -o \
      'jsonpath={.status.conditions[?(@.type=="Ready")].status} {.spec.taints[*].key} {.status.allocatable}' 2>/dev/null) || got=""
    want=ok
    [[ "$got" == True* ]] || want=""
    [[ "$got" == *node.kubernetes.io/not-ready* ]] && want=""
    if [ -n "$host" ] && [ -n "$want" ]; then
      local resource
      for resource in $(sed -n 's/^gpu-device-plugin: \(.*\): registered$/\1/p' "$node_dir/logs/gpu-device-plugin.log"); do
        [[ "$got" == *"\"$resource\""* ]] || want=""
      done
      grep -q "registered$" "$node_dir/logs/gpu-device-plugin.log" ||
        grep -q "no vfio-bound GPU function" "$node_dir/logs/gpu-device-plugin.log" || want=""
    fi
    [ -n "$want" ] && break
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "cluster.sh: node $name is not Ready with its devices within 90 s ($got); see $node_dir/logs/" >&2
      exit 1
    fi
    sleep 0.2
  done
  echo "$node_dir"
}

# node-down DIR NAME
node_down() {
  dir=$(cd "$1" 2>/dev/null && pwd) || die 2 "$1 is not a cluster's directory"
  local name=$2 node_dir
  node_dir=$(readlink -f "$dir/nodes/$2") && [ -f "$node_dir/kubelet.yaml" ] || die 2 "no node $name in $dir"
  require_tools node kubectl
  stop_pids "$node_dir"
  restore_sysctls "$dir"
  "$bin/kubectl" --kubeconfig "$dir/kubeconfig" --request-timeout=20s delete node "$name" \
    --ignore-not-found >/dev/null || die 1 "cannot delete Node $name"
  remove_node_state "$dir" "$name"
}

# take_pod_subnet NODEDIR: a /24 of 10.88.0.0/16 for the node's pods (--programs), unique on this
# machine whatever the cluster (each pod's address is routed on the host): the first K whose
# directory /run/cozy-pod-subnets/K this node makes (mkdir is atomic), or whose owner is gone.
take_pod_subnet() {
  local node_dir=$1 root=/run/cozy-pod-subnets k
  mkdir -p "$root"
  for k in $(seq 1 250); do
    if [ -d "$root/$k" ] && [ ! -d "$(cat "$root/$k/owner" 2>/dev/null)" ]; then
      release_pod_subnet "$k"
    fi
    if mkdir "$root/$k" 2>/dev/null; then
      echo "$node_dir" >"$root/$k/owner"
      echo "$k" >"$node_dir/pod-subnet"
      echo "10.88.$k"
      return 0
    fi
  done
  return 1
}
# release_pod_subnet K: its pods' network namespaces (their veths go with them) and the subnet.
release_pod_subnet() {
  local k=$1 ns
  for ns in $(ip netns list 2>/dev/null | awk -v p="cozy-$k-" 'index($1, p) == 1 { print $1 }'); do
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "/run/cozy-pod-subnets/$k"
}

# remove_node_state DIR NAME: the node's logs to DIR/logs/nodes/NAME/, its state gone (its name
# free for another node).
remove_node_state() {
  local dir=$1 name=$2 node_dir
  node_dir=$(readlink -f "$dir/nodes/$name") || return 0
  if [ -d "$node_dir" ]; then
    [ ! -f "$node_dir/pod-subnet" ] || release_pod_subnet "$(cat "$node_dir/pod-subnet")"
    mkdir -p "$dir/logs/nodes"
    rm -rf "$dir/logs/nodes/$name"
    cp -r "$node_dir/logs" "$dir/logs/nodes/$name" 2>/dev/null || true
    rm -rf "$node_dir"
  fi
  rm -f "$dir/nodes/$name"
}

# kubelet DIR NAME stop|start
kubelet_control() {
  dir=$(cd "$1" 2>/dev/null && pwd) || die 2 "$1 is not a cluster's directory"
  local name=$2 action=$3 node_dir pid
  node_dir=$(readlink -f "$dir/nodes/$2") && [ -f "$node_dir/kubelet.yaml" ] || die 2 "no node $name in $dir"
  require_tools node "${node_tools[@]}"
  pid=$(awk '$1 == "kubelet" {p = $2} END {print p}' "$node_dir/pids" 2>/dev/null)
  case $action in
    stop)
      [ -n "$pid" ] && alive "$pid" || die 2 "the kubelet of $name is not running"
      kill -TERM "$pid"
      for _ in $(seq 100); do alive "$pid" || break; sleep 0.1; done
      alive "$pid" && kill -KILL "$pid"
      for _ in $(seq 50); do alive "$pid" || break; sleep 0.1; done
      grep -v "^kubelet " "$node_dir/pids" >"$node_dir/pids.new" || true
      mv "$node_dir/pids.new" "$node_dir/pids"
      ;;
    start)
      [ -z "$pid" ] || ! alive "$pid" || die 2 "the kubelet of $name is running"
      start_kubelet "$node_dir"
      ;;
    *) die 2 "usage: scripts/cluster.sh kubelet DIR NAME stop|start" ;;
  esac
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
  # Each node's processes, then its state: the logs move to DIR/logs/nodes/NAME/.
  local link node_dir
  for link in "$dir"/nodes/*; do
    [ -L "$link" ] || continue
    node_dir=$(readlink -f "$link") && [ -d "$node_dir" ] && stop_pids "$node_dir"
    remove_node_state "$dir" "${link##*/}"
  done
  stop_pids "$dir"
  restore_sysctls "$dir"
  if [ -f "$dir/dummy-interface" ]; then
    ip link del "$(cat "$dir/dummy-interface")" 2>/dev/null || true
    rm -f "$dir/dummy-interface"
  fi
}

case "${1:-}" in
  build)
    shift
    build_tools "$@"
    echo "$(tools_dir)/bin"
    ;;
  node)
    [ $# -ge 3 ] || die 2 "usage: scripts/cluster.sh node DIR NAME [--host FIXTURE_ROOT] [--ids address|iommu-group] [--label K=V]... [--taint K=V:EFFECT]... [--feature-gates GATE=BOOL,...] [--programs FILE]"
    shift
    node "$@"
    ;;
  node-down)
    [ $# -eq 3 ] || die 2 "usage: scripts/cluster.sh node-down DIR NAME"
    node_down "$2" "$3"
    ;;
  kubelet)
    [ $# -eq 4 ] || die 2 "usage: scripts/cluster.sh kubelet DIR NAME stop|start"
    kubelet_control "$2" "$3" "$4"
    ;;
  bin)
    [ $# -eq 1 ] || die 2 "usage: scripts/cluster.sh bin"
    echo "$(tools_dir)/bin"
    ;;
  up)
    [ $# -eq 2 ] || die 2 "usage: scripts/cluster.sh up DIR"
    up "$2"
    ;;
  restart)
    [ $# -eq 3 ] || die 2 "usage: scripts/cluster.sh restart DIR etcd|kube-apiserver"
    restart "$2" "$3"
    ;;
  compact)
    [ $# -eq 2 ] || die 2 "usage: scripts/cluster.sh compact DIR"
    compact "$2"
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
    die 2 "usage: scripts/cluster.sh build [TOOL...] | bin | up DIR | node DIR NAME [OPTION...] | node-down DIR NAME | kubelet DIR NAME stop|start | restart DIR etcd|kube-apiserver | compact DIR | down DIR | user DIR FILE CN [GROUP...]"
    ;;
esac
