// SOURCE of dashboards/fleet-overview.json (scripts/gen-monitoring.py; placeholders in
// scripts/gen_dashboards.py). One panel per question an operator asks; every window is
// $__rate_interval, $__range or a fixed hour, never $__interval (empty at the scrape interval).
// Readable at 1,000 nodes: counts of nodes in each state, fleet-wide sums and rates, top-k
// panels and tables of the nodes in trouble (whose node cell opens the node-detail dashboard);
// nothing draws one line or one row per node of the fleet.
{
  uid: 'nre-fleet-overview',
  title: 'Node resize: fleet overview',
  description: 'Kernel CPU/memory hotplug joined with kubelet and API server state, for every node (node-resize-exporter).',
  node: 'multi',
  links: [
    {
      title: 'Node detail',
      type: 'link',
      icon: 'dashboard',
      url: '/d/nre-node-detail/node-resize-node-detail?%(vars)s',
    },
  ],
  annotations: [
    {
      name: 'Episode starts',
      color: 'blue',
      expr: |||
        label_replace(sum by (resource) (changes(node_resize_resync_request_total{%(sel)s}[$__rate_interval])) > 0, "change", "hot-plug", "", "")
          or
        label_replace(sum by (resource) (changes(node_hot_unplug_request_total{%(sel)s}[$__rate_interval])) > 0, "change", "hot-unplug", "", "")
      |||,
      title: '{{change}} {{resource}}: episodes started',
      tags: 'resource,change',
    },
    {
      name: 'Episode ends',
      color: 'purple',
      expr: |||
        label_replace(
          sum by (resource) (changes(node_resize_resync_duration_seconds_count{%(sel)s}[$__rate_interval])) > 0
            or
          sum by (resource) (node_resize_resync_duration_seconds_count{%(sel)s} unless node_resize_resync_duration_seconds_count{%(sel)s} offset $__rate_interval) > 0,
          "reason", "resynced", "", "")
          or
        sum by (resource, reason) (changes(node_resize_resync_errors_total{%(sel)s}[$__rate_interval])) > 0
          or
        sum by (resource, reason) (changes(node_hot_unplug_errors_total{%(sel)s}[$__rate_interval])) > 0
      |||,
      title: '{{resource}}: episodes ended ({{reason}})',
      tags: 'resource,reason',
    },
    {
      name: 'Kubelet restarts',
      color: 'red',
      expr: 'sum(changes(node_resize_kubelet_restarts_total{%(sel)s}[$__rate_interval])) > 0',
      title: 'kubelet restarts',
      tags: '',
    },
  ],
  rows: [
    {
      title: 'Now',
      panels: [
        {
          type: 'stat',
          title: 'Nodes reporting',
          w: 3,
          description: 'Nodes whose exporter Prometheus holds now (node_resize_exporter_build_info): the fleet the other counts are out of.',
          alarm_at: 1000000000,
          targets: [
            {
              expr: 'count(count by (%(by)s) (node_resize_exporter_build_info{%(sel)s})) or vector(0)',
            },
          ],
        },
        {
          type: 'stat',
          title: 'Nodes with stale capacity',
          w: 3,
          description: "Nodes whose kubelet advertises CPUs or memory the kernel took away (NodeResizeCapacityStale's condition, without its 10 minutes). The table below names them.",
          targets: [
            {
              expr: 'count(max by (%(by)s) (node_resize_capacity_drift{%(sel)s,unit="core"} <= -1) or max by (%(by)s) (node_resize_capacity_drift{%(sel)s,unit="byte"} < -104857600)) or vector(0)',
            },
          ],
        },
        {
          type: 'stat',
          title: 'Nodes with stranded capacity',
          w: 3,
          description: 'Nodes whose kernel has capacity the kubelet does not advertise yet (a hot-plug not resynced).',
          alarm_color: 'blue',
          targets: [
            {
              expr: 'count(max by (%(by)s) (node_resize_capacity_drift{%(sel)s,unit="core"} >= 1) or max by (%(by)s) (node_resize_capacity_drift{%(sel)s,unit="byte"} > 104857600)) or vector(0)',
            },
          ],
        },
        {
          type: 'stat',
          title: 'Nodes where a kubelet restart would fail',
          w: 3,
          description: "node_resize_kubelet_restart_blocked: a static CPU (or Static memory) manager checkpoint that names resources not online now. Follow the runbook's safe restart, never a bare restart.",
          targets: [
            {
              expr: 'count(max by (%(by)s) (node_resize_kubelet_restart_blocked{%(sel)s}) == 1) or vector(0)',
            },
          ],
        },
        {
          type: 'stat',
          title: 'Pods rejected at readmission (time range)',
          w: 3,
          description: "Pods the kubelets failed when they re-ran admission after a hot-unplug, in the time range. A reason's first rejections create its series, which increase() alone cannot see: the second half counts series born inside the range.",
          targets: [
            {
              expr: 'sum(sum by (%(by)s, reason) (increase(node_resize_readmission_pods_total{%(sel)s,outcome="rejected"}[$__range])) > 0 or sum by (%(by)s, reason) (node_resize_readmission_pods_total{%(sel)s,outcome="rejected"} unless node_resize_readmission_pods_total{%(sel)s,outcome="rejected"} offset $__range)) or vector(0)',
            },
          ],
        },
        {
          type: 'stat',
          title: 'Exporters down',
          w: 3,
          description: 'Exporters Prometheus fails to scrape now (up == 0): resizes on those nodes are not observed (NodeResizeExporterDown after 5 minutes).',
          targets: [
            {
              expr: 'count(up{%(sel)s} == 0) or vector(0)',
            },
          ],
        },
        {
          type: 'stat',
          title: 'Nodes with a source down',
          w: 3,
          description: "Nodes where at least one of the exporter's sources reports down (node_resize_exporter_source_up == 0); the Exporter health row says which sources.",
          targets: [
            {
              expr: 'count(count by (%(by)s) (node_resize_exporter_source_up{%(sel)s} == 0)) or vector(0)',
            },
          ],
        },
        {
          type: 'stat',
          title: 'Open episodes',
          w: 3,
          description: 'Resizes in progress across the fleet: episodes whose kernel, resync or readmission phase has not ended.',
          alarm_at: 1000000000,
          targets: [
            {
              expr: 'sum(node_resize_exporter_episodes_open{%(sel)s}) or vector(0)',
            },
          ],
        },
        {
          type: 'stat',
          title: 'Nodes where a kubelet restart would reject pods',
          w: 8,
          description: "Nodes whose readmission forecast says a kubelet restart now would reject pods (NodeResizeRestartWouldRejectPods's condition). Before restarting a kubelet there, drain the named pods: the node's dashboard lists them.",
          targets: [
            {
              expr: 'count(max by (%(by)s) (node_resize_readmission_forecast_rejected_pods{%(sel)s}) > 0) or vector(0)',
            },
          ],
        },
        {
          type: 'stat',
          title: 'Nodes with stale running containers',
          w: 8,
          description: "Nodes where running containers were left in a state the kubelet would not create today by a resize (NodeResizeRunningContainersStale's condition): a pod restart fixes them.",
          targets: [
            {
              expr: 'count(max by (%(by)s) (node_resize_running_containers_stale{%(sel)s}) > 0) or vector(0)',
            },
          ],
        },
        {
          type: 'stat',
          title: 'Nodes with a sink down',
          w: 8,
          description: 'Nodes whose exporter turned a sink off (the journal, after a rollback onto a newer journal): episodes there are not kept for postmortems (NodeResizeExporterSinkDown).',
          targets: [
            {
              expr: 'count(max by (%(by)s) (node_resize_exporter_sink_up{%(sel)s}) == 0) or vector(0)',
            },
          ],
        },
      ],
    },
    {
      title: 'Which nodes are in trouble',
      panels: [
        {
          type: 'table',
          title: 'Nodes in trouble',
          w: 24,
          description: "One row per node with something to act on now, whatever the size of the fleet; empty cells are fine. Stale: resources the kubelet advertises although the kernel took them away; stranded: added but not advertised; restart would fail: read the runbook's safe restart first; offline CPUs offered: the kubelet's podresources API still hands out CPUs the kernel has offline; pods a restart would reject: the readmission forecast. Click a node for its dashboard.",
          node_link: true,
          sort_by: 'Stale resources',
          columns: {
            'Value #A': 'Stale resources',
            'Value #B': 'Stranded resources',
            'Value #C': 'Restart would fail',
            'Value #D': 'Sources down',
            'Value #E': 'Exporter down',
            'Value #F': 'Offline CPUs offered',
            'Value #G': 'Offline CPUs (present)',
            'Value #H': 'Pods rejected (time range)',
            'Value #I': 'Pods a restart would reject',
          },
          targets: [
            {
              expr: 'count by (%(by)s) (node_resize_capacity_drift{%(sel)s,unit="core"} <= -1 or node_resize_capacity_drift{%(sel)s,unit="byte"} < -104857600)',
            },
            {
              expr: 'count by (%(by)s) (node_resize_capacity_drift{%(sel)s,unit="core"} >= 1 or node_resize_capacity_drift{%(sel)s,unit="byte"} > 104857600)',
            },
            {
              expr: 'max by (%(by)s) (node_resize_kubelet_restart_blocked{%(sel)s}) == 1',
            },
            {
              expr: 'count by (%(by)s) (node_resize_exporter_source_up{%(sel)s} == 0)',
            },
            {
              expr: 'count by (%(by)s) (up{%(sel)s} == 0)',
            },
            {
              expr: 'max by (%(by)s) (node_resize_podresources_offline_cpus{%(sel)s}) > 0',
            },
            {
              expr: 'max by (%(by)s) (node_resize_kernel_cpus{%(sel)s,state="offline"}) > 0',
            },
            {
              expr: |||
                sum by (%(by)s) (
                  sum by (%(by)s, reason) (increase(node_resize_readmission_pods_total{%(sel)s,outcome="rejected"}[$__range])) > 0
                    or
                  sum by (%(by)s, reason) (node_resize_readmission_pods_total{%(sel)s,outcome="rejected"}
                    unless node_resize_readmission_pods_total{%(sel)s,outcome="rejected"} offset $__range))
              |||,
            },
            {
              expr: 'sum by (%(by)s) (node_resize_readmission_forecast_rejected_pods{%(sel)s}) > 0',
            },
          ],
        },
        {
          type: 'table',
          title: 'Nodes whose Node object differs from the kernel, since when',
          w: 24,
          description: 'One row per node and resource whose capacity differs now. Negative drift: the kubelet advertises what the kernel took away (stale, NodeResizeCapacityStale); positive: new capacity not advertised yet (stranded). Before restarting a kubelet, read the runbook. Click a node for its dashboard.',
          node_link: true,
          columns: {
            'Value #A': 'CPU drift (cores)',
            'Value #B': 'Differs for',
            'Value #C': 'Since',
            'Value #D': 'Memory drift',
          },
          column_units: {
            'Differs for': 's',
            Since: 'dateTimeAsIso',
            'Memory drift': 'bytes',
          },
          column_drift: {
            'CPU drift (cores)': 'cores',
            'Memory drift': 'bytes',
          },
          targets: [
            {
              expr: 'max by (%(by)s, resource) (node_resize_capacity_drift{%(sel)s,unit="core"} != 0)',
            },
            {
              expr: 'max by (%(by)s, resource) (node_resize_capacity_drift_seconds{%(sel)s} > 0)',
            },
            {
              expr: '(time() - max by (%(by)s, resource) (node_resize_capacity_drift_seconds{%(sel)s} > 0)) * 1000',
            },
            {
              expr: 'max by (%(by)s, resource) (node_resize_capacity_drift{%(sel)s,unit="byte"} != 0)',
            },
          ],
        },
      ],
    },
    {
      title: 'What can leave now',
      panels: [
        {
          type: 'stat',
          title: 'CPUs reclaimable now',
          w: 6,
          description: 'The CPUs the fleet could give back now, summed over the nodes: on each, the most that can be removed with no pod rejected at the next kubelet restart, no running container left stale and no kernel refusal expected (node_resize_unpluggable). Nodes whose pods are unjudged count nothing. `node-resize-exporter plan` or GET /plan names them, node by node.',
          alarm_at: 1000000000,
          targets: [
            {
              expr: 'sum(max by (%(by)s) (node_resize_unpluggable{%(sel)s,resource="cpu"})) or vector(0)',
            },
          ],
        },
        {
          type: 'stat',
          title: 'Memory reclaimable now',
          w: 6,
          unit: 'bytes',
          description: 'The memory the fleet could give back now, summed over the nodes (node_resize_unpluggable: blocks in ZONE_MOVABLE the plan would take with no harm; kernel-zone blocks need their page flags read, which only a plan does, so this is a floor).',
          alarm_at: 1000000000000000000,
          targets: [
            {
              expr: 'sum(max by (%(by)s) (node_resize_unpluggable{%(sel)s,resource="memory"})) or vector(0)',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Top 10 nodes by memory reclaimable now',
          w: 12,
          unit: 'bytes',
          description: "The 10 nodes that could give back the most memory now with no harm expected (node_resize_unpluggable). Click a line for the node's dashboard.",
          node_link: true,
          targets: [
            {
              expr: 'topk(10, max by (%(by)s) (node_resize_unpluggable{%(sel)s,resource="memory"}))',
              legend: '{{node}}',
            },
          ],
        },
      ],
    },
    {
      title: 'Fleet trends',
      panels: [
        {
          type: 'timeseries',
          title: 'Nodes in each trouble state',
          w: 8,
          description: 'How many nodes were stale, stranded, unsafe to restart, missing a source or unscraped, over time: one line per state, whatever the size of the fleet.',
          targets: [
            {
              expr: 'count(max by (%(by)s) (node_resize_capacity_drift{%(sel)s,unit="core"} <= -1) or max by (%(by)s) (node_resize_capacity_drift{%(sel)s,unit="byte"} < -104857600)) or vector(0)',
              legend: 'stale capacity',
            },
            {
              expr: 'count(max by (%(by)s) (node_resize_capacity_drift{%(sel)s,unit="core"} >= 1) or max by (%(by)s) (node_resize_capacity_drift{%(sel)s,unit="byte"} > 104857600)) or vector(0)',
              legend: 'stranded capacity',
            },
            {
              expr: 'count(max by (%(by)s) (node_resize_kubelet_restart_blocked{%(sel)s}) == 1) or vector(0)',
              legend: 'restart would fail',
            },
            {
              expr: 'count(max by (%(by)s) (node_resize_readmission_forecast_rejected_pods{%(sel)s}) > 0) or vector(0)',
              legend: 'restart would reject pods',
            },
            {
              expr: 'count(count by (%(by)s) (node_resize_exporter_source_up{%(sel)s} == 0)) or vector(0)',
              legend: 'a source down',
            },
            {
              expr: 'count(up{%(sel)s} == 0) or vector(0)',
              legend: 'exporter down',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Top 10 nodes by CPU drift (kernel - kubelet)',
          w: 8,
          unit: 'short',
          description: "The 10 nodes whose CPU capacity differs most from what their kubelet advertises, signed (negative: stale, positive: stranded). Click a line for the node's dashboard.",
          node_link: true,
          drift: 'cores',
          targets: [
            {
              expr: 'max by (%(by)s) (node_resize_capacity_drift{%(sel)s,unit="core"}) and topk(10, abs(max by (%(by)s) (node_resize_capacity_drift{%(sel)s,unit="core"})) > 0)',
              legend: '{{node}}',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Top 10 nodes by memory drift (kernel - kubelet)',
          w: 8,
          unit: 'bytes',
          description: "The 10 nodes whose memory capacity differs most from what their kubelet advertises, signed (negative: stale, positive: stranded). Click a line for the node's dashboard.",
          node_link: true,
          drift: 'bytes',
          targets: [
            {
              expr: 'max by (%(by)s) (node_resize_capacity_drift{%(sel)s,unit="byte"}) and topk(10, abs(max by (%(by)s) (node_resize_capacity_drift{%(sel)s,unit="byte"})) > 0)',
              legend: '{{node}}',
            },
          ],
        },
      ],
    },
    {
      title: 'How long resyncs take',
      panels: [
        {
          type: 'heatmap',
          title: 'Resync duration (kernel done -> Node updated)',
          unit: 's',
          description: 'Every resync the exporter timed across the fleet, by duration bucket. Minutes mean someone restarted the kubelet; seconds, a kubelet that resyncs by itself.',
          targets: [
            {
              expr: 'sum by (le) (increase(node_resize_resync_duration_seconds_bucket{%(sel)s}[$__rate_interval]))',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Slowest 10 nodes: resync duration p90 (1h window)',
          unit: 's',
          description: "The 10 node, resource and direction series with the highest p90 resync time (recording rule node_resource_direction:node_resize_resync_duration_seconds:p90_1h). Click a line for the node's dashboard.",
          log: true,
          node_link: true,
          targets: [
            {
              expr: 'topk(10, node_resource_direction:node_resize_resync_duration_seconds:p90_1h{%(rsel)s})',
              legend: '{{node}} {{resource}} {{direction}} {{resynced_by}}',
            },
          ],
        },
        {
          type: 'heatmap',
          title: 'Readmission duration (kernel done -> readmission settled)',
          unit: 's',
          description: 'Every hot-unplug readmission the exporter timed across the fleet (kernel done until the kubelet stopped failing pods), by duration bucket.',
          targets: [
            {
              expr: 'sum by (le) (increase(node_resize_readmission_duration_seconds_bucket{%(sel)s}[$__rate_interval]))',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Slowest 10 nodes: readmission duration p90 (1h window)',
          unit: 's',
          description: "The 10 node and resource series with the highest p90 readmission time (recording rule node_resource:node_resize_readmission_duration_seconds:p90_1h). Click a line for the node's dashboard.",
          log: true,
          node_link: true,
          targets: [
            {
              expr: 'topk(10, node_resource:node_resize_readmission_duration_seconds:p90_1h{%(rsel)s})',
              legend: '{{node}} {{resource}}',
            },
          ],
        },
      ],
    },
    {
      title: 'Which pods were rejected',
      panels: [
        {
          type: 'table',
          title: 'Pods rejected at readmission, by node and reason (time range)',
          description: 'Only nodes that rejected pods in the time range. Counts only: pod names are not metric labels. For the names run `node-resize-exporter episodes show ID` on the node, or `kubectl get pods -A --field-selector spec.nodeName=NODE,status.phase=Failed`. Click a node for its dashboard.',
          node_link: true,
          columns: {
            'Value #A': 'Rejected pods',
          },
          targets: [
            {
              expr: |||
                sum by (%(by)s, reason) (increase(node_resize_readmission_pods_total{%(sel)s,outcome="rejected"}[$__range])) > 0
                  or
                sum by (%(by)s, reason) (node_resize_readmission_pods_total{%(sel)s,outcome="rejected"}
                  unless node_resize_readmission_pods_total{%(sel)s,outcome="rejected"} offset $__range) > 0
              |||,
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Pods rejected by reason, fleet-wide (1h window)',
          description: 'Pods failed at readmission across the fleet in the hour before each point, by reason (recording rule node_reason:node_resize_readmission_pods_rejected:increase1h, which counts a first rejection too).',
          bars: true,
          targets: [
            {
              expr: 'sum by (reason) (node_reason:node_resize_readmission_pods_rejected:increase1h{%(rsel)s})',
              legend: '{{reason}}',
            },
          ],
        },
      ],
    },
    {
      title: 'Episodes',
      panels: [
        {
          type: 'timeseries',
          title: 'Episodes started, fleet-wide',
          w: 8,
          description: 'Hot-plug and hot-unplug episodes that began across the fleet, by resource.',
          bars: true,
          targets: [
            {
              expr: 'sum by (resource) (increase(node_resize_resync_request_total{%(sel)s}[$__rate_interval]))',
              legend: 'hot-plug {{resource}}',
            },
            {
              expr: 'sum by (resource) (increase(node_hot_unplug_request_total{%(sel)s}[$__rate_interval]))',
              legend: 'hot-unplug {{resource}}',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Episodes ended badly, by reason',
          w: 8,
          description: 'Episodes across the fleet that ended without a resync: kernel_failed (the kernel refused), resync_timeout (the kubelet never followed), mismatch, readmission_rejected.',
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
          type: 'table',
          title: 'Busiest 10 nodes (time range)',
          w: 8,
          description: 'The nodes with the most hot-unplug, and the most hot-plug, episodes in the time range (up to 10 of each). Click a node for its dashboard.',
          node_link: true,
          sort_by: 'Hot-unplug episodes',
          columns: {
            'Value #A': 'Hot-unplug episodes',
            'Value #B': 'Hot-plug episodes',
          },
          targets: [
            {
              expr: 'topk(10, sum by (%(by)s) (increase(node_hot_unplug_request_total{%(sel)s}[$__range])) > 0)',
            },
            {
              expr: 'topk(10, sum by (%(by)s) (increase(node_resize_resync_request_total{%(sel)s}[$__range])) > 0)',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Kernel transitions by result',
          description: 'CPU and memory-block transitions the kernels made across the fleet, by resource, direction and result (failed: refused or rolled back).',
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
          title: 'CPUs present but offline, fleet-wide',
          description: 'CPUs present but offline across the fleet. After a hot-unplug that is expected; after a hot-add it means nothing onlined them (NodeResizeHotAddedOffline).',
          targets: [
            {
              expr: 'sum(node_resize_kernel_cpus{%(sel)s,state="offline"})',
              legend: 'CPUs offline',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Memory blocks present but offline, fleet-wide',
          description: 'Memory blocks present but offline across the fleet. After a hot-unplug that is expected; after a hot-add it means nothing onlined them (NodeResizeHotAddedOffline).',
          targets: [
            {
              expr: 'sum(node_resize_kernel_memory_blocks{%(sel)s,state="offline"})',
              legend: 'memory blocks offline',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Nodes with CPUs or memory present but offline',
          description: 'How many nodes have a CPU or a memory block present but offline: a few after hot-unplugs, more after a hot-add that nothing onlined (NodeResizeHotAddedOffline).',
          targets: [
            {
              expr: 'count(max by (%(by)s) (node_resize_kernel_cpus{%(sel)s,state="offline"}) > 0 or max by (%(by)s) (node_resize_kernel_memory_blocks{%(sel)s,state="offline"}) > 0) or vector(0)',
              legend: 'nodes',
            },
          ],
        },
      ],
    },
    {
      title: 'Balloon vs real vs effective capacity',
      panels: [
        {
          type: 'timeseries',
          title: 'CPU: kernel, kubelet, balloon, effective',
          unit: 'short',
          description: "Fleet-wide CPU cores: what the kernels have, what the kubelets advertise, what balloon pods hold (the scheduler's view) and what is left for real work (effective).",
          targets: [
            {
              expr: 'sum(node_resize_kernel_capacity{%(sel)s,resource="cpu"})',
              legend: 'kernel',
            },
            {
              expr: 'sum(node_resize_kubelet_capacity{%(sel)s,resource="cpu"})',
              legend: 'kubelet capacity',
            },
            {
              expr: 'sum(node_resize_balloon_requests{%(sel)s,resource="cpu",view="scheduler"})',
              legend: 'balloon requests',
            },
            {
              expr: 'sum(node_resize_capacity_effective{%(sel)s,resource="cpu"})',
              legend: 'effective',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Memory: kernel, kubelet, balloon, effective',
          unit: 'bytes',
          description: "Fleet-wide memory: what the kernels have, what the kubelets advertise, what balloon pods hold (the scheduler's view) and what is left for real work (effective).",
          targets: [
            {
              expr: 'sum(node_resize_kernel_capacity{%(sel)s,resource="memory"})',
              legend: 'kernel',
            },
            {
              expr: 'sum(node_resize_kubelet_capacity{%(sel)s,resource="memory"})',
              legend: 'kubelet capacity',
            },
            {
              expr: 'sum(node_resize_balloon_requests{%(sel)s,resource="memory",view="scheduler"})',
              legend: 'balloon requests',
            },
            {
              expr: 'sum(node_resize_capacity_effective{%(sel)s,resource="memory"})',
              legend: 'effective',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Balloon resizes by result',
          description: 'In-place resizes of balloon pods across the fleet, by result (infeasible: the kubelet refused, NodeResizeBalloonResizeInfeasible).',
          bars: true,
          targets: [
            {
              expr: 'sum by (result) (increase(node_resize_balloon_resize_total{%(sel)s}[$__rate_interval]))',
              legend: '{{result}}',
            },
          ],
        },
      ],
    },
    {
      title: 'Exporter health',
      panels: [
        {
          type: 'timeseries',
          title: 'Share of nodes whose source is up',
          w: 8,
          unit: 'percentunit',
          description: 'For each source, the share of nodes where it works (1 = every node). A source that never works on some nodes (bpf without BTF, no kubelet socket) shows as a steady share below 1; the Nodes in trouble table names the nodes.',
          targets: [
            {
              expr: 'avg by (source) (node_resize_exporter_source_up{%(sel)s})',
              legend: '{{source}}',
            },
          ],
        },
        {
          type: 'timeseries',
          title: 'Events and lost events by source',
          w: 8,
          unit: 'ops',
          description: 'Kernel and Kubernetes events the exporters read per second across the fleet, and those lost (ring buffer overruns, dropped watches) by source.',
          targets: [
            {
              expr: 'sum by (source) (rate(node_resize_exporter_events_total{%(sel)s}[$__rate_interval]))',
              legend: '{{source}}',
            },
            {
              expr: 'sum by (source) (rate(node_resize_exporter_events_lost_total{%(sel)s}[$__rate_interval]))',
              legend: '{{source}} lost',
            },
          ],
        },
        {
          type: 'table',
          title: 'Exporter versions',
          w: 8,
          description: 'How many exporters run each version: a rollout in progress shows two rows.',
          columns: {
            'Value #A': 'Exporters',
          },
          targets: [
            {
              expr: 'count by (version) (node_resize_exporter_build_info{%(sel)s})',
            },
          ],
        },
      ],
    },
  ],
}
