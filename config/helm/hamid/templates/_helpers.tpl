{{/* Chart name. */}}
{{- define "hamid.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified app name (HAMi's naming: objects are "<fullname>-<part>"). */}}
{{- define "hamid.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "hamid.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Common labels. */}}
{{- define "hamid.labels" -}}
helm.sh/chart: {{ include "hamid.chart" . }}
app.kubernetes.io/name: {{ include "hamid.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "hamid.scheduler.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hamid.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: scheduler
{{- end -}}

{{/* The same labels as a label selector string (--scheduler-pod-selector). */}}
{{- define "hamid.scheduler.selector" -}}
app.kubernetes.io/name={{ include "hamid.name" . }},app.kubernetes.io/instance={{ .Release.Name }},app.kubernetes.io/component=scheduler
{{- end -}}

{{- define "hamid.devicePlugin.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hamid.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: device-plugin
{{- end -}}

{{/* Object names. */}}
{{- define "hamid.scheduler.name" -}}{{ include "hamid.fullname" . }}-scheduler{{- end -}}
{{- define "hamid.scheduler.serviceAccount" -}}{{ include "hamid.fullname" . }}-scheduler{{- end -}}
{{- define "hamid.devicePlugin.name" -}}{{ include "hamid.fullname" . }}-device-plugin{{- end -}}
{{/* The plugins' metrics Service, so also their scrape job (ServiceMonitor, PrometheusRule). */}}
{{- define "hamid.devicePlugin.metricsService" -}}{{ include "hamid.devicePlugin.name" . }}-metrics{{- end -}}
{{- define "hamid.devicePlugin.serviceAccount" -}}{{ include "hamid.fullname" . }}-device-plugin{{- end -}}
{{- define "hamid.deviceConfig.name" -}}{{ include "hamid.fullname" . }}-device-config{{- end -}}
{{- define "hamid.tls.generatedSecret" -}}{{ include "hamid.fullname" . }}-scheduler-tls{{- end -}}
{{- define "hamid.tls.caConfigMap" -}}{{ include "hamid.fullname" . }}-scheduler-ca{{- end -}}
{{- define "hamid.webhook.name" -}}{{ include "hamid.fullname" . }}-webhook{{- end -}}
{{- define "hamid.allocationKeys.generatedSecret" -}}{{ include "hamid.fullname" . }}-allocation-keys{{- end -}}
{{- define "hamid.devicePlugin.nodeScopePolicy.name" -}}{{ include "hamid.fullname" . }}-device-plugin-node-scope{{- end -}}
{{- define "hamid.annotationPolicy.name" -}}{{ include "hamid.fullname" . }}-scheduler-owned-annotations{{- end -}}
{{/* Usernames that may change scheduler-owned pod annotations: the scheduler and the device plugin. */}}
{{- define "hamid.annotationWriters" -}}
{{- $ns := include "hamid.namespace" . -}}
{{- $writers := list (printf "system:serviceaccount:%s:%s" $ns (include "hamid.scheduler.serviceAccount" .)) (printf "system:serviceaccount:%s:%s" $ns (include "hamid.devicePlugin.serviceAccount" .)) -}}
{{- with .Values.scheduler.refitHamiPluginServiceAccount -}}
{{- $writers = append $writers (printf "system:serviceaccount:%s" (replace "/" ":" .)) -}}
{{- end -}}
{{- toJson $writers -}}
{{- end -}}

{{/* The Secret the scheduler serves TLS from. */}}
{{- define "hamid.tls.secretName" -}}
{{- default (include "hamid.tls.generatedSecret" .) .Values.scheduler.tls.existingSecret -}}
{{- end -}}

{{/* "true" when the chart knows the scheduler's CA (generated, or scheduler.tls.caBundle). */}}
{{- define "hamid.tls.caKnown" -}}
{{- if or (not .Values.scheduler.tls.existingSecret) .Values.scheduler.tls.caBundle -}}true{{- end -}}
{{- end -}}

{{/* "true" when the metrics port serves TLS: scheduler.metricsTls.enabled, or metricsAuth when null
(or absent: `helm upgrade --reuse-values` from a release older than the key). */}}
{{- define "hamid.scheduler.metricsTls" -}}
{{- $s := .Values.scheduler -}}
{{- $tls := dig "metricsTls" "enabled" nil $s -}}
{{- if ternary $s.metricsAuth.enabled $tls (kindIs "invalid" $tls) -}}true{{- end -}}
{{- end -}}

{{/* Leader election is on only with more than one replica. */}}
{{- define "hamid.scheduler.leaderElect" -}}
{{- if and .Values.scheduler.leaderElect (gt (int .Values.scheduler.replicas) 1) -}}true{{- end -}}
{{- end -}}

{{/* The one Lease: kube-scheduler campaigns for it, hamid follows it (leads iff its pod's
kube-scheduler holds it). */}}
{{- define "hamid.scheduler.leaseName" -}}{{ include "hamid.fullname" . }}-scheduler{{- end -}}
{{- define "hamid.webhook.serviceName" -}}{{ include "hamid.fullname" . }}-scheduler-webhook{{- end -}}

{{/* DNS name of the scheduler Service inside the cluster. */}}
{{- define "hamid.scheduler.serviceHost" -}}
{{- printf "%s.%s.svc" (include "hamid.scheduler.name" .) (include "hamid.namespace" .) -}}
{{- end -}}

{{/* Refit endpoint handed to the device plugins. */}}
{{- define "hamid.numaRefit.endpoint" -}}
{{- if .Values.devicePlugin.numaRefit.schedulerEndpoint -}}
{{- .Values.devicePlugin.numaRefit.schedulerEndpoint -}}
{{- else -}}
{{- printf "https://%s:%v" (include "hamid.scheduler.serviceHost" .) (.Values.scheduler.service.httpPort | default 443) -}}
{{- end -}}
{{- end -}}

{{/*
How the device plugin verifies the scheduler, first match wins:
caFile (a path in the container) > caSecret (mounted) > tlsInsecure (explicit opt-out) >
the chart-known CA (generated or scheduler.tls.caBundle, mounted) > system roots ("").
Prints one of: file, secret, insecure, chart, system.
*/}}
{{- define "hamid.numaRefit.trust" -}}
{{- $r := .Values.devicePlugin.numaRefit -}}
{{- if $r.caFile -}}file
{{- else if $r.caSecret -}}secret
{{- else if $r.tlsInsecure -}}insecure
{{- else if include "hamid.tls.caKnown" . -}}chart
{{- else -}}system
{{- end -}}
{{- end -}}

{{- define "hamid.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* kube-scheduler image: the cluster's vMAJOR.MINOR.PATCH unless a tag is given. */}}
{{- define "hamid.kubeScheduler.image" -}}
{{- $img := .Values.scheduler.kubeScheduler.image -}}
{{- $tag := $img.tag -}}
{{- if not $tag -}}
{{- $tag = regexFind "^v?[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version -}}
{{- if not (hasPrefix "v" $tag) -}}{{- $tag = printf "v%s" $tag -}}{{- end -}}
{{- end -}}
{{- printf "%s:%s" $img.repository $tag -}}
{{- end -}}

{{/* Every HAMi resource name (extender managedResources). */}}
{{- define "hamid.resourceNames" -}}
{{- list .Values.resourceName .Values.resourceMem .Values.resourceMemPercentage .Values.resourceCores .Values.resourcePriority | toJson -}}
{{- end -}}

{{/* Global hamid options, before the mode name. */}}
{{- define "hamid.globalArgs" -}}
- --log-format={{ .Values.log.format }}
- --log-level={{ .Values.log.level }}
{{- end -}}

{{/* Restricted container security context (non-root modes). */}}
{{- define "hamid.restrictedSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Namespace of every namespaced object. */}}
{{- define "hamid.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The device plugin's node selector: HAMi's nvidiaNodeSelector under nodeSelector. */}}
{{- define "hamid.devicePlugin.nodeSelector" -}}
{{- $dp := .Values.devicePlugin -}}
{{- $sel := merge (deepCopy ($dp.nodeSelector | default dict)) (deepCopy ($dp.nvidiaNodeSelector | default dict)) -}}
{{- if $sel }}{{ toYaml $sel }}{{ end -}}
{{- end -}}

{{/*
HAMi's chart default of devices.nvidia.migProfileAllowlist (used when it is null or absent, as
after `helm upgrade --reuse-values` from a chart without it): the MIG profiles per GPU model.
*/}}
{{- define "hamid.migProfileAllowlist" -}}
- models: ["A30"]
  profiles: ["1g.6gb", "2g.12gb", "4g.24gb"]
- models: ["A100-SXM4-40GB", "A100-40GB-PCIe", "A100-PCIE-40GB"]
  profiles: ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]
- models: ["A100-SXM4-80GB", "A100-80GB-PCIe", "A100-PCIE-80GB"]
  profiles: ["1g.10gb", "2g.20gb", "3g.40gb", "7g.79gb"]
- models: ["H100-PCIE-80GB", "H100-SXM5-80GB"]
  profiles: ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]
- models: ["H100-PCIE-94GB", "H100-SXM5-94GB"]
  profiles: ["1g.12gb", "2g.24gb", "3g.47gb", "7g.94gb"]
- models: ["H20", "H100 on GH200"]
  profiles: ["1g.12gb", "2g.24gb", "3g.48gb", "7g.96gb"]
- models: ["H200 NVL", "H200-SXM5"]
  profiles: ["1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb"]
- models: ["B200"]
  profiles: ["1g.23gb", "2g.45gb", "3g.90gb", "7g.180gb"]
- models: ["RTX PRO 6000 Blackwell Server Edition"]
  profiles: ["1g.24gb", "2g.48gb", "4g.96gb"]
{{- end }}
