#!/usr/bin/env bash
# Prints the chart's admission webhook configurations (charts/gpu/templates/controller-webhook.yaml)
# as `helm template` renders them for scripts/demo.sh on the fake API server: release gpu in
# cozy-system, GPUs on, no cert-manager, the webhooks at the Service, and CA_BUNDLE where the
# demo puts its CA. test/fakes/gpu-webhooks.yaml holds what it prints, so the demo's first run
# needs no helm (docs/testing.md, "The first command's time"); demo_test fails when the two
# differ. To write the file anew:
#   test/fakes/render-gpu-webhooks.sh > test/fakes/gpu-webhooks.yaml
# helm: the pinned one of scripts/cluster.sh (scripts/cluster.sh build helm).
set -euo pipefail
source_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
helm=$("$source_dir/scripts/cluster.sh" bin)/helm
[ -x "$helm" ] || {
  echo "render-gpu-webhooks: $helm is not built (scripts/cluster.sh build helm)" >&2
  exit 2
}
# Only the webhook configurations are kept, and in them only the release, the namespace and the
# values set here are read; the rest is what the chart requires to render at all.
values=$(mktemp)
trap 'rm -f "$values"' EXIT
cat >"$values" <<'VALUES'
gpu:
  enabled: true
  webhook:
    certManager: false
    caBundle: CA_BUNDLE
    existingSecret: gpu-controller-webhook-tls
    networkPolicy: {podCIDRs: [10.244.0.0/16]}
    allowUnauthenticatedCallers: true
VALUES
echo "# Written by test/fakes/render-gpu-webhooks.sh (helm template of charts/gpu): do not edit."
HELM_CACHE_HOME=$(dirname "$values") HELM_CONFIG_HOME=$(dirname "$values") \
  HELM_DATA_HOME=$(dirname "$values") \
  "$helm" template gpu "$source_dir/charts/gpu" -f "$values" --namespace cozy-system |
  awk 'function flush() {
         if (doc ~ /\nkind: (Validating|Mutating)WebhookConfiguration/) printf "---%s\n", doc
         doc = ""
       }
       /^---/ { flush(); next } { doc = doc "\n" $0 } END { flush() }'
