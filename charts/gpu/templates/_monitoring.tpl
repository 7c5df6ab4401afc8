{{/*
Whether one monitoring object renders (docs/operations.md, "The chart's monitoring values"): its
switch (auto, true or false) and the API version its kind is served under. "true" or "".
  include "gpu.monitoringOn" (list .Values.monitoring.serviceMonitor.enabled "monitoring.coreos.com/v1" .Capabilities)
*/}}
{{- define "gpu.monitoringOn" -}}
{{- $switch := index . 0 -}}
{{- $api := index . 1 -}}
{{- $capabilities := index . 2 -}}
{{- if eq (toString $switch) "auto" -}}
{{- if $capabilities.APIVersions.Has $api }}true{{ end -}}
{{- else if eq (toString $switch) "true" -}}
true
{{- end -}}
{{- end }}

{{/* The labels of every monitoring object: the chart's, then monitoring.labels. */}}
{{- define "gpu.monitoringLabels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: cozy-gpu
{{- with .Values.monitoring.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The alert rules, one source for the PrometheusRule and the VMRule (both take Prometheus's rule
groups as spec.groups). Each alert's runbook is its section of docs/operations.md, whose anchor
is the alert's name in lower case. The series carry the scrape's target labels namespace and pod
(the controller's and agent's pods) and, for the agents, node (the endpoint's node); the
controller's own labels win (honorLabels), so the tenant metric keeps its namespace.
test/chart/alert_rules_test.sh runs promtool on exactly this.
*/}}
{{- define "gpu.alertGroups" -}}
{{- $alerts := .Values.monitoring.alerts -}}
{{- $runbook := $alerts.runbookBaseURL -}}
- name: gpu-controller
  rules:
  - alert: GPUControllerNoLeader
    expr: sum by (namespace) (gpu_controller_leader) == 0
    for: 5m
    labels:
      severity: critical
    annotations:
      summary: "No gpu-controller replica holds the Lease."
      description: "{{`No gpu-controller replica in namespace {{ $labels.namespace }} has held the Lease gpu-controller for 5 minutes: the reconciler and the binder do not run.`}}"
      runbook_url: {{ $runbook }}#gpucontrollernoleader
  - alert: GPUControllerCacheNotSynced
    expr: gpu_controller_cache_synced == 0
    for: 10m
    labels:
      severity: critical
    annotations:
      summary: "A gpu-controller cache has not listed."
      description: "{{`The cache {{ $labels.cache }} of gpu-controller pod {{ $labels.namespace }}/{{ $labels.pod }} has not listed for 10 minutes: the replica is not ready and decides nothing on those objects.`}}"
      runbook_url: {{ $runbook }}#gpucontrollercachenotsynced
  - alert: GPUControllerCacheFailing
    expr: rate(gpu_controller_cache_failures_total[10m]) > 0
    for: 15m
    labels:
      severity: warning
    annotations:
      summary: "A gpu-controller cache keeps failing to list or watch."
      description: "{{`The cache {{ $labels.cache }} of gpu-controller pod {{ $labels.namespace }}/{{ $labels.pod }} has failed lists or watches in every 10 minutes for 15 minutes: it may be serving stale objects.`}}"
      runbook_url: {{ $runbook }}#gpucontrollercachefailing
{{- if .Values.gpu.enabled }}
  - alert: GPUBinderStalled
    expr: min by (namespace) (time() - gpu_controller_binder_last_success_timestamp_seconds) > {{ $alerts.binderStaleSeconds }}
    for: 2m
    labels:
      severity: critical
    annotations:
      summary: "No binder pass has succeeded for a while."
      description: "{{`No gpu-controller replica in namespace {{ $labels.namespace }} has finished a binder pass for {{ $value | humanizeDuration }}: orders are not bound, moved or released.`}}"
      runbook_url: {{ $runbook }}#gpubinderstalled
  - alert: GPUWebhookSaturated
    expr: sum by (namespace, pod) (rate(gpu_controller_webhook_connections_total{outcome=~"busy|turned_away"}[5m])) > 0
    for: 10m
    labels:
      severity: warning
    annotations:
      summary: "The GPU admission webhooks turn callers away."
      description: "{{`gpu-controller pod {{ $labels.namespace }}/{{ $labels.pod }} has answered webhook connections busy (503) or turned them away for 10 minutes ({{ $value | humanize }} a second): admissions fail closed.`}}"
      runbook_url: {{ $runbook }}#gpuwebhooksaturated
  - alert: GPUWebhookCertificateExpiresSoon
    expr: gpu_controller_webhook_certificate_expiry_timestamp_seconds > 0 and gpu_controller_webhook_certificate_expiry_timestamp_seconds - time() < {{ mul $alerts.certificateExpiryDays 86400 }}
    labels:
      severity: warning
    annotations:
      summary: "The GPU webhooks' serving certificate expires soon."
      description: "{{`The serving certificate of gpu-controller pod {{ $labels.namespace }}/{{ $labels.pod }} expires at {{ $value | humanizeTimestamp }}; with an expired certificate kube-apiserver cannot call the webhooks and GPU admissions fail.`}}"
      runbook_url: {{ $runbook }}#gpuwebhookcertificateexpiressoon
- name: gpu-catalog
  rules:
  - alert: GPUOrderPendingTooLong
    expr: max by (namespace, class) (gpu_catalog_class_oldest_pending_seconds) > {{ $alerts.pendingOrderSeconds }}
    labels:
      severity: warning
    annotations:
      summary: "A GPU order has been Pending too long."
      description: "{{`The oldest Pending GPUDevice of class {{ $labels.class }} has waited {{ $value | humanizeDuration }}.`}}"
      runbook_url: {{ $runbook }}#gpuorderpendingtoolong
  - alert: GPUClassSoldOut
    expr: max by (namespace, class) (gpu_catalog_class_units_free) == 0 and max by (namespace, class) (gpu_catalog_class_units) > 0
    for: 15m
    labels:
      severity: warning
    annotations:
      summary: "A GPU class has no free units."
      description: "{{`Class {{ $labels.class }} has had no free unit for 15 minutes: new orders of it stay Pending.`}}"
      runbook_url: {{ $runbook }}#gpuclasssoldout
  - alert: GPUNodeHoldsOrdersButTakesNoBinds
    expr: max by (namespace, node) (gpu_catalog_node_orders_bound) > 0 and max by (namespace, node) (gpu_catalog_node_takes_binds) == 0
    for: 15m
    labels:
      severity: warning
    annotations:
      summary: "A node holds GPU orders but takes no binds."
      description: "{{`Node {{ $labels.node }} holds {{ $value }} bound GPU orders but has not taken binds for 15 minutes (gpu_catalog_node_not_taking_binds names why).`}}"
      runbook_url: {{ $runbook }}#gpunodeholdsordersbuttakesnobinds
{{- end }}
- name: gpu-agent
  rules:
  - alert: GPUAgentNotPublishing
    expr: sum by (namespace, pod, node) (increase(gpu_agent_publishes_total{result=~"written|unchanged"}[30m])) == 0
    for: 15m
    labels:
      severity: warning
    annotations:
      summary: "A gpu-agent has not published its GPUNode."
      description: "{{`gpu-agent {{ $labels.namespace }}/{{ $labels.pod }} on node {{ $labels.node }} has not written or confirmed its GPUNode for 45 minutes (it does at least every resync, 10 minutes): the catalog sees the node's GPUs as they were.`}}"
      runbook_url: {{ $runbook }}#gpuagentnotpublishing
  - alert: GPUAgentUnitsUnknown
    expr: gpu_agent_units_known == 0
    for: 15m
    labels:
      severity: warning
    annotations:
      summary: "A gpu-agent does not know its node's GPU units."
      description: "{{`gpu-agent {{ $labels.namespace }}/{{ $labels.pod }} on node {{ $labels.node }} has had no answer from kubelet's pod-resources for 15 minutes: the node's unit counts are unknown and it takes no binds.`}}"
      runbook_url: {{ $runbook }}#gpuagentunitsunknown
  - alert: GPUAgentUnitsStale
    expr: gpu_agent_units_stale == 1
    for: 15m
    labels:
      severity: warning
    annotations:
      summary: "A gpu-agent reports stale GPU units."
      description: "{{`kubelet's pod-resources on node {{ $labels.node }} has not answered gpu-agent {{ $labels.namespace }}/{{ $labels.pod }} for 15 minutes: it keeps publishing the last counts.`}}"
      runbook_url: {{ $runbook }}#gpuagentunitsstale
{{- end }}
