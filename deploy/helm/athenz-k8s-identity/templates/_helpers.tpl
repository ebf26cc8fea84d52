{{/* The one image every container of ours runs (and the initializer injects): the repository
     with the digest when one is given (what deploy/image.sh prints), else tagged with the
     release. */}}
{{- define "athenz.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* kubelet's flex plugin dir on the host: the platform's (components.gke, components.openshift)
     or flexPluginDir. */}}
{{- define "athenz.flexPluginDir" -}}
{{- if .Values.components.gke -}}
/home/kubernetes/flexvolume
{{- else if .Values.components.openshift -}}
/etc/kubernetes/kubelet-plugins/volume/exec
{{- else -}}
{{ .Values.flexPluginDir }}
{{- end -}}
{{- end -}}

{{/* What the agent's kubelet reads need: nodes/pods with fine-grained kubelet authorization
     (Kubernetes 1.33+), else nodes/proxy (components.legacyKubeletAuthz forces it); an explicit
     kubeletAuthorization wins. */}}
{{- define "athenz.kubeletAuthorization" -}}
{{- if .Values.kubeletAuthorization -}}
{{ .Values.kubeletAuthorization }}
{{- else if .Values.components.legacyKubeletAuthz -}}
nodes/proxy
{{- else if semverCompare ">=1.33.0-0" .Capabilities.KubeVersion.Version -}}
nodes/pods
{{- else -}}
nodes/proxy
{{- end -}}
{{- end -}}
