// Example Alertmanager inhibit rules for the NodeResize* alerts (alertmanagerConfig: route and
// receiver are placeholders so that `amtool check-config` accepts it as it is). They pair alerts
// on the node (and cluster); kube-prometheus-stack's own rules (equal: [namespace]) need nothing
// from here: every alert keeps the exporter's namespace.
{
  local c = $._config,
  local equal = c.nodeLabels,
  alertmanagerConfig+:: {
    route: { receiver: 'default', group_by: ['alertname'] + equal + ['resource'] },
    receivers: [{ name: 'default' }],
    inhibit_rules: [
      // Nothing the exporter says about a node it cannot be scraped on is current.
      {
        source_matchers: ['alertname="NodeResizeExporterDown"'],
        target_matchers: ['alertname=~"NodeResize.+"', 'alertname!="NodeResizeExporterDown"'],
        equal: equal,
      },
      // Without the Node watch the kubelet side of every judgement is stale.
      {
        source_matchers: ['alertname="NodeResizeExporterSourceDown"', 'source=~"kube_node|kube_pods"'],
        target_matchers: [
          'alertname=~"NodeResize(CapacityStale|CapacityStranded|ReadmissionRejectedPods|PodresourcesOfflineCPUs)"',
        ],
        equal: equal,
      },
      // A node whose capacity is stale: its informational notices are the same story and wait
      // until the warning is handled.
      {
        source_matchers: ['alertname="NodeResizeCapacityStale"'],
        target_matchers: ['alertname=~"NodeResize.+"', 'severity="info"'],
        equal: equal,
      },
      // A CPU the kubelet offers although it is offline, on a node whose CPU capacity is stale,
      // is that same cause (the rule already says so; this covers evaluation skew).
      {
        source_matchers: ['alertname="NodeResizeCapacityStale"', 'resource="cpu"'],
        target_matchers: ['alertname="NodeResizePodresourcesOfflineCPUs"'],
        equal: equal,
      },
    ],
  },
}
