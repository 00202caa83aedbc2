// Recording rules (prometheusRules). Every rule keeps the node it is about, with the cluster
// and the exporter's namespace (c.by); a group whose name ends in c.globalGroupSuffix reads
// series of more than one target and belongs on the global ruler of a sharded setup
// (docs/monitoring-mixin.md).
{
  local c = $._config,
  prometheusRules+:: {
    groups+: [
      {
        name: 'node-resize-exporter.rules',
        rules: [
          // Resizes are rare: a 1h window keeps one slow episode visible long enough to be seen,
          // where a 5m rate would be NaN between episodes. resynced_by (kubelet_restart or
          // kubelet_live) is kept: minutes are a restart by hand, seconds a kubelet that resyncs.
          {
            record: 'node_resource_direction:node_resize_resync_duration_seconds:p90_1h',
            expr: |||
              histogram_quantile(0.9,
                sum by (%(by)s, resource, direction, resynced_by, le) (
                  rate(node_resize_resync_duration_seconds_bucket{%(jobSelector)s}[1h])))
            ||| % c,
          },
          {
            record: 'node_resource:node_resize_readmission_duration_seconds:p90_1h',
            expr: |||
              histogram_quantile(0.9,
                sum by (%(by)s, resource, le) (
                  rate(node_resize_readmission_duration_seconds_bucket{%(jobSelector)s}[1h])))
            ||| % c,
          },
          // > 1: balloon pods hold more than the kubelet can hand out; effective capacity is negative.
          // The scheduler's view: what node_resize_capacity_effective subtracts.
          {
            record: 'node_resource:node_resize_balloon_requests:ratio_allocatable',
            expr: |||
              max by (%(by)s, resource) (node_resize_balloon_requests{%(jobSelector)s,view="scheduler"})
                / max by (%(by)s, resource) (node_resize_kubelet_allocatable{%(jobSelector)s})
            ||| % c,
          },
          // Episode errors are rare, so the first one of its kind matters most, and increase() cannot
          // see it: a series born at 1 has no earlier sample to rise from. The `unless ... offset`
          // half counts such a series' whole value while it is younger than the window.
          {
            record: 'node_resource_reason:node_resize_resync_errors:increase30m',
            expr: |||
              sum by (%(by)s, resource, reason) (increase(node_resize_resync_errors_total{%(jobSelector)s}[30m])) > 0
                or
              sum by (%(by)s, resource, reason) (
                node_resize_resync_errors_total{%(jobSelector)s} unless node_resize_resync_errors_total{%(jobSelector)s} offset 30m)
            ||| % c,
          },
          {
            record: 'node_resource_reason:node_hot_unplug_errors:increase30m',
            expr: |||
              sum by (%(by)s, resource, reason) (increase(node_hot_unplug_errors_total{%(jobSelector)s}[30m])) > 0
                or
              sum by (%(by)s, resource, reason) (
                node_hot_unplug_errors_total{%(jobSelector)s} unless node_hot_unplug_errors_total{%(jobSelector)s} offset 30m)
            ||| % c,
          },
          {
            record: 'node_reason:node_resize_readmission_pods_rejected:increase1h',
            expr: |||
              sum by (%(by)s, reason) (
                increase(node_resize_readmission_pods_total{%(jobSelector)s,outcome="rejected"}[1h])) > 0
                or
              sum by (%(by)s, reason) (
                node_resize_readmission_pods_total{%(jobSelector)s,outcome="rejected"}
                  unless node_resize_readmission_pods_total{%(jobSelector)s} offset 1h)
            ||| % c,
          },
          {
            record: 'node_reason:node_resize_balloon_resize_infeasible:increase1h',
            expr: |||
              sum by (%(by)s, reason) (
                increase(node_resize_balloon_resize_total{%(jobSelector)s,result="infeasible"}[1h])) > 0
                or
              sum by (%(by)s, reason) (
                node_resize_balloon_resize_total{%(jobSelector)s,result="infeasible"}
                  unless node_resize_balloon_resize_total{%(jobSelector)s} offset 1h)
            ||| % c,
          },
          {
            record: 'node_source:node_resize_exporter_events_lost:increase15m',
            expr: |||
              sum by (%(by)s, source) (increase(node_resize_exporter_events_lost_total{%(jobSelector)s}[15m])) > 0
                or
              sum by (%(by)s, source) (
                node_resize_exporter_events_lost_total{%(jobSelector)s}
                  unless node_resize_exporter_events_lost_total{%(jobSelector)s} offset 15m)
            ||| % c,
          },
        ],
      },
      // For the global ruler (c.globalGroupSuffix): a node's kubelet and its exporter are two
      // targets, which a sharded scrape (hashmod on the address) puts on different shards.
      {
        name: 'node-resize-exporter.rules' + c.globalGroupSuffix,
        rules: [
          // The names KEP-3953 plans for the kubelet's own counters, recorded from the exporter's,
          // so a dashboard written against them works today and keeps working once kubelets export
          // them: a node whose kubelet has its own series (job="kubelet", labelled with its node as
          // kube-prometheus-stack's kubelet job labels them) gets none recorded here, so nothing is
          // counted twice. requests: resize episodes by resource and direction (increase: a hot-plug,
          // decrease: a hot-unplug); errors: those that failed, with the exporter's `reason`
          // (kernel_failed, resync_timeout, mismatch, readmission_rejected) where the kubelet will
          // name its failing subsystem. docs/metrics.md says how the two coexist. Matched on the
          // cluster and node only: the kubelet's series carry its own target's namespace.
          {
            record: 'kubelet_node_resize_requests_total',
            expr: |||
              (
                label_replace(sum by (%(by)s, resource) (node_resize_resync_request_total{%(jobSelector)s}),
                              "direction", "increase", "", "")
                  or
                label_replace(sum by (%(by)s, resource) (node_hot_unplug_request_total{%(jobSelector)s}),
                              "direction", "decrease", "", "")
              )
                unless on (%(nodeBy)s)
              kubelet_node_resize_requests_total{job="kubelet"}
            ||| % c,
          },
          {
            record: 'kubelet_node_resize_errors_total',
            expr: |||
              (
                label_replace(sum by (%(by)s, resource, reason) (node_resize_resync_errors_total{%(jobSelector)s}),
                              "direction", "increase", "", "")
                  or
                label_replace(sum by (%(by)s, resource, reason) (node_hot_unplug_errors_total{%(jobSelector)s}),
                              "direction", "decrease", "", "")
              )
                unless on (%(nodeBy)s)
              kubelet_node_resize_errors_total{job="kubelet"}
            ||| % c,
          },
        ],
      },
    ],
  },
}
