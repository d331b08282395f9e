{{/* The name of everything the release makes. */}}
{{- define "sluice.name" -}}
{{- printf "%s-agent" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sluice.serviceAccount" -}}
{{- default (include "sluice.name" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* registry/sluice@sha256:... by digest, else by tag. */}}
{{- define "sluice.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "sluice.labels" -}}
app.kubernetes.io/name: sluice
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "sluice.selector" -}}
app.kubernetes.io/name: sluice
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
