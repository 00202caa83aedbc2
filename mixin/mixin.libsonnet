// node-resize-exporter's monitoring mixin (the layout of node_exporter's node-mixin and
// kubernetes-mixin): prometheusRules, prometheusAlerts and grafanaDashboards from one source,
// with the parameters in config.libsonnet's _config. alertmanagerConfig holds example inhibit
// rules. scripts/gen-monitoring.py renders the committed YAML and JSON from it.
(import 'config.libsonnet')
+ (import 'rules/rules.libsonnet')
+ (import 'alerts/alerts.libsonnet')
+ (import 'dashboards/dashboards.libsonnet')
+ (import 'alertmanager/inhibit.libsonnet')
