// Grafana dashboard JSON from the small specs in dashboards/*.libsonnet.
//
// A spec names rows of panels with their questions (description, required), queries and units;
// this fills in what every Grafana panel needs (datasource, grid position, field config, data
// links). Placeholders in a query (jsonnet's %(name)s): sel (job, cluster and node matchers of
// the exporter's series), rsel (cluster and node only: recording rules drop job), by (cluster
// label and node, for `by` clauses), job; in a link URL: vars (time range, datasource, job and
// cluster as query parameters).
//
// The job is a template variable, not a constant baked into every query: `$job` lists the jobs
// whose series carry node_resize_exporter_build_info and starts on the site's job (jobSelector),
// so a dashboard dropped into Grafana as it is finds an exporter scraped under any job name.
local DS = { type: 'prometheus', uid: '${datasource}' };
local GRAFANA_DS = { type: 'grafana', uid: '-- Grafana --' };
local PANEL_H = { stat: 4 };
// What a panel of a spec may say; anything else is a typo.
local PANEL_KEYS = ['type', 'title', 'description', 'targets', 'w', 'h', 'unit', 'bars', 'log',
                    'alarm_at', 'alarm_color', 'node_link', 'sort_by', 'columns', 'column_units',
                    'on', 'off', 'on_is_alarm', 'drift', 'column_drift'];
// Colours that mean what they say on a drift (kernel minus kubelet): below the jitter bound the
// kubelet advertises what the kernel took away, pods at risk (red); within it, in sync (green);
// above it, capacity not advertised yet, nothing at risk (amber: Grafana's default warning
// colour). CPUs are whole cores; memory has the alerts' jitter bound. A step's colour applies
// from its value up.
local AMBER = '#EAB839';
local driftSteps(c) = {
  cores: [{ color: 'red', value: null }, { color: 'green', value: 0 }, { color: AMBER, value: 1 }],
  bytes: [{ color: 'red', value: null }, { color: 'green', value: -c.memoryJitterBytes },
          { color: AMBER, value: c.memoryJitterBytes + 1 }],
};
local get(o, k, default) = if std.objectHas(o, k) then o[k] else default;
local strip(s) = std.stripChars(s, ' \n');

// (label, operator, value) of the site's job selector; null when there is none.
local jobMatcher(c) =
  if c.jobSelector == '' then null
  else
    local quotes = std.findSubstr('"', c.jobSelector);
    local head = strip(std.substr(c.jobSelector, 0, quotes[0]));
    local regex = std.endsWith(head, '=~');
    {
      label: strip(std.rstripChars(head, '=~')),
      op: if regex then '=~' else '=',
      value: std.substr(c.jobSelector, quotes[0] + 1, quotes[std.length(quotes) - 1] - quotes[0] - 1),
    };

// The query parameters a link to another dashboard carries: what the user is looking at.
local linkVars(c) = std.join('&', ['${__url_time_range}', '${datasource:queryparam}']
                                  + (if jobMatcher(c) != null then ['${job:queryparam}'] else [])
                                  + (if c.clusterLabel != '' then ['${cluster:queryparam}'] else []));

local values(spec, c) =
  local node = if get(spec, 'node', 'multi') == 'multi' then 'node=~"$node"' else 'node="$node"';
  local cluster = if c.clusterLabel != '' then ['%s="$cluster"' % c.clusterLabel] else [];
  local m = jobMatcher(c);
  local job = if m != null then ['%s=~"$job"' % m.label] else [];
  {
    sel: std.join(',', job + cluster + [node]),
    rsel: std.join(',', cluster + [node]),
    job: std.join(',', job),
    by: c.nodeBy,
    vars: linkVars(c),
  };

local queryVar(name, label, query, multi) = {
  name: name,
  label: label,
  type: 'query',
  datasource: DS,
  definition: query,
  query: { query: query, refId: 'PrometheusVariableQueryEditor-VariableQuery', qryType: 1 },
  refresh: 2,
  sort: 1,
  regex: '',
  hide: 0,
  current: {},
  options: [],
  includeAll: multi,
  multi: multi,
  skipUrlSync: false,
} + (if multi then { allValue: '.+' } else {});

local variables(spec, c) =
  local m = jobMatcher(c);
  local job = if m != null then '%s=~"$job"' % m.label else '';
  local datasource = {
    name: 'datasource', label: 'Data source', type: 'datasource', query: 'prometheus', regex: '',
    current: {}, hide: 0, includeAll: false, multi: false, options: [], refresh: 1,
    skipUrlSync: false,
  };
  // Every job that exposes the exporter's build_info; it starts on the site's job when that
  // exists (Grafana falls back to the first value otherwise), and a =~ selector filters the
  // list. Changing it is a click (or ?var-job= in a link), not a regeneration.
  local jobVar = if m == null then [] else [
    queryVar('job', 'Job', 'label_values(node_resize_exporter_build_info, %s)' % m.label, false)
    + (if m.op == '=' then { current: { selected: true, text: m.value, value: m.value } }
       else { regex: '/^(?:%s)$/' % m.value }),
  ];
  // One cluster (kubernetes-mixin's showMultiCluster off): nothing to choose, so the variable is
  // hidden; it still takes the one value (or none: series without the label) and a link's
  // var-cluster.
  local clusterVar = if c.clusterLabel == '' then [] else [
    queryVar('cluster', 'Cluster', 'label_values(node_resize_exporter_build_info{%s}, %s)'
                                   % [job, c.clusterLabel], false)
    + { hide: if c.showMultiCluster then 0 else 2 },
  ];
  local nodeMatchers = (if job != '' then [job] else [])
                       + (if c.clusterLabel != '' then ['%s="$cluster"' % c.clusterLabel] else []);
  [datasource] + jobVar + clusterVar + [
    queryVar('node', 'Node', 'label_values(node_resize_exporter_build_info{%s}, node)'
                             % std.join(',', nodeMatchers), get(spec, 'node', 'multi') == 'multi'),
  ];

local annotations(spec, vals) = [{
  builtIn: 1, datasource: GRAFANA_DS, enable: true, hide: true,
  iconColor: 'rgba(0, 211, 255, 1)', name: 'Annotations & Alerts', type: 'dashboard',
}] + [
  {
    name: ann.name,
    datasource: DS,
    enable: true,
    hide: false,
    iconColor: get(ann, 'color', 'orange'),
    expr: strip(ann.expr % vals),
    step: '$__interval',
    titleFormat: ann.title,
    textFormat: get(ann, 'text', ''),
    tagKeys: get(ann, 'tags', 'node,resource'),
    useValueForTime: false,
  }
  for ann in get(spec, 'annotations', [])
];

local nodeLink(nodeRef, vals) = {
  title: 'Node detail',
  url: '/d/nre-node-detail/node-resize-node-detail?var-node=%s&%s' % [nodeRef, vals.vars],
};

local fieldConfig(panel, vals, c) =
  local kind = panel.type;
  local steps = driftSteps(c);
  local drift = get(panel, 'drift', null);
  assert drift == null || std.objectHas(steps, drift) :
         'panel %s: drift must be one of %s' % [std.manifestJson(panel.title), std.objectFields(steps)];
  local bars = get(panel, 'bars', false);
  local byKind =
    if kind == 'stat' then {
      thresholds: { mode: 'absolute', steps: if drift != null then steps[drift] else [
        { color: 'green', value: null },
        { color: get(panel, 'alarm_color', 'red'), value: get(panel, 'alarm_at', 1) },
      ] },
    } else if kind == 'timeseries' then {
      custom: {
        drawStyle: if bars then 'bars' else 'line',
        lineWidth: 1,
        fillOpacity: if bars then 80 else 10,
        showPoints: 'never',
        spanNulls: false,
      } + (if bars then { axisSoftMin: 0 } else {})
      + (if get(panel, 'log', false) then { scaleDistribution: { type: 'log', log: 10 } } else {})
      // The bands behind the lines say which side of in-sync a value is.
      + (if drift != null then { thresholdsStyle: { mode: 'area' } } else {}),
    } + (if drift != null then { thresholds: { mode: 'absolute', steps: steps[drift] } } else {})
    else if kind == 'state-timeline' then
      // 1 is good (a source up) unless the panel says 1 is the alarm (a restart blocked).
      local off = if get(panel, 'on_is_alarm', false) then 'green' else 'red';
      local on = if get(panel, 'on_is_alarm', false) then 'red' else 'green';
      {
        color: { mode: 'thresholds' },
        mappings: [{ type: 'value', options: {
          '0': { text: get(panel, 'off', 'down'), color: off, index: 0 },
          '1': { text: get(panel, 'on', 'up'), color: on, index: 1 },
        } }],
        thresholds: { mode: 'absolute', steps: [{ color: off, value: null }, { color: on, value: 1 }] },
        custom: { fillOpacity: 70, lineWidth: 0 },
      }
    else if kind == 'heatmap' then { custom: { scaleDistribution: { type: 'linear' } } }
    else {};
  // A node's name opens the node-detail dashboard on that node, keeping the time range,
  // datasource, job and cluster: the table's node cell, or a top-k series' node label.
  local link = get(panel, 'node_link', false);
  {
    defaults: { unit: get(panel, 'unit', 'short') } + byKind
              + (if link && kind != 'table' then { links: [nodeLink('${__field.labels.node}', vals)] } else {}),
    overrides: [
      { matcher: { id: 'byName', options: name }, properties: [{ id: 'unit', value: unit }] }
      for name in std.objectFields(get(panel, 'column_units', {}))
      for unit in [panel.column_units[name]]
    ] + [
      { matcher: { id: 'byName', options: name }, properties: [
        { id: 'thresholds', value: { mode: 'absolute', steps: steps[panel.column_drift[name]] } },
        { id: 'custom.cellOptions', value: { type: 'color-text' } },
      ] }
      for name in std.objectFields(get(panel, 'column_drift', {}))
    ] + (if link && kind == 'table' then [
           { matcher: { id: 'byName', options: 'node' }, properties: [
             { id: 'links', value: [nodeLink('${__value.raw}', vals)] },
           ] },
         ] else []),
  };

local options(panel) =
  local kind = panel.type;
  if kind == 'stat' then {
    reduceOptions: { calcs: ['lastNotNull'], fields: '', values: false },
    colorMode: 'value', graphMode: 'area', justifyMode: 'auto', orientation: 'auto', textMode: 'auto',
  } else if kind == 'table' then {
    showHeader: true, cellHeight: 'sm', footer: { show: false, reducer: ['sum'], fields: '' },
  } + (if std.objectHas(panel, 'sort_by') then { sortBy: [{ displayName: panel.sort_by, desc: true }] } else {})
  else if kind == 'heatmap' then {
    calculate: false, cellGap: 1, yAxis: { unit: get(panel, 'unit', 's'), axisPlacement: 'left' },
    color: { mode: 'scheme', scheme: 'Oranges', steps: 64, exponent: 0.5, fill: 'dark-orange', reverse: false },
    rowsFrame: { layout: 'auto' }, tooltip: { mode: 'single', yHistogram: true },
    legend: { show: true }, showValue: 'never',
  } else if kind == 'state-timeline' then {
    showValue: 'never', mergeValues: true, rowHeight: 0.9, alignValue: 'left',
    legend: { showLegend: false }, tooltip: { mode: 'single', sort: 'none' },
  } else {
    legend: { displayMode: 'table', placement: 'bottom', showLegend: true, calcs: ['lastNotNull', 'max'] },
    tooltip: { mode: 'multi', sort: 'desc' },
  };

local targets(panel, vals) =
  local instant = std.member(['stat', 'table'], panel.type);
  [
    {
      datasource: DS,
      editorMode: 'code',
      expr: strip(panel.targets[i].expr % vals),
      legendFormat: get(panel.targets[i], 'legend', '__auto'),
      range: !instant,
      instant: instant,
      refId: std.char(std.codepoint('A') + i),
    }
    + (if panel.type == 'table' then { format: 'table' }
       else if panel.type == 'heatmap' then { format: 'heatmap', legendFormat: '{{le}}' }
       else {})
    for i in std.range(0, std.length(panel.targets) - 1)
  ];

local panelOf(panel, id, x, y, vals, c) =
  local unknown = [k for k in std.objectFields(panel) if !std.member(PANEL_KEYS, k)];
  assert unknown == [] : 'panel %s: unknown key(s) %s' % [std.manifestJson(panel.title), unknown];
  local description = strip(get(panel, 'description', ''));
  assert description != '' :
         'panel %s has no description (the question it answers and how to read it)'
         % std.manifestJson(panel.title);
  {
    type: panel.type,
    id: id,
    title: panel.title,
    description: description,
    datasource: DS,
    gridPos: { h: get(panel, 'h', get(PANEL_H, panel.type, 8)), w: get(panel, 'w', 12), x: x, y: y },
    targets: targets(panel, vals),
    fieldConfig: fieldConfig(panel, vals, c),
    options: options(panel),
  } + (if panel.type == 'table' then {
         transformations: [
           { id: 'merge', options: {} },
           { id: 'organize', options: { excludeByName: { Time: true },
                                        renameByName: get(panel, 'columns', {}) } },
         ],
       } else {});

// Rows of panels laid out left to right, wrapping to the next line of the row at 24 columns.
local layout(spec, vals, c) =
  local addRow(state, row) =
    local start = state {
      panels+: [{ type: 'row', id: state.id, title: row.title, collapsed: false,
                  gridPos: { h: 1, w: 24, x: 0, y: state.y }, panels: [] }],
      id: state.id + 1,
      y: state.y + 1,
      x: 0,
      rowH: 0,
    };
    local addPanel(s, panel) =
      local w = get(panel, 'w', 12);
      local h = get(panel, 'h', get(PANEL_H, panel.type, 8));
      local wrap = s.x + w > 24;
      local x = if wrap then 0 else s.x;
      local y = if wrap then s.y + s.rowH else s.y;
      local rowH = if wrap then 0 else s.rowH;
      s {
        panels+: [panelOf(panel, s.id, x, y, vals, c)],
        id: s.id + 1,
        x: x + w,
        y: y,
        rowH: std.max(rowH, h),
      };
    local end = std.foldl(addPanel, row.panels, start);
    end { y: end.y + end.rowH };
  std.foldl(addRow, spec.rows, { panels: [], id: 1, y: 0 }).panels;

{
  build(spec, c)::
    local vals = values(spec, c);
    {
      annotations: { list: annotations(spec, vals) },
      description: strip(spec.description),
      editable: true,
      fiscalYearStartMonth: 0,
      graphTooltip: 1,
      id: null,
      links: [link { url: link.url % vals } for link in get(spec, 'links', [])],
      liveNow: false,
      panels: layout(spec, vals, c),
      refresh: '30s',
      schemaVersion: 39,
      tags: ['node-resize-exporter', 'kubernetes', 'hotplug'],
      templating: { list: variables(spec, c) },
      time: { from: 'now-6h', to: 'now' },
      timepicker: {},
      timezone: 'utc',
      title: spec.title,
      uid: spec.uid,
      version: 1,
      weekStart: '',
    },
}
