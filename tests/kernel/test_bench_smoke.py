"""Each benchmark of bench/ for a few iterations, so it keeps working.

No timed assertions: only that every benchmark ran on the real kernel and produced well-formed
numbers (finite, non-negative, counts that add up). node_exporter (Debian's
prometheus-node-exporter, `scripts/setup.sh bench`) is measured when it is installed.
"""
from __future__ import annotations

import contextlib
import json
import math

import pytest

from bench import correlator, latency, overhead, scrape_load, storm
from bench.procs import node_exporter_path
from bench.table import render

PEER = node_exporter_path() is not None
HELD = contextlib.nullcontext  # the cpu1 / memory_block fixture holds the hotplug lock already


def finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def well_formed(summary: dict, n: int | None = None) -> None:
    assert summary["n"] > 0, summary
    if n is not None:
        assert summary["n"] == n, summary
    for key in ("median", "p99", "min", "max"):
        assert finite(summary[key]), summary
    assert summary["min"] <= summary["median"] <= summary["p99"] <= summary["max"], summary


def check_peer(result: dict) -> None:
    assert set(result["node_exporter"]) == ({"1s", "15s"} if PEER else set())
    for view in result["node_exporter"].values():
        assert view["transitions"] == result["transitions"]
        assert 0 <= view["shown"] <= view["transitions"]
        assert view["latency_ms"]["n"] == view["shown"]
        if view["shown"]:
            well_formed(view["latency_ms"])
            assert view["latency_ms"]["min"] > 0


@pytest.mark.kernel
def test_cpu_latency_and_storm(cpu1):
    lat = latency.cpu_latency(n=6, hold=(0.02, 0.1), peer=PEER, hold_lock=HELD)
    assert lat["transitions"] + lat["refused"] == lat["writes"] == 6
    assert lat["transitions"] >= 4
    # Every accepted transition reached the in-process agent and the exporter's /metrics.
    assert lat["hook_missed"] == 0 and lat["scrape_missed"] == 0
    well_formed(lat["hook_ms"], lat["transitions"])
    well_formed(lat["scrape_ms"], lat["transitions"])
    assert lat["scrape_ms"]["min"] > 0
    check_peer(lat)
    assert cpu1.online()

    result = storm.flap_storm(cycles=3, repeats=1, peer=PEER, hold_lock=HELD)
    (run,) = result["runs"]
    assert run["true"] + run["refused"] == 6
    assert run["counted"] == run["true"]  # every transition counted, none twice
    assert run["events_by_source"]["bpf"] >= run["true"]
    well_formed(result["fidelity"], 1)
    assert all(finite(v) and v >= 0 for v in run["cpu_s_per_min"].values())
    assert set(run["cpu_ms_per_transition"]) == set(run["cpu_s_per_min"])
    assert all(finite(v) and v >= 0 for v in run["cpu_ms_per_transition"].values())
    assert set(run["node_exporter_seen"]) == ({"1s", "15s"} if PEER else set())
    assert all(0 <= v <= run["true"] for v in run["node_exporter_seen"].values())
    # The floor ran in the same storm: the minimal listeners, and the ratio to the Python one.
    assert "python_listener" in run["cpu_ms_per_transition"]
    assert {"ours", "python_listener"} <= set(run["wakeups_per_transition"])
    assert all(finite(v) and v >= 0 for v in run["wakeups_per_transition"].values())
    if run["cpu_ms_per_transition"]["python_listener"] > 0:
        well_formed(result["vs_python_listener"], 1)
    # Structural: with BPF reporting CPU transitions, no CPU transition woke the uevent source.
    assert run["events_by_source"].get("uevent", 0) == 0
    assert cpu1.online()


@pytest.mark.kernel
def test_memory_latency(memory_block):
    lat = latency.memory_latency(n=2, hold=(0.02, 0.05), peer=PEER, hold_lock=HELD,
                                 block=memory_block)
    assert lat["block"] == str(memory_block.n)
    assert lat["transitions"] >= 1 and lat["hook_missed"] == 0
    well_formed(lat["hook_ms"], lat["transitions"])
    well_formed(lat["scrape_ms"], lat["transitions"])
    check_peer(lat)
    assert memory_block.state() == "online"


@pytest.mark.kernel
def test_overhead_and_scrape_cost():
    start = overhead.startup(repeats=1, peer=PEER)
    idle = overhead.idle(seconds=1.0, peer=PEER)
    names = {"node-resize-exporter", "node_exporter"} if PEER else {"node-resize-exporter"}
    assert set(start) == set(idle) == names
    for name in names:
        well_formed(start[name], 1)
        assert start[name]["min"] > 0
        x = idle[name]
        assert x["cpu_s_per_min"] >= 0 and finite(x["cpu_s_per_min"])
        assert 0 < x["anon_mib"] < x["rss_mib"]
    scrape = scrape_load.scrape_cost(seconds=1.0, peer=PEER)
    assert set(scrape) == names
    for name in names:
        for label, clients, interval in scrape_load.SHAPES:
            x = scrape[name][label]
            assert x["clients"] == clients and x["requests"] > 0
            well_formed(x["latency_ms"], x["requests"])


def test_correlator_throughput_and_memory():
    t = correlator.throughput(events=5_000, chunk=2_000, repeats=1)
    well_formed(t["events_per_s"], 1)
    assert t["episodes_ended"] > 0  # the stream's flaps open and end episodes
    m = correlator.episode_memory(open_episodes=100, probe_events=2)
    assert m["open_episodes"] == m["still_open"] == 100
    assert m["bytes_per_episode"] > 0 and finite(m["ms_per_event_while_open"])


def test_table_renders_a_results_file(tmp_path):
    """The table renders from what `bench/run.py all --quick --out` writes (JSON round trip)."""
    results = {"machine": {"nproc": 2, "kernel": "k", "cpu_model": "m", "mem_gib": 1.0,
                           "python": "3.11", "node_exporter": "none"},
               "quick": True, "command": "bench/run.py correlator --quick",
               "correlator": {"throughput": correlator.throughput(2_000, 1_000, 1),
                              "memory": correlator.episode_memory(20, 1)}}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(results))
    text = render(json.loads(path.read_text()))
    assert "| throughput, 2,000 synthetic events x1 |" in text
    assert "20 open episodes" in text


def test_the_peer_is_installed():
    """`make test` installs Debian's prometheus-node-exporter, so the side-by-side numbers are
    always measured; without it the benchmarks above would quietly measure one exporter."""
    assert PEER, "prometheus-node-exporter missing: run scripts/setup.sh test"
