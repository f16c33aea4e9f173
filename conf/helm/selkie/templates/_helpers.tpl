{{/*
Labels of every object of a component: `app` (its namePrefix, which also selects its pods), the
release, and the project. Call with (dict "root" $ "prefix" $prefix).
*/}}
{{- define "selkie.labels" -}}
app: {{ .prefix }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/part-of: selkie
{{- end }}

{{/*
The API group of one of Pinniped's groups under the chart's apiGroupSuffix:
(include "selkie.group" (list $ "login.concierge")) is login.concierge.pinniped.dev by default.
*/}}
{{- define "selkie.group" -}}
{{- printf "%s.%s" (index . 1) (index . 0).Values.apiGroupSuffix }}
{{- end }}

{{/*
The image reference of a component's values.
*/}}
{{- define "selkie.image" -}}
{{- printf "%s:%s" .image.repository .image.tag }}
{{- end }}

{{/*
Fails when a component's PodDisruptionBudget could never let a pod be evicted. Call with
(dict "name" "concierge" "values" $c).
*/}}
{{- define "selkie.checkPodDisruptionBudget" -}}
{{- $budget := .values.podDisruptionBudget }}
{{- if and $budget.enabled (not (kindIs "string" $budget.minAvailable)) (ge (int $budget.minAvailable) (int .values.replicas)) (gt (int .values.replicas) 1) }}
{{- fail (printf "%s.podDisruptionBudget.minAvailable (%v) must be less than %s.replicas (%v): no pod could ever be evicted" .name $budget.minAvailable .name .values.replicas) }}
{{- end }}
{{- end }}

{{/*
The pod-level settings both Deployments share: pull secrets, placement, priority, security
context. Call with the component's values; indented by the caller.
*/}}
{{- define "selkie.podSettings" -}}
{{- with .imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
