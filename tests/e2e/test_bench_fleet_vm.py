"""bench/fleet_vm.py at its --quick size (40 replayed nodes, 2 vmagent shards, seconds of
scraping): the fleet past one Prometheus keeps working. Debian's vmagent shards scrape every
target once between them into Debian's VictoriaMetrics, vmalert evaluates the project's rules
against it split as a sharded fleet runs them (the `.global` groups on one global ruler, the
others on one ruler per shard seeing only its shard's series), each shard's ruler raises exactly
the alerts of its own shard's faulty nodes, the global ruler none, and every dashboard query
answers from the store.

No timed assertions: counts must add up exactly, whatever the machine's load.
"""
from __future__ import annotations

import json
import os

import promql_parser
import pytest
import yaml

from bench import fleet, fleet_vm

NODES, SHARDS, INTERVAL, WINDOW, REPEATS = (fleet_vm.SIZES[k][1] for k in (
    "nodes", "shards", "interval", "window", "repeats"))
FAULTY = sum(map(fleet_vm.faulty, range(NODES)))

pytestmark = pytest.mark.promtool


@pytest.fixture(scope="module")
def result():
    for binary in (fleet_vm.VICTORIA_METRICS, fleet_vm.VMAGENT, fleet_vm.VMALERT):
        if not os.access(binary, os.X_OK):
            pytest.fail(f"{binary} not found: run scripts/setup.sh test")
    return fleet_vm.fleet_vm(NODES, SHARDS, INTERVAL, WINDOW, REPEATS)


def test_the_shards_scrape_every_target_once_between_them(result):
    per_scrape = result["exposition"]["series"]
    assert result["exposition"]["content_type"].startswith("text/plain; version=0.0.4")
    assert result["up"] == result["up_ever"] == NODES
    per_shard = result["targets_per_shard"]
    assert set(per_shard) == {str(s) for s in range(SHARDS)}, per_shard
    assert sum(per_shard.values()) == NODES and all(per_shard.values()), per_shard
    assert result["scrapes_failed"] < result["scrapes"] / 2, result
    # Every series of every node reached the store (the faulty copy has the same series).
    assert result["samples_scraped"] == NODES * per_scrape, result
    assert result["store_series"] >= NODES * per_scrape
    for name, proc in result["processes"].items():
        assert proc["rss_bytes"] > 0 and proc["cpu_cores"] >= 0, (name, proc)


def test_each_ruler_evaluates_its_groups(result):
    groups = {g["name"] for g in yaml.safe_load(fleet.RULES.read_text())["groups"]}
    glob = {g for g in groups if g.endswith(".global")}
    assert glob and set(result["rule_groups"]["vmalert-global"]) == glob
    for s in range(SHARDS):
        assert set(result["rule_groups"][f"vmalert-shard-{s}"]) == groups - glob
    assert all(t["evaluations"] > 0 for r in result["rule_groups"].values() for t in r.values())


def test_each_faulty_nodes_alerts_come_once_from_its_own_shard(result):
    check = result["alert_check"]
    assert sum(check["nodes_per_shard"]) == NODES and all(check["nodes_per_shard"])
    assert check["wanted"] == FAULTY * len(fleet_vm.FAULTS)
    assert check["correct"], json.dumps(check, indent=1)
    assert check["raised_once"] == check["wanted"]
    assert result["alerts_by_name"] == {alert: FAULTY for _, alert in fleet_vm.FAULTS.values()}
    assert [x["alerts"] for x in check["shards"]] == [x["want"] for x in check["shards"]]


def test_the_global_ruler_sees_every_node_and_raises_nothing(result):
    check = result["alert_check"]
    assert check["global_alerts"] == {}
    recorded = check["global_recordings_nodes"]
    assert recorded and all(v == NODES for v in recorded.values()), recorded


def test_each_rule_is_timed_on_the_whole_store_and_on_one_shard(result):
    costs = result["rule_costs"]
    assert len(costs) == sum(len(g["rules"]) for g in
                             yaml.safe_load(fleet.RULES.read_text())["groups"])
    assert all("fleet_error" not in c and "shard_error" not in c for c in costs), costs
    up = next(c for c in costs if c["rule"] == "NodeResizeExporterSourceDown")
    # Against shard 0's series: its own faulty nodes only (the hash may give it none of 4).
    on_shard_0 = result["alert_check"]["shards"][0]["want"] // len(fleet_vm.FAULTS)
    assert up["fleet_series"] == FAULTY and up["shard_series"] == on_shard_0


def test_every_dashboard_query_answers_from_the_store(result):
    q = result["queries"]
    exprs = fleet.dashboard_queries()
    variables = sum(1 for e in exprs if e["grafana"] == "labels")
    assert q["expressions"] == len(exprs) > 0
    assert len(q["rows"]) == 2 * (len(exprs) - variables) + variables
    assert q["errors"] == [], json.dumps(q["errors"], indent=1)[:4000]
    nodes = [r for r in q["rows"] if r["where"] == "variable $node"]
    assert nodes and all(r["series"] == NODES for r in nodes), nodes


def test_the_table_renders(result):
    text = fleet_vm.render(result)
    assert f"| targets up | {NODES}/{NODES} |" in text
    assert "NodeResizeExporterAbsent" in text  # a global ruler's rule, named


# --- which rules a shard may evaluate -------------------------------------------------------

@pytest.mark.parametrize("expr, per_node", [
    ("up == 0", True),
    ("max by (cluster, node, reason) (x) > 0", True),
    ("sum without (pod) (x)", True),
    ("a unless on (cluster, node) b", True),
    ("a unless on (instance) up == 1", True),
    ('label_replace(sum by (node) (x), "direction", "up", "", "")', True),
    ("sum(up)", False),
    ("sum by (cluster) (x) > 0", False),
    ("sum without (node) (x)", False),
    ('absent(up{job="x"})', False),
    ("x and on () count(up == 1) > 0", False),
    ("a / ignoring (node) b", False),
    ('label_replace(x, "node", "$1", "instance", "(.*)")', False),
])
def test_rule_scope_keeps_node_or_goes_global(expr, per_node):
    assert fleet_vm._per_node(promql_parser.parse(expr), {}) is per_node


def test_a_rule_reading_a_cross_node_recording_goes_global(tmp_path):
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [
        {"record": "cluster:up:sum", "expr": "sum by (cluster) (up)"},
        {"record": "node:up:max", "expr": "max by (cluster, node) (up)"},
        {"alert": "A", "expr": "cluster:up:sum < 3"},
        {"alert": "B", "expr": "node:up:max == 0"}]}]}))
    assert fleet_vm.rule_scope(rules) == {"cluster:up:sum": "global", "node:up:max": "node",
                                          "A": "global", "B": "node"}


def test_a_cross_node_rule_outside_a_global_group_is_refused(tmp_path):
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": [
        {"name": "x.rules", "rules": [{"alert": "A", "expr": "sum(up) < 3"}]},
        {"name": "x.alerts.global", "rules": [{"alert": "B", "expr": "absent(up)"}]}]}))
    with pytest.raises(ValueError, match="A read other nodes"):
        fleet_vm.split_rules(rules, fleet_vm.rule_scope(rules))


def test_the_shipped_rules_split_into_shard_and_global_groups():
    glob, local = fleet_vm.split_rules(fleet.RULES, fleet_vm.rule_scope())
    assert glob and local
    assert all(g["name"].endswith(".global") for g in glob)


def test_the_shipped_rules_that_need_the_global_ruler():
    """What bench/README.md says must run on the global ruler."""
    scope = fleet_vm.rule_scope()
    assert {r for r, s in scope.items() if s == "global"} == {
        "NodeResizeExporterAbsent", "NodeResizeExporterSeriesAbsent"}


def test_the_healthy_replay_does_not_carry_the_recording_machines_faults():
    """Recorded while another session had a CPU offline, every replayed node would raise
    NodeResizeCapacityStale: the healthy copy says what a healthy node says."""
    body = b"\n".join([
        b'node_resize_capacity_drift{resource="cpu",unit="core"} -1.0',
        b'node_resize_kernel_cpus{state="offline"} 1.0',
        b'node_resize_exporter_source_up{source="sysfs"} 0.0',
        b'node_resize_exporter_source_up{source="kubelet_process"} 0.0',
        b'node_resize_readmission_forecast_valid{reason="no_pods"} 0.0', b""])
    assert fleet_vm.healthy(body) == b"\n".join([
        b'node_resize_capacity_drift{resource="cpu",unit="core"} 0.0',
        b'node_resize_kernel_cpus{state="offline"} 0.0',
        b'node_resize_exporter_source_up{source="sysfs"} 1.0',
        b'node_resize_exporter_source_up{source="kubelet_process"} 0.0',
        b'node_resize_readmission_forecast_valid{reason="no_pods"} 1.0', b""])
