"""bench/fleet_vm.py at its --quick size (40 replayed nodes, 2 vmagent shards, seconds of
scraping): the fleet past one Prometheus keeps working. Debian's vmagent shards scrape every
target once between them into Debian's VictoriaMetrics, vmalert evaluates the project's rules
against it and raises exactly the faulty nodes' alerts, every dashboard query answers from the
store, and a shard-local ruler running the per-node rules raises exactly the alerts of its own
shard's nodes.

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


def test_the_global_ruler_raises_each_faulty_nodes_alerts(result):
    groups = {g["name"] for g in yaml.safe_load(fleet.RULES.read_text())["groups"]}
    assert set(result["rule_groups"]) == groups
    assert all(t["evaluations"] > 0 for t in result["rule_groups"].values())
    want = {alert: FAULTY for _, alert in fleet_vm.FAULTS.values()}
    assert result["alerts_by_name"] == want, result["alerts_by_name"]


def test_per_node_alerts_are_the_same_on_any_one_shard(result):
    check = result["shard_check"]
    assert sum(check["nodes_per_shard"]) == NODES and all(check["nodes_per_shard"])
    assert check["global_per_node_alerts"] == FAULTY * len(fleet_vm.FAULTS)
    assert check["correct"], json.dumps(check, indent=1)
    assert check["alerts_by_name"] == result["alerts_by_name"]


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


def test_the_shipped_rules_that_need_the_global_ruler():
    """What bench/README.md says must run on the global ruler."""
    scope = fleet_vm.rule_scope()
    assert {r for r, s in scope.items() if s == "global"} == {
        "NodeResizeExporterAbsent", "NodeResizeExporterSeriesAbsent"}
