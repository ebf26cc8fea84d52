{{/* The one image every container of ours runs: the repository, tagged with the release. */}}
{{- define "athenz.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
