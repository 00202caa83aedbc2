"""alerts/, dashboards/ and docs/runbooks.md against real promtool and the metric catalogue.

- `promtool check rules` and `promtool test rules` pass, and every alert has a firing and a
  non-firing promtool case that asserts its labels and annotations;
- every alert carries severity, summary, description, a runbook_url whose anchor exists and a
  dashboard_url that opens a committed dashboard on the alert's node;
- every PromQL expression in the dashboards parses (each is wrapped in a temporary rule file
  and given to promtool), and every metric name in dashboards and alerts is in the catalogue,
  docs/metrics.md (plus recording rules of our own), so a renamed metric breaks a test.
  tests/kernel/test_prometheus_e2e.py checks the same names against a live scrape.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import promql_parser
import pytest
import yaml

from testkit import metrics_doc
from testkit.monitoring import as_promql, dashboard_exprs, recorded_rules, rule_groups, walk

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "alerts" / "node-resize-exporter.rules.yml"
RULE_TESTS = sorted((REPO / "alerts" / "tests").glob("*.yml"))
RUNBOOKS = REPO / "docs" / "runbooks.md"
DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))
RUNBOOK_BASE = ("https://github.com/node-resize-exporter/node-resize-exporter/blob/main/"
                "docs/runbooks.md#")
ANNOTATIONS = {"summary", "description", "runbook_url", "dashboard_url"}
SEVERITIES = {"critical", "warning", "info"}
# Series Prometheus itself makes for every target.
PROMETHEUS_SERIES = {"up"}

pytestmark = pytest.mark.promtool


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: run scripts/setup.sh test (Debian package prometheus)")
    return path


def _run_promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([_promtool(), *args], capture_output=True, text=True, timeout=120)



def _alerts() -> list[dict]:
    return [r for g in rule_groups() for r in g["rules"] if "alert" in r]




# --- promtool on the rule files --------------------------------------------------------------

def test_promtool_check_rules():
    result = _run_promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_test_rules():
    assert RULE_TESTS, "no promtool test files under alerts/tests/"
    result = _run_promtool("test", "rules", *map(str, RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_test_rules_fails_on_a_wrong_expectation(tmp_path):
    """The promtool tests can fail: a changed expected annotation must be reported."""
    shutil.copy(RULES, tmp_path / RULES.name)
    (tmp_path / "tests").mkdir()
    text = RULE_TESTS[0].read_text().replace("after a hot-unplug, so the scheduler",
                                             "after a hot-unplug, so the kubelet", 1)
    assert text != RULE_TESTS[0].read_text()
    broken = tmp_path / "tests" / RULE_TESTS[0].name
    broken.write_text(text)
    result = _run_promtool("test", "rules", str(broken))
    assert result.returncode != 0
    assert "NodeResizeCapacityStale" in result.stdout + result.stderr


def test_recording_rules_come_before_alerts():
    kinds = ["record" if "record" in r else "alert" for g in rule_groups() for r in g["rules"]]
    assert kinds == sorted(kinds, key=lambda k: k != "record")
    assert "record" in kinds and "alert" in kinds


# --- alert conventions -----------------------------------------------------------------------

REQUIRED_ALERTS = {
    "NodeResizeCapacityStale", "NodeResizeCapacityStranded", "NodeResizeKernelRefused",
    "NodeResizeReadmissionRejectedPods", "NodeResizeResyncSlow",
    "NodeResizePodresourcesOfflineCPUs", "NodeResizeHotAddedOffline",
    "NodeResizeBalloonRequestsAboveAllocatable", "NodeResizeBalloonResizeInfeasible",
    "NodeResizeExporterDown", "NodeResizeExporterSourceDown", "NodeResizeExporterEventsLost",
    "NodeResizeRestartWouldRejectPods", "NodeResizeRunningContainersStale",
    "NodeResizeExporterSinkDown", "NodeResizeExporterAbsent", "NodeResizeExporterSeriesAbsent",
}
# absent() rules: about the whole job, so no node; their dashboard_url opens the fleet overview.
FLEET_WIDE = {"NodeResizeExporterAbsent", "NodeResizeExporterSeriesAbsent"}


def test_required_alerts_exist_once_each():
    names = [a["alert"] for a in _alerts()]
    assert len(names) == len(set(names))
    assert REQUIRED_ALERTS <= set(names)


@pytest.mark.parametrize("alert", _alerts(), ids=lambda a: a["alert"])
def test_alert_is_named_labelled_and_annotated(alert):
    assert re.fullmatch(r"NodeResize(?:[A-Z][a-z0-9]*|[A-Z]+(?=[A-Z][a-z]|s?$)s?)+",
                        alert["alert"]), "CamelCase with the NodeResize prefix"
    assert alert["labels"]["severity"] in SEVERITIES
    annotations = alert["annotations"]
    assert set(annotations) == ANNOTATIONS
    assert annotations["summary"].strip() and annotations["description"].strip()
    assert annotations["runbook_url"] == RUNBOOK_BASE + alert["alert"].lower()


def _keeps(node, label: str, recorded: dict[str, str]) -> bool:
    """Whether every series a PromQL expression returns still has `label` where its inputs,
    the exporter's series, have it (a recording rule is read through its own expression)."""
    if isinstance(node, (promql_parser.VectorSelector, promql_parser.MatrixSelector)):
        selector = node if isinstance(node, promql_parser.VectorSelector) else \
            node.vector_selector
        name = selector.name
        return name not in recorded or _keeps(promql_parser.parse(recorded[name]), label,
                                              recorded)
    if isinstance(node, (promql_parser.ParenExpr, promql_parser.UnaryExpr,
                         promql_parser.SubqueryExpr)):
        return _keeps(node.expr, label, recorded)
    if isinstance(node, promql_parser.Call):
        if node.func.name in ("absent", "absent_over_time", "vector", "time", "scalar"):
            return False
        vectors = [a for a in node.args if not isinstance(
            a, (promql_parser.StringLiteral, promql_parser.NumberLiteral))]
        return all(_keeps(a, label, recorded) for a in vectors)
    if isinstance(node, promql_parser.AggregateExpr):
        modifier = node.modifier
        if modifier is None:
            return str(node.op) in ("topk", "bottomk", "limitk") and \
                _keeps(node.expr, label, recorded)
        kept = (label in modifier.labels) == (modifier.type == promql_parser.AggModifierType.By)
        return kept and _keeps(node.expr, label, recorded)
    if isinstance(node, promql_parser.BinaryExpr):
        op = str(node.op)
        scalar = (promql_parser.NumberLiteral, promql_parser.StringLiteral)
        if isinstance(node.rhs, scalar):
            return _keeps(node.lhs, label, recorded)
        if isinstance(node.lhs, scalar):
            return _keeps(node.rhs, label, recorded)
        if op == "or":
            return _keeps(node.lhs, label, recorded) and _keeps(node.rhs, label, recorded)
        matching = node.modifier.matching if node.modifier else None
        filters = op in ("and", "unless") or (op in ("==", "!=", ">", "<", ">=", "<=")
                                              and not node.modifier.return_bool)
        if matching is not None and not filters and \
                str(node.modifier.card).endswith("OneToOne"):
            # One-to-one arithmetic keeps only the `on` labels, or drops the `ignoring` ones.
            included = matching.type == promql_parser.LabelModifierType.Include
            if (label in matching.labels) != included:
                return False
        return _keeps(node.lhs, label, recorded)
    return False


@pytest.mark.parametrize("expr, kept", [
    ('max by (cluster, namespace, node) (x{job="j"}) > 0', True),
    ('max by (cluster, node) (x{job="j"}) > 0', False),
    ('absent(up{job="j"})', False),
    ('x > 0 unless on (node) y', True),
    ('sum(x) > 0', False),
    ('label_replace(max by (namespace, node) (x), "resource", "cpu", "", "") or '
     'max by (node) (y)', False),
    ('increase(x[15m]) > 0', True),
    ("recorded:x > 1", False),
])
def test_keeps_reads_promql(expr, kept):
    assert _keeps(promql_parser.parse(expr), "namespace",
                  {"recorded:x": "sum by (node) (x)"}) == kept


@pytest.mark.parametrize("alert", _alerts(), ids=lambda a: a["alert"])
def test_every_alert_keeps_the_exporters_namespace(alert):
    """kube-prometheus-stack pairs alerts on `namespace`: its InfoInhibitor holds back an info
    alert unless a warning or critical one fires in the same namespace, and its inhibit rules
    have equal: [namespace]. An alert that aggregates the label away is paired with every other
    namespace-less alert of the cluster instead of with the exporter's own (tests/e2e/
    test_alerts_kube_prometheus_stack.py delivers them through a real Alertmanager). absent()
    has no target labels: those alerts carry the namespace as a fixed label."""
    recorded = {r["record"]: r["expr"] for g in rule_groups() for r in g["rules"]
                if "record" in r}
    if "absent(" in alert["expr"]:
        assert alert["labels"].get("namespace") == "node-resize-exporter"
    else:
        assert "namespace" not in alert["labels"]
        assert _keeps(promql_parser.parse(alert["expr"]), "namespace", recorded), alert["expr"]


def _selectors(node) -> list:
    """Every vector selector in a PromQL tree."""
    if isinstance(node, promql_parser.VectorSelector):
        return [node]
    if isinstance(node, promql_parser.MatrixSelector):
        return [node.vector_selector]
    out = []
    for attr in ("expr", "lhs", "rhs"):
        if hasattr(node, attr) and getattr(node, attr) is not None:
            out += _selectors(getattr(node, attr))
    for arg in getattr(node, "args", None) or []:
        out += _selectors(arg)
    return out


def test_only_the_global_groups_read_more_than_one_target():
    """With scrapes sharded, a shard holds some nodes' exporters and nothing else. A rule
    outside a `.global` group must be right there: it keeps the node (no absent(), no sum over
    nodes) and reads only the exporter's job; what does not is marked for the global ruler."""
    groups = rule_groups()
    recorded = {r["record"]: r["expr"] for g in groups for r in g["rules"] if "record" in r}
    marked = []
    for group in groups:
        for rule in group["rules"]:
            tree = promql_parser.parse(rule["expr"])
            jobs = {str(m) for s in _selectors(tree) for m in s.matchers.matchers
                    if m.name == "job"} - {'job="node-resize-exporter"'}
            per_node = _keeps(tree, "node", recorded) and not jobs
            name = rule.get("record") or rule.get("alert")
            if group["name"].endswith(".global"):
                marked.append((name, per_node))
            else:
                assert per_node, (group["name"], name, jobs)
    assert marked and not any(per_node for _, per_node in marked), marked


@pytest.mark.parametrize("alert", _alerts(), ids=lambda a: a["alert"])
def test_dashboard_url_opens_a_committed_dashboard_on_the_alerts_node(alert):
    """Relative (/d/<uid>/<slug>?...: Grafana's address is the site's; a notification template
    prefixes it, or scripts/gen-monitoring.py --grafana-url makes it absolute), on a dashboard
    that exists, with the node (and cluster) variables set from the alert's labels."""
    url = alert["annotations"]["dashboard_url"]
    m = re.fullmatch(r"/d/([\w-]+)/[\w-]+\?(.+)", url)
    assert m, url
    uids = {json.loads(p.read_text())["uid"]: p for p in DASHBOARDS}
    assert m.group(1) in uids, f"{url}: no committed dashboard has uid {m.group(1)}"
    board = json.loads(uids[m.group(1)].read_text())
    variables = {v["name"] for v in board["templating"]["list"]}
    params = dict(part.split("=", 1) for part in m.group(2).split("&"))
    if alert["alert"] in FLEET_WIDE:
        assert "absent(" in alert["expr"] and m.group(1) == "nre-fleet-overview", url
        assert "var-node" not in params
    else:
        assert "absent(" not in alert["expr"], "an absent() rule is fleet-wide: list it"
        assert params["var-node"] == "{{ $labels.node }}"
    assert params.get("var-cluster") == "{{ $labels.cluster }}"
    assert {k.removeprefix("var-") for k in params} <= variables


def _runbook_anchors() -> set[str]:
    # GitHub's anchor for "## NodeResizeFoo" is "noderesizefoo".
    return {m.lower() for m in re.findall(r"^## (\S+)\s*$", RUNBOOKS.read_text(), re.M)}


def test_every_alert_has_a_runbook_section_and_no_section_is_orphaned():
    anchors = _runbook_anchors()
    linked = {a["annotations"]["runbook_url"].split("#", 1)[1] for a in _alerts()}
    assert linked == anchors


@pytest.mark.parametrize("alert", sorted(REQUIRED_ALERTS))
def test_runbook_section_says_meaning_confirm_and_fix(alert):
    text = RUNBOOKS.read_text()
    section = re.search(rf"^## {alert}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S).group(1)
    for part in ("**Meaning.**", "**Confirm.**", "**Fix"):
        assert part in section, f"{alert}: no {part} part"
    # Confirm with commands: an indented code block.
    assert re.search(r"^    \S", section, re.M), f"{alert}: no commands to confirm with"


def _alert_rule_tests() -> list[dict]:
    cases = []
    for path in RULE_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            cases.extend(test.get("alert_rule_test", []))
    return cases


@pytest.mark.parametrize("alert", _alerts(), ids=lambda a: a["alert"])
def test_alert_has_firing_and_silent_promtool_cases(alert):
    cases = [c for c in _alert_rule_tests() if c["alertname"] == alert["alert"]]
    firing = [c for c in cases if c.get("exp_alerts")]
    assert firing, f"{alert['alert']}: no promtool case where it fires"
    assert any(not c.get("exp_alerts") for c in cases), \
        f"{alert['alert']}: no promtool case where it stays silent"
    for case in firing:
        for exp in case["exp_alerts"]:
            assert exp["exp_labels"]["severity"] == alert["labels"]["severity"]
            assert set(exp["exp_annotations"]) == ANNOTATIONS
            # Every alert but the absent() ones is about one node: its dashboard_url has a
            # node to open.
            if alert["alert"] in FLEET_WIDE:
                assert "node" not in exp["exp_labels"], exp
            else:
                assert exp["exp_labels"].get("node"), exp


# --- dashboards ------------------------------------------------------------------------------







@pytest.fixture(params=DASHBOARDS, ids=lambda p: p.name)
def dashboard(request) -> dict:
    return json.loads(request.param.read_text())


def test_both_dashboards_exist():
    assert {p.name for p in DASHBOARDS} >= {"fleet-overview.json", "node-detail.json"}


def test_dashboard_is_importable_as_is(dashboard):
    assert dashboard["schemaVersion"] >= 39
    assert dashboard["uid"] and dashboard["title"]
    assert dashboard.get("id") is None, "an exported id would collide on import"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    # No hard-coded datasource: every reference goes through ${datasource}, except Grafana's
    # own built-in annotation source.
    for node in walk(dashboard):
        ref = node.get("datasource")
        if isinstance(ref, dict) and ref.get("type") != "grafana":
            assert ref == {"type": "prometheus", "uid": "${datasource}"}, ref
        elif ref is not None and not isinstance(ref, dict):
            pytest.fail(f"datasource given by name: {ref!r}")
    ids = [p["id"] for p in walk(dashboard["panels"]) if "gridPos" in p]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in walk(dashboard["panels"]):
        if "gridPos" in panel:
            pos = panel["gridPos"]
            assert pos["x"] + pos["w"] <= 24, panel["title"]


def test_dashboard_shows_episodes_as_annotations(dashboard):
    exprs = [a["expr"] for a in dashboard["annotations"]["list"] if "expr" in a]
    assert any(re.search(r"changes\(node_(resize_resync|hot_unplug)_request_total", e)
               for e in exprs)


def test_node_detail_has_a_node_variable_used_by_every_query():
    detail = json.loads((REPO / "dashboards" / "node-detail.json").read_text())
    node = {v["name"]: v for v in detail["templating"]["list"]}["node"]
    assert node["type"] == "query" and not node["multi"]
    for where, expr in dashboard_exprs(detail):
        if not where.startswith("variable"):
            assert 'node="$node"' in expr, f"{where}: not restricted to $node: {expr}"


def test_fleet_overview_has_the_panels_the_issue_asks_for():
    fleet = json.loads((REPO / "dashboards" / "fleet-overview.json").read_text())
    text = " ".join(expr for _, expr in dashboard_exprs(fleet))
    for metric in ["node_resize_resync_request_total", "node_hot_unplug_request_total",
                   "node_resize_resync_errors_total", "node_hot_unplug_errors_total",
                   "node_resize_resync_duration_seconds_bucket",
                   "node_resize_readmission_duration_seconds_bucket",
                   "node_resize_capacity_drift_seconds", "node_resize_balloon_requests",
                   "node_resize_kernel_capacity", "node_resize_capacity_effective",
                   "node_resize_exporter_source_up", "node_resize_exporter_events_lost_total"]:
        assert metric in text, metric
    assert any(p["type"] == "heatmap" for p in fleet["panels"])


def test_every_dashboard_expression_parses_in_promtool(dashboard, tmp_path):
    exprs = dashboard_exprs(dashboard)
    assert exprs
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": as_promql(expr)}
        for i, (_, expr) in enumerate(exprs)]}]}
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump(rules))
    result = _run_promtool("check", "rules", str(path))
    if result.returncode != 0:
        # Name the failing expressions, one promtool run each.
        bad = []
        for where, expr in exprs:
            path.write_text(yaml.safe_dump({"groups": [{"name": "one", "rules": [
                {"record": "dashboard:expr", "expr": as_promql(expr)}]}]}))
            one = _run_promtool("check", "rules", str(path))
            if one.returncode != 0:
                bad.append(f"{where}: {expr}\n{one.stdout}{one.stderr}")
        pytest.fail("\n".join(bad) or result.stdout + result.stderr)


def test_promtool_rejects_a_broken_expression(tmp_path):
    """The wrapping really reaches promtool's parser."""
    path = tmp_path / "broken.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [
        {"record": "dashboard:expr", "expr": "sum by (node (rate(x[1m]))"}]}]}))
    assert _run_promtool("check", "rules", str(path)).returncode != 0


# --- metric names are the catalogue's --------------------------------------------------------

def catalogue() -> set[str]:
    """Sample names of docs/metrics.md (tests/e2e/test_catalogue.py checks it against a scrape)."""
    return {name for row in metrics_doc.rows().values() for name in metrics_doc.sample_names(row)}


def metric_names(expr: str) -> set[str]:
    names: set[str] = set()

    def visit(node):
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"selector without a metric name in {expr!r}"
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(as_promql(expr)), visit)
    return names


def used_metric_names() -> dict[str, set[str]]:
    """metric name -> where it is used (alerts and dashboards)."""
    used: dict[str, set[str]] = {}
    for group in rule_groups():
        for rule in group["rules"]:
            for name in metric_names(rule["expr"]):
                used.setdefault(name, set()).add(rule.get("alert") or rule["record"])
    for path in DASHBOARDS:
        for where, expr in dashboard_exprs(json.loads(path.read_text())):
            for name in metric_names(expr):
                used.setdefault(name, set()).add(f"{path.name} {where}")
    return used


def test_metric_name_parser_finds_selectors():
    assert metric_names('sum by (node) (rate(a_total{x="y"}[$__rate_interval])) / on (node) '
                        'b or histogram_quantile(0.9, c_bucket) > bool 1') == \
        {"a_total", "b", "c_bucket"}


def test_every_metric_in_dashboards_and_alerts_is_in_the_catalogue():
    known = catalogue() | recorded_rules() | PROMETHEUS_SERIES
    unknown = {name: sorted(where) for name, where in used_metric_names().items()
               if name not in known}
    assert not unknown, f"metrics not in the catalogue: {json.dumps(unknown, indent=1)}"


def _exposed_names(exposition: str) -> set[str]:
    """Sample names each declared family can have (families are declared even when empty)."""
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)", exposition, re.M):
        if kind == "counter":
            names.add(name if name.endswith("_total") else f"{name}_total")
        elif kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        else:
            names.add(name)
    return names


def test_every_metric_in_dashboards_and_alerts_is_in_a_live_scrape(tmp_path):
    """A real `node-resize-exporter run` joined to a fake API server and a podresources
    socket (so every source has a reason to declare its families) exposes every name used."""
    from exporter.sources.kubelet.proto import podresources_pb2 as pb
    from testkit.exporter_proc import RunningExporter
    from testkit.fakes.apiserver import FakeApiServer
    from testkit.fakes.podresources import Kubelet, Server

    kubelet = Kubelet()
    kubelet.answer = pb.AllocatableResourcesResponse(cpu_ids=[0])
    sock = str(tmp_path / "kubelet.sock")
    server = Server(sock, kubelet)
    state = tmp_path / "state"  # a journal, for the sink's series
    state.mkdir(mode=0o700)
    try:
        with FakeApiServer() as api:
            api.set_node("live-node", cpu="2", memory="8Gi")
            kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
            with RunningExporter("--source", "sysfs", "--kubeconfig", kubeconfig,
                                 "--node-name", "live-node",
                                 "--podresources-socket", sock,
                                 "--journal", str(state / "journal.db")) as exporter:
                # podresources declares its families once it has had an answer, the kernel
                # ones once the first sysfs read is in: two threads, either first.
                scrape = exporter.wait_for(
                    lambda s: s.value("node_resize_exporter_source_up", source="podresources")
                    == 1.0 and s.series("node_resize_kernel_capacity"), timeout=30)
                exposed = _exposed_names(scrape.text)
    finally:
        server.stop()
    assert scrape is not None
    known = exposed | recorded_rules() | PROMETHEUS_SERIES
    missing = {name: sorted(where) for name, where in used_metric_names().items()
               if name not in known}
    assert not missing, f"used but not exposed: {json.dumps(missing, indent=1)}"
