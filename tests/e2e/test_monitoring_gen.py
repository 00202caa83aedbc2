"""scripts/gen-monitoring.py and the monitoring mixin (mixin/) it evaluates: the committed rules,
inhibit rules, dashboards and PrometheusRules are what it generates; its parameters reach every
file; the outputs pass promtool and amtool; the dashboards follow the project's rules (windows
valid at any scrape interval, a cluster variable, recording rules where they exist, one panel
per operator question) and drop into a Grafana as they are: the job is a variable, every panel
says what it answers, the fleet view stays readable at 1,000 nodes and links a node to its own
dashboard."""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import promql_parser
import pytest
import yaml

from testkit import metrics_doc
from testkit.exporter_proc import free_port, poll_until
from testkit.monitoring import as_promql, dashboard_exprs, recorded_rules
from testkit.prometheus import Daemon, get_json

REPO = Path(__file__).resolve().parents[2]
INHIBIT = REPO / "alerts" / "alertmanager-inhibit.yml"

pytestmark = pytest.mark.promtool


def _gen():
    spec = importlib.util.spec_from_file_location("gen_monitoring",
                                                  REPO / "scripts" / "gen-monitoring.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: run scripts/setup.sh test")
    return path


def test_committed_files_are_current():
    gen = _gen()
    files = gen.render()
    assert {"alerts/node-resize-exporter.rules.yml", "alerts/alertmanager-inhibit.yml",
            "alerts/kube-prometheus-stack-values.yaml", "deploy/prometheusrule.yaml",
            "deploy/prometheusrule-global.yaml", "dashboards/fleet-overview.json",
            "dashboards/node-detail.json",
            "deploy/components/dashboards/dashboards.yaml"} <= set(files)
    stale = gen.check(files, REPO)
    assert not stale, "run scripts/gen-monitoring.py:\n" + "\n".join(stale)[:4000]


def test_check_mode_reports_a_hand_edit(tmp_path, capsys):
    gen = _gen()
    assert gen.main(["--out", str(tmp_path)]) == 0
    assert gen.main(["--check", "--out", str(tmp_path)]) == 0
    board = tmp_path / "dashboards" / "node-detail.json"
    board.write_text(board.read_text().replace("$__rate_interval", "$__interval", 1))
    assert gen.main(["--check", "--out", str(tmp_path)]) == 1
    assert "dashboards/node-detail.json" in capsys.readouterr().out


def test_parameters_reach_rules_dashboards_and_inhibit_rules(tmp_path):
    gen = _gen()
    assert gen.main(["--out", str(tmp_path), "--job-selector", 'job="nre"',
                     "--cluster-label", "k8s_cluster",
                     "--runbook-url", "https://wiki.example/nre#{anchor}",
                     "--grafana-url", "https://grafana.example/sub"]) == 0
    rules_path = tmp_path / "alerts" / "node-resize-exporter.rules.yml"
    rules = yaml.safe_load(rules_path.read_text())
    text = rules_path.read_text()
    assert 'job="node-resize-exporter"' not in text and "(cluster, node" not in text
    assert "by (k8s_cluster, namespace, node, resource)" in text
    assert 'up{job="nre"} == 0' in text
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    for alert in alerts:
        assert alert["annotations"]["runbook_url"] == \
            f"https://wiki.example/nre#{alert['alert'].lower()}"
        assert alert["annotations"]["dashboard_url"] == (
            "https://grafana.example/sub/d/nre-fleet-overview/node-resize-fleet-overview"
            "?var-cluster={{ $labels.k8s_cluster }}" if "absent(" in alert["expr"] else
            "https://grafana.example/sub/d/nre-node-detail/node-resize-node-detail"
            "?var-cluster={{ $labels.k8s_cluster }}&var-node={{ $labels.node }}")
    stale = next(a for a in alerts if a["alert"] == "NodeResizeCapacityStale")
    assert 'k8s_cluster="%s",node="%s"} == 1` $labels.k8s_cluster $labels.node' in \
        stale["annotations"]["description"]
    result = subprocess.run([_tool("promtool"), "check", "rules", str(rules_path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    for path in (tmp_path / "dashboards").glob("*.json"):
        board = json.loads(path.read_text())
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["cluster"]["query"]["query"] == \
            'label_values(node_resize_exporter_build_info{job=~"$job"}, k8s_cluster)'
        # The site's job is where the job variable starts, not a constant in the queries.
        assert variables["job"]["current"]["value"] == "nre"
        assert 'job="nre"' not in path.read_text()
        for where, expr in dashboard_exprs(board):
            if where in ("variable 'cluster'", "variable 'job'"):
                continue
            assert 'k8s_cluster="$cluster"' in expr, (path.name, where, expr)
    inhibit = yaml.safe_load((tmp_path / "alerts" / "alertmanager-inhibit.yml").read_text())
    assert all(r["equal"] == ["k8s_cluster", "node"] for r in inhibit["inhibit_rules"])


def test_no_cluster_label_for_a_single_cluster_prometheus(tmp_path):
    gen = _gen()
    assert gen.main(["--out", str(tmp_path), "--cluster-label", ""]) == 0
    text = (tmp_path / "alerts" / "node-resize-exporter.rules.yml").read_text()
    assert "cluster" not in text.replace("over-commits", "")
    board = json.loads((tmp_path / "dashboards" / "fleet-overview.json").read_text())
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource", "job", "node"]
    rules = yaml.safe_load(text)
    urls = {r["annotations"]["dashboard_url"] for g in rules["groups"] for r in g["rules"]
            if "alert" in r}
    assert urls == {"/d/nre-node-detail/node-resize-node-detail?var-node={{ $labels.node }}",
                    "/d/nre-fleet-overview/node-resize-fleet-overview"}


def test_a_regex_job_selector_filters_the_job_variable(tmp_path):
    gen = _gen()
    assert gen.main(["--out", str(tmp_path), "--job-selector", 'job=~"nre-.+"']) == 0
    board = json.loads((tmp_path / "dashboards" / "node-detail.json").read_text())
    job = {v["name"]: v for v in board["templating"]["list"]}["job"]
    assert job["regex"] == "/^(?:nre-.+)$/" and job["current"] == {}
    rules = (tmp_path / "alerts" / "node-resize-exporter.rules.yml").read_text()
    assert 'up{job=~"nre-.+"} == 0' in rules


def test_the_namespace_parameters_reach_the_alerts(tmp_path):
    """--namespace: the fixed label of the alerts about no target (absent()); --namespace-label
    '': a Prometheus whose targets have no namespace label, every aggregation without it."""
    gen = _gen()

    def alerts(*args: str) -> tuple[str, dict[str, dict]]:
        out = tmp_path / "-".join(args)
        assert gen.main(["--out", str(out), *args]) == 0
        text = (out / "alerts" / "node-resize-exporter.rules.yml").read_text()
        rules = yaml.safe_load(text)
        return text, {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}

    text, moved = alerts("--namespace", "monitoring")
    assert moved["NodeResizeExporterAbsent"]["labels"]["namespace"] == "monitoring"
    assert "by (cluster, namespace, node, resource)" in text
    text, none = alerts("--namespace-label", "")
    assert "namespace, node" not in text and "by (cluster, node, resource)" in text
    assert all("namespace" not in a["labels"] for a in none.values())


@pytest.mark.parametrize("bad", [["--cluster-label", "a-b"], ["--job-selector", "job=x"],
                                 ["--namespace-label", "a-b"], ["--namespace", "Not_A_Name"],
                                 ["--job-selector", 'job!="x"'],
                                 ["--runbook-url", "https://example/runbooks"],
                                 ["--grafana-url", "grafana.example"],
                                 ["--grafana-url", "https://grafana.example/"]])
def test_bad_parameters_are_refused(bad, tmp_path):
    with pytest.raises(SystemExit, match=re.escape(bad[0])):
        _gen().main(["--out", str(tmp_path), *bad])


@pytest.mark.parametrize("change, refused", [
    ("std.objectRemoveKey(panel, 'description')", "has no description"),
    ("panel { colour: 'red' }", "unknown key"),
    ("panel { drift: 'volts' }", "drift must be one of"),
])
def test_a_panel_spec_that_would_be_generated_wrong_is_refused(change, refused):
    gen = _gen()
    build = ("local d = import 'lib/dashboard.libsonnet';\n"
             "local spec = import 'dashboards/node-detail.libsonnet';\n"
             "local change(panel) = {change};\n"
             "d.build(spec {{ rows: [spec.rows[0] {{ panels: [change(spec.rows[0].panels[0])]"
             " + spec.rows[0].panels[1:] }}] + spec.rows[1:] }}, mixin._config)")
    assert gen.evaluate(expr=build.format(change="panel"))["uid"] == "nre-node-detail"
    with pytest.raises(SystemExit, match=refused):
        gen.evaluate(expr=build.format(change=change))


def test_a_jsonnet_user_gets_what_the_generator_writes():
    """The mixin imported the jsonnet way, its _config overridden there: the same rules and
    dashboards the command line's options give."""
    gen = _gen()
    site = gen.Params(job_selector='job="nre"', cluster_label="k8s_cluster")
    assert gen.evaluate(site) == gen.evaluate(expr=(
        "local m = (import 'mixin.libsonnet') + { _config+:: { jobSelector: 'job=\"nre\"', "
        "clusterLabel: 'k8s_cluster' } };\n"
        "{ rules: m.prometheusRules, alerts: m.prometheusAlerts, "
        "dashboards: m.grafanaDashboards, alertmanager: m.alertmanagerConfig, "
        "globalSuffix: m._config.globalGroupSuffix }"))


def test_the_global_groups_reach_kube_prometheus_stack_values_whatever_our_labels():
    """The groups for the global ruler (the absent guard among them) are also Helm values for
    kube-prometheus-stack's additionalPrometheusRulesMap: the chart labels that object with
    its own release, so the guard loads even where our objects' release label is wrong."""
    values = yaml.safe_load((REPO / "alerts" / "kube-prometheus-stack-values.yaml").read_text())
    (obj,) = values["additionalPrometheusRulesMap"].values()
    fleet = yaml.safe_load((REPO / "deploy" / "prometheusrule-global.yaml").read_text())
    assert obj["groups"] == fleet["spec"]["groups"]
    assert all(g["name"].endswith(".global") for g in obj["groups"])
    alerts = {r["alert"] for g in obj["groups"] for r in g["rules"] if "alert" in r}
    assert {"NodeResizeExporterAbsent", "NodeResizeExporterSeriesAbsent"} <= alerts


# --- Alertmanager inhibit rules ------------------------------------------------------------

def test_amtool_accepts_the_inhibit_rules():
    result = subprocess.run([_tool("amtool"), "check-config", str(INHIBIT)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 inhibit rules" in result.stdout


def test_amtool_rejects_a_broken_inhibit_rule(tmp_path):
    broken = tmp_path / "am.yml"
    broken.write_text(INHIBIT.read_text().replace("source_matchers:", "source_matcherz:", 1))
    result = subprocess.run([_tool("amtool"), "check-config", str(broken)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0


def test_inhibit_rules_name_alerts_that_exist():
    rules = yaml.safe_load((REPO / "alerts" / "node-resize-exporter.rules.yml").read_text())
    names = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    for rule in yaml.safe_load(INHIBIT.read_text())["inhibit_rules"]:
        for matcher in rule["source_matchers"] + rule["target_matchers"]:
            m = re.fullmatch(r'alertname(=|=~|!=)"(.+)"', matcher)
            if m:
                assert any(re.fullmatch(m.group(2), n) for n in names), matcher


# --- dashboards ------------------------------------------------------------------------------

DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))


@pytest.fixture(params=DASHBOARDS, ids=lambda p: p.name)
def board(request) -> dict:
    return json.loads(request.param.read_text())


def test_no_window_is_the_bare_interval(board):
    """increase(x[$__interval]) is empty when the step equals the scrape interval."""
    for where, expr in dashboard_exprs(board):
        assert "$__interval" not in expr, (where, expr)
        for window in re.findall(r"\[([^\]]+)\]", expr):
            assert window in ("$__rate_interval", "$__range", "1h"), (where, window)


def test_every_query_is_restricted_to_the_cluster_variable(board):
    variables = [v["name"] for v in board["templating"]["list"]]
    assert variables == ["datasource", "job", "cluster", "node"]
    for where, expr in dashboard_exprs(board):
        if where not in ("variable 'cluster'", "variable 'job'"):
            assert 'cluster="$cluster"' in expr, (where, expr)


def test_the_job_is_a_variable_not_a_constant(board):
    """Every selector of the exporter's own series matches job=~"$job" (recording rules drop
    job, so theirs do not); the job variable lists the jobs that expose the exporter's
    build_info and starts on node-resize-exporter, the job deploy/ gives it."""
    assert 'job=\\"node-resize-exporter\\"' not in json.dumps(board)
    job = {v["name"]: v for v in board["templating"]["list"]}["job"]
    assert job["type"] == "query" and not job["multi"]
    assert job["query"]["query"] == "label_values(node_resize_exporter_build_info, job)"
    assert job["current"]["value"] == "node-resize-exporter"
    for where, expr in dashboard_exprs(board):
        for name, matchers in re.findall(r"([a-zA-Z_][\w:]*)\{([^}]*)\}", expr):
            if ":" not in name and where != "variable 'job'":
                assert 'job=~"$job"' in matchers, (where, name, matchers)


def test_every_panel_says_what_it_answers(board):
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert panels
    for panel in panels:
        assert panel.get("description", "").strip(), f"panel {panel['title']!r}: no description"


def test_links_between_dashboards_keep_what_the_user_looks_at(board):
    uids = {json.loads(p.read_text())["uid"] for p in DASHBOARDS}
    for link in board["links"]:
        m = re.fullmatch(r"/d/([\w-]+)/[\w-]+\?(.+)", link["url"])
        assert m and m.group(1) in uids, link
        assert m.group(2).split("&") == ["${__url_time_range}", "${datasource:queryparam}",
                                         "${job:queryparam}", "${cluster:queryparam}"]


def _node_links(panel: dict) -> list[str]:
    config = panel["fieldConfig"]
    links = [link["url"] for link in config["defaults"].get("links", [])]
    for override in config["overrides"]:
        if override["matcher"] == {"id": "byName", "options": "node"}:
            links += [link["url"] for prop in override["properties"] if prop["id"] == "links"
                      for link in prop["value"]]
    return links


def _per_node(node) -> str:
    """What a PromQL expression's result is, per node: "each" (one series per node: a raw
    selector, or an aggregation by node), "top" (per node but at most k: topk) or "none"
    (aggregated over the nodes)."""
    if isinstance(node, (promql_parser.VectorSelector, promql_parser.MatrixSelector)):
        return "each"
    if isinstance(node, (promql_parser.ParenExpr, promql_parser.UnaryExpr,
                         promql_parser.SubqueryExpr)):
        return _per_node(node.expr)
    if isinstance(node, promql_parser.Call):
        kinds = {_per_node(a) for a in node.args if not isinstance(
            a, (promql_parser.StringLiteral, promql_parser.NumberLiteral))}
        return "each" if "each" in kinds else "top" if "top" in kinds else "none"
    if isinstance(node, promql_parser.AggregateExpr):
        if str(node.op) in ("topk", "bottomk", "limitk"):
            return "top" if _per_node(node.expr) != "none" else "none"
        modifier = node.modifier
        if modifier is None:
            return "none"
        keeps = ("node" in modifier.labels) == (modifier.type == promql_parser.AggModifierType.By)
        return _per_node(node.expr) if keeps else "none"
    if isinstance(node, promql_parser.BinaryExpr):
        lhs, rhs = _per_node(node.lhs), _per_node(node.rhs)
        if str(node.op) == "and":  # the left side, only where the right has a match
            return "top" if "top" in (lhs, rhs) and lhs != "none" else lhs
        return "each" if "each" in (lhs, rhs) else "top" if "top" in (lhs, rhs) else "none"
    return "none"  # number and string literals


def _per_node_expr(expr: str) -> str:
    return _per_node(promql_parser.parse(as_promql(expr)))


@pytest.mark.parametrize("expr, kind", [
    ('max by (cluster, node) (x{job=~"$job"})', "each"),
    ("sum by (resource) (rate(x[$__rate_interval]))", "none"),
    ("count(max by (cluster, node) (x <= -1) or max by (node) (y > 1)) or vector(0)", "none"),
    ("max by (node) (x) and topk(10, abs(max by (node) (x)) > 0)", "top"),
    ("topk(10, node_resource:x:p90_1h)", "top"),
    ("node_resource:x:p90_1h", "each"),
    ("sum without (node) (x)", "none"),
    ("(time() - max by (node, resource) (x > 0)) * 1000", "each"),
])
def test_per_node_reads_promql(expr, kind):
    assert _per_node_expr(expr) == kind


def test_fleet_overview_is_readable_at_a_thousand_nodes():
    """Nothing draws one line or one row per node of the fleet: graphs aggregate or keep the
    top 10, per-node tables list only nodes with something wrong (a filter in every query),
    no per-node state timeline, annotations fleet-wide."""
    fleet = json.loads((REPO / "dashboards" / "fleet-overview.json").read_text())
    panels = [p for p in fleet["panels"] if p["type"] != "row"]
    assert not [p["title"] for p in panels if p["type"] == "state-timeline"]
    for panel in panels:
        for target in panel["targets"]:
            expr, where = target["expr"], (panel["title"], target["refId"])
            kind = _per_node_expr(expr)
            if panel["type"] in ("timeseries", "heatmap", "stat"):
                assert kind != "each", where
                if "{{node}}" in target["legendFormat"]:
                    assert kind == "top", where
            elif kind == "each":
                # A table with a row per node lists the nodes in trouble: a filter (a
                # comparison with a number) in the query bounds it.
                assert re.search(r"(==|!=|<=|>=|<|>) -?\d", expr), where
    for ann in fleet["annotations"]["list"]:
        if "expr" in ann:
            assert _per_node_expr(ann["expr"]) == "none", ann["name"]
    titles = {p["title"] for p in panels}
    assert {"Nodes in trouble", "Nodes in each trouble state",
            "Top 10 nodes by CPU drift (kernel - kubelet)"} <= titles


def test_a_node_in_the_fleet_view_opens_its_node_dashboard():
    """Tables with a node column link the cell, top-k graphs the series, to the node-detail
    dashboard with its node variable set and the time range, datasource, job and cluster
    kept."""
    fleet = json.loads((REPO / "dashboards" / "fleet-overview.json").read_text())
    detail = json.loads((REPO / "dashboards" / "node-detail.json").read_text())
    detail_vars = {v["name"] for v in detail["templating"]["list"]}
    linked = 0
    for panel in (p for p in fleet["panels"] if p["type"] != "row"):
        per_node = any(_per_node_expr(t["expr"]) != "none" for t in panel["targets"])
        links = _node_links(panel)
        assert bool(links) == per_node, panel["title"]
        for url in links:
            m = re.fullmatch(rf"/d/{detail['uid']}/[\w-]+\?var-node=(\S+?)&(.+)", url)
            assert m, url
            node_ref = "${__value.raw}" if panel["type"] == "table" else \
                "${__field.labels.node}"
            assert m.group(1) == node_ref, (panel["title"], url)
            params = m.group(2).split("&")
            assert params[:2] == ["${__url_time_range}", "${datasource:queryparam}"]
            assert {re.fullmatch(r"\$\{(\w+):queryparam\}", p).group(1) for p in params[1:]} \
                <= detail_vars
            linked += 1
    assert linked >= 5


def test_recording_rules_are_used_where_they_exist(board):
    used = " ".join(expr for _, expr in dashboard_exprs(board))
    assert "node_resource_direction:node_resize_resync_duration_seconds:p90_1h" in used
    assert "node_resource:node_resize_readmission_duration_seconds:p90_1h" in used
    # The quantiles a recording rule already computes are not recomputed in a panel.
    assert "histogram_quantile(0.9, sum by (le, resource, direction) (rate(" \
        "node_resize_resync_duration_seconds_bucket" not in used
    assert {n for n in recorded_rules() if n in used}


def test_episode_starts_and_ends_are_annotations(board):
    names = [a["name"] for a in board["annotations"]["list"]]
    assert "Episode starts" in names and "Episode ends" in names


def test_fleet_overview_answers_the_operator_questions():
    fleet = json.loads((REPO / "dashboards" / "fleet-overview.json").read_text())
    panels = {p["title"]: p for p in fleet["panels"] if p["type"] != "row"}
    stale = panels["Nodes whose Node object differs from the kernel, since when"]
    assert stale["type"] == "table"
    assert any("time() - " in t["expr"] and "node_resize_capacity_drift_seconds" in t["expr"]
               for t in stale["targets"])
    assert "Since" in json.dumps(stale["fieldConfig"])
    assert panels["Resync duration (kernel done -> Node updated)"]["type"] == "heatmap"
    rejected = panels["Pods rejected at readmission, by node and reason (time range)"]
    assert 'outcome="rejected"' in rejected["targets"][0]["expr"]
    assert "episodes show" in rejected["description"]


def test_a_real_alertmanager_applies_the_inhibit_rules(tmp_path):
    """The shipped inhibit rules loaded into Debian's Alertmanager: an exporter that cannot be
    scraped mutes what it said about that node, and a stale node mutes its own info notices,
    while another node's alerts stay active."""
    port = free_port()
    (tmp_path / "am-data").mkdir()
    am = Daemon("prometheus-alertmanager", [
        f"--config.file={INHIBIT}", f"--storage.path={tmp_path / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="], port, tmp_path)
    try:
        am.wait_ready()

        def alert(name, node, severity, **labels):
            return {"labels": {"alertname": name, "cluster": "prod", "node": node,
                               "severity": severity, **labels}}
        posted = [
            alert("NodeResizeExporterDown", "node-a", "warning", instance="10.0.0.1:9862"),
            alert("NodeResizeKernelRefused", "node-a", "warning", resource="cpu"),
            alert("NodeResizeCapacityStale", "node-b", "warning", resource="cpu"),
            alert("NodeResizeHotAddedOffline", "node-b", "info", resource="memory"),
            alert("NodeResizePodresourcesOfflineCPUs", "node-b", "critical"),
            alert("NodeResizeKernelRefused", "node-c", "warning", resource="cpu"),
        ]
        request = urllib.request.Request(am.url + "/api/v2/alerts", method="POST",
                                         data=json.dumps(posted).encode(),
                                         headers={"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=5).close()

        want = {
            ("NodeResizeExporterDown", "node-a"): "active",
            ("NodeResizeKernelRefused", "node-a"): "suppressed",  # exporter down there
            ("NodeResizeCapacityStale", "node-b"): "active",
            ("NodeResizeHotAddedOffline", "node-b"): "suppressed",  # info on a stale node
            ("NodeResizePodresourcesOfflineCPUs", "node-b"): "suppressed",  # same cause
            ("NodeResizeKernelRefused", "node-c"): "active",
        }
        # Alertmanager's inhibitor learns of a source alert on its own goroutine: a target read
        # just after the POST can still be "active" (CI saw all three so), so the states are
        # read until they are the expected ones or the wait ends.
        poll_until(lambda: {(a["labels"]["alertname"], a["labels"]["node"]): a["status"]["state"]
                            for a in get_json(am.url + "/api/v2/alerts")},
                   lambda got: got == want, 30, 0.2,
                   lambda got: AssertionError(f"states {got}, want {want}\n{am.logs()}"))
    finally:
        am.stop()


# --- colours that mean what they say ---------------------------------------------------------

RED, GREEN, AMBER = "red", "green", "#EAB839"
GIB, MIB = 2**30, 2**20


def _colour(steps: list[dict], value: float) -> str:
    """The colour Grafana gives `value`: the last step whose value it reaches (the first step,
    value null, is the base)."""
    colour = steps[0]["color"]
    for step in steps[1:]:
        if value >= step["value"]:
            colour = step["color"]
    return colour


def _panels(board: dict) -> list[dict]:
    return [p for p in board["panels"] if p["type"] != "row"]


def _boards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted((REPO / "dashboards").glob("*.json"))}


def _drift_thresholds(panel: dict) -> list[tuple[str, list[dict]]]:
    """(unit, steps) of each drift the panel shows: its defaults, or a table column's."""
    config = panel["fieldConfig"]
    if panel["type"] == "table":
        out = []
        for override in config["overrides"]:
            props = {p["id"]: p["value"] for p in override["properties"]}
            if "thresholds" in props:
                name = override["matcher"]["options"]
                out.append(("bytes" if "Memory" in name else "short",
                            props["thresholds"]["steps"]))
        return out
    thresholds = config["defaults"].get("thresholds")
    return [(config["defaults"]["unit"], thresholds["steps"] if thresholds else [])]


def test_every_drift_panel_is_red_below_green_at_amber_above_in_sync():
    """Negative drift (the kernel has less than the kubelet advertises: pods at risk) red, in
    sync green, positive (capacity not advertised yet) amber; memory within KEP-3953's 100 MiB
    jitter counts as in sync, as the alerts have it."""
    checked = []
    for name, board in _boards().items():
        for panel in _panels(board):
            exprs = " ".join(t["expr"] for t in panel.get("targets", []))
            if not re.search(r"node_resize_capacity_drift\{", exprs):
                continue
            drawn = [t["expr"] for t in panel["targets"] if "node_resize_capacity_drift{" in
                     t["expr"] and not t["expr"].startswith("count")]
            if not drawn:
                continue  # counts nodes in a state, not drift values
            drifts = _drift_thresholds(panel)
            assert drifts and all(steps for _, steps in drifts), (name, panel["title"])
            for unit, steps in drifts:
                if unit == "bytes":
                    cases = {-2 * GIB: RED, -101 * MIB: RED, -50 * MIB: GREEN, 0: GREEN,
                             50 * MIB: GREEN, 101 * MIB: AMBER, 2 * GIB: AMBER}
                else:
                    cases = {-2: RED, -1: RED, 0: GREEN, 1: AMBER, 4: AMBER}
                got = {v: _colour(steps, v) for v in cases}
                assert got == cases, (name, panel["title"], unit, steps)
            checked.append((name, panel["title"]))
    # The node's two stats and two graphs, the fleet's two top-10 graphs and its drift table.
    assert len(checked) >= 7, checked


def test_every_forecast_stat_is_green_at_zero_and_red_from_one_pod():
    checked = []
    for name, board in _boards().items():
        for panel in _panels(board):
            exprs = " ".join(t["expr"] for t in panel.get("targets", []))
            if "readmission_forecast" not in exprs or panel["type"] != "stat":
                continue
            steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
            assert (_colour(steps, 0), _colour(steps, 1), _colour(steps, 20)) == \
                (GREEN, RED, RED), (name, panel["title"], steps)
            checked.append((name, panel["title"]))
    assert {n for n, _ in checked} == {"fleet-overview.json", "node-detail.json"}, checked


def test_no_panel_mixes_units_on_one_axis():
    """A graph's targets share one unit: no cores beside bytes (or a bytes/2^30 GiB line)."""
    for name, board in _boards().items():
        for panel in _panels(board):
            if panel["type"] not in ("timeseries", "stat"):
                continue
            exprs = [t["expr"] for t in panel["targets"]]
            # What each target draws is in its unit, unless it counts nodes (in any unit).
            units = {u for e in exprs if not e.startswith("count(")
                     for u in re.findall(r'unit="(core|byte)"', e)}
            assert len(units) <= 1, (name, panel["title"], units)
            assert not any("2^30" in e or "1073741824" in e for e in exprs), \
                (name, panel["title"])
            if "byte" in units:
                assert panel["fieldConfig"]["defaults"]["unit"] == "bytes", panel["title"]


# Families that are a 0/1 flag (the catalogue's meaning starts "1 when" or "1 while"), and
# Prometheus's own `up`: drawn as they are, they sit on no axis with counts.
FLAGS = {"up"} | {r.name for r in metrics_doc.rows().values()
                  if r.type == "gauge" and re.match(r"1 (when|while|\(reason ok\) while)\b",
                                                    r.meaning)}
CPU_FAMILIES = r"node_resize_(kernel_cpus|podresources_\w+_cpus|kubelet_\w*cpus)\b"
BLOCK_FAMILIES = r"node_resize_(kernel_memory_blocks|memory_blocks_by_zone|" \
                 r"memory_hot_added_blocks)\b(?!_bytes)"


def _quantity(expr: str) -> str | None:
    """What a target counts, where the expression says so: nodes (a count() over them), CPUs,
    memory blocks, or a 0/1 flag drawn as it is; None when it does not say (left alone)."""
    if expr.startswith("count("):
        return "nodes"
    if re.search(CPU_FAMILIES, expr) or re.search(r'unit="core"|resource="cpu"', expr):
        return "CPUs"
    if re.search(BLOCK_FAMILIES, expr):
        return "memory blocks"
    names = set(re.findall(r"\b([a-z_:]+)\{", expr))
    if names & FLAGS and not re.match(r"(sum|avg|count)\b", expr):
        return "0/1 flag"
    return None


@pytest.mark.parametrize("expr, quantity", [
    ("count(max by (node) (x{a=\"1\"}) > 0) or vector(0)", "nodes"),
    ('sum(node_resize_kernel_cpus{state="offline"})', "CPUs"),
    ('max(node_resize_podresources_offline_cpus{job=~"$job"})', "CPUs"),
    ('max(node_resize_kubelet_capacity{resource="cpu"})', "CPUs"),
    ('sum(node_resize_kernel_memory_blocks{state="offline"})', "memory blocks"),
    ('max(node_resize_kernel_memory_blocks_bytes{job=~"$job"})', None),
    ('max by (reason) (node_resize_kubelet_restart_blocked{job=~"$job"})', "0/1 flag"),
    ('avg by (source) (node_resize_exporter_source_up{job=~"$job"})', None),  # a share
    ('max(node_resize_exporter_episodes_open{job=~"$job"})', None),
])
def test_quantity_reads_what_a_target_counts(expr, quantity):
    assert _quantity(expr) == quantity


def test_no_graph_puts_different_counts_on_one_axis():
    """A graph's lines count one thing: no 0/1 flag beside counts, no nodes beside the CPUs or
    memory blocks they have, no CPUs beside memory blocks."""
    assert {"node_resize_kubelet_restart_blocked", "node_resize_exporter_source_up"} <= FLAGS
    mixed = []
    for name, board in _boards().items():
        for panel in _panels(board):
            if panel["type"] not in ("timeseries", "stat"):
                continue
            kinds = {_quantity(t["expr"]) for t in panel["targets"]} - {None}
            if len(kinds) > 1:
                mixed.append((name, panel["title"], sorted(kinds)))
    assert not mixed, mixed


def test_a_state_timeline_is_red_where_its_state_is_bad():
    """Up, attached: green at 1; a kubelet restart blocked: red at 1."""
    for name, board in _boards().items():
        for panel in _panels(board):
            if panel["type"] != "state-timeline":
                continue
            steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
            (mapping,) = panel["fieldConfig"]["defaults"]["mappings"]
            alarm = "restart_blocked" in panel["targets"][0]["expr"]
            want = (GREEN, RED) if alarm else (RED, GREEN)
            assert (_colour(steps, 0), _colour(steps, 1)) == want, (name, panel["title"])
            assert (mapping["options"]["0"]["color"], mapping["options"]["1"]["color"]) == want


def test_the_cluster_variable_is_hidden_unless_the_site_has_several(tmp_path):
    for name, board in _boards().items():
        (cluster,) = [v for v in board["templating"]["list"] if v["name"] == "cluster"]
        assert cluster["hide"] == 2, name  # hidden: variable and label
    gen = _gen()
    assert gen.main(["--out", str(tmp_path), "--multi-cluster"]) == 0
    for path in (tmp_path / "dashboards").glob("*.json"):
        (cluster,) = [v for v in json.loads(path.read_text())["templating"]["list"]
                      if v["name"] == "cluster"]
        assert cluster["hide"] == 0, path.name
