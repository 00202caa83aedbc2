// grafanaDashboards: file name -> dashboard, each built from its spec by lib/dashboard.libsonnet.
local dashboard = import '../lib/dashboard.libsonnet';
{
  grafanaDashboards+:: {
    'fleet-overview.json': dashboard.build(import 'fleet-overview.libsonnet', $._config),
    'node-detail.json': dashboard.build(import 'node-detail.libsonnet', $._config),
  },
}
