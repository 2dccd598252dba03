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

{{/* Webhook TLS ---------------------------------------------------------------------------------
Generated once per render and cached on .Values (one map shared by all templates of this chart),
so the Secret, the caBundle and the pod's checksum annotation see the same certificate whatever
order Helm renders the files in. An existing Secret (helm install/upgrade with a cluster) is
reused until 30 days before its recorded expiry; then the next upgrade rotates it.
*/}}
{{- define "crewfence.webhookCerts" -}}
{{- if not (hasKey .Values "_crewfenceWebhookCerts") }}
{{- $svc := include "crewfence.webhookName" . }}
{{- $ns := .Release.Namespace }}
{{- $secretName := printf "%s-tls" $svc }}
{{- $days := int .Values.webhook.generatedCert.validityDays }}
{{- $certs := dict }}
{{- $existing := lookup "v1" "Secret" $ns $secretName }}
{{- if and $existing $existing.data $existing.metadata.annotations }}
{{- $notAfter := get $existing.metadata.annotations "crewfence.dev/not-after" }}
{{- if and $notAfter (gt (toDate "2006-01-02T15:04:05Z07:00" $notAfter | unixEpoch | int64) (add (now | unixEpoch) 2592000 | int64)) }}
{{- $certs = dict "crt" (index $existing.data "tls.crt" | b64dec) "key" (index $existing.data "tls.key" | b64dec) "ca" (index $existing.data "ca.crt" | b64dec) "notAfter" $notAfter }}
{{- end }}
{{- end }}
{{- if not $certs }}
{{- $ca := genCA (printf "%s-ca" $svc) $days }}
{{- $dns := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) }}
{{- $cert := genSignedCert (printf "%s.%s.svc" $svc $ns) nil $dns $days $ca }}
{{- $notAfter := dateInZone "2006-01-02T15:04:05Z07:00" (dateModify (printf "%dh" (mul $days 24)) now) "UTC" }}
{{- $certs = dict "crt" $cert.Cert "key" $cert.Key "ca" $ca.Cert "notAfter" $notAfter }}
{{- end }}
{{- $_ := set .Values "_crewfenceWebhookCerts" $certs }}
{{- end }}
{{- toJson (get .Values "_crewfenceWebhookCerts") }}
{{- end }}

{{/* RBAC rules: must equal operator/crewfence_operator/rbac.py (tests/chart checks) ------------- */}}
{{- define "crewfence.rbac.namespacedRules" -}}
- apiGroups: ["crewfence.dev"]
  resources: ["crews", "crewjobs"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["crewfence.dev"]
  resources: ["crews/status", "crewjobs/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: [""]
  resources: ["pods", "persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "create"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "create", "patch", "update", "delete"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create"]
{{- end }}

{{- define "crewfence.rbac.clusterRules" -}}
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
