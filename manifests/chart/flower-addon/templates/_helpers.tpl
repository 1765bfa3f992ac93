{{/* The image both binaries run from. */}}
{{- define "flower-addon.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* Arguments both binaries take from the shared values. */}}
{{- define "flower-addon.commonArgs" -}}
{{- if ne .Values.logFormat "text" }}
            - --log-format={{ .Values.logFormat }}
{{- end }}
{{- if not .Values.metrics.enabled }}
            - --metrics-bind-address=0
{{- end }}
{{- end }}

{{/* Probes and ports both Deployments share. */}}
{{- define "flower-addon.opsPorts" }}
            # `--metrics-bind-address` (default :8080): GET /metrics, Prometheus text format.
            - name: metrics
              containerPort: 8080
              protocol: TCP
            # `--health-probe-bind-address` (default :8081): /healthz and /readyz.
            - name: health
              containerPort: 8081
              protocol: TCP
{{- end }}

{{- define "flower-addon.probes" }}
          readinessProbe:
            httpGet:
              path: /readyz
              port: health
            periodSeconds: 5
          livenessProbe:
            httpGet:
              path: /healthz
              port: health
            initialDelaySeconds: 5
            periodSeconds: 20
{{- end }}

{{- define "flower-addon.securityContext" }}
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        runAsGroup: 65532
        seccompProfile:
          type: RuntimeDefault
{{- end }}

{{- define "flower-addon.containerSecurityContext" }}
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities:
              drop: ["ALL"]
{{- end }}

{{/* nodeSelector and tolerations of a component's values. */}}
{{- define "flower-addon.scheduling" -}}
{{- with .nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
{{- end }}
{{- with .tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
{{- end }}
{{- end }}

{{/* The rules on namespaced objects: cluster-wide by default, or a Role in each namespace of
agent.namespaces (and the release's own, for the agent's credentials Secret). */}}
{{- define "flower-addon.agentNamespacedRules" }}
  - apiGroups: ["apps"]
    resources: ["statefulsets", "daemonsets"]
    verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
  # The SuperLink CA Secret the pools mount, each pool's SuperNode key Secret (one private key
  # per pod or node, made and kept on this cluster; created, then replaced at the read
  # resourceVersion), and the headless Service each StatefulSet pool names in serviceName
  # (stable SuperNode DNS names).
  - apiGroups: [""]
    resources: ["secrets", "services"]
    verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
  # Readiness comes from workload status; pods are read for per-pod detail only.
  - apiGroups: [""]
    resources: ["pods"]
    verbs: ["get", "list", "watch"]
  - apiGroups: ["", "events.k8s.io"]
    resources: ["events"]
    verbs: ["create", "patch"]
{{- end }}

{{/* The agent's cluster-wide rules (namespaces and nodes). */}}
{{- define "flower-addon.agentClusterRules" }}
  # Namespaces work goes to: created with Pod Security labels, or labelled (patch) when they
  # exist without an enforce label.
  - apiGroups: [""]
    resources: ["namespaces"]
    verbs: ["get", "list", "watch", "create", "patch"]
  # Allocatable CPU and memory (summed over nodes) reported to the hub for the
  # ResourceAllocatable* Placement prioritizers, and the nodes a DaemonSet pool may run on
  # (one SuperNode key per node).
  - apiGroups: [""]
    resources: ["nodes"]
    verbs: ["get", "list", "watch"]
{{- end }}
