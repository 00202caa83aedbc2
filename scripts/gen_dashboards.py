"""Grafana dashboard JSON from the small specs in dashboards/src/*.yml (used by gen-monitoring.py).

A spec names rows of panels with their questions (description, required), queries and units;
this fills in what every Grafana panel needs (datasource, grid position, field config, data
links). Placeholders in a query: @sel@ (job, cluster and node matchers of the exporter's series),
@rsel@ (cluster and node only: recording rules drop job), @by@ (cluster label and node, for `by`
clauses); in a link URL: @vars@ (time range, datasource, job and cluster as query parameters).

The job is a template variable, not a constant baked into every query: `$job` lists the jobs
whose series carry node_resize_exporter_build_info and starts on the site's job (the
--job-selector value), so a dashboard dropped into Grafana as it is finds an exporter scraped
under any job name, and no query needs the generator to change it.
"""
from __future__ import annotations

import copy
import re

DS = {"type": "prometheus", "uid": "${datasource}"}
# Where a node's name links to (uid and slug of dashboards/src/node-detail.yml).
NODE_DETAIL_PATH = "/d/nre-node-detail/node-resize-node-detail"
FLEET_OVERVIEW_PATH = "/d/nre-fleet-overview/node-resize-fleet-overview"
GRAFANA_DS = {"type": "grafana", "uid": "-- Grafana --"}
PANEL_H = {"stat": 4}
# What a panel of a spec may say; anything else is a typo or a YAML surprise (an unquoted
# `on:` is the boolean true, a comma in an unquoted flow-style title starts a new key).
PANEL_KEYS = {"type", "title", "description", "targets", "w", "h", "unit", "bars", "log",
              "alarm_at", "alarm_color", "node_link", "sort_by", "columns", "column_units",
              "on", "off", "on_is_alarm", "drift", "column_drift"}
# Colours that mean what they say on a drift (kernel minus kubelet): below the jitter bound
# the kubelet advertises what the kernel took away, pods at risk (red); within it, in sync
# (green); above it, capacity not advertised yet, nothing at risk (amber: Grafana's default
# warning colour). CPUs are whole cores; memory has KEP-3953's 100 MiB jitter bound, as the
# alerts. A step's colour applies from its value up.
AMBER = "#EAB839"
DRIFT_STEPS = {
    "cores": [{"color": "red", "value": None}, {"color": "green", "value": 0},
              {"color": AMBER, "value": 1}],
    "bytes": [{"color": "red", "value": None}, {"color": "green", "value": -104857600},
              {"color": AMBER, "value": 104857601}],
}


def _expand(text: str, values: dict[str, str], where: str) -> str:
    def sub(m: re.Match) -> str:
        if m.group(1) not in values:
            raise SystemExit(f"{where}: unknown parameter @{m.group(1)}@")
        return values[m.group(1)]
    return re.sub(r"@(\w+)@", sub, text)


def job_matcher(p) -> tuple[str, str, str] | None:
    """(label, operator, value) of the site's job selector; None when there is none."""
    if not p.job_selector:
        return None
    m = re.fullmatch(r'\s*(\w+)\s*(=~|=)\s*"(.*)"\s*', p.job_selector)
    assert m, p.job_selector  # Params.check refused anything else
    label, op, value = m.groups()
    return label, op, value


def _link_vars(p) -> str:
    """The query parameters a link to another dashboard carries: what the user is looking at."""
    out = ["${__url_time_range}", "${datasource:queryparam}"]
    if job_matcher(p):
        out.append("${job:queryparam}")
    if p.cluster_label:
        out.append("${cluster:queryparam}")
    return "&".join(out)


def _values(spec: dict, p) -> dict[str, str]:
    node = 'node=~"$node"' if spec.get("node", "multi") == "multi" else 'node="$node"'
    cluster = [f'{p.cluster_label}="$cluster"'] if p.cluster_label else []
    matcher = job_matcher(p)
    job = [f'{matcher[0]}=~"$job"'] if matcher else []
    return {"sel": ",".join(job + cluster + [node]), "rsel": ",".join(cluster + [node]),
            "job": ",".join(job), "by": p.by, "vars": _link_vars(p)}


def _variables(spec: dict, p) -> list[dict]:
    matcher = job_matcher(p)
    job = f'{matcher[0]}=~"$job"' if matcher else ""
    out = [{"name": "datasource", "label": "Data source", "type": "datasource",
            "query": "prometheus", "regex": "", "current": {}, "hide": 0, "includeAll": False,
            "multi": False, "options": [], "refresh": 1, "skipUrlSync": False}]

    def query_var(name: str, label: str, query: str, multi: bool) -> dict:
        var = {"name": name, "label": label, "type": "query", "datasource": DS,
               "definition": query,
               "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery",
                         "qryType": 1},
               "refresh": 2, "sort": 1, "regex": "", "hide": 0, "current": {}, "options": [],
               "includeAll": multi, "multi": multi, "skipUrlSync": False}
        if multi:
            var["allValue"] = ".+"
        return var

    if matcher:
        # Every job that exposes the exporter's build_info; it starts on the site's job when
        # that exists (Grafana falls back to the first value otherwise), and a =~ selector
        # filters the list. Changing it is a click (or ?var-job= in a link), not a regeneration.
        label, op, value = matcher
        var = query_var("job", "Job", f"label_values(node_resize_exporter_build_info, {label})",
                        False)
        if op == "=":
            var["current"] = {"selected": True, "text": value, "value": value}
        else:
            var["regex"] = f"/^(?:{value})$/"
        out.append(var)
    node_matchers = [job] if job else []
    if p.cluster_label:
        cluster = query_var("cluster", "Cluster", "label_values(node_resize_exporter_build_info"
                            f"{{{job}}}, {p.cluster_label})", False)
        # One cluster (kubernetes-mixin's showMultiCluster off): nothing to choose, so the
        # variable is hidden; it still takes the one value (or none: series without the label)
        # and a link's var-cluster. --multi-cluster shows it.
        cluster["hide"] = 0 if p.multi_cluster else 2
        out.append(cluster)
        node_matchers.append(f'{p.cluster_label}="$cluster"')
    out.append(query_var("node", "Node", "label_values(node_resize_exporter_build_info"
                         f"{{{','.join(node_matchers)}}}, node)",
                         spec.get("node", "multi") == "multi"))
    return out


def _annotations(spec: dict, values: dict, where: str) -> list[dict]:
    out = [{"builtIn": 1, "datasource": GRAFANA_DS, "enable": True, "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts",
            "type": "dashboard"}]
    for ann in spec.get("annotations", []):
        out.append({"name": ann["name"], "datasource": DS, "enable": True, "hide": False,
                    "iconColor": ann.get("color", "orange"),
                    "expr": _expand(ann["expr"].strip(), values, where), "step": "$__interval",
                    "titleFormat": ann["title"], "textFormat": ann.get("text", ""),
                    "tagKeys": ann.get("tags", "node,resource"), "useValueForTime": False})
    return out


def _field_config(panel: dict, values: dict) -> dict:
    defaults: dict = {"unit": panel.get("unit", "short")}
    kind = panel["type"]
    drift = panel.get("drift")
    if drift is not None and drift not in DRIFT_STEPS:
        raise SystemExit(f"panel {panel['title']!r}: drift must be one of {sorted(DRIFT_STEPS)}")
    if kind == "stat":
        defaults["thresholds"] = {"mode": "absolute", "steps": copy.deepcopy(DRIFT_STEPS[drift])
                                  if drift else [
            {"color": "green", "value": None},
            {"color": panel.get("alarm_color", "red"), "value": panel.get("alarm_at", 1)}]}
    elif kind == "timeseries":
        bars = panel.get("bars", False)
        defaults["custom"] = {"drawStyle": "bars" if bars else "line", "lineWidth": 1,
                              "fillOpacity": 80 if bars else 10, "showPoints": "never",
                              "spanNulls": False, "axisSoftMin": 0 if bars else None}
        defaults["custom"] = {k: v for k, v in defaults["custom"].items() if v is not None}
        if panel.get("log"):
            defaults["custom"]["scaleDistribution"] = {"type": "log", "log": 10}
        if drift:
            # The bands behind the lines say which side of in-sync a value is.
            defaults["thresholds"] = {"mode": "absolute",
                                      "steps": copy.deepcopy(DRIFT_STEPS[drift])}
            defaults["custom"]["thresholdsStyle"] = {"mode": "area"}
    elif kind == "state-timeline":
        # 1 is good (a source up) unless the panel says 1 is the alarm (a restart blocked).
        off, on = ("green", "red") if panel.get("on_is_alarm") else ("red", "green")
        defaults.update({"color": {"mode": "thresholds"}, "mappings": [{
            "type": "value", "options": {"0": {"text": panel.get("off", "down"), "color": off,
                                               "index": 0},
                                         "1": {"text": panel.get("on", "up"), "color": on,
                                               "index": 1}}}],
            "thresholds": {"mode": "absolute", "steps": [{"color": off, "value": None},
                                                         {"color": on, "value": 1}]},
            "custom": {"fillOpacity": 70, "lineWidth": 0}})
    elif kind == "heatmap":
        defaults["custom"] = {"scaleDistribution": {"type": "linear"}}
    overrides = [{"matcher": {"id": "byName", "options": name},
                  "properties": [{"id": "unit", "value": unit}]}
                 for name, unit in panel.get("column_units", {}).items()]
    for name, kind_of_drift in panel.get("column_drift", {}).items():
        overrides.append({"matcher": {"id": "byName", "options": name}, "properties": [
            {"id": "thresholds", "value": {"mode": "absolute",
                                           "steps": copy.deepcopy(DRIFT_STEPS[kind_of_drift])}},
            {"id": "custom.cellOptions", "value": {"type": "color-text"}}]})
    if panel.get("node_link"):
        # A node's name opens the node-detail dashboard on that node, keeping the time range,
        # datasource, job and cluster: the table's node cell, or a top-k series' node label.
        if kind == "table":
            overrides.append({"matcher": {"id": "byName", "options": "node"}, "properties": [
                {"id": "links", "value": [_node_link("${__value.raw}", values)]}]})
        else:
            defaults["links"] = [_node_link("${__field.labels.node}", values)]
    return {"defaults": defaults, "overrides": overrides}


def _node_link(node_ref: str, values: dict) -> dict:
    return {"title": "Node detail",
            "url": f"{NODE_DETAIL_PATH}?var-node={node_ref}&{values['vars']}"}


def _options(panel: dict) -> dict:
    kind = panel["type"]
    if kind == "stat":
        return {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                "colorMode": "value", "graphMode": "area", "justifyMode": "auto",
                "orientation": "auto", "textMode": "auto"}
    if kind == "table":
        out = {"showHeader": True, "cellHeight": "sm",
               "footer": {"show": False, "reducer": ["sum"], "fields": ""}}
        if "sort_by" in panel:
            out["sortBy"] = [{"displayName": panel["sort_by"], "desc": True}]
        return out
    if kind == "heatmap":
        return {"calculate": False, "cellGap": 1, "yAxis": {"unit": panel.get("unit", "s"),
                                                            "axisPlacement": "left"},
                "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64,
                          "exponent": 0.5, "fill": "dark-orange", "reverse": False},
                "rowsFrame": {"layout": "auto"}, "tooltip": {"mode": "single",
                                                             "yHistogram": True},
                "legend": {"show": True}, "showValue": "never"}
    if kind == "state-timeline":
        return {"showValue": "never", "mergeValues": True, "rowHeight": 0.9,
                "alignValue": "left", "legend": {"showLegend": False},
                "tooltip": {"mode": "single", "sort": "none"}}
    return {"legend": {"displayMode": "table", "placement": "bottom", "showLegend": True,
                       "calcs": ["lastNotNull", "max"]},
            "tooltip": {"mode": "multi", "sort": "desc"}}


def _targets(panel: dict, values: dict, where: str) -> list[dict]:
    instant = panel["type"] in ("stat", "table")
    out = []
    for i, t in enumerate(panel["targets"]):
        target = {"datasource": DS, "editorMode": "code",
                  "expr": _expand(t["expr"].strip(), values, where),
                  "legendFormat": t.get("legend", "__auto"), "range": not instant,
                  "instant": instant, "refId": chr(ord("A") + i)}
        if panel["type"] == "table":
            target["format"] = "table"
        elif panel["type"] == "heatmap":
            target["format"] = "heatmap"
            target["legendFormat"] = "{{le}}"
        out.append(target)
    return out


def _panel(panel: dict, pid: int, x: int, y: int, values: dict, where: str) -> dict:
    unknown = sorted(map(repr, set(panel) - PANEL_KEYS))
    if unknown:
        raise SystemExit(f"{where}: panel {panel['title']!r}: unknown key(s) {', '.join(unknown)}"
                         " (quote a title with a comma, and the keys on/off)")
    description = panel.get("description", "").strip()
    if not description:
        raise SystemExit(f"{where}: panel {panel['title']!r} has no description (the question "
                         "it answers and how to read it)")
    out = {"type": panel["type"], "id": pid, "title": panel["title"],
           "description": description, "datasource": DS,
           "gridPos": {"h": panel.get("h", PANEL_H.get(panel["type"], 8)),
                       "w": panel.get("w", 12), "x": x, "y": y},
           "targets": _targets(panel, values, where),
           "fieldConfig": _field_config(panel, values), "options": _options(panel)}
    if panel["type"] == "table":
        out["transformations"] = [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {"Time": True},
                                           "renameByName": panel.get("columns", {})}}]
    return out


def dashboard(spec: dict, p, where: str) -> dict:
    values = _values(spec, p)
    panels, pid, y = [], 1, 0
    for row in spec["rows"]:
        panels.append({"type": "row", "id": pid, "title": row["title"], "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid, y, x, row_h = pid + 1, y + 1, 0, 0
        for panel in row["panels"]:
            built = _panel(panel, pid, x, y, values, where)
            w, h = built["gridPos"]["w"], built["gridPos"]["h"]
            if x + w > 24:  # wrap to the next line of the row
                x, y, row_h = 0, y + row_h, 0
                built["gridPos"].update(x=x, y=y)
            panels.append(built)
            pid, x, row_h = pid + 1, x + w, max(row_h, h)
        y += row_h
    return {
        "annotations": {"list": _annotations(spec, values, where)},
        "description": spec["description"].strip(),
        "editable": True, "fiscalYearStartMonth": 0, "graphTooltip": 1, "id": None,
        "links": [{**link, "url": _expand(link["url"], values, where)}
                  for link in copy.deepcopy(spec.get("links", []))], "liveNow": False,
        "panels": panels, "refresh": "30s", "schemaVersion": 39,
        "tags": ["node-resize-exporter", "kubernetes", "hotplug"],
        "templating": {"list": _variables(spec, p)},
        "time": {"from": "now-6h", "to": "now"}, "timepicker": {}, "timezone": "utc",
        "title": spec["title"], "uid": spec["uid"], "version": 1, "weekStart": "",
    }
