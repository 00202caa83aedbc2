// The mixin's parameters. Override any of them where the mixin is imported:
//   (import 'node-resize-exporter-mixin/mixin.libsonnet') + { _config+:: { clusterLabel: '' } }
// scripts/gen-monitoring.py renders the committed files with these defaults, and a site's copy
// with its command-line options.
{
  _config+:: {
    // Selects the exporter's series in rules and alerts (one = or =~ matcher); in the
    // dashboards, where their `job` variable starts (or, for =~, which jobs it lists).
    jobSelector: 'job="node-resize-exporter"',
    // Kept by every rule and alert, a dashboard variable; '' for a single-cluster Prometheus.
    clusterLabel: 'cluster',
    // The label that names the exporter's namespace on its series (prometheus-operator's
    // target label). Every alert keeps it: kube-prometheus-stack's InfoInhibitor and its
    // Alertmanager inhibit rules pair alerts on `namespace`. '' aggregates it away.
    namespaceLabel: 'namespace',
    // The namespace the exporter runs in: the fleet-wide alerts (absent(): no target, no
    // labels) carry it as a fixed label.
    exporterNamespace: 'node-resize-exporter',
    // %s: the alert name in lower case (docs/runbooks.md's anchors).
    runbookURLPattern: 'https://github.com/node-resize-exporter/node-resize-exporter/blob/main/docs/runbooks.md#%s',
    // The prefix of every alert's dashboard_url; '' leaves a path (/d/...) that a notification
    // template prefixes with the Grafana address. No trailing slash.
    grafanaURL: '',
    // Show the dashboards' cluster variable (kubernetes-mixin's showMultiCluster; hidden by
    // default: one cluster has nothing to choose).
    showMultiCluster: false,
    // A group whose name ends in this reads series of more than one target (absent(), a join
    // with the kubelet's own series): with sharded scrapers, evaluate it on the global ruler;
    // every other group is correct on the one shard that scrapes the node.
    globalGroupSuffix: '.global',

    // Thresholds.
    // Memory drift within this is in sync: the jitter bound KEP-3953 allows the kubelet.
    memoryJitterBytes: 104857600,
    // A p90 resync slower than this (seconds) waits for restarts: how often the kubelet
    // refreshes its machine info (NodeResizeResyncSlow).
    resyncSlowSeconds: 300,

    // Derived (not meant to be overridden).
    local nonEmpty(labels) = [l for l in labels if l != ''],
    // What a per-node series is about, for `by` and `on` clauses of the dashboards and of joins
    // with other jobs' series (which carry their own namespace).
    nodeLabels:: nonEmpty([self.clusterLabel, 'node']),
    nodeBy:: std.join(', ', self.nodeLabels),
    // What an alert is about: its node's labels and the exporter's namespace.
    by:: std.join(', ', nonEmpty([self.clusterLabel, self.namespaceLabel, 'node'])),
    exporterNamespaceLabels:: if self.namespaceLabel == '' then {}
    else { [$._config.namespaceLabel]: $._config.exporterNamespace },
    // Go-template `query` arguments of the alerts' descriptions: a series of the alert's node.
    local cfg = self,
    local nodeQuery(template, extra=[]) =
      local matchers = nonEmpty([cfg.jobSelector])
                       + [l + '="%s"' for l in cfg.nodeLabels] + [e[0] + '="%s"' for e in extra];
      local args = ['$labels.' + l for l in cfg.nodeLabels] + [e[1] for e in extra];
      '(printf `%s` %s)' % [std.strReplace(template, 'SEL', std.join(',', matchers)),
                            std.join(' ', args)],
    // The capacity alerts: restart_blocked of the node.
    blockedQuery:: nodeQuery('node_resize_kubelet_restart_blocked{SEL} == 1'),
    // NodeResizeCapacityStale: the reasons a restart of the node would reject pods.
    forecastQuery:: nodeQuery('node_resize_readmission_forecast_rejected_pods{SEL} > 0'),
    // NodeResizeRestartWouldRejectPods: the first five pods named for its reason.
    forecastPodsQuery:: nodeQuery('topk(5, node_resize_readmission_forecast_rejected{SEL})',
                                  [['reason', '$labels.reason']]),
    // The dashboards' addresses (uid and slug), and an alert's dashboard_url: the node-detail
    // dashboard on the alert's node (and cluster), or the fleet overview for an alert about no
    // one node. The dashboards' variable is `cluster` whatever the label is called.
    nodeDetailPath:: '/d/nre-node-detail/node-resize-node-detail',
    fleetOverviewPath:: '/d/nre-fleet-overview/node-resize-fleet-overview',
    local clusterParam = if cfg.clusterLabel == '' then []
    else ['var-cluster={{ $labels.%s }}' % cfg.clusterLabel],
    nodeDashboardURL:: '%s%s?%s' % [self.grafanaURL, self.nodeDetailPath,
                                    std.join('&', clusterParam + ['var-node={{ $labels.node }}'])],
    fleetDashboardURL:: self.grafanaURL + self.fleetOverviewPath
                        + (if clusterParam == [] then '' else '?' + std.join('&', clusterParam)),
  },
}
