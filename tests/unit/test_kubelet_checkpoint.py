"""The kubelet's CPU and memory manager checkpoints: parsed as a real kubelet v1.36 wrote them
(checksum re-computed), judged as the kubelet judges them at start, and followed with inotify."""
from __future__ import annotations

import json
import os
import queue
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.clock import MonotonicWallClock
from exporter.correlate.kubelet_view import KubeletView, cpu_manager_problem
from exporter.events import (
    CpuManagerCheckpoint,
    KernelSnapshot,
    MalformedInput,
    MemoryManagerCheckpoint,
    Resource,
    SourceStatus,
)
from exporter.sources.kubelet.kubelet_checkpoint import (
    MAX_BYTES,
    KubeletCheckpointSource,
    cpu_manager_checksum,
    parse_cpu_manager_state,
    parse_memory_manager_state,
    read_cpu_manager_state,
    read_reserved_cpus,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kubelet-v1.36"
POD = "f79f4487-f91d-48af-be9a-27c9c5b6583d"


def fixture(name: str) -> bytes:
    return (FIXTURES / f"cpu_manager_state.{name}").read_bytes()


def snapshot(online: set[int], mem: int = 8 << 30, hugepages: dict | None = None
             ) -> KernelSnapshot:
    return KernelSnapshot(time=1.0, cpus_online=frozenset(online),
                          cpus_offline=frozenset({0, 1}) - frozenset(online),
                          cpus_present=frozenset({0, 1}), cpus_possible=frozenset({0, 1}),
                          memory_block_size=128 << 20, memory_blocks_online=frozenset(),
                          memory_blocks_offline=frozenset(), mem_total_bytes=mem,
                          swap_total_bytes=0, hugepages_bytes=hugepages or {})


def write_checkpoint(root: Path, name: str, data: bytes) -> None:
    """As the kubelet's file store writes: a temporary file in the directory, renamed."""
    tmp = root / f".{name}.tmp"
    tmp.write_bytes(data)
    os.rename(tmp, root / name)


# ------------------------------------------------------------------ format and checksum


def test_real_checkpoints_parse_and_their_checksums_match():
    plain = parse_cpu_manager_state(fixture("static-0-1"), "p", 1.0)
    assert (plain.policy, plain.default_cpus, plain.assigned_cpus, plain.error) == (
        "static", frozenset({0, 1}), frozenset(), "")
    pinned = parse_cpu_manager_state(fixture("static-exclusive-cpu1"), "p", 1.0)
    assert (pinned.default_cpus, pinned.assigned_cpus, pinned.error) == (
        frozenset({0}), frozenset({1}), "")


def test_checksum_is_the_kubelets():
    assert cpu_manager_checksum("static", "0-1", {}) == json.loads(
        fixture("static-0-1"))["checksum"]
    assert cpu_manager_checksum("static", "0", {POD: {"sleep": "1"}}) == json.loads(
        fixture("static-exclusive-cpu1"))["checksum"]


def test_an_edited_checkpoint_is_corrupted_as_the_kubelet_says():
    obj = json.loads(fixture("static-0-1"))
    obj["defaultCpuSet"] = "0"  # edited by hand, checksum left alone
    cp = parse_cpu_manager_state(json.dumps(obj).encode(), "p", 1.0)
    assert "checksum mismatch" in cp.error
    assert cpu_manager_problem(cp, frozenset({0})) is not None


def test_checksum_zero_is_accepted_like_the_old_file_backend():
    data = json.dumps({"policyName": "static", "defaultCpuSet": "0-1", "checksum": 0}).encode()
    assert parse_cpu_manager_state(data, "p", 1.0).error == ""


@pytest.mark.parametrize("data, wanted", [
    (b"{not json", "not a CPU manager checkpoint"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"policyName": "static", "defaultCpuSet": "0-99999999"}', "bad CPU range"),
    (b'{"policyName": "static", "defaultCpuSet": "0", "entries": {"p": "1"}}', "v1 checkpoints"),
    (b'{"policyName": 3, "defaultCpuSet": "0"}', "policyName is not a string"),
    (b"\xff\xfe", "not a CPU manager checkpoint"),
    (b" " * (MAX_BYTES + 1), "larger than"),
    (b"[" * 60_000 + b"]" * 60_000, "nested too deeply"),
    (json.dumps({"policyName": "static", "defaultCpuSet": "0", "entries": {
        f"pod{i}": {"c": "0-65535"} for i in range(3)}}).encode(), "more than 65536 CPUs"),
])
def test_hostile_checkpoints_are_errors_not_crashes(data, wanted):
    cp = parse_cpu_manager_state(data, "p", 1.0)
    assert wanted in cp.error and cp.present


def test_memory_manager_checkpoint_shape():
    # The shape of pkg/kubelet/cm/memorymanager/state (NUMANodeMap, MemoryTable's json tags).
    data = json.dumps({
        "policyName": "Static",
        "machineState": {
            "0": {"numberOfAssignments": 0, "cells": [0], "memoryMap": {
                "memory": {"total": 4 << 30, "systemReserved": 1 << 29, "allocatable": 3 << 30,
                           "reserved": 0, "free": 3 << 30},
                "hugepages-2Mi": {"total": 0, "systemReserved": 0, "allocatable": 0,
                                  "reserved": 0, "free": 0}}},
            "1": {"numberOfAssignments": 0, "cells": [1], "memoryMap": {
                "memory": {"total": 4 << 30, "systemReserved": 0, "allocatable": 4 << 30,
                           "reserved": 0, "free": 4 << 30}}}},
        "checksum": 12345}).encode()
    mp = parse_memory_manager_state(data, "p", 1.0)
    assert mp.policy == "Static" and mp.total_bytes == {"memory": 8 << 30, "hugepages-2Mi": 0}
    bad = parse_memory_manager_state(b'{"machineState": {"0": {"memoryMap": {"memory": {}}}}}',
                                     "p", 1.0)
    assert "total is not a size" in bad.error
    deep = parse_memory_manager_state(b'{"machineState": ' + b"[" * 200_000, "p", 1.0)
    assert "nested too deeply" in deep.error or "not a memory manager" in deep.error


# ------------------------------------------------------------------ the kubelet's start checks


def view_with(cp: CpuManagerCheckpoint, online: set[int]) -> KubeletView:
    view = KubeletView()
    view.handle(cp)
    view.handle(snapshot(online))
    return view


def test_static_checkpoint_naming_an_offline_cpu_blocks_a_restart():
    view = view_with(parse_cpu_manager_state(fixture("static-0-1"), "p", 1.0), {0})
    # No series for the memory manager checkpoint until it has been read (not a false 0).
    assert view.restart_blocked() == {"cpu_manager_state": 1}
    assert view.restart_problems()["cpu_manager_state"] == (
        "the CPU manager checkpoint names cpu1, which is offline")
    assert view.cpu_manager_cpus() == {("default", "online"): 1, ("default", "offline"): 1,
                                       ("assigned", "online"): 0, ("assigned", "offline"): 0}
    view.handle(snapshot({0, 1}))
    assert view.restart_blocked()["cpu_manager_state"] == 0


def test_a_cpu_pinned_to_an_offline_cpu_blocks_and_counts_as_assigned():
    view = view_with(parse_cpu_manager_state(fixture("static-exclusive-cpu1"), "p", 1.0), {0})
    assert view.restart_blocked()["cpu_manager_state"] == 1
    assert view.cpu_manager_cpus()[("assigned", "offline")] == 1


def test_a_new_online_cpu_the_checkpoint_lacks_blocks_too():
    # kubernetes#79823: a CPU hot-added while the kubelet ran; its checkpoint still says 0-1.
    cp = parse_cpu_manager_state(fixture("static-0-1"), "p", 1.0)
    assert cpu_manager_problem(cp, frozenset({0, 1, 2})) == (
        "the CPU manager checkpoint lacks cpu2, which is online")


def test_none_policy_and_no_checkpoint_never_block():
    none = CpuManagerCheckpoint(1.0, "p", True, "none", frozenset({0, 1}))
    assert view_with(none, {0}).restart_blocked()["cpu_manager_state"] == 0
    absent = CpuManagerCheckpoint(1.0, "p", False)
    assert view_with(absent, {0}).restart_blocked()["cpu_manager_state"] == 0


def test_static_memory_manager_with_changed_memory_blocks():
    view = KubeletView()
    view.handle(MemoryManagerCheckpoint(1.0, "p", True, "Static", {"memory": 8 << 30}))
    view.handle(snapshot({0, 1}, mem=8 << 30))
    assert view.restart_blocked()["memory_manager_state"] == 0
    view.handle(snapshot({0, 1}, mem=(8 << 30) - (128 << 20)))  # a memory block offlined
    assert view.restart_blocked()["memory_manager_state"] == 1
    view.handle(MemoryManagerCheckpoint(1.0, "p", True, "None", {"memory": 8 << 30}))
    assert view.restart_blocked()["memory_manager_state"] == 0


def test_hugepages_in_a_static_memory_checkpoint_are_compared():
    view = KubeletView()
    view.handle(MemoryManagerCheckpoint(1.0, "p", True, "Static",
                                        {"memory": 8 << 30, "hugepages-2Mi": 4 << 20}))
    view.handle(snapshot({0, 1}, hugepages={Resource.HUGEPAGES_2MI: 2 << 20}))
    assert "hugepages-2Mi" in view.restart_problems()["memory_manager_state"]


# ------------------------------------------------------------------ the source, on a real fs


def events_of(q: queue.Queue, kind: type, timeout: float = 10.0):
    while True:
        event = q.get(timeout=timeout)
        if isinstance(event, kind):
            return event


def test_source_reads_at_start_and_follows_the_file_with_inotify(tmp_path):
    (tmp_path / "pods").mkdir()  # a kubelet's root: its pods folder, no checkpoint yet
    q: queue.Queue = queue.Queue()
    source = KubeletCheckpointSource(MonotonicWallClock(), str(tmp_path), interval=3600)
    source.open()
    source.start(q.put)
    try:
        first = events_of(q, CpuManagerCheckpoint)
        assert not first.present and first.path == str(tmp_path / "cpu_manager_state")
        # No timer can explain what follows (interval 3600 s): only the inotify watch.
        write_checkpoint(tmp_path, "cpu_manager_state", fixture("static-0-1"))
        written = events_of(q, CpuManagerCheckpoint)
        assert written.present and written.default_cpus == {0, 1}
        write_checkpoint(tmp_path, "cpu_manager_state", fixture("static-exclusive-cpu1"))
        assert events_of(q, CpuManagerCheckpoint).assigned_cpus == {1}
        (tmp_path / "cpu_manager_state").write_text("{garbage")  # in place, not renamed
        assert isinstance(events_of(q, MalformedInput), MalformedInput)
        assert "not a CPU manager checkpoint" in events_of(q, CpuManagerCheckpoint).error
        (tmp_path / "cpu_manager_state").unlink()  # what operators do before a restart
        assert not events_of(q, CpuManagerCheckpoint).present
    finally:
        source.stop()


def test_source_rereads_when_poked(tmp_path):
    """A kernel event pokes the source: it re-reads (here the watch is gone, so only the poke
    can explain the new event)."""
    q: queue.Queue = queue.Queue()
    source = KubeletCheckpointSource(MonotonicWallClock(), str(tmp_path / "later"),
                                     interval=3600)
    source.open()  # the root does not exist yet: no watch
    source.start(q.put)
    try:
        down = events_of(q, SourceStatus)  # no root: not mounted, not "no checkpoint"
        assert not down.up and "not mounted" in down.reason
        (tmp_path / "later").mkdir()
        write_checkpoint(tmp_path / "later", "cpu_manager_state", fixture("static-0-1"))
        source.poke()
        assert events_of(q, CpuManagerCheckpoint).present
    finally:
        source.stop()


def test_unchanged_files_are_not_emitted_again(tmp_path):
    write_checkpoint(tmp_path, "cpu_manager_state", fixture("static-0-1"))
    emitted: list = []
    source = KubeletCheckpointSource(MonotonicWallClock(), str(tmp_path), interval=3600)
    source.read(emitted.append)
    source.read(emitted.append)
    assert [type(e).__name__ for e in emitted] == ["SourceStatus", "CpuManagerCheckpoint",
                                                   "MemoryManagerCheckpoint"]
    source.close()


@pytest.mark.parametrize("layout", [(), ("pod-resources",), ("pod-resources", "config.yaml")])
def test_a_root_without_the_kubelets_files_is_not_mounted_not_no_checkpoint(tmp_path, layout):
    """The default DaemonSet mounted only pod-resources under /var/lib/kubelet: the checkpoints
    were absent from the pod, not from the node. The source is down saying so, and emits no
    checkpoint (so no restart_blocked series); `check` says the same."""
    from exporter.config.options import Options
    from exporter.sinks.kubelet_collector import check_kubelet_restart
    for name in layout:
        (tmp_path / name).mkdir()
    emitted: list = []
    source = KubeletCheckpointSource(MonotonicWallClock(), str(tmp_path), interval=3600)
    source.read(emitted.append)
    [down] = emitted
    assert isinstance(down, SourceStatus) and not down.up
    assert "not mounted" in down.reason and "kubelet-state" in down.reason
    source.close()
    check = check_kubelet_restart(Options(kubelet_root_dir=str(tmp_path)))
    assert check.status == "warn" and "not mounted" in check.detail, check
    (tmp_path / "pods").mkdir()  # the kubelet's own folder: mounted, and no checkpoint
    check = check_kubelet_restart(Options(kubelet_root_dir=str(tmp_path)))
    assert check.status == "ok" and "no checkpoints" in check.detail


def test_the_kubelets_reserved_cpus_are_read_from_its_config(tmp_path):
    assert read_reserved_cpus(tmp_path)[0] is None
    (tmp_path / "config.yaml").write_text("kind: KubeletConfiguration\nreservedSystemCPUs: "
                                          "\"0,2-3\"\n")
    assert read_reserved_cpus(tmp_path) == (frozenset({0, 2, 3}), "")
    (tmp_path / "config.yaml").write_text("kind: KubeletConfiguration\n")
    assert read_reserved_cpus(tmp_path) == (frozenset(), "")
    (tmp_path / "config.yaml").write_text("reservedSystemCPUs: [1, 2]\n")
    assert read_reserved_cpus(tmp_path)[0] is None
    (tmp_path / "config.yaml").unlink()
    os.mkfifo(tmp_path / "config.yaml")  # never blocks, never read
    assert "not a regular file" in read_reserved_cpus(tmp_path)[1]


def test_read_of_the_real_default_path_on_this_machine():
    """/var/lib/kubelet as this machine has it (no kubelet in CI: absent, not an error)."""
    cp = read_cpu_manager_state("/var/lib/kubelet", 1.0)
    assert cp.path == "/var/lib/kubelet/cpu_manager_state"
    assert cp.present == os.path.exists(cp.path) and not cp.error


# ------------------------------------------------------------------ fuzz

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=12), children, max_size=4), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=300),
                 JSONISH.map(lambda v: json.dumps(v).encode()),
                 st.dictionaries(st.sampled_from(["policyName", "defaultCpuSet", "entries",
                                                  "checksum", "machineState"]),
                                 JSONISH).map(lambda v: json.dumps(v).encode())))
def test_no_input_crashes_the_parsers(data):
    cp = parse_cpu_manager_state(data, "p", 1.0)
    mp = parse_memory_manager_state(data, "p", 1.0)
    view = KubeletView()
    for event in (cp, mp, snapshot({0})):
        view.handle(event)
    assert set(view.restart_blocked()) == {"cpu_manager_state", "memory_manager_state"}


def test_an_unreadable_checkpoint_is_no_verdict_and_the_source_says_why(tmp_path):
    """Unreadable (here a directory where the file should be: root reads anything else) is not
    corrupted: no checkpoint event, so no restart_blocked series; the source is down."""
    from exporter.events import SourceStatus
    (tmp_path / "cpu_manager_state").mkdir()
    emitted: list = []
    source = KubeletCheckpointSource(MonotonicWallClock(), str(tmp_path), interval=3600)
    source.read(emitted.append)
    source.read(emitted.append)  # still down: said once
    [down] = emitted
    assert isinstance(down, SourceStatus) and not down.up
    assert "a directory" in down.reason and "fix:" in down.reason
    (tmp_path / "cpu_manager_state").rmdir()
    write_checkpoint(tmp_path, "cpu_manager_state", fixture("static-0-1"))
    source.read(emitted.append)
    assert [type(e).__name__ for e in emitted[1:]] == [
        "SourceStatus", "CpuManagerCheckpoint", "MemoryManagerCheckpoint"]
    assert emitted[1].up
    source.close()


def test_a_checkpoint_source_gone_down_leaves_no_verdict_behind():
    """A checkpoint read, then the root unmounted (or unreadable): the restart verdict that
    was read says nothing now; restart_blocked is absent, not stuck at its last value."""
    view = KubeletView()
    for event in (snapshot({0}), parse_cpu_manager_state(fixture("static-0-1"), "p", 1.0)):
        view.handle(event)
    assert view.restart_blocked() == {"cpu_manager_state": 1}
    view.handle(SourceStatus("kubelet_checkpoint", False, 2.0, "not mounted: ..."))
    assert view.restart_blocked() == {}
