{{/* The release's full name, 63 characters at most (a DNS label). */}}
{{- define "otel-ofu.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "otel-ofu.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component (producer, collector, shard, merge, agent). */}}
{{- define "otel-ofu.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "otel-ofu.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "otel-ofu.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (include "otel-ofu.fullname" .) -}}
{{- end -}}

{{- define "otel-ofu.authSecret" -}}
{{- .Values.auth.existingSecret | default (printf "%s-auth" (include "otel-ofu.fullname" .)) -}}
{{- end -}}

{{/* The Service every producer exports to: the collector, or in sharded mode the routing agent. */}}
{{- define "otel-ofu.collectorService" -}}
{{- printf "%s-collector" (include "otel-ofu.fullname" .) -}}
{{- end -}}

{{- define "otel-ofu.scheme" -}}
{{- if .Values.tls.enabled }}https{{ else }}http{{ end -}}
{{- end -}}

{{- define "otel-ofu.producerEndpoint" -}}
{{- if .Values.producer.exportEndpoint -}}
{{- .Values.producer.exportEndpoint -}}
{{- else -}}
{{- printf "%s://%s.%s.svc:%v" (include "otel-ofu.scheme" .) (include "otel-ofu.collectorService" .) .Release.Namespace .Values.collector.grpcPort -}}
{{- end -}}
{{- end -}}

{{/* The collector's settings shared by the single collector and the shards. */}}
{{- define "otel-ofu.collectorEnv" -}}
- name: OTEL_OFU_COLLECTOR_LISTEN
  value: "0.0.0.0:{{ .Values.collector.grpcPort }}"
{{- if .Values.collector.httpPort }}
- name: OTEL_OFU_COLLECTOR_HTTP_LISTEN
  value: "0.0.0.0:{{ .Values.collector.httpPort }}"
{{- end }}
- name: OTEL_OFU_COLLECTOR_PROMETHEUS_PORT
  value: {{ .Values.collector.prometheusPort | quote }}
- name: OTEL_OFU_COLLECTOR_PROMETHEUS_HOST
  value: "0.0.0.0"
{{ include "otel-ofu.collectorHealthEnv" . }}
- name: OTEL_OFU_COLLECTOR_WINDOW
  value: {{ .Values.collector.window | quote }}
{{- if .Values.collector.exportEndpoint }}
- name: OTEL_OFU_COLLECTOR_EXPORT_ENDPOINT
  value: {{ .Values.collector.exportEndpoint | quote }}
{{- end }}
{{- if .Values.tls.enabled }}
- name: OTEL_OFU_COLLECTOR_TLS_CERT
  value: /etc/otel-ofu/tls/tls.crt
- name: OTEL_OFU_COLLECTOR_TLS_KEY
  value: /etc/otel-ofu/tls/tls.key
{{- end }}
{{- if .Values.auth.enabled }}
- name: OTEL_OFU_COLLECTOR_BEARER_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "otel-ofu.authSecret" . }}
      key: {{ .Values.auth.key }}
{{- end }}
{{- end -}}

{{- define "otel-ofu.tlsVolume" -}}
{{- if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ required "tls.secretName is required when tls.enabled" .Values.tls.secretName }}
{{- end }}
{{- end -}}

{{- define "otel-ofu.tlsMount" -}}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: /etc/otel-ofu/tls
  readOnly: true
{{- end }}
{{- end -}}

{{/* The collector's /healthz, opened to the pod's address for the kubelet's probe. */}}
{{- define "otel-ofu.collectorHealthEnv" -}}
- name: OTEL_OFU_COLLECTOR_HEALTH_PORT
  value: {{ .Values.collector.healthPort | quote }}
- name: OTEL_OFU_COLLECTOR_HEALTH_HOST
  value: "0.0.0.0"
{{- end -}}

{{/* The liveness probe of an otel-ofu container: /healthz on its port named health. A stuck loop answers 503;
three in a row (30 s) restart the container. */}}
{{- define "otel-ofu.livenessProbe" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: health
  initialDelaySeconds: 10
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 3
{{- end -}}
