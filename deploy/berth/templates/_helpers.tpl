{{/* Labels on every object of the chart. */}}
{{- define "berth.labels" -}}
app.kubernetes.io/name: berth
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/*
berth.ref is an image reference: registry/repository:tag, or
repository:tag without a registry. Arguments: (list registry repository tag)
*/}}
{{- define "berth.ref" -}}
{{- $registry := index . 0 | trimSuffix "/" -}}
{{- if $registry }}{{ $registry }}/{{ end }}{{ index . 1 }}:{{ index . 2 }}
{{- end -}}

{{- define "berth.image" -}}
{{ include "berth.ref" (list .Values.image.registry .Values.image.repository .Values.image.tag) }}
{{- end -}}

{{/* berth.sidecar is a CSI sidecar's image. Arguments: (list $ "provisioner") */}}
{{- define "berth.sidecar" -}}
{{- $values := (index . 0).Values -}}
{{- $s := index $values.csiSidecars (index . 1) -}}
{{ include "berth.ref" (list ($values.csiSidecars.registry | default $values.image.registry) $s.repository $s.tag) }}
{{- end -}}

{{/*
berth.rbac renders one component's generated roles (files/rbac/<name>.yaml,
copied from config/rbac by `make generate`) and binds them to its service
account: ClusterRoles cluster-wide, Roles in the release namespace.
Arguments: (dict "root" $ "file" "operator" "sa" "berth-operator")
*/}}
{{- define "berth.rbac" -}}
{{- $root := .root -}}
{{- range $doc := splitList "\n---\n" ($root.Files.Get (printf "files/rbac/%s.yaml" .file)) }}
{{- $role := fromYaml $doc }}
{{- if $role.kind }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: {{ $role.kind }}
metadata:
  name: {{ $role.metadata.name }}
  {{- if eq $role.kind "Role" }}
  namespace: {{ $root.Release.Namespace }}
  {{- end }}
  labels:
    {{- include "berth.labels" $root | nindent 4 }}
rules:
{{ toYaml $role.rules }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: {{ $role.kind }}Binding
metadata:
  name: {{ $role.metadata.name }}
  {{- if eq $role.kind "Role" }}
  namespace: {{ $root.Release.Namespace }}
  {{- end }}
  labels:
    {{- include "berth.labels" $root | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: {{ $role.kind }}
  name: {{ $role.metadata.name }}
subjects:
- kind: ServiceAccount
  name: {{ $.sa }}
  namespace: {{ $root.Release.Namespace }}
{{- end }}
{{- end }}
{{- end -}}
