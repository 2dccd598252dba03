{{/* The operator's pod template, shared by the Deployment (1 replica) and the StatefulSet (>1). */}}
{{- define "crewfence.operatorPodTemplate" -}}
{{- $peering := gt (int .Values.replicaCount) 1 -}}
metadata:
  labels:
    {{- include "crewfence.labels" . | nindent 4 }}
    app.kubernetes.io/component: operator
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .Values.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  serviceAccountName: {{ include "crewfence.serviceAccountName" . }}
  automountServiceAccountToken: true
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  containers:
    - name: operator
      image: {{ include "crewfence.operatorImage" . }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      command: ["crewfence-operator"]
      {{- with .Values.operator.extraArgs }}
      args:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      env:
        - name: CREWFENCE_OPERATOR_NAMESPACES
          value: {{ include "crewfence.watchNamespaces" . | quote }}
        - name: CREWFENCE_OPERATOR_ALL_NAMESPACES
          value: {{ (not .Values.operator.watchNamespaces) | toString | quote }}
        - name: CREWFENCE_OPERATOR_STANDALONE
          value: {{ (not $peering) | toString | quote }}
        {{- if $peering }}
        - name: CREWFENCE_OPERATOR_PEERING
          value: {{ .Values.operator.peeringName | quote }}
        # Distinct kopf priorities: the StatefulSet ordinal (the highest live ordinal is active).
        - name: CREWFENCE_OPERATOR_PRIORITY
          valueFrom:
            fieldRef:
              fieldPath: metadata.labels['apps.kubernetes.io/pod-index']
        {{- end }}
        - name: CREWFENCE_OPERATOR_LIVENESS_PORT
          value: {{ .Values.operator.livenessPort | quote }}
        - name: CREWFENCE_OPERATOR_READINESS_PORT
          value: {{ .Values.operator.readinessPort | quote }}
        - name: CREWFENCE_OPERATOR_METRICS_PORT
          value: {{ .Values.operator.metricsPort | quote }}
        - name: CREWFENCE_OPERATOR_STATUS_INTERVAL
          value: {{ .Values.operator.statusInterval | quote }}
        - name: CREWFENCE_OPERATOR_AUDIT_INTERVAL
          value: {{ .Values.operator.auditInterval | quote }}
        - name: CREWFENCE_OPERATOR_VERBOSE
          value: {{ .Values.operator.verbose | toString | quote }}
        - name: CREWFENCE_OPERATOR_SIDECAR_IMAGE
          value: {{ include "crewfence.sidecarImage" . | quote }}
        - name: CREWFENCE_OPERATOR_IMAGE_PULL_POLICY
          value: {{ .Values.sidecar.image.pullPolicy | quote }}
        - name: CREWFENCE_OPERATOR_SIDECAR_TLS
          value: {{ .Values.sidecar.tls.enabled | toString | quote }}
        {{- if .Values.certManager.enabled }}
        {{- if not .Values.sidecar.tls.enabled }}
        {{- fail "certManager.enabled needs sidecar.tls.enabled: cert-manager issues the mutual-TLS certificates" }}
        {{- end }}
        - name: CREWFENCE_OPERATOR_CERT_SOURCE
          value: cert-manager
        {{- with .Values.certManager.issuerRef }}
        {{- if .name }}
        - name: CREWFENCE_OPERATOR_CERT_MANAGER_ISSUER
          value: {{ printf "%s/%s" (.kind | default "Issuer") .name | quote }}
        {{- end }}
        {{- end }}
        {{- end }}
        - name: CREWFENCE_OPERATOR_SIDECAR_MAX_CONCURRENCY
          value: {{ .Values.sidecar.journal.maxConcurrency | int64 | quote }}
        - name: CREWFENCE_OPERATOR_SIDECAR_MAX_RETAINED_RUNS
          value: {{ .Values.sidecar.journal.maxRetainedRuns | int64 | quote }}
        - name: CREWFENCE_OPERATOR_SIDECAR_MAX_EVENTS_PER_RUN
          value: {{ .Values.sidecar.journal.maxEventsPerRun | int64 | quote }}
        - name: CREWFENCE_OPERATOR_SIDECAR_MAX_EVENT_BYTES
          value: {{ .Values.sidecar.journal.maxEventBytes | int64 | quote }}
        - name: CREWFENCE_OPERATOR_SIDECAR_MAX_STATE_BYTES
          value: {{ .Values.sidecar.journal.maxStateBytes | int64 | quote }}
        {{- if .Values.webhook.enabled }}
        - name: CREWFENCE_OPERATOR_WEBHOOK_MODE
          value: service
        - name: CREWFENCE_OPERATOR_WEBHOOK_ADDR
          value: "0.0.0.0"
        - name: CREWFENCE_OPERATOR_WEBHOOK_PORT
          value: {{ .Values.webhook.port | quote }}
        {{- if .Values.webhook.certManager.enabled }}
        - name: CREWFENCE_OPERATOR_WEBHOOK_CERT_DIR
          value: /etc/crewfence/webhook-tls
        {{- else }}
        # The operator keeps its serving certificate in this Secret and injects the CA.
        - name: CREWFENCE_OPERATOR_WEBHOOK_CERT_DIR
          value: /tmp/webhook-tls
        - name: CREWFENCE_OPERATOR_WEBHOOK_TLS_SECRET
          value: {{ printf "%s/%s" .Release.Namespace (include "crewfence.webhookTlsSecret" .) | quote }}
        - name: CREWFENCE_OPERATOR_WEBHOOK_SERVICE
          value: {{ include "crewfence.webhookName" . | quote }}
        - name: CREWFENCE_OPERATOR_WEBHOOK_CONFIGURATION
          value: {{ include "crewfence.fullname" . | quote }}
        {{- end }}
        {{- else }}
        - name: CREWFENCE_OPERATOR_WEBHOOK_MODE
          value: "off"
        {{- end }}
        {{- with .Values.operator.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        - name: metrics
          containerPort: {{ .Values.operator.metricsPort }}
          protocol: TCP
        - name: healthz
          containerPort: {{ .Values.operator.livenessPort }}
          protocol: TCP
        - name: readyz
          containerPort: {{ .Values.operator.readinessPort }}
          protocol: TCP
        {{- if .Values.webhook.enabled }}
        - name: webhook
          containerPort: {{ .Values.webhook.port }}
          protocol: TCP
        {{- end }}
      livenessProbe:
        httpGet:
          path: /healthz
          port: healthz
        initialDelaySeconds: 10
        periodSeconds: 20
        timeoutSeconds: 5
        failureThreshold: 3
      # Ready: connected to the API server and, with the webhook, serving admission.
      readinessProbe:
        httpGet:
          path: /readyz
          port: readyz
        periodSeconds: 10
        timeoutSeconds: 5
        failureThreshold: 3
      resources:
        {{- toYaml .Values.resources | nindent 8 }}
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
        {{- if and .Values.webhook.enabled .Values.webhook.certManager.enabled }}
        - name: webhook-tls
          mountPath: /etc/crewfence/webhook-tls
          readOnly: true
        {{- end }}
  volumes:
    - name: tmp
      emptyDir:
        sizeLimit: 64Mi
    {{- if and .Values.webhook.enabled .Values.webhook.certManager.enabled }}
    - name: webhook-tls
      secret:
        secretName: {{ include "crewfence.webhookTlsSecret" . }}
        defaultMode: 0400
    {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
