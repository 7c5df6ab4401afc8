#!/usr/bin/env bash
# monitoring_queries_test: a real Prometheus server (Debian's) scrapes the demo's controller
# replicas and agents (scripts/demo.sh on the fake API server, its scrape targets written for
# file-based discovery and labelled as the chart's ServiceMonitors label them), waiting at the
# end of each demo step for a scrape of every target; then every alert expression of the chart's
# PrometheusRule and every query of its Grafana dashboard is asked of that server
# (docs/operations.md, "Tests"). Each must be valid PromQL; every metric each names must have had
# series during the run (a misspelt or missing metric is the usual bug, which promtool cannot
# see); every dashboard query must have returned series at some point of the run.
#   test/e2e/monitoring_queries_test.sh SOURCE_DIR BUILD_DIR HELM PROMETHEUS
# Exit 0 passed, 1 failed, 77 skipped (a tool the demo calls is missing).
set -uo pipefail
source_dir=$1
build_dir=$2
helm=$3
prometheus=$4

for tool in kubectl openssl curl jq; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIP: $tool is not installed (scripts/install-deps.sh installs it)"
    exit 77
  fi
done

scratch=$(mktemp -d "${TMPDIR:-/tmp}/monitoring-test.XXXXXX")
prometheus_pid=""
cleanup() {
  if [ -n "$prometheus_pid" ]; then
    kill "$prometheus_pid" 2>/dev/null
    wait "$prometheus_pid" 2>/dev/null
  fi
  rm -rf "$scratch"
}
trap cleanup EXIT
export HELM_CACHE_HOME="$scratch/helm" HELM_CONFIG_HOME="$scratch/helm" HELM_DATA_HOME="$scratch/helm"

# --- Prometheus, scraping every target of the demo's file once a second. honor_labels: the
# controller's ServiceMonitor honours its labels (gpu_catalog_tenant_units_held's namespace).
source "$source_dir/scripts/lib/free-port.sh"
free_port prometheus_port || exit 1
echo "[]" >"$scratch/targets.json"
cat >"$scratch/prometheus.yml" <<CONFIG
global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}
scrape_configs:
- job_name: demo
  honor_labels: true
  file_sd_configs: [{files: ["$scratch/targets.json"], refresh_interval: 1s}]
CONFIG
"$prometheus" --config.file "$scratch/prometheus.yml" --storage.tsdb.path "$scratch/data" \
  --web.listen-address "127.0.0.1:$prometheus_port" >"$scratch/prometheus.log" 2>&1 &
prometheus_pid=$!
export PROMETHEUS_URL="http://127.0.0.1:$prometheus_port"
for _ in $(seq 100); do
  curl -sf "$PROMETHEUS_URL/-/ready" >/dev/null && break
  sleep 0.2
done
curl -sf "$PROMETHEUS_URL/-/ready" >/dev/null || {
  echo "FAIL: prometheus did not become ready"
  tail -n 20 "$scratch/prometheus.log"
  exit 1
}

# query EXPR [TIME]: the server's JSON answer to an instant query.
query() {
  curl -s "$PROMETHEUS_URL/api/v1/query" --data-urlencode "query=$1" ${2:+--data-urlencode "time=$2"}
}

# --- The demo; at each hook, Prometheus has scraped all four targets (two replicas, two agents)
# twice since the hook began. The first waits longer: file-based discovery hands new targets over
# every 5 s.
cat >"$scratch/hook.sh" <<'HOOK'
#!/usr/bin/env bash
# scraped_since T: Prometheus holds a scrape of all four targets begun after T (to the ms).
scraped_since() {
  answer=$(curl -s "$PROMETHEUS_URL/api/v1/query" \
    --data-urlencode "query=count(timestamp(up == 1) > $1)")
  [ "$(jq -r '.data.result[0].value[1] // 0' <<<"$answer")" = 4 ]
}
# Two rounds: a scrape that began as the hook did may still show the page of just before it.
for round in 1 2; do
  start=$(date +%s.%3N)
  for _ in $(seq 150); do
    scraped_since "$start" && continue 2
    sleep 0.2
  done
  echo "monitoring test: Prometheus did not scrape the 4 targets after step $1: $answer" >&2
  exit 1
done
HOOK
chmod +x "$scratch/hook.sh"
run_start=$(date +%s)
if ! COZY_DEMO_SCRAPE_TARGETS="$scratch/targets.json" COZY_DEMO_HOOK="$scratch/hook.sh" \
  "$source_dir/scripts/demo.sh" --no-setup "$build_dir" >"$scratch/demo.out" 2>&1; then
  echo "FAIL: the demo failed"
  tail -n 40 "$scratch/demo.out"
  exit 1
fi
run_end=$(date +%s)

# --- The expressions: the alerts of the PrometheusRule (GPUs on, so every alert renders) and the
# dashboard's panel and variable queries, with Grafana's variables given values.
if ! "$helm" template gpu "$source_dir/charts/gpu" --namespace cozy-system \
  --set gpu.enabled=true --set gpu.webhook.allowUnauthenticatedCallers=true \
  --set gpu.webhook.networkPolicy.enabled=false --set monitoring.vmRule.enabled=false \
  --api-versions monitoring.coreos.com/v1 --show-only templates/monitoring-rules.yaml \
  >"$scratch/rules.yaml"; then
  echo "FAIL: helm could not render templates/monitoring-rules.yaml"
  exit 1
fi
mapfile -t alert_exprs < <(sed -nE 's/^ +expr: (.*)$/\1/p' "$scratch/rules.yaml")
dashboard="$source_dir/charts/gpu/dashboards/gpu.json"
mapfile -t panel_exprs < <(jq -r '.panels[].targets[].expr' "$dashboard" |
  sed -e 's/\$__rate_interval/1m/g' -e 's/\$class/.*/g')
mapfile -t variable_metrics < <(jq -r '.templating.list[] | select(.type == "query") | .definition' \
  "$dashboard" | sed -nE 's/^label_values\(([a-z_:]+), *[a-z_]+\)$/\1/p')
if [ "${#alert_exprs[@]}" -lt 12 ] || [ "${#panel_exprs[@]}" -lt 6 ]; then
  echo "FAIL: ${#alert_exprs[@]} alert expressions, ${#panel_exprs[@]} panel queries found"
  exit 1
fi

failures=0
declare -A missing=()
# metrics EXPR: the metric names EXPR reads (the project's and the process ones), strings dropped.
metrics() { sed -E 's/"[^"]*"//g' <<<"$1" | grep -oE '\b(gpu|process)_[a-zA-Z0-9_]+\b' | sort -u; }
# check_metric NAME WHERE: NAME had series during the run.
check_metric() {
  local answer
  answer=$(query "last_over_time($1[$((run_end - run_start + 60))s])" "$run_end")
  if [ "$(jq -r '.data.result | length' <<<"$answer")" = 0 ]; then
    echo "FAIL: $2 names $1, which had no series during the run"
    missing[$1]=1
    failures=$((failures + 1))
  fi
}
# check_valid EXPR WHERE: Prometheus evaluates EXPR without an error.
check_valid() {
  local answer
  answer=$(query "$1" "$run_end")
  if [ "$(jq -r '.status' <<<"$answer")" != success ]; then
    echo "FAIL: $2: $1: $(jq -r '.error' <<<"$answer")"
    failures=$((failures + 1))
  fi
}
for expr in "${alert_exprs[@]}"; do
  check_valid "$expr" "alert expression"
  for metric in $(metrics "$expr"); do check_metric "$metric" "alert expression $expr"; done
done
for expr in "${panel_exprs[@]}"; do
  check_valid "$expr" "dashboard query"
  for metric in $(metrics "$expr"); do check_metric "$metric" "dashboard query $expr"; done
  answer=$(curl -s "$PROMETHEUS_URL/api/v1/query_range" --data-urlencode "query=$expr" \
    --data-urlencode "start=$run_start" --data-urlencode "end=$run_end" --data-urlencode "step=1")
  if [ "$(jq -r '.data.result | length' <<<"$answer")" = 0 ]; then
    echo "FAIL: dashboard query $expr returned no series during the run"
    failures=$((failures + 1))
  fi
done
for metric in "${variable_metrics[@]}"; do check_metric "$metric" "a dashboard variable"; done

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s); metrics without series: ${!missing[*]}"
  exit 1
fi
echo "PASS: ${#alert_exprs[@]} alert expressions and ${#panel_exprs[@]} dashboard queries," \
  "every metric they name scraped from the demo"
