"""bench/fleet.py at its --quick size (50 simulated nodes, ~30 s of scraping, both fleets at
once), so "what 1,000 nodes cost the monitoring" keeps working: a real /usr/bin/prometheus
scraped every target, every series the exporters expose reached its head, the recording rules
and alerts were evaluated, and every dashboard query answered without an error.

No timed assertions: the counts must add up exactly (head series = targets x (series per
scrape + Prometheus' 5 per-target series) + what the rules recorded), which fails when a
target, a relabeling, a rule or a query breaks, whatever the machine's load.
"""
from __future__ import annotations

import json
import math
import os

import pytest
import yaml

from bench import fleet
from bench.table import render

PEER = fleet.node_exporter_path() is not None
NODES, INTERVAL, WINDOW, REPEATS = (fleet.SIZES[k][1] for k in ("nodes", "interval", "window",
                                                                "repeats"))

pytestmark = pytest.mark.promtool


@pytest.fixture(scope="module")
def result():
    if not os.access(fleet.PROMETHEUS, os.X_OK):
        pytest.fail(f"{fleet.PROMETHEUS} not found: run scripts/setup.sh test")
    if not PEER:
        pytest.fail("prometheus-node-exporter missing: run scripts/setup.sh test")
    return fleet.fleet_cost(NODES, INTERVAL, WINDOW, REPEATS, peer=True, parallel=True)


def test_every_target_scraped_and_every_series_in_the_head(result):
    assert set(result["fleets"]) == {fleet.NRE, fleet.NE}
    for job, run in result["fleets"].items():
        per_scrape = result["exposition"][job]["series"]
        assert per_scrape > 0
        # Every target answered; a scrape that timed out on a loaded machine is counted, and
        # may not be most of them.
        assert run["targets"] == NODES and run["up_ever"] == NODES, (job, run)
        assert 0 <= run["scrapes_failed"] < run["scrapes"] / 2, (job, run)
        assert run["samples_scraped"] == NODES * per_scrape, (job, run)
        recorded = run.get("rule_series", 0)
        live = NODES * (per_scrape + fleet.SYNTHETIC_PER_TARGET) + recorded
        assert run["series_live"] == live, (job, run["series_live"], per_scrape, recorded)
        # A static replay never drops a scraped series: whatever the head holds beyond the
        # live ones is a rule's (an alert gone from pending to firing, say), never a target's.
        gone = run["series_gone_by_name"]
        names = {name.split("{")[0] for name in gone}
        assert names <= set(fleet.recorded_rule_names()) | {"ALERTS", "ALERTS_FOR_STATE"}, gone
        assert run["head_series"] == live + sum(gone.values()), (job, run["head_series"], live,
                                                                 gone)
        assert run["rss_bytes"] > 0 and run["rss_peak_bytes"] >= run["rss_bytes"] * 0.5
        assert math.isfinite(run["cpu_cores"]) and run["cpu_cores"] >= 0
        assert run["window_s"] >= WINDOW


def test_the_exporter_ran_as_deployed(result):
    """The recorded scrape is today's exporter joined to an API server (Kubernetes on): the
    kubelet and drift families are in it, and more series than with Kubernetes off."""
    ex = result["exposition"][fleet.NRE]
    assert ex["kubernetes"].startswith("on"), ex["kubernetes"]
    assert {"node_resize_kubelet_capacity", "node_resize_capacity_drift",
            "node_resize_kernel_capacity"} <= set(ex["series_by_name"])
    assert sum(ex["series_by_name"].values()) == ex["series"] > ex["series_kubernetes_off"] > 0


def test_rules_evaluated_per_node(result):
    run = result["fleets"][fleet.NRE]
    groups = {g["name"] for g in yaml.safe_load(fleet.RULES.read_text())["groups"]}
    assert set(run["rule_groups"]) == groups
    for timing in run["rule_groups"].values():
        assert 0 < timing["last_ms"] <= timing["max_ms"]
    # The recording rules keep the per-node series they aggregate by (cluster, node, ...): at
    # least one recorded series per node, and a whole number of them per node.
    assert run["rule_series"] >= NODES and run["rule_series"] % NODES == 0, run["rule_series"]
    assert len(run["slowest_rules"]) == 5
    assert {r["group"] for r in run["slowest_rules"]} <= groups


def test_every_dashboard_query_answers(result):
    q = result["fleets"][fleet.NRE]["queries"]
    exprs = fleet.dashboard_queries()
    variables = sum(1 for e in exprs if e["grafana"] == "labels")
    assert q["expressions"] == len(exprs) > 0 and variables > 0
    assert len(q["rows"]) == 2 * (len(exprs) - variables) + variables
    assert q["errors"] == [], json.dumps(q["errors"], indent=1)[:4000]
    assert all(r["ok"] and r["ms"] > 0 for r in q["rows"])
    # $node's label values are every simulated node: the ServiceMonitor's relabeling made
    # `node` from the pod's node name on every target.
    nodes = [r for r in q["rows"] if r["where"] == "variable $node"]
    assert nodes and all(r["series"] == NODES for r in nodes), nodes
    # Queries over series every node has are not empty.
    versions = [r for r in q["rows"] if r["where"].startswith("Exporter versions")]
    assert versions and all(r["series"] == 1 for r in versions), versions
    assert len(q["slowest"]) == 5
    assert q["as_grafana_sends_them"]["n"] == len(exprs)


def test_the_table_renders(result):
    results = {"machine": {"nproc": 2, "kernel": "k", "cpu_model": "m", "mem_gib": 1.0,
                           "python": "3.11", "node_exporter": "x"},
               "quick": True, "command": "bench/run.py fleet --quick",
               "fleet": json.loads(json.dumps(result))}
    text = render(results)
    assert f"### What {NODES} nodes cost the monitoring" in text
    assert f"| targets up at least once | {NODES}/{NODES} | {NODES}/{NODES} |" in text
