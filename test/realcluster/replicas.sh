# Two gpu-controller replicas as the chart runs them, behind a balancer, and the invariant
# checker: shared by the tests of docs/reliability.md (chaos_test.sh; upgrade_test.sh, whose replicas
# are the chart's Deployment, uses the checker alone); sourced
# after lib.sh (or own_cluster.sh), not run.
#   replicas_up NAMESPACE [FLAG...]   the chart's service account, webhook serving pair, two
#                                     replicas (FLAGs added to both) and the balancer; the chart
#                                     must point its webhooks at https://127.0.0.1:$balancer_port
#                                     (gpus_on_values "$file" "$balancer_port"), so pick the ports
#                                     first with replicas_ports
#   start_replica I, stop_replica I   replica-I started again / stopped (SIGTERM, as a rollout);
#                                     it runs $controller_program (default this build's)
#   check WHAT [--settled]            the checker on a new snapshot against the one before
command -v node >/dev/null || abort "node is not installed (scripts/install-deps.sh installs it)"

# replicas_ports: $balancer_port (the webhooks' address for the chart) and the replicas' ports.
replicas_ports() {
  local v
  for v in balancer_port webhook0 webhook1 health0 health1; do free_port "$v" || abort "no free port"; done
  webhook_ports=("$webhook0" "$webhook1")
  health_ports=("$health0" "$health1")
}

declare -A replica_pids replica_flags
replicas_up() {
  replicas_ns=$1
  shift
  replica_extra=("$@")
  node "$source_dir/test/realcluster/balancer.mjs" "$balancer_port" "$webhook0:$health0" "$webhook1:$health1" \
    >"$work/balancer.log" 2>&1 &
  pids+=($!)
  wait_until 10 grep -q listening "$work/balancer.log" || abort "the balancer did not start"
  token_kubeconfig "$work/controller.kubeconfig" \
    "$(kc create token gpu-controller -n "$replicas_ns" --duration 3h)" || abort "TokenRequest"
  start_replica 0
  start_replica 1
  wait_until 60 replica_ready 0 && wait_until 60 replica_ready 1 || abort "the replicas are not ready"
  wait_until 45 vmis_read "127.0.0.1:$health0" && wait_until 45 vmis_read "127.0.0.1:$health1" ||
    abort "the replicas do not read VirtualMachineInstances"
}
# start_replica I: replica-I as the chart's service account, its log $work/replica-I.log.
start_replica() {
  "${controller_program:-$build_dir/controller/gpu-controller}" run --kubeconfig "$work/controller.kubeconfig" \
    --namespace "$replicas_ns" --identity "replica-$1" --enable-gpu \
    --webhook-addr "127.0.0.1:${webhook_ports[$1]}" --webhook-cert-dir "$work/certs" \
    --webhook-client-ca "$cluster_dir/pki/webhook-client-ca.crt" \
    --health-addr "127.0.0.1:${health_ports[$1]}" "${replica_extra[@]}" \
    >>"$work/replica-$1.log" 2>&1 &
  replica_pids[$1]=$!
  pids+=($!)
}
# stop_replica I: SIGTERM, as a rollout stops a pod; waits for it to exit.
stop_replica() {
  kill -TERM "${replica_pids[$1]}" 2>/dev/null
  wait "${replica_pids[$1]}" 2>/dev/null
}
replica_ready() { curl -fsS "http://127.0.0.1:${health_ports[$1]}/readyz" >/dev/null 2>&1; }
holder() { kc get lease gpu-controller -n "$replicas_ns" -o jsonpath='{.spec.holderIdentity}'; }

# snapshot DIR: every object the checker reads, into DIR.
snapshot() {
  local dir=$1 kind
  mkdir -p "$dir"
  for kind in gpunodes gpuclasses gpudevices vmis pods namespaces resourcequotas nodes workloads \
    workloadmonitors; do
    kc get "$kind" -A -o json >"$dir/$kind.json" 2>>"$dir/errors" || return 1
  done
  date +%s >"$dir/taken-at"
}
snapshots=0
previous=""
violations=0
check_grace=${check_grace:-10} # the replicas' --attachment-grace, in seconds
check_not_ready_grace=${check_not_ready_grace:-300} # their --not-ready-grace, in seconds
# check WHAT [--settled]: the checker (invariants.mjs) on a new snapshot against the last one; the
# safety invariants must hold at once, the rest (--settled) within 45 s.
check() {
  local what=$1 settled=${2:-} dir deadline=$((SECONDS + 45))
  while :; do
    dir="$work/snap-$((++snapshots))"
    if ! snapshot "$dir"; then
      [ "$SECONDS" -lt "$deadline" ] || { fail "$what: no snapshot in 45 s: $(tail -n 2 "$dir/errors")"; return 1; }
      sleep 1
      continue
    fi
    if node "$source_dir/test/realcluster/invariants.mjs" ${previous:+--previous "$previous"} \
      --attachment-grace "$check_grace" --not-ready-grace "$check_not_ready_grace" $settled "$dir" >"$dir/checker.out" 2>&1; then
      previous=$dir
      return 0
    fi
    # A safety violation is one at once; what settles may take its time.
    if [ -z "$settled" ] || [ "$SECONDS" -ge "$deadline" ]; then
      fail "$what${seed:+ (seed $seed)}: $(grep -c '^VIOLATION' "$dir/checker.out") invariant violations"
      sed 's/^/  /' "$dir/checker.out"
      violations=$((violations + $(grep -c '^VIOLATION' "$dir/checker.out")))
      previous=$dir
      return 1
    fi
    sleep 2
  done
}
