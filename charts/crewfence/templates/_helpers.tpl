{{/* Names ----------------------------------------------------------------------------------- */}}
{{- define "crewfence.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "crewfence.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "crewfence.operatorName" -}}
{{- printf "%s-operator" (include "crewfence.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "crewfence.webhookName" -}}
{{- printf "%s-webhook" (include "crewfence.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "crewfence.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "crewfence.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "crewfence.imageTag" -}}
{{- default .Chart.AppVersion .tag }}
{{- end }}

{{- define "crewfence.operatorImage" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "crewfence.sidecarImage" -}}
{{- printf "%s:%s" .Values.sidecar.image.repository (default .Chart.AppVersion .Values.sidecar.image.tag) }}
{{- end }}

{{/* Labels ---------------------------------------------------------------------------------- */}}
{{- define "crewfence.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "crewfence.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: crewfence
{{- end }}

{{/* The operator pods: the NetworkPolicy and the Services select them by exactly these. */}}
{{- define "crewfence.operatorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "crewfence.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Namespaces ------------------------------------------------------------------------------ */}}
{{- define "crewfence.watchNamespaces" -}}
{{- join "," .Values.operator.watchNamespaces }}
{{- end }}

{{/* Where Crew pods (and so the sidecar NetworkPolicy) live. */}}
{{- define "crewfence.sidecarNamespaces" -}}
{{- $ns := .Values.networkPolicy.namespaces }}
{{- if not $ns }}{{ $ns = .Values.operator.watchNamespaces }}{{ end }}
{{- if not $ns }}{{ $ns = list .Release.Namespace }}{{ end }}
{{- toJson $ns }}
{{- end }}

{{/* Admission namespace selectors ---------------------------------------------------------------
Must equal operator/crewfence_operator/admission.py namespace_selector() (tests/chart checks):
the user's selector (matchLabels kept, matchExpressions first), then the watched namespaces (when
set), then NotIn kube-system + the given exclusions: those exclusions ALWAYS apply.
Arguments: dict "base" (selector) "watch" (list) "excluded" (list).
*/}}
{{- define "crewfence.namespaceSelector" -}}
{{- $exprs := list }}
{{- range $e := (default (list) .base.matchExpressions) }}{{ $exprs = append $exprs $e }}{{ end }}
{{- if .watch }}
{{- $exprs = append $exprs (dict "key" "kubernetes.io/metadata.name" "operator" "In" "values" (.watch | uniq | sortAlpha)) }}
{{- end }}
{{- $never := uniq (concat (list "kube-system") .excluded) | sortAlpha }}
{{- $exprs = append $exprs (dict "key" "kubernetes.io/metadata.name" "operator" "NotIn" "values" $never) }}
{{- $sel := dict "matchExpressions" $exprs }}
{{- if .base.matchLabels }}{{ $_ := set $sel "matchLabels" .base.matchLabels }}{{ end }}
{{- toJson $sel }}
{{- end }}

{{/* The webhook never sees kube-system or the release namespace (the operator's own pods). */}}
{{- define "crewfence.webhookNamespaceSelector" -}}
{{- include "crewfence.namespaceSelector" (dict "base" (default (dict) .Values.webhook.namespaceSelector) "watch" .Values.operator.watchNamespaces "excluded" (list .Release.Namespace)) }}
{{- end }}

{{/* The policies do not depend on the operator: only kube-system is left out. */}}
{{- define "crewfence.policyNamespaceSelector" -}}
{{- include "crewfence.namespaceSelector" (dict "base" (dict) "watch" .Values.operator.watchNamespaces "excluded" (list)) }}
{{- end }}

{{- define "crewfence.webhookTlsSecret" -}}
{{- printf "%s-tls" (include "crewfence.webhookName" .) }}
{{- end }}

{{/* RBAC rules: must equal operator/crewfence_operator/rbac.py (tests/chart checks) ------------- */}}
{{- define "crewfence.rbac.namespacedRules" -}}
- apiGroups: ["crewfence.dev"]
  resources: ["crews", "crewjobs"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["crewfence.dev"]
  resources: ["crews/status", "crewjobs/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["crewfence.dev"]
  resources: ["crewjobs"]
  verbs: ["delete"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "list", "watch", "create"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["get", "patch"]
- apiGroups: [""]
  resources: ["pods", "persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "create"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create", "update"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "create", "patch", "update", "delete"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create"]
- apiGroups: ["crewfence.dev"]
  resources: ["crewcronjobs"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["crewfence.dev"]
  resources: ["crewcronjobs/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["crewfence.dev"]
  resources: ["crewjobs"]
  verbs: ["create", "delete"]
{{- if .Values.certManager.enabled }}
- apiGroups: ["cert-manager.io"]
  resources: ["issuers", "certificates"]
  verbs: ["get", "create", "update"]
{{- end }}
{{- end }}

{{- define "crewfence.rbac.clusterRules" -}}
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloadpriorityclasses"]
  verbs: ["get"]
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get", "list", "watch"]
{{- end }}

{{/* kopf peering (replicaCount > 1 only). */}}
{{- define "crewfence.rbac.peeringRules" -}}
- apiGroups: ["kopf.dev"]
  resources: [{{ if .Values.operator.watchNamespaces }}"kopfpeerings"{{ else }}"clusterkopfpeerings"{{ end }}]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
