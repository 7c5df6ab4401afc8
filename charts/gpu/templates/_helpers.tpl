{{/*
The controller's identity as the API server names it: the ServiceAccount gpu-controller of the
release's namespace (controller-serviceaccount.yaml), whatever namespace the chart is installed
into. The admission policies trust exactly this user, never a whole namespace's group: any other
service account of that namespace (another release, a tenant's debug pod) is not the controller.
*/}}
{{- define "gpu.controllerUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:gpu-controller
{{- end }}

{{/*
The device platform-fields policy's callers (docs/policies.md, F7) as two CEL list literals
(JSON string lists are CEL list literals): users by exact name, and groups. Always the
controller, kube-controller-manager (a user without a group of its own) and cluster admins; then
the hoster's policies.platformUsers and policies.platformGroups. No namespace's whole group of
service accounts, kube-system's included: none of the cluster's own controllers touches the
device finalizer or the template mark (the garbage collector's foregroundDeletion and orphan are
free, and DELETE is not matched), and any service account a hoster creates in kube-system would
otherwise be the platform.
*/}}
{{- define "gpu.platformUsers" -}}
{{- $extra := .Values.policies.platformUsers | default list -}}
{{- range $extra }}{{ if or (not (kindIs "string" .)) (eq . "") }}{{ fail "policies.platformUsers: every entry must be a non-empty user name" }}{{ end }}{{ end -}}
{{- concat (list (include "gpu.controllerUser" .) "system:kube-controller-manager") $extra | toJson -}}
{{- end }}
{{- define "gpu.platformGroups" -}}
{{- $extra := .Values.policies.platformGroups | default list -}}
{{- range $extra }}{{ if or (not (kindIs "string" .)) (eq . "") }}{{ fail "policies.platformGroups: every entry must be a non-empty group name" }}{{ end }}{{ end -}}
{{- concat (list "system:masters") $extra | toJson -}}
{{- end }}

{{/*
gpu-agent as the node-bound policies match it (gpunode-node-bound-policy.yaml,
resourceslice-node-bound-policy.yaml): its pods' service account, a bare-metal agent's user by
name, or any member of the agents' group (which then must carry a node name too).
*/}}
{{- define "gpu.agentMatch" -}}
has(request.userInfo.username) &&
(request.userInfo.username == 'system:serviceaccount:{{ .Release.Namespace }}:gpu-agent' ||
request.userInfo.username.startsWith('gpu.cozystack.io:agent:')) ||
has(request.userInfo.groups) && 'gpu.cozystack.io:agents' in request.userInfo.groups
{{- end }}

{{/*
The node gpu-agent's credentials are bound to, as a CEL string; '' when they name none: a pod's
token carries it as the user extra authentication.kubernetes.io/node-name, a bare-metal agent's
certificate as its user name gpu.cozystack.io:agent:<node>.
*/}}
{{- define "gpu.agentNodeName" -}}
has(request.userInfo.username) &&
request.userInfo.username == 'system:serviceaccount:{{ .Release.Namespace }}:gpu-agent'
? (has(request.userInfo.extra) &&
'authentication.kubernetes.io/node-name' in request.userInfo.extra &&
size(request.userInfo.extra['authentication.kubernetes.io/node-name']) > 0
? request.userInfo.extra['authentication.kubernetes.io/node-name'][0] : '')
: (has(request.userInfo.username) &&
request.userInfo.username.startsWith('gpu.cozystack.io:agent:')
? request.userInfo.username.substring(size('gpu.cozystack.io:agent:')) : '')
{{- end }}
