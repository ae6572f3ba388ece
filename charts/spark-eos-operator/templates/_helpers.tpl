{{/* Chart name, release-scoped full name and labels (the usual Helm conventions). */}}
{{- define "eos.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "eos.fullname" -}}
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

{{- define "eos.selectorLabels" -}}
app.kubernetes.io/name: {{ include "eos.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "eos.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "eos.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: spark-eos-operator
{{- end -}}

{{- define "eos.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "eos.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Cluster-scoped objects are shared by every namespace: the release namespace keeps two
     releases of the same name in different namespaces apart. */}}
{{- define "eos.clusterName" -}}
{{- printf "%s-%s" .Release.Namespace (include "eos.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* A rule of the chart's values that values.schema.json cannot say (it compares two values): `fail`, which
     stops helm template and install. helm lint only logs a fail and renders on, so the include of a template
     named like the message then stops lint too ("no template \"<message>\""). Every rule goes through here. */}}
{{- define "eos.fail" -}}
{{- fail . -}}
{{- include . nil -}}
{{- end -}}

{{- define "eos.image" -}}
{{- if eq .Values.image.tag "latest" -}}
{{- include "eos.fail" "image.tag: 'latest' is not allowed: pin a version (or leave it empty for the chart's appVersion, or set image.digest)" -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Namespaces that get the driver ServiceAccount and Role. */}}
{{- define "eos.jobNamespaces" -}}
{{- $ns := .Values.jobRbac.namespaces | default .Values.watchNamespaces | default (list .Release.Namespace) -}}
{{- toJson (uniq $ns) -}}
{{- end -}}
