// Alerts (prometheusAlerts). One alert per cause. The states a resize leaves behind are judged
// from gauges (drift, offline CPUs), which last exactly as long as the cause; episode-ending
// counters only raise what no gauge shows (a refused kernel transition, rejected pods,
// infeasible balloon resizes). resync_timeout and mismatch are not alerted on: the capacity
// drift they end with is NodeResizeCapacityStale / NodeResizeCapacityStranded.
//
// Every alert keeps the labels of what it is about: the cluster, the exporter's namespace
// (c.namespaceLabel: kube-prometheus-stack's InfoInhibitor and inhibit rules pair alerts on
// `namespace`) and the node. Its runbook_url and dashboard_url are added below (decorate).
{
  local c = $._config,
  // The source's descriptions are wrapped for reading; an alert's are one line.
  local fold(text) = std.join(' ', [std.stripChars(l, ' ') for l in std.split(std.stripChars(text, '\n'), '\n')]),
  local fleetWide(rule) = std.length(std.findSubstr('absent(', rule.expr)) > 0,
  // What every alert gets: its runbook section and the dashboard to open (the node's, or the
  // fleet's for an alert about no one node).
  local decorate(group) = group {
    rules: [
      rule {
        annotations+: {
          description: fold(rule.annotations.description),
          runbook_url: c.runbookURLPattern % std.asciiLower(rule.alert),
          dashboard_url: if fleetWide(rule) then c.fleetDashboardURL else c.nodeDashboardURL,
        },
      }
      for rule in group.rules
    ],
  },
  prometheusAlerts+:: {
    groups+: std.map(decorate, [
      {
        name: 'node-resize-exporter.alerts',
        rules: [
          // The cause today's kubelets always produce: a hot-unplug that is never resynced (the
          // kubelet reads capacity once, at start-up). The Node advertises what the kernel no longer
          // has, so the scheduler over-commits the node. One alert per node and resource, whatever
          // episode counters say. 10m matches the exporter's default resync deadline; memory gets
          // the 100 MiB jitter bound KEP-3953 allows the kubelet; CPUs are whole cores. The value is
          // the amount the Node advertises too much.
          // The description leads with what matters before anyone acts: whether a kubelet restart,
          // the obvious remedy, would fail now (node_resize_kubelet_restart_blocked).
          {
            alert: 'NodeResizeCapacityStale',
            expr: |||
              max by (%(by)s, resource) (-node_resize_capacity_drift{%(jobSelector)s,unit="core"} >= 1)
                or
              max by (%(by)s, resource) (-node_resize_capacity_drift{%(jobSelector)s,unit="byte"} > %(memoryJitterBytes)d)
            ||| % c,
            'for': '10m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'Node {{ $labels.node }}: kubelet advertises {{ $labels.resource }} the kernel took away',
              description: |||-
                {{ range query %(blockedQuery)s }}A kubelet restart now would FAIL ({{ .Labels.reason }} names
                resources that are not online): follow the runbook's order, do not just restart.
                {{ end }}The Node object of {{ $labels.node }} advertises
                {{ if eq $labels.resource "memory" }}{{ $value | humanize1024 }}B{{ else }}{{ $value }} core(s){{ end }}
                of {{ $labels.resource }} more than the kernel has, for more than 10 minutes: the
                kubelet did not resync after a hot-unplug, so the scheduler over-commits the
                node.{{ range query %(forecastQuery)s }} A kubelet restart now would reject {{ .Value }}
                pod(s) ({{ .Labels.reason }}): see NodeResizeRestartWouldRejectPods before
                restarting.{{ end }}
              ||| % c,
            },
          },
          // The mirror image: a hot-plug never resynced. The new capacity sits unused; nothing
          // running is at risk, so it informs.
          {
            alert: 'NodeResizeCapacityStranded',
            expr: |||
              max by (%(by)s, resource) (node_resize_capacity_drift{%(jobSelector)s,unit="core"} >= 1)
                or
              max by (%(by)s, resource) (node_resize_capacity_drift{%(jobSelector)s,unit="byte"} > %(memoryJitterBytes)d)
            ||| % c,
            'for': '10m',
            labels: { severity: 'info' },
            annotations: {
              summary: 'Node {{ $labels.node }}: hot-added {{ $labels.resource }} is not schedulable yet',
              description: |||-
                {{ range query %(blockedQuery)s }}A kubelet restart now would FAIL ({{ .Labels.reason }} names
                resources that were not online when the kubelet started): follow the runbook's order.
                {{ end }}The kernel of {{ $labels.node }} has
                {{ if eq $labels.resource "memory" }}{{ $value | humanize1024 }}B{{ else }}{{ $value }} core(s){{ end }}
                of {{ $labels.resource }} more than the Node object advertises, for more than 10
                minutes: the kubelet did not resync after a hot-plug. Nothing running is at risk.
              ||| % c,
            },
          },
          // The kernel refused (or rolled back) a transition: a hot-unplug the hypervisor may now
          // force, or a hot-plug that added nothing. Capacity is unchanged, so no drift shows it.
          {
            alert: 'NodeResizeKernelRefused',
            expr: |||
              label_replace(node_resource_reason:node_hot_unplug_errors:increase30m{reason="kernel_failed"} > 0,
                            "direction", "decrease", "", "")
                or
              label_replace(node_resource_reason:node_resize_resync_errors:increase30m{reason="kernel_failed"} > 0,
                            "direction", "increase", "", "")
            |||,
            labels: { severity: 'warning' },
            annotations: {
              summary: 'Node {{ $labels.node }}: the kernel refused a {{ $labels.resource }} {{ $labels.direction }}',
              description: |||-
                {{ printf "%.0f" $value }} {{ $labels.resource }} {{ $labels.direction }} episode(s) on
                {{ $labels.node }} failed in the kernel in the last 30 minutes: the transition was
                refused or rolled back, so the node's capacity did not change.
              |||,
            },
          },
          // Plainly informational: the kubelet already failed these pods when it re-ran admission
          // after a resync; nothing here can be resolved, and the notice clears after an hour.
          {
            alert: 'NodeResizeReadmissionRejectedPods',
            expr: 'node_reason:node_resize_readmission_pods_rejected:increase1h > 0',
            labels: { severity: 'info' },
            annotations: {
              summary: 'Node {{ $labels.node }}: {{ printf "%.0f" $value }} pod(s) rejected {{ $labels.reason }} after a hot-unplug (informational)',
              description: |||-
                For information: the kubelet on {{ $labels.node }} failed {{ printf "%.0f" $value }}
                pod(s) with reason {{ $labels.reason }} when it re-ran admission after a hot-unplug in
                the last hour. Controllers recreate their pods elsewhere; bare pods are gone. This
                notice clears by itself after an hour.
              |||,
            },
          },
          // 5 minutes is how often the kubelet refreshes its own machine info; a kubelet with the
          // resync gate answers in seconds, so a p90 above it means resyncs wait for restarts.
          // Informational: the drift itself, while it lasts, is NodeResizeCapacityStale/Stranded.
          {
            alert: 'NodeResizeResyncSlow',
            expr: 'node_resource_direction:node_resize_resync_duration_seconds:p90_1h > %(resyncSlowSeconds)d' % c,
            labels: { severity: 'info' },
            annotations: {
              summary: 'Node {{ $labels.node }}: {{ $labels.resource }} capacity resyncs are slow',
              description: |||-
                90% of {{ $labels.resource }} {{ $labels.direction }} resyncs on {{ $labels.node }} in the
                last hour took up to {{ $value | humanizeDuration }} from the kernel change to the
                Node object update (threshold 5m): resyncs wait for someone to restart the kubelet.
              |||,
            },
          },
          // The CPU manager can pin a new container to a CPU the kernel has offlined (KEP-2403).
          // While the Node's CPU capacity is stale too, that is the same cause as
          // NodeResizeCapacityStale and only it fires; this alert is for a kubelet that resynced its
          // capacity but not its CPU manager (kubernetes#79823).
          {
            alert: 'NodeResizePodresourcesOfflineCPUs',
            expr: |||
              max by (%(by)s) (node_resize_podresources_offline_cpus{%(jobSelector)s}) > 0
                unless on (%(by)s)
              node_resize_capacity_drift{%(jobSelector)s,resource="cpu"} <= -1
            ||| % c,
            'for': '5m',
            labels: { severity: 'critical' },
            annotations: {
              summary: 'Node {{ $labels.node }}: kubelet offers CPUs that are offline',
              description: |||-
                The kubelet podresources API on {{ $labels.node }} lists {{ $value }} allocatable CPU(s)
                the kernel has offline while its Node capacity is current: exclusive-CPU pods may be
                pinned to CPUs that do not exist.
              |||,
            },
          },
          // Present but not usable: hot-added CPUs or memory blocks the kernel did not online (a
          // missing udev rule or auto_online_blocks=offline). A resource taken offline by a
          // hot-unplug the kubelet has not followed is NodeResizeCapacityStale's, not this.
          {
            alert: 'NodeResizeHotAddedOffline',
            expr: |||
              label_replace(max by (%(by)s) (node_resize_kernel_cpus{%(jobSelector)s,state="offline"}) > 0,
                            "resource", "cpu", "", "")
                unless on (%(by)s, resource) (node_resize_capacity_drift{%(jobSelector)s,unit="core"} <= -1)
                or
              label_replace(max by (%(by)s) (node_resize_kernel_memory_blocks{%(jobSelector)s,state="offline"}) > 0,
                            "resource", "memory", "", "")
                unless on (%(by)s, resource) (node_resize_capacity_drift{%(jobSelector)s,unit="byte"} < -%(memoryJitterBytes)d)
            ||| % c,
            'for': '15m',
            labels: { severity: 'info' },
            annotations: {
              summary: 'Node {{ $labels.node }}: {{ $value }} {{ $labels.resource }} unit(s) present but offline',
              description: |||-
                {{ $value }} {{ if eq $labels.resource "cpu" }}CPU(s){{ else }}memory block(s){{ end }}
                on {{ $labels.node }} have been present but offline for more than 15 minutes: the
                VM pays for them and nothing can use them. Usually a hot-add without the udev rule
                (or auto_online_blocks setting) that onlines what was added.
              |||,
            },
          },
          // Hot-added memory onlined into a kernel zone (Normal): the kernel may put unmovable pages
          // in it, and then refuses to offline it (EBUSY), so the hypervisor cannot take it back.
          // Only ZONE_MOVABLE memory can be counted on to leave again. 15m: a block onlined by hand
          // and corrected at once is not a cause. The count is the kernel's (the exporter reads it
          // at each scrape), so it survives an exporter restart; the alert does too: while the
          // target is down (a restart), the last value of the last 10 minutes stands in, so the
          // 15 minutes do not start again. It clears at the first scrape without such blocks.
          {
            alert: 'NodeResizeHotAddedMemoryNotMovable',
            expr: |||
              sum by (%(by)s) (
                node_resize_memory_hot_added_blocks{%(jobSelector)s,zone!="Movable"}
                  or
                (last_over_time(node_resize_memory_hot_added_blocks{%(jobSelector)s,zone!="Movable"}[10m])
                  unless on (instance) up{%(jobSelector)s} == 1)
              ) > 0
            ||| % c,
            'for': '15m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'Node {{ $labels.node }}: {{ $value }} hot-added memory block(s) may never leave',
              description: |||-
                {{ $value }} memory block(s) hot-added to {{ $labels.node }} were onlined into a
                kernel zone, not ZONE_MOVABLE, more than 15 minutes ago: once the kernel puts
                unmovable pages in them it refuses to offline them, and the memory cannot be
                unplugged again. Ask `node-resize-exporter plan --memory -SIZE` (or GET /plan) what
                can still leave; online future hot-adds as online_movable.
              |||,
            },
          },
          {
            alert: 'NodeResizeBalloonRequestsAboveAllocatable',
            expr: 'node_resource:node_resize_balloon_requests:ratio_allocatable > 1',
            'for': '5m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'Node {{ $labels.node }}: balloon pods hold more {{ $labels.resource }} than is allocatable',
              description: |||-
                Balloon pods on {{ $labels.node }} request {{ $value | humanizePercentage }} of the
                kubelet's allocatable {{ $labels.resource }}: effective capacity is negative.
              |||,
            },
          },
          // A balloon resize the kubelet marked Infeasible: the capacity hand-over did not happen.
          // `reason` (cpu_manager_static, capacity, other) says why where the exporter reports it.
          {
            alert: 'NodeResizeBalloonResizeInfeasible',
            expr: 'node_reason:node_resize_balloon_resize_infeasible:increase1h > 0',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'Node {{ $labels.node }}: balloon pod resize infeasible{{ with $labels.reason }} ({{ . }}){{ end }}',
              description: |||-
                {{ printf "%.0f" $value }} in-place resize(s) of balloon pods on {{ $labels.node }} were
                marked Infeasible by the kubelet in the last hour{{ with $labels.reason }} (reason {{ . }}){{ end }}:
                the capacity they were to hand over or take back did not move.
              |||,
            },
          },
          // What a kubelet restart now would do to the pods bound to the node (the readmission
          // forecast): the obvious remedy for stale capacity would fail these pods. Informational:
          // nothing has failed yet, and while the capacity is stale NodeResizeCapacityStale (whose
          // description carries the same count) is the one to act on; the inhibit rules hold this
          // one back meanwhile. The description names up to five pods.
          {
            alert: 'NodeResizeRestartWouldRejectPods',
            expr: 'max by (%(by)s, reason) (node_resize_readmission_forecast_rejected_pods{%(jobSelector)s}) > 0' % c,
            'for': '5m',
            labels: { severity: 'info' },
            annotations: {
              summary: 'Node {{ $labels.node }}: a kubelet restart now would reject {{ $value }} pod(s) {{ $labels.reason }}',
              description: |||-
                A kubelet restart on {{ $labels.node }} now would reject {{ $value }} pod(s) with
                reason {{ $labels.reason }}: the kernel no longer has the capacity they were admitted
                against. {{ range query %(forecastPodsQuery)s }}{{ .Labels.namespace }}/{{ .Labels.pod }}
                {{ end }}Drain or move them before restarting the kubelet.
              ||| % c,
            },
          },
          // Running containers in a state the kubelet would not create today (a cpuset naming
          // offline CPUs, a CFS quota or a memory limit above what the node has, an OOM score or
          // swap limit computed from another capacity): a kubelet restart does not fix them, a pod
          // restart does.
          {
            alert: 'NodeResizeRunningContainersStale',
            expr: 'max by (%(by)s, kind) (node_resize_running_containers_stale{%(jobSelector)s}) > 0' % c,
            'for': '15m',
            labels: { severity: 'info' },
            annotations: {
              summary: 'Node {{ $labels.node }}: {{ $value }} running container(s) stale ({{ $labels.kind }})',
              description: |||-
                {{ $value }} running container(s) on {{ $labels.node }} have been in a state the
                kubelet would not create today ({{ $labels.kind }}) for 15 minutes, left by a resize:
                `node-resize-exporter check` on the node names the pods; restarting a pod fixes it.
              |||,
            },
          },
          {
            alert: 'NodeResizeExporterDown',
            expr: 'up{%(jobSelector)s} == 0' % c,
            'for': '5m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'Node {{ $labels.node }}: node-resize-exporter cannot be scraped',
              description: |||-
                Prometheus has failed to scrape node-resize-exporter on {{ $labels.node }}
                ({{ $labels.instance }}) for 5 minutes: resizes on this node are not observed.
              |||,
            },
          },
          {
            alert: 'NodeResizeExporterSourceDown',
            // kubelet_process is down wherever the pod cannot see the host's processes (the
            // default DaemonSet: hostPID false): that is a deploy choice, not an outage, and it
            // shows as resynced_by="unknown" (docs/metrics.md), so it pages nobody.
            expr: 'node_resize_exporter_source_up{%(jobSelector)s, source!="kubelet_process"} == 0' % c,
            'for': '10m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'Node {{ $labels.node }}: exporter source {{ $labels.source }} is down',
              description: |||-
                The {{ $labels.source }} source of node-resize-exporter on {{ $labels.node }} has been
                down for 10 minutes; the metrics it feeds are stale or missing.
              |||,
            },
          },
          // The forecast of what a kubelet restart would reject is shown only while the exporter
          // sees this node's pods; without it, "nothing would be rejected" cannot be read from
          // the absence of the forecast's series.
          {
            alert: 'NodeResizeReadmissionForecastUnknown',
            expr: 'node_resize_readmission_forecast_valid{%(jobSelector)s} == 0' % c,
            'for': '10m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'Node {{ $labels.node }}: cannot forecast what a kubelet restart would reject',
              description: |||-
                node-resize-exporter on {{ $labels.node }} has not seen this node's pods for 10
                minutes ({{ $labels.reason }}): whether a kubelet restart is safe is unknown, not
                "nothing rejected".
              |||,
            },
          },
          {
            alert: 'NodeResizeExporterJournalFailing',
            expr: 'increase(node_resize_exporter_sink_errors_total{%(jobSelector)s, sink="journal"}[15m]) > 0' % c,
            'for': '15m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'Node {{ $labels.node }}: the episode journal is not being written',
              description: |||-
                node-resize-exporter on {{ $labels.node }} has failed journal writes for 15 minutes:
                episodes are not kept for postmortems and will not resume after a restart.
              |||,
            },
          },
          {
            alert: 'NodeResizeExporterEventsLost',
            expr: 'node_source:node_resize_exporter_events_lost:increase15m > 0',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'Node {{ $labels.node }}: exporter lost {{ $labels.source }} events',
              description: |||-
                node-resize-exporter on {{ $labels.node }} lost {{ printf "%.0f" $value }} {{ $labels.source }}
                event(s) in the last 15 minutes; episode timings may be incomplete (gauges are
                reconciled from sysfs and stay right).
              |||,
            },
          },
          // A sink the exporter turned off at start (the journal: a newer exporter wrote the file,
          // after a rollback): metrics flow, but episodes are not kept for postmortems.
          {
            alert: 'NodeResizeExporterSinkDown',
            expr: 'max by (%(by)s, sink) (node_resize_exporter_sink_up{%(jobSelector)s}) == 0' % c,
            'for': '5m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'Node {{ $labels.node }}: exporter sink {{ $labels.sink }} is down',
              description: |||-
                The {{ $labels.sink }} sink of node-resize-exporter on {{ $labels.node }} has been off
                for 5 minutes: episodes are not kept for postmortems. The exporter's log and
                `node-resize-exporter check` on the node say why and what to do.
              |||,
            },
          },
        ],
      },
      // Fleet-wide (absent() has no node, and so no target labels: the exporter's namespace is
      // set), for the global ruler, and its own rule object (deploy/prometheusrule-global.yaml)
      // so that it loads where the main object does not.
      {
        name: 'node-resize-exporter.alerts' + c.globalGroupSuffix,
        rules: [
          // No target at all: a ServiceMonitor that no Prometheus selects (a wrong `release` label,
          // a namePrefix overlay, a namespace the Prometheus does not watch) leaves no `up` series,
          // so NodeResizeExporterDown can never fire. Fleet-wide: absent() has no node to name.
          {
            alert: 'NodeResizeExporterAbsent',
            expr: 'absent(up{%(jobSelector)s})' % c,
            'for': '15m',
            labels: { severity: 'warning' } + c.exporterNamespaceLabels,
            annotations: {
              summary: 'No node-resize-exporter target in Prometheus',
              description: |||-
                Prometheus has had no target of node-resize-exporter ({{ $labels.job }}) for 15
                minutes: no resize on any node is observed, and no other node-resize alert can fire.
              |||,
            },
          },
          // Targets scraped, but the KEP-5578 counters missing: a metric relabeling that drops them,
          // or an exporter that does not export them. The hot-unplug panels and rules are blind.
          {
            alert: 'NodeResizeExporterSeriesAbsent',
            expr: |||
              (absent(node_hot_unplug_request_total{%(jobSelector)s}) or absent(node_hot_unplug_errors_total{%(jobSelector)s}))
                and on ()
              count(up{%(jobSelector)s} == 1) > 0
            ||| % c,
            'for': '15m',
            labels: { severity: 'warning' } + c.exporterNamespaceLabels,
            annotations: {
              summary: 'node-resize-exporter targets are up but export no KEP-5578 counters',
              description: |||-
                Prometheus scrapes node-resize-exporter ({{ $labels.job }}) but has held no
                node_hot_unplug_request_total or no node_hot_unplug_errors_total for 15 minutes: a
                metric relabeling drops them, or the targets are not node-resize-exporter.
              |||,
            },
          },
        ],
      },
    ]),
  },
}
