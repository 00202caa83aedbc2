"""scripts/gen-monitoring.py: the committed rules, inhibit rules, dashboards and PrometheusRule
are what it generates; its parameters reach every file; the outputs pass promtool and amtool;
the dashboards follow the rules issue 12 sets (windows valid at any scrape interval, a cluster
variable, recording rules where they exist, one panel per operator question)."""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from testkit.exporter_proc import free_port
from testkit.monitoring import dashboard_exprs, recorded_rules
from testkit.prometheus import Daemon, get_json, wait_for

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
            "deploy/prometheusrule.yaml", "dashboards/fleet-overview.json",
            "dashboards/node-detail.json"} <= set(files)
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
                     "--runbook-url", "https://wiki.example/nre#{anchor}"]) == 0
    rules_path = tmp_path / "alerts" / "node-resize-exporter.rules.yml"
    rules = yaml.safe_load(rules_path.read_text())
    text = rules_path.read_text()
    assert 'job="node-resize-exporter"' not in text and "(cluster, node" not in text
    assert "by (k8s_cluster, node, resource)" in text
    assert 'up{job="nre"} == 0' in text
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    for alert in alerts:
        assert alert["annotations"]["runbook_url"] == \
            f"https://wiki.example/nre#{alert['alert'].lower()}"
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
            'label_values(node_resize_exporter_build_info{job="nre"}, k8s_cluster)'
        for where, expr in dashboard_exprs(board):
            if where.startswith("variable 'cluster'"):
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
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource", "node"]


@pytest.mark.parametrize("bad", [["--cluster-label", "a-b"], ["--job-selector", "job=x"],
                                 ["--runbook-url", "https://example/runbooks"]])
def test_bad_parameters_are_refused(bad, tmp_path):
    with pytest.raises(SystemExit, match=re.escape(bad[0])):
        _gen().main(["--out", str(tmp_path), *bad])


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
    assert variables == ["datasource", "cluster", "node"]
    for where, expr in dashboard_exprs(board):
        if where != "variable 'cluster'":
            assert 'cluster="$cluster"' in expr, (where, expr)


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

        def states():
            got = {(a["labels"]["alertname"], a["labels"]["node"]): a["status"]["state"]
                   for a in get_json(am.url + "/api/v2/alerts")}
            return got if len(got) == len(posted) and "unprocessed" not in got.values() \
                else None
        got = wait_for("Alertmanager to process the alerts", states, timeout=30, logs=am.logs)
        assert got == {
            ("NodeResizeExporterDown", "node-a"): "active",
            ("NodeResizeKernelRefused", "node-a"): "suppressed",  # exporter down there
            ("NodeResizeCapacityStale", "node-b"): "active",
            ("NodeResizeHotAddedOffline", "node-b"): "suppressed",  # info on a stale node
            ("NodeResizePodresourcesOfflineCPUs", "node-b"): "suppressed",  # same cause
            ("NodeResizeKernelRefused", "node-c"): "active",
        }
    finally:
        am.stop()
