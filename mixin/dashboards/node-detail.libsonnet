// SOURCE of dashboards/node-detail.json (scripts/gen-monitoring.py; placeholders in
// scripts/gen_dashboards.py). One node: what the kernel, the kubelet and the exporter say.
{
  uid: 'nre-node-detail',
  title: 'Node resize: node detail',
  description: "One node: kernel hotplug state and transitions, the kubelet's view, episodes, balloon pods and the exporter's own health (node-resize-exporter).",
  node: 'single',
  links: [
    {
      title: 'Fleet overview',
      type: 'link',
      icon: 'dashboard',
      url: '/d/nre-fleet-overview/node-resize-fleet-overview?%(vars)s',
    },
  ],
  annotations: [
    {
      name: 'Episode starts',
      color: 'blue',
      expr: |||
        label_replace(sum by (%(by)s, resource) (changes(node_resize_resync_request_total{%(sel)s}[$__rate_interval])) > 0, "change", "hot-plug", "", "")
          or
        label_replace(sum by (%(by)s, resource) (changes(node_hot_unplug_request_total{%(sel)s}[$__rate_interval])) > 0, "change", "hot-unplug", "", "")
      |||,
      title: '{{change}} {{resource}}: episode started',
      tags: 'resource,change',
    },
    {
      name: 'Episode ends',
      color: 'purple',
      expr: |||
        label_replace(
          sum by (%(by)s, resource) (changes(node_resize_resync_duration_seconds_count{%(sel)s}[$__rate_interval])) > 0
            or
          sum by (%(by)s, resource) (node_resize_resync_duration_seconds_count{%(sel)s} unless node_resize_resync_duration_seconds_count{%(sel)s} offset $__rate_interval) > 0,
          "reason", "resynced", "", "")
          or
        sum by (%(by)s, resource, reason) (changes(node_resize_resync_errors_total{%(sel)s}[$__rate_interval])) > 0
          or
        sum by (%(by)s, resource, reason) (changes(node_hot_unplug_errors_total{%(sel)s}[$__rate_interval])) > 0
      |||,
      title: '{{resource}}: episode ended ({{reason}})',
      tags: 'resource,reason',
    },
    {
      name: 'Kernel transitions',
      color: 'orange',
      expr: 'sum by (%(by)s, resource, direction, result) (changes(node_resize_kernel_transitions_total{%(sel)s}[$__rate_interval])) > 0',
      title: '{{resource}} {{direction}} {{result}}',
      tags: 'resource,direction,result',
    },
    {
      name: 'Kubelet restarts',
      color: 'red',
      expr: 'sum by (%(by)s) (changes(node_resize_kubelet_restarts_total{%(sel)s}[$__rate_interval])) > 0',
      title: 'kubelet restarted',
      tags: 'node',
    },
  ],
  rows: [
    {
      title: 'Now',
      panels: [
        {
          type: 'stat',
          title: 'CPUs online (kernel)',
          w: 4,
          description: 'CPUs the kernel has online now (sysfs /sys/devices/system/cpu/online): the truth the kubelet should advertise.',
          alarm_at: 1000000,
          targets: [
            {
              expr: 'max(node_resize_kernel_cpus{%(sel)s,state="online"})',
            },
          ],
        },
        {
          type: 'stat',
          title: 'CPU capacity (kubelet)',
          w: 4,
          description: 'CPU capacity the Node object advertises now (status.capacity): what the scheduler believes.',
          alarm_at: 1000000,
          targets: [
            {
              expr: 'max(node_resize_kubelet_capacity{%(sel)s,resource="cpu"})',
            },
          ],
        },
        {
          type: 'stat',
          title: 'CPU drift (kernel - kubelet)',
          w: 4,
          description: 'Kernel minus kubelet CPU capacity, in cores. Red, negative: the kubelet advertises CPUs the kernel took away (stale: pods at risk at the next kubelet restart); amber, positive: added CPUs not advertised yet (stranded); green, 0: in sync.',
          drift: 'cores',
          targets: [
            {
              expr: 'max(node_resize_capacity_drift{%(sel)s,resource="cpu"})',
            },
          ],
        },
        {
          type: 'stat',
          title: 'Memory drift (kernel - kubelet)',
          w: 4,
          unit: 'bytes',
          description: "Kernel minus kubelet memory capacity. Red, below -100 MiB: stale (pods at risk); amber, above 100 MiB: stranded; green within 100 MiB: in sync (KEP-3953's jitter bound).",
          drift: 'bytes',
          targets: [
            {
              expr: 'max(node_resize_capacity_drift{%(sel)s,resource="memory"})',
            },
          ],
        },
        {
          type: 'stat',
          title: 'Capacity differs since',
          w: 4,
          unit: 'dateTimeAsIso',
          description: 'When the current drift began (empty: in sync).',
          targets: [
            {
              expr: '(time() - max(node_resize_capacity_drift_seconds{%(sel)s} > 0)) * 1000',
            },
          ],
        },
        {
          type: 'stat',
          title: 'Kubelet restart would fail',
          w: 4,
          description: "1: node_resize_kubelet_restart_blocked says a restart now fails (its checkpoint names CPUs or memory not online). Follow the runbook's safe restart.",
          targets: [
            {
              expr: 'max(node_resize_kubelet_restart_blocked{%(sel)s})',
            },
          ],
        },
        {
          type: 'stat',
          title: 'Pods a kubelet restart would reject',
          w: 4,
          description: "The readmission forecast: pods bound to this node a kubelet restart now would reject, all reasons (red from 1: NodeResizeRestartWouldRejectPods). The table below names them; the runbook's 'Before you restart the kubelet' says what to do.",
          targets: [
            {
              expr: 'sum(node_resize_readmission_forecast_rejected_pods{%(sel)s})',
            },
          ],
        },
        {
          type: 'stat',
          title: 'Running containers stale',
          w: 4,
          description: 'Running containers a resize left in a state the kubelet would not create today, all kinds (red from 1: NodeResizeRunningContainersStale). `node-resize-exporter check` names the pods.',
          targets: [
            {
              expr: 'sum(node_resize_running_containers_stale{%(sel)s})',
            },
          ],
        },
      ],
    },
    {
      title: 'Before a kubelet restart',
      panels: [
        {
          type: 'table',
          title: 'Pods a kubelet restart now would reject',
          description: "The readmission forecast, pod by pod (the first 20 in readmission order): the pod's namespace and name and the reason the kubelet would give. Empty: every pod would be readmitted. Drain these, or give the capacity back, before restarting the kubelet.",
          columns: {
            'Value #A': 'Rejected',
          },
          targets: [
            {
              expr: 'max by (namespace, pod, reason) (node_resize_readmission_forecast_rejected{%(sel)s})',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Forecast: pods a restart would reject, by reason',
          description: 'Over time, how many pods a kubelet restart would have rejected at each moment, by the reason it would give (OutOfcpu, OutOfmemory, OutOfpods, ...). It rises with a hot-unplug and falls when capacity returns or pods leave.',
          bars: true,
          targets: [
            {
              expr: 'max by (reason) (node_resize_readmission_forecast_rejected_pods{%(sel)s})',
              legend: '{{reason}}',
            },
            {
              expr: 'max(node_resize_readmission_forecast_rejected_unlisted_pods{%(sel)s})',
              legend: 'beyond the 20 named',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Running containers stale, by kind',
          description: 'Running containers a resize left stale, by kind (cpuset_offline, cpuset_missing, cpu_limit_above_online, memory_limit_above_capacity, oom_score_adj, swap_limit). A kubelet restart does not fix them; re-creating the pods does.',
          targets: [
            {
              expr: 'max by (kind) (node_resize_running_containers_stale{%(sel)s})',
              legend: '{{kind}}',
            },
          ],
        },
      ],
    },
    {
      title: 'Kernel vs kubelet',
      panels: [
        {
          type: 'timeseries',
          title: 'CPUs: kernel vs kubelet',
          description: "CPUs online and present in the kernel against the kubelet's capacity and allocatable and the effective capacity left after balloon pods. A gap between kernel online and kubelet capacity is a resync not done.",
          targets: [
            {
              expr: 'max(node_resize_kernel_cpus{%(sel)s,state="online"})',
              legend: 'kernel online',
            },
            {
              expr: 'max(node_resize_kernel_cpus{%(sel)s,state="present"})',
              legend: 'kernel present',
            },
            {
              expr: 'max(node_resize_kubelet_capacity{%(sel)s,resource="cpu"})',
              legend: 'kubelet capacity',
            },
            {
              expr: 'max(node_resize_kubelet_allocatable{%(sel)s,resource="cpu"})',
              legend: 'kubelet allocatable',
            },
            {
              expr: 'max(node_resize_capacity_effective{%(sel)s,resource="cpu"})',
              legend: 'effective',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Memory: kernel vs kubelet',
          unit: 'bytes',
          description: "The kernel's MemTotal and online memory blocks against the kubelet's capacity and allocatable and the effective capacity left after balloon pods.",
          targets: [
            {
              expr: 'max(node_resize_kernel_capacity{%(sel)s,resource="memory"})',
              legend: 'kernel MemTotal',
            },
            {
              expr: 'max(node_resize_kernel_memory_blocks_bytes{%(sel)s})',
              legend: 'kernel online blocks',
            },
            {
              expr: 'max(node_resize_kubelet_capacity{%(sel)s,resource="memory"})',
              legend: 'kubelet capacity',
            },
            {
              expr: 'max(node_resize_kubelet_allocatable{%(sel)s,resource="memory"})',
              legend: 'kubelet allocatable',
            },
            {
              expr: 'max(node_resize_capacity_effective{%(sel)s,resource="memory"})',
              legend: 'effective',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'CPU drift (kernel - kubelet)',
          description: 'Kernel minus kubelet CPU capacity over time, in cores: in the red band the Node advertises CPUs the kernel took away (stale), in the amber band too few (stranded).',
          drift: 'cores',
          targets: [
            {
              expr: 'max by (resource) (node_resize_capacity_drift{%(sel)s,unit="core"})',
              legend: '{{resource}} cores',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Memory drift (kernel - kubelet)',
          unit: 'bytes',
          description: 'Kernel minus kubelet memory (and hugepage) capacity over time: in the red band the Node advertises memory the kernel took away (stale), in the amber band too little (stranded); within 100 MiB is in sync.',
          drift: 'bytes',
          targets: [
            {
              expr: 'max by (resource) (node_resize_capacity_drift{%(sel)s,unit="byte"})',
              legend: '{{resource}}',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Memory blocks by state',
          description: 'Memory blocks online and offline: what memory hotplug can still add or has taken away (in blocks, see node_resize_kernel_memory_blocks_bytes for bytes).',
          targets: [
            {
              expr: 'max by (state) (node_resize_kernel_memory_blocks{%(sel)s})',
              legend: 'memory blocks {{state}}',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'CPUs offline and possible',
          description: 'CPUs offline and possible: what CPU hotplug can still add or has taken away.',
          targets: [
            {
              expr: 'max by (state) (node_resize_kernel_cpus{%(sel)s,state=~"offline|possible"})',
              legend: 'CPUs {{state}}',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Kubelet: CPUs it offers, and those offline',
          description: "The kubelet's podresources API: the CPUs it offers as allocatable, and those of them the kernel has offline (exclusive-CPU pods may be pinned there: NodeResizePodresourcesOfflineCPUs).",
          targets: [
            {
              expr: 'max(node_resize_podresources_allocatable_cpus{%(sel)s})',
              legend: 'podresources allocatable CPUs',
            },
            {
              expr: 'max(node_resize_podresources_offline_cpus{%(sel)s})',
              legend: 'podresources offline CPUs',
            },
          ],
        },
        {
          type: 'state-timeline',
          title: 'Kubelet restart blocked, by checkpoint',
          description: "Whether a kubelet restart would fail on its checkpoint, over time, per checkpoint (CPU manager, memory manager): blocked when it names CPUs or memory not online. `node-resize-exporter check` names them; follow the runbook's safe restart.",
          on: 'blocked',
          off: 'ok',
          on_is_alarm: true,
          targets: [
            {
              expr: 'max by (reason) (node_resize_kubelet_restart_blocked{%(sel)s})',
              legend: '{{reason}}',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Hugepages and swap (kernel vs kubelet)',
          unit: 'bytes',
          description: 'Hugepages and swap the kernel has against what the kubelet advertises: they change with memory hotplug too.',
          targets: [
            {
              expr: 'max by (resource) (node_resize_kernel_capacity{%(sel)s,resource=~"hugepages-.*|swap"})',
              legend: 'kernel {{resource}}',
            },
            {
              expr: 'max by (resource) (node_resize_kubelet_capacity{%(sel)s,resource=~"hugepages-.*|swap"})',
              legend: 'kubelet {{resource}}',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Before you unplug: CPUs that can leave now',
          description: 'The most CPUs that can be removed now with no pod rejected, no running container stale and no kernel refusal expected (node_resize_unpluggable). `node-resize-exporter plan` or GET /plan names them.',
          targets: [
            {
              expr: 'max(node_resize_unpluggable{%(sel)s,resource="cpu"})',
              legend: 'CPUs that can leave',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Before you unplug: memory that can leave now',
          unit: 'bytes',
          description: 'The most memory that can be removed now with no pod rejected, no running container stale and no kernel refusal expected (node_resize_unpluggable: blocks in ZONE_MOVABLE). `node-resize-exporter plan` or GET /plan names the blocks.',
          targets: [
            {
              expr: 'max(node_resize_unpluggable{%(sel)s,resource="memory"})',
              legend: 'memory that can leave',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Memory blocks by zone',
          description: 'Online memory blocks by zone, and those hot-added while the exporter ran: hot-added memory outside Movable may never leave again (the kernel cannot migrate what ZONE_NORMAL holds).',
          targets: [
            {
              expr: 'max by (zone) (node_resize_memory_blocks_by_zone{%(sel)s})',
              legend: 'memory blocks in {{zone}}',
            },
            {
              expr: 'max by (zone) (node_resize_memory_hot_added_blocks{%(sel)s})',
              legend: 'hot-added blocks in {{zone}}',
            },
          ],
        },
      ],
    },
    {
      title: 'Transitions and episodes',
      panels: [
        {
          type: 'timeseries',
          title: 'Kernel transition duration (1h window)',
          unit: 's',
          description: 'Median and p99 time the kernel took per CPU or memory-block transition over the last hour (BPF source only).',
          log: true,
          targets: [
            {
              expr: 'histogram_quantile(0.5, sum by (le, resource, direction) (rate(node_resize_kernel_transition_duration_seconds_bucket{%(sel)s}[1h])))',
              legend: 'p50 {{resource}} {{direction}}',
            },
            {
              expr: 'histogram_quantile(0.99, sum by (le, resource, direction) (rate(node_resize_kernel_transition_duration_seconds_bucket{%(sel)s}[1h])))',
              legend: 'p99 {{resource}} {{direction}}',
            },
          ],
        },
        {
          type: 'heatmap',
          title: 'Kernel transition duration',
          unit: 's',
          description: 'Every kernel transition timed by the BPF source, by duration bucket: a hot-unplug that migrates many pages shows as a slow outlier.',
          targets: [
            {
              expr: 'sum by (le) (increase(node_resize_kernel_transition_duration_seconds_bucket{%(sel)s}[$__rate_interval]))',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Transitions by result',
          description: 'CPU and memory-block transitions by direction and result (failed: the kernel refused or rolled back).',
          bars: true,
          targets: [
            {
              expr: 'sum by (resource, direction, result) (increase(node_resize_kernel_transitions_total{%(sel)s}[$__rate_interval]))',
              legend: '{{resource}} {{direction}} {{result}}',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Resync and readmission duration p90 (1h window)',
          unit: 's',
          description: 'p90 time from kernel done to the Node object updated (resync) and to readmission settled, over the last hour (recording rules).',
          log: true,
          targets: [
            {
              expr: 'node_resource_direction:node_resize_resync_duration_seconds:p90_1h{%(rsel)s}',
              legend: 'resync {{resource}} {{direction}} {{resynced_by}}',
            },
            {
              expr: 'node_resource:node_resize_readmission_duration_seconds:p90_1h{%(rsel)s}',
              legend: 'readmission {{resource}}',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Episodes ended badly, by reason',
          description: 'Episodes of this node that ended without a resync: kernel_failed, resync_timeout (the kubelet never followed), mismatch, readmission_rejected.',
          bars: true,
          targets: [
            {
              expr: 'sum by (resource, reason) (increase(node_resize_resync_errors_total{%(sel)s}[$__rate_interval]))',
              legend: 'hot-plug {{resource}} {{reason}}',
            },
            {
              expr: 'sum by (resource, reason) (increase(node_hot_unplug_errors_total{%(sel)s}[$__rate_interval]))',
              legend: 'hot-unplug {{resource}} {{reason}}',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Readmission: pods kept and rejected',
          description: 'Pods the kubelet kept or failed when it re-ran admission after a hot-unplug, by reason (OutOfcpu, OutOfmemory, ...). Names: `node-resize-exporter episodes show ID` on the node.',
          bars: true,
          targets: [
            {
              expr: 'sum by (outcome, reason) (increase(node_resize_readmission_pods_total{%(sel)s}[$__rate_interval]))',
              legend: '{{outcome}} {{reason}}',
            },
          ],
        },
      ],
    },
    {
      title: 'Balloon pods',
      panels: [
        {
          type: 'timeseries',
          title: 'Balloon pods and resizes',
          description: 'Balloon pods on the node and their in-place resizes by result (infeasible: the kubelet refused the hand-over).',
          targets: [
            {
              expr: 'max(node_resize_balloon_pods{%(sel)s})',
              legend: 'balloon pods',
            },
            {
              expr: 'sum by (result) (increase(node_resize_balloon_resize_total{%(sel)s}[$__rate_interval]))',
              legend: 'resizes {{result}}',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Balloon resize duration p90 (1h window)',
          unit: 's',
          description: "p90 time a balloon pod's in-place resize took, from the request to the kubelet applying it, over the last hour.",
          targets: [
            {
              expr: 'histogram_quantile(0.9, sum by (le) (rate(node_resize_balloon_resize_duration_seconds_bucket{%(sel)s}[1h])))',
              legend: 'p90',
            },
          ],
        },
      ],
    },
    {
      title: 'Exporter',
      panels: [
        {
          type: 'state-timeline',
          title: 'Sources up',
          description: "Each source of this node's exporter, up or down over time. A down source's metrics are stale or missing (`node-resize-exporter check` on the node says why).",
          targets: [
            {
              expr: 'max by (source) (node_resize_exporter_source_up{%(sel)s})',
              legend: '{{source}}',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Events, lost and malformed by source',
          unit: 'ops',
          description: 'Events read per second by source, and those lost (ring buffer overruns) or malformed. Gauges are reconciled from sysfs either way; lost events can cost episode timings.',
          targets: [
            {
              expr: 'sum by (source) (rate(node_resize_exporter_events_total{%(sel)s}[$__rate_interval]))',
              legend: '{{source}}',
            },
            {
              expr: 'sum by (source) (rate(node_resize_exporter_events_lost_total{%(sel)s}[$__rate_interval]))',
              legend: '{{source}} lost',
            },
            {
              expr: 'sum by (source) (rate(node_resize_exporter_malformed_total{%(sel)s}[$__rate_interval]))',
              legend: '{{source}} malformed',
            },
          ],
        },
        {
          type: 'state-timeline',
          title: 'Sinks up',
          description: "The exporter's sinks that can be turned off (the journal): down means episodes are not kept for postmortems (NodeResizeExporterSinkDown; after a rollback onto a journal a newer exporter wrote). No row with --no-journal.",
          targets: [
            {
              expr: 'max by (sink) (node_resize_exporter_sink_up{%(sel)s})',
              legend: '{{sink}}',
            },
          ],
        },
        {
          type: 'state-timeline',
          title: 'BPF programs attached',
          description: 'Each BPF program of the bpf source, attached or not: a detached one means its transitions are seen by uevent and sysfs only, without durations.',
          on: 'attached',
          off: 'detached',
          targets: [
            {
              expr: 'max by (program) (node_resize_exporter_bpf_program_attached{%(sel)s})',
              legend: '{{program}}',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Open episodes',
          description: 'Episodes of this node in progress: kernel, resync or readmission phase not ended. One that stays open is waiting for a kubelet resync.',
          targets: [
            {
              expr: 'max(node_resize_exporter_episodes_open{%(sel)s})',
              legend: 'open',
            },
          ],
        },
      ],
    },
  ],
}
