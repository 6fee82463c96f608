{{/* Chart name, truncated to 63 characters. */}}
{{- define "mtp-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Object name prefix: fullnameOverride, else <release>-<chart> unless the release name already contains the chart name. */}}
{{- define "mtp-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "mtp-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mtp-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "mtp-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "mtp-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: mtp-operator
{{- end -}}

{{- define "mtp-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "mtp-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "mtp-operator.tokenSecretName" -}}
{{- default (printf "%s-alerts-token" (include "mtp-operator.fullname" .)) .Values.alerts.tokenSecret.name -}}
{{- end -}}

{{/*
"true" when a monitoring object should be rendered, else "".
Usage: include "mtp-operator.monitoringOn" (list .Values.monitoring.podMonitor.enabled "PodMonitor" $)
"auto" renders when the API server (helm install/upgrade) or --api-versions (helm template)
reports monitoring.coreos.com/v1/<Kind>.
*/}}
{{- define "mtp-operator.monitoringOn" -}}
{{- $enabled := index . 0 -}}
{{- $kind := index . 1 -}}
{{- $root := index . 2 -}}
{{- if eq (toString $enabled) "auto" -}}
{{- if or ($root.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" $kind)) ($root.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") -}}true{{- end -}}
{{- else if eq (toString $enabled) "true" -}}true
{{- end -}}
{{- end -}}

{{/* The settings file the operator reads (--settings). */}}
{{- define "mtp-operator.settings" -}}
defaultImage: {{ .Values.defaultRuntimeImage | quote }}
gpuProfiles:
{{- if .Values.gpuProfiles }}
{{- range $key, $k := .Values.gpuProfiles }}
  {{ $key | quote }}: {{ $k }}
{{- end }}
{{- else }} {}
{{- end }}
evaluator:
  enabled: {{ .Values.evaluator.enabled }}
  intervalSeconds: {{ .Values.evaluator.intervalSeconds }}
modelCache:
{{- with .Values.modelCache.default }}
  default: {{ toJson . }}
{{- end }}
  allowedHostPaths: {{ toJson (.Values.modelCache.allowedHostPaths | default list) }}
  shareHostPathAcrossNamespaces: {{ .Values.modelCache.shareHostPathAcrossNamespaces | default false }}
poolRemovalGraceSeconds: {{ .Values.poolRemovalGraceSeconds }}
listPageSize: {{ .Values.listPageSize }}
alerts:
  requireNamespaceOptIn: {{ .Values.alerts.requireNamespaceOptIn }}
{{- end -}}
