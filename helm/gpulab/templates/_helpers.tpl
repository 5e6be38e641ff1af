{{/* The base name of gpulab's objects. */}}
{{- define "gpulab.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else if contains "gpulab" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-gpulab" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "gpulab.labels" -}}
app.kubernetes.io/name: gpulab
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
{{- end -}}

{{/* Selector labels of one component: include with (list . "service"). */}}
{{- define "gpulab.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: gpulab
app.kubernetes.io/instance: {{ $root.Release.Name | quote }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "gpulab.serviceImage" -}}
{{- printf "%s:%s" .Values.service.image.repository .Values.service.image.tag -}}
{{- end -}}

{{- define "gpulab.agentImage" -}}
{{- $repo := .Values.agent.image.repository | default .Values.service.image.repository -}}
{{- $tag := .Values.agent.image.tag | default .Values.service.image.tag -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}

{{/* The service's in-cluster base URL: https with tls.internal.enabled. */}}
{{- define "gpulab.serviceUrl" -}}
{{- printf "%s://%s.%s.svc:%d" (include "gpulab.serviceScheme" .) (include "gpulab.fullname" .) .Release.Namespace (int .Values.service.port) -}}
{{- end -}}

{{/* "https" when the service serves TLS (tls.internal.enabled), else "http". */}}
{{- define "gpulab.serviceScheme" -}}
{{- ternary "https" "http" (.Values.tls.internal.enabled | default false) -}}
{{- end -}}

{{/* What the service's values add for the replicas with tls.internal: {"tlsSecret": <replicasSecret>}; {} without. */}}
{{- define "gpulab.replicasTlsValues" -}}
{{- if .Values.tls.internal.enabled -}}
{{- dict "tlsSecret" .Values.tls.internal.replicasSecret | toJson -}}
{{- else -}}
{{- "{}" -}}
{{- end -}}
{{- end -}}

{{/* Where gpulab's pods mount the service's certificate Secret (tls.internal.serviceSecret). */}}
{{- define "gpulab.tlsDir" -}}
/etc/gpulab-tls
{{- end -}}

{{/* The jobs directory's claim (jobs.storage): an existing one, or the chart's <fullname>-jobs. */}}
{{- define "gpulab.jobsClaim" -}}
{{- .Values.jobs.storage.existingClaim | default (printf "%s-jobs" (include "gpulab.fullname" .)) -}}
{{- end -}}

{{/* The deployments directory's claim (deployments.storage): an existing one, or the chart's <fullname>-models. */}}
{{- define "gpulab.modelsClaim" -}}
{{- .Values.deployments.storage.existingClaim | default (printf "%s-models" (include "gpulab.fullname" .)) -}}
{{- end -}}

{{/* The model-server pods' image (deployments.kubernetes.image). */}}
{{- define "gpulab.modelsImage" -}}
{{- printf "%s:%s" .Values.deployments.kubernetes.image.name .Values.deployments.kubernetes.image.tag -}}
{{- end -}}

{{/* The cluster objects (PriorityClass, WorkloadPriorityClass) of gpulab priority class <name>: gpulab-<name>. */}}
{{- define "gpulab.priorityClassName" -}}
{{- printf "gpulab-%s" . -}}
{{- end -}}

{{/* The highest value of a preemptible class (priorityClasses.classes); 0 when none is. */}}
{{- define "gpulab.maxPreemptibleValue" -}}
{{- $top := 0 -}}
{{- range .Values.priorityClasses.classes -}}
{{- if and .preemptible (gt (int .value) $top) -}}
{{- $top = int .value -}}
{{- end -}}
{{- end -}}
{{- $top -}}
{{- end -}}

{{/* The database URL's variable, GPULAB_DB_URL: from service.dbUrlSecret (a
secretKeyRef: the password never in the pod spec) or service.dbUrl (plain text in
the Deployment); nothing without either (SQLite). Include with nindent. */}}
{{- define "gpulab.dbUrlEnv" -}}
{{- $secret := .Values.service.dbUrlSecret | default dict -}}
{{- if and $secret.name .Values.service.dbUrl -}}
{{- fail "service.dbUrl and service.dbUrlSecret.name are both set: keep dbUrlSecret (the URL holds the database's password; dbUrl puts it in the Deployment as plain text) and remove dbUrl" -}}
{{- end -}}
{{- if $secret.name -}}
- name: GPULAB_DB_URL
  valueFrom:
    secretKeyRef:
      name: {{ $secret.name | quote }}
      key: {{ $secret.key | default "url" | quote }}
{{- else if .Values.service.dbUrl -}}
- name: GPULAB_DB_URL
  value: {{ .Values.service.dbUrl | quote }}
{{- end -}}
{{- end -}}
