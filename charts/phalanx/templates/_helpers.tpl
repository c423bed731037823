{{/*
Labels of every object: the chart's standard labels. The pods also carry app: phalanx-scheduler,
the selector deploy/kubernetes uses (the Deployment's selector is immutable).
*/}}
{{- define "phalanx.labels" -}}
app.kubernetes.io/name: phalanx
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "phalanx.selectorLabels" -}}
app: phalanx-scheduler
{{- end -}}

{{/* The node agent's pods (nodeAgent.enabled): the selector deploy/kubernetes uses. */}}
{{- define "phalanx.nodeAgentSelectorLabels" -}}
app: phalanx-node-agent
{{- end -}}

{{/* The profile Phalanx serves. */}}
{{- define "phalanx.schedulerName" -}}
{{- if .Values.replaceDefaultScheduler -}}
default-scheduler
{{- else -}}
{{- required "schedulerName must not be empty" .Values.schedulerName -}}
{{- end -}}
{{- end -}}

{{/* repository:tag, or repository@digest when a digest is set. Argument: an image value. */}}
{{- define "phalanx.image" -}}
{{- if .digest -}}
{{- printf "%s@%s" .repository .digest -}}
{{- else -}}
{{- printf "%s:%s" .repository (required "an image needs a tag or a digest" .tag | toString) -}}
{{- end -}}
{{- end -}}

{{/* The extender's readiness and liveness probes: exec, since kubelet cannot reach loopback. */}}
{{- define "phalanx.probe" -}}
exec: {command: [python, -c, "import urllib.request as u; u.urlopen('http://127.0.0.1:{{ .port }}/{{ .path }}', timeout=2)"]}
{{- end -}}

{{/* kube-scheduler's KubeSchedulerConfiguration (scheduler.yaml of phalanx-scheduler-config). */}}
{{- define "phalanx.schedulerConfig" -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: true
  resourceNamespace: {{ .Release.Namespace }}
  resourceName: {{ .Values.leaderElection.leaseName }}
{{- with .Values.kubeScheduler.percentageOfNodesToScore }}
percentageOfNodesToScore: {{ . }}
{{- end }}
profiles:
  - schedulerName: {{ include "phalanx.schedulerName" . }}
    pluginConfig:
      - name: NodeResourcesFit
        args:
          # Accounted by Phalanx, not by node allocatable: HAMi-style share resources, and
          # MIG resources (a dynamic-MIG node advertises no slices until Phalanx cuts them).
          ignoredResources:
            {{- toYaml .Values.kubeScheduler.ignoredResources | nindent 12 }}
# Three entries, one extender. Prioritize only for pods that request GPU resources: filter
# already offers a pod without GPUs only the nodes Phalanx ranks first, so it costs one call on
# the scheduling cycle, not two. Bind apart from the verbs of the scheduling cycle: each entry
# has its own HTTP client, which keeps two idle connections; binds in flight (up to hundreds of
# ms each under load) would take them, and filter, on the scheduling cycle, would dial anew.
extenders:
  - urlPrefix: http://127.0.0.1:{{ .Values.extender.port }}
    filterVerb: filter
    preemptVerb: preempt
    enableHTTPS: false
    nodeCacheCapable: true
    ignorable: false
    httpTimeout: {{ .Values.extender.httpTimeout }}
    managedResources: []
  - urlPrefix: http://127.0.0.1:{{ .Values.extender.port }}
    prioritizeVerb: prioritize
    weight: 1
    enableHTTPS: false
    nodeCacheCapable: true
    ignorable: false
    httpTimeout: {{ .Values.extender.httpTimeout }}
    managedResources:
      - name: nvidia.com/gpu
        ignoredByScheduler: false
      - name: phalanx.io/gpu-share
        ignoredByScheduler: false
      {{- range .Values.kubeScheduler.ignoredResources }}
      - name: {{ . }}
        ignoredByScheduler: false
      {{- end }}
  - urlPrefix: http://127.0.0.1:{{ .Values.extender.port }}
    bindVerb: bind
    enableHTTPS: false
    nodeCacheCapable: true
    ignorable: false
    httpTimeout: {{ .Values.extender.httpTimeout }}
    managedResources: []
{{- end -}}
