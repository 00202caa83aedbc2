"""The plan's contract: every answer the planner gives validates against docs/plan.schema.json
(which sets additionalProperties false throughout: an undocumented key fails), carries the
schema id and version, node, time and generation, integers for counts and bytes, and ordered
actions with their rollbacks."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import jsonschema
import pytest

from exporter.events import CpuManagerCheckpoint, MemoryManagerCheckpoint
from exporter.plan.answer import answer, generation
from exporter.plan.model import SCHEMA_ID, SCHEMA_VERSION, Change
from exporter.plan.pages import KPF_BUDDY, KPF_LRU
from exporter.plan.planner import Inputs
from exporter.sources.kernel.cpu_topology import CpuPlace
from testkit.forecast import GiB, T, forecaster, node, pod, snapshot
from tests.unit.test_plan import BLOCK, PAGES, block, hardware, inputs

SCHEMA = json.loads((Path(__file__).parents[2] / "docs/plan.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA,
                                            format_checker=jsonschema.FormatChecker())
# Two sockets of one core with two threads each: cpu0-1 and cpu2-3
PLACES = {c: CpuPlace(c, c // 2, 0, 0, c % 2, (c - c % 2, c - c % 2 + 1), 0, c * 2)
          for c in range(4)}


def _checkpoints(static: bool = False):
    cp = CpuManagerCheckpoint(T, "/var/lib/kubelet/cpu_manager_state", True,
                              "static" if static else "none", frozenset(range(4)))
    mp = MemoryManagerCheckpoint(T, "/var/lib/kubelet/memory_manager_state", True, "None")
    return cp, mp


def _answers():
    dimm = {"PNP0C80:00": range(40, 44)}
    hw = hardware(*(block(n, lru=5) for n in range(40, 44)), block(60, "Movable"),
                  block(70, online=False), dimms=dimm, hotpluggable=frozenset({1, 2, 3}))
    from dataclasses import replace
    hw = replace(hw, cpu_places=PLACES)
    cp, mp = _checkpoints()
    f = forecaster(node(cpu="4", allocatable_cpu="4"), snapshot(4),
                   [pod("a", {"cpu": "1500m"}), pod("b", {"cpu": "1500m"})])
    full = inputs(hw, cpus=4, forecast=f, cpu_checkpoint=cp, memory_checkpoint=mp,
                  running=None, not_read={"running_containers": "no kubepods cgroup found"},
                  gates={"NodeResourceHotPlug": False})
    bare = inputs(hw, cpus=4)
    static = inputs(hw, cpus=4, cpu_checkpoint=_checkpoints(True)[0], memory_checkpoint=mp,
                    forecast=f, not_read={"running_containers": "partial"})
    asks = [
        (Change(0, -BLOCK), bare), (Change(0, -5 * BLOCK), bare), (Change(-1, 0), full),
        (Change(-2, 0), full), (Change(-1, 0, "core"), bare), (Change(+1, 0, "core"), bare),
        (Change(0, 2 * BLOCK), bare), (Change(-9, 0), bare), (Change(-1, 0), static),
        (Change(-1, -BLOCK), full), (Change(0, -100 * GiB), bare),
    ]
    return [answer(c, i, node="vm", now=T, asked_generation="0" * 16) for c, i in asks]


@pytest.mark.parametrize("p", _answers(), ids=lambda p: p.change.words() + " " + p.verdict)
def test_every_answer_validates_against_the_schema(p):
    doc = json.loads(json.dumps(p.json()))
    VALIDATOR.validate(doc)
    assert doc["schema"] == SCHEMA_ID and doc["schema_version"] == SCHEMA_VERSION
    assert doc["node"] == "vm" and doc["time"] == "2026-01-01T08:00:00.000Z" or \
        doc["time"].endswith("Z")
    assert doc["stale"] is True and len(doc["generation"]) == 16
    assert doc["safe"] == (doc["verdict"] == "safe")
    assert [a["order"] for a in doc["actions"]] == list(range(1, len(doc["actions"]) + 1))
    assert len(doc["steps"]) == len(doc["actions"])


def test_the_three_verdicts_and_what_each_names():
    got = _answers()
    assert got[0].verdict == "safe"  # the movable block of the virtio-mem device
    assert got[3].verdict == "harmful"  # two pods of 1.5 CPU on 2 CPUs
    rejected = got[3].json()["pods"]["rejected"][0]
    assert rejected["uid"] and rejected["pdb_blocked"] is None
    assert got[2].verdict == "unknown"  # the running containers were not read
    assert got[2].json()["unknown"] == ["running containers: no kubepods cgroup found"]
    assert got[7].verdict == "harmful" and "take at most 3" in got[7].harm[0]
    # A static CPU manager: the kubelet's configuration (reservedSystemCPUs) was not read,
    # and its checkpoint names the CPU: harmful, whatever else is unknown.
    assert got[8].verdict == "harmful" and got[8].kubelet_restarts is False
    assert any("reservedSystemCPUs" in u for u in got[8].unjudged)


def test_actions_take_whole_dimms_with_rollbacks_in_the_order_of_memory_take():
    p = next(p for p in _answers() if p.change == Change(0, -5 * BLOCK))
    doc = p.json()
    writes = [a for a in doc["actions"] if a["do"] == "write"]
    assert [int(a["path"].split("memory")[-1].split("/")[0]) for a in writes] == \
        doc["memory"]["take"]
    assert all(a["value"] == "offline" and a["rollback"] == [
        {"do": "write", "path": a["path"], "value": "online_movable"}] for a in writes)
    removes = [a for a in doc["actions"] if a["do"] == "hypervisor_remove"]
    assert {a["device"]["id"] for a in removes} == {"PNP0C80:00", "virtio0"}
    assert [a["do"] for a in doc["actions"]][-1] != "uncordon"  # no Kubernetes: no cordon


def test_a_cpu_removal_with_kubernetes_cordons_waits_for_capacity_and_uncordons():
    p = next(p for p in _answers() if p.change == Change(-1, -BLOCK))
    dos = [a["do"] for a in p.json()["actions"]]
    assert dos[0] == "cordon" and dos[-2:] == ["wait_for_capacity", "uncordon"]
    wait = p.json()["actions"][-2]
    assert wait["memory_bytes"] == p.capacity_after["memory"] and isinstance(wait["cpu"], int)
    assert p.json()["kubelet"]["live_resize_gates"] == {"InPlaceNodeResourceResize": None,
                                                        "NodeResourceHotPlug": False}


def test_a_whole_core_is_taken_by_its_topology():
    p = next(p for p in _answers() if p.change == Change(-1, 0, "core"))
    assert p.cpu_take == (3, 2) and [c["socket"] for c in p.json()["cpu"]["places"]] == [1, 1]


def test_the_generation_moves_with_the_node_and_not_with_the_question():
    hw = hardware(block(40, "Movable"), block(41, "Movable"))
    a = inputs(hw)
    from dataclasses import replace
    b = replace(a, snapshot=replace(a.snapshot, memory_blocks_online=frozenset({40})))
    assert generation(a) == generation(replace(a)) != generation(b)
    p = answer(Change(0, -BLOCK), a, node="vm", now=T, asked_generation=generation(a))
    assert p.json()["stale"] is False


def test_counts_and_bytes_are_integers_everywhere():
    def walk(x, path=""):
        if isinstance(x, float):
            raise AssertionError(f"{path} is a float: {x}")
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{path}.{k}")
        elif isinstance(x, list):
            for i, v in enumerate(x):
                walk(v, f"{path}[{i}]")
    for p in _answers():
        walk(p.json())


def test_page_flags_of_a_moved_block_count_what_moves():
    flags = Counter({KPF_LRU: 100, KPF_BUDDY: PAGES - 100})
    hw = hardware(block(40), block(41))
    p = answer(Change(0, -BLOCK), inputs(hw), node="vm", now=T,
               page_flags=lambda n: flags, page_budget=4)
    assert p.safe and p.json()["memory"]["move_bytes"] == 100 * 4096
    assert p.json()["inputs"]["page_flags"] == "read"
    assert isinstance(Inputs, type)


def test_an_evict_action_says_how_many_pods_it_has_to_move_beyond_the_twenty_listed():
    """30 pods of 100m on 4 CPUs, 3 taken away: 1 CPU left for them, 20 listed (the contract's
    first 20), pods_total the whole count an orchestrator overriding the verdict has to move."""
    hw = hardware(block(60, "Movable"), hotpluggable=frozenset({1, 2, 3}))
    cp, mp = _checkpoints()
    f = forecaster(node(cpu="4", allocatable_cpu="4"), snapshot(4),
                   [pod(f"p{i:02d}", {"cpu": "100m"}, uid=f"uid-{i}") for i in range(40)])
    i = inputs(hw, cpus=4, forecast=f, cpu_checkpoint=cp, memory_checkpoint=mp, running=None,
               not_read={"running_containers": "no kubepods cgroup found"})
    doc = json.loads(json.dumps(answer(Change(-3, 0), i, node="vm", now=T,
                                       asked_generation="0" * 16).json()))
    VALIDATOR.validate(doc)
    [evict] = [a for a in doc["actions"] if a["do"] == "evict"]
    assert doc["pods"]["rejected_total"] == 30 and len(doc["pods"]["rejected"]) == 20
    assert len(evict["pods"]) == 20 and evict["pods_total"] == 30
