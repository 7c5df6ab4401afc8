#!/usr/bin/env bash
# alert_rules_test: the chart's alert rules as Prometheus takes them (docs/operations.md,
# "Alerts"). Renders the PrometheusRule with real helm (GPUs on, --api-versions
# monitoring.coreos.com/v1), takes its spec.groups as a rule file, and runs Prometheus's own
# promtool on it: `promtool check rules` (they parse, the expressions are valid PromQL) and
# `promtool test rules` on test/chart/alert_rules.test.yaml (each alert fires on the series that
# should fire it, naming the object, and not on the others). Also: every alert has a firing and
# a quiet case there, the labels and annotations docs/operations.md promises, and a runbook
# section there its runbook_url points to.
#   test/chart/alert_rules_test.sh SOURCE_DIR HELM PROMTOOL
set -uo pipefail
source_dir=$1
helm=$2
promtool=$3

scratch=$(mktemp -d "${TMPDIR:-/tmp}/alert-rules-test.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export HELM_CACHE_HOME="$scratch/helm" HELM_CONFIG_HOME="$scratch/helm" HELM_DATA_HOME="$scratch/helm"

# The PrometheusRule alone (the VMRule holds the same groups: chart_test checks it); its
# spec.groups, two spaces in, is a Prometheus rule file once the spec line is dropped and the
# indent taken off.
if ! "$helm" template gpu "$source_dir/charts/gpu" --namespace cozy-system \
  --set gpu.enabled=true --set gpu.webhook.allowUnauthenticatedCallers=true \
  --set gpu.webhook.networkPolicy.enabled=false --set monitoring.vmRule.enabled=false \
  --api-versions monitoring.coreos.com/v1 --show-only templates/monitoring-rules.yaml \
  >"$scratch/rendered.yaml"; then
  echo "FAIL: helm could not render templates/monitoring-rules.yaml"
  exit 1
fi
awk 'found { sub(/^  /, ""); print } /^spec:$/ { found = 1 }' "$scratch/rendered.yaml" \
  >"$scratch/rules.yaml"
cp "$source_dir/test/chart/alert_rules.test.yaml" "$scratch/"

failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
"$promtool" check rules "$scratch/rules.yaml" || fail "promtool check rules refused the chart's rules"

mapfile -t alerts < <(sed -nE 's/^ *- alert: *([A-Za-z0-9]+)$/\1/p' "$scratch/rules.yaml")
[ "${#alerts[@]}" -ge 12 ] || fail "the PrometheusRule holds ${#alerts[@]} alerts, expected at least 12"
tests="$scratch/alert_rules.test.yaml"
for alert in "${alerts[@]}"; do
  # A firing case is written as a block ("alertname: X" on its own line, exp_alerts below it);
  # a quiet one as a flow map with exp_alerts: [].
  grep -Eq "^ +alertname: $alert\$" "$tests" || fail "$alert: no case in alert_rules.test.yaml where it fires"
  grep -Eq "alertname: $alert, exp_alerts: \[\]" "$tests" ||
    fail "$alert: no case in alert_rules.test.yaml where it stays quiet"
  # The rule's own block: from its "- alert:" line to the next one.
  block=$(awk -v name="$alert" '/^ *- alert:/ { inside = ($3 == name) } inside' "$scratch/rules.yaml")
  for key in 'severity: (critical|warning|info)' 'summary: ' 'description: ' \
    "runbook_url: https://.*/docs/operations.md#${alert,,}\$"; do
    grep -Eq "^ +$key" <<<"$block" || fail "$alert: no /$key/ in its rule"
  done
  grep -Eq "\\\$labels\\." <<<"$block" || fail "$alert: its description names no object (\$labels)"
  grep -Eq "^### $alert\$" "$source_dir/docs/operations.md" ||
    fail "$alert: no section \"### $alert\" in docs/operations.md (its runbook_url's anchor)"
done

"$promtool" test rules "$tests" || fail "promtool test rules failed on alert_rules.test.yaml"

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "PASS: ${#alerts[@]} alerts checked and unit-tested by $("$promtool" --version 2>&1 | head -n1)"
