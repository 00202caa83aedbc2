"""Odd trees under --path.sysfs, --path.procfs and --kubelet-root-dir:
FIFOs where files should be, garbage, oversized and furiously rewritten checkpoints. Real files
and FIFOs in a temporary directory; each must be refused, counted or degraded, never hang."""
from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from exporter.clock import MonotonicWallClock
from exporter.events import CpuManagerCheckpoint, KernelSnapshot, MalformedInput, SourceStatus
from exporter.sources.base import SourceUnavailable
from exporter.sources.kernel.sysfs import SysfsSource
from exporter.sources.kubelet import kubelet_checkpoint
from exporter.sources.kubelet.kubelet_checkpoint import (
    CPU_STATE,
    MAX_BYTES,
    KubeletCheckpointSource,
)
from exporter.untrusted import NotRegularFile, TooLarge, read_bytes
from testkit.event_log import EventLog

CHECKPOINT = Path(__file__).parents[1] / "fixtures/kubelet-v1.36/cpu_manager_state.static-0-1"


def tree(tmp_path: Path) -> tuple[Path, Path]:
    """A sysfs and procfs copy of what the reconciler reads (2 CPUs, 2 memory blocks)."""
    sysfs, procfs = tmp_path / "sys", tmp_path / "proc"
    cpu = sysfs / "devices/system/cpu"
    cpu.mkdir(parents=True)
    for name, text in (("online", "0-1\n"), ("offline", "\n"), ("present", "0-1\n"),
                       ("possible", "0-1\n")):
        (cpu / name).write_text(text)
    mem = sysfs / "devices/system/memory"
    mem.mkdir(parents=True)
    (mem / "block_size_bytes").write_text("8000000\n")
    for n in (0, 1):
        (mem / f"memory{n}").mkdir()
        (mem / f"memory{n}/state").write_text("online\n")
    procfs.mkdir()
    (procfs / "meminfo").write_text("MemTotal:        8000000 kB\nSwapTotal:       0 kB\n")
    return sysfs, procfs


def bounded(fn, *args):
    """Run fn in a thread; a hang fails the test instead of hanging the suite."""
    result: dict = {}

    def target():
        try:
            result["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            result["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(20)
    assert not thread.is_alive(), f"{fn.__name__} hung"
    if "error" in result:
        raise result["error"]
    return result.get("value")


def test_the_reader_refuses_fifos_and_oversized_files_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(NotRegularFile, match="a FIFO"):
        bounded(read_bytes, fifo)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    with pytest.raises(TooLarge):
        read_bytes(big, 100)
    assert read_bytes(big, 101) == b"x" * 101


@pytest.mark.parametrize("where", ["proc/meminfo", "sys/devices/system/memory/block_size_bytes",
                                   "sys/devices/system/cpu/online"])
def test_a_fifo_in_the_tree_is_refused_at_start_with_the_fix(tmp_path, where):
    sysfs, procfs = tree(tmp_path)
    (tmp_path / where).unlink()
    os.mkfifo(tmp_path / where)
    source = SysfsSource(MonotonicWallClock(), sysfs=str(sysfs), procfs=str(procfs))
    with pytest.raises(SourceUnavailable) as e:
        bounded(source.open)
    assert "not a regular file" in str(e.value) and "--path.sysfs" in e.value.fix


@pytest.mark.parametrize("where, garbage", [("proc/meminfo", "MemTotal: lots kB\n"),
                                            ("sys/devices/system/cpu/online", "0-zz\n"),
                                            ("sys/devices/system/memory/block_size_bytes",
                                             "-1\n")])
def test_garbage_in_the_tree_is_refused_at_start_with_the_fix(tmp_path, where, garbage):
    sysfs, procfs = tree(tmp_path)
    (tmp_path / where).write_text(garbage)
    source = SysfsSource(MonotonicWallClock(), sysfs=str(sysfs), procfs=str(procfs))
    with pytest.raises(SourceUnavailable, match="cannot read the CPU and memory state"):
        source.open()


def test_garbage_while_running_is_counted_down_once_then_up(tmp_path):
    sysfs, procfs = tree(tmp_path)
    source = SysfsSource(MonotonicWallClock(), sysfs=str(sysfs), procfs=str(procfs))
    source.open()
    log = EventLog()
    (procfs / "meminfo").write_text("MemTotal: \x00\xff garbage kB\n")
    source.reconcile(log.emit)
    source.reconcile(log.emit)
    assert len(log.of(MalformedInput)) == 2
    assert [s.up for s in log.of(SourceStatus)] == [False]
    (procfs / "meminfo").unlink()
    os.mkfifo(procfs / "meminfo")
    bounded(source.reconcile, log.emit)
    assert "not a regular file" in log.of(MalformedInput)[-1].detail
    (procfs / "meminfo").unlink()
    (procfs / "meminfo").write_text("MemTotal:        4000000 kB\n")
    source.reconcile(log.emit)
    assert [s.up for s in log.of(SourceStatus)] == [False, True]
    assert log.of(KernelSnapshot)[-1].mem_total_bytes == 4_000_000 * 1024


def checkpoint_source(root: Path, **kwargs) -> tuple[KubeletCheckpointSource, EventLog]:
    source = KubeletCheckpointSource(MonotonicWallClock(), str(root), interval=3600, **kwargs)
    source.open()
    log = EventLog()
    source.start(log.emit)
    return source, log


def test_a_fifo_checkpoint_is_down_then_up_when_a_file_is_renamed_over_it(tmp_path):
    os.mkfifo(tmp_path / CPU_STATE)
    source, log = checkpoint_source(tmp_path, read_gap=0.1)
    try:
        down = log.wait_for(SourceStatus, lambda s: not s.up)
        assert "not a regular file (a FIFO)" in down.reason
        shutil.copy(CHECKPOINT, tmp_path / "tmp")
        os.rename(tmp_path / "tmp", tmp_path / CPU_STATE)  # as the kubelet writes it
        log.wait_for(SourceStatus, lambda s: s.up)
        cp = log.wait_for(CpuManagerCheckpoint, lambda c: c.present)
        assert cp.error == "" and cp.policy == "static"
    finally:
        source.stop()


def test_an_oversized_checkpoint_is_refused_unparsed(tmp_path, monkeypatch):
    parsed = []
    real = kubelet_checkpoint.parse_cpu_manager_state
    monkeypatch.setattr(kubelet_checkpoint, "parse_cpu_manager_state",
                        lambda data, *a: parsed.append(len(data)) or real(data, *a))
    (tmp_path / CPU_STATE).write_bytes(b" " * (MAX_BYTES + 1) + CHECKPOINT.read_bytes())
    source, log = checkpoint_source(tmp_path)
    try:
        cp = log.wait_for(CpuManagerCheckpoint)
        assert "larger than" in cp.error and cp.present
        assert parsed == [MAX_BYTES + 1]  # the bound, not the file: never read whole
    finally:
        source.stop()


def test_checkpoint_rewrites_are_read_at_a_bounded_rate_and_same_content_emits_nothing(
        tmp_path, monkeypatch):
    """A writer renaming a checkpoint over itself as fast as it can: reads are at most one per
    read_gap, a rewrite of the same content emits nothing, and a change is still seen."""
    reads = []
    real = kubelet_checkpoint.read_file
    monkeypatch.setattr(kubelet_checkpoint, "read_file",
                        lambda path: reads.append(time.monotonic()) or real(path))
    data = CHECKPOINT.read_bytes()
    (tmp_path / CPU_STATE).write_bytes(data)
    source, log = checkpoint_source(tmp_path, read_gap=0.5)
    try:
        log.wait_for(CpuManagerCheckpoint)
        for i in range(2000):
            (tmp_path / f"tmp{i}").write_bytes(data)
            os.rename(tmp_path / f"tmp{i}", tmp_path / CPU_STATE)
        changed = json.loads(data)
        changed["checksum"] = 0
        changed["defaultCpuSet"] = "0"
        (tmp_path / "tmp").write_text(json.dumps(changed))
        os.rename(tmp_path / "tmp", tmp_path / CPU_STATE)
        second = log.wait_for(CpuManagerCheckpoint, count=2)
        assert second.default_cpus == frozenset({0})
        assert len(log.of(CpuManagerCheckpoint)) == 2
        cpu_reads = reads[::2]  # each read reads both files: cpu, then memory
        gaps = [b - a for a, b in zip(cpu_reads, cpu_reads[1:])]
        assert gaps and min(gaps) >= 0.45, gaps
    finally:
        source.stop()
