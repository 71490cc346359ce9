{{- define "caret.secretName" -}}
{{- if .Values.secrets.existingSecret }}{{ .Values.secrets.existingSecret }}{{ else }}{{ .Release.Name }}-caret{{ end -}}
{{- end -}}

{{- define "caret.labels" -}}
app.kubernetes.io/part-of: caret
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
