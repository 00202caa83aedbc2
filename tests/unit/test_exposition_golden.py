"""The whole kernel-side exposition for a known state, diffed against a golden file
(node_exporter's habit): a renamed metric, label or help text shows up here.
Regenerate with UPDATE_GOLDEN=1 after a deliberate change."""
import os
import threading
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from exporter.correlate.ledger import KernelLedger
from exporter.events import (
    Direction,
    EventsLost,
    ProgramStatus,
    Resource,
    Result,
    SourceStatus,
    Transition,
)
from exporter.sinks.metrics import MetricsSink
from exporter.sources import registry as sources
from exporter.sources.kernel.sysfs import SysfsReader, diff_transitions

HERE = Path(__file__).resolve().parents[1]
FIXTURE = HERE / "fixtures" / "small-node"
GOLDEN = HERE / "fixtures" / "small-node.prom"


def test_fixture_tree_snapshot():
    snap = SysfsReader(FIXTURE / "sys", FIXTURE / "proc").read(100.0)
    assert snap.cpus_online == {0, 1, 2} and snap.cpus_offline == {3}
    assert snap.cpus_possible == frozenset(range(8))
    assert snap.memory_blocks_online == {0, 1, 2} and snap.memory_blocks_offline == {3}
    assert snap.memory_blocks_bytes == 3 * 128 * 2**20
    assert snap.capacity(Resource.MEMORY) == 393216 * 1024
    assert snap.hugepages_bytes == {Resource.HUGEPAGES_2MI: 4 * 2 * 2**20}
    assert snap.capacity(Resource.SWAP) == 2**30


def test_diff_between_snapshots_names_each_unit():
    reader = SysfsReader(FIXTURE / "sys", FIXTURE / "proc")
    a = reader.read(1.0)
    b = a.__class__(**{**a.__dict__, "time": 2.0, "cpus_online": frozenset({0, 1, 2, 3}),
                       "memory_blocks_online": frozenset({0, 1}),
                       "memory_blocks_offline": frozenset({2, 3})})
    got = {(t.resource, t.unit, t.direction) for t in diff_transitions(a, b)}
    assert got == {(Resource.CPU, 3, Direction.ONLINE), (Resource.MEMORY, 2, Direction.OFFLINE)}


def test_golden_exposition(monkeypatch):
    from exporter import buildinfo
    monkeypatch.setattr(buildinfo, "revision", lambda: "0123456789abcdef")
    ledger = KernelLedger()
    ledger.handle(SourceStatus("bpf", True, 1.0))
    ledger.handle(SourceStatus("uevent", False, 1.0, "netlink refused"))
    ledger.handle(ProgramStatus("cpuhp_exit", True, 1.0))
    ledger.handle(ProgramStatus("online_pages_enter", False, 1.0, "no kprobes"))
    ledger.handle(SysfsReader(FIXTURE / "sys", FIXTURE / "proc").read(1.0), "sysfs")
    ledger.handle(Transition("bpf", Resource.CPU, 3, Direction.OFFLINE, Result.SUCCESS,
                             end=2.02, start=2.0, steps=53))
    ledger.handle(Transition("bpf", Resource.CPU, 3, Direction.ONLINE, Result.FAILED,
                             end=3.003, start=3.0, failed_state="83 (cpu:bringup)",
                             error="EAGAIN"))
    ledger.handle(EventsLost("bpf", 2, 4.0))
    registry = CollectorRegistry()
    registry.register(MetricsSink(threading.Lock(), ledger, lossy=sources.lossy_names()))
    text = generate_latest(registry).decode()
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
