"""Kubelet restarts, seen as a new start time of a real process found by name (psutil)."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from exporter.clock import MonotonicWallClock
from exporter.correlate.kubelet_view import SAME_START, KubeletView
from exporter.events import KubeletProcess
from exporter.sources.kubelet_process import KubeletProcessSource
from testkit.exporter_proc import terminate

NAME = f"nrek{os.getpid()}"[:15]  # a process name no other test or host process has


def spawn(tmp_path: Path) -> subprocess.Popen:
    """A real process whose name (comm) is NAME: the kernel takes it from the file run."""
    exe = tmp_path / NAME
    if not exe.exists():
        exe.symlink_to(shutil.which("sleep"))
    return subprocess.Popen([str(exe), "600"])


def test_a_new_process_is_a_restart_and_the_same_one_is_not(tmp_path):
    emitted: list[KubeletProcess] = []
    source = KubeletProcessSource(MonotonicWallClock(), process_name=NAME)
    view = KubeletView()
    first = spawn(tmp_path)
    second = None
    try:
        source.poll(emitted.append)
        assert emitted[-1].pid == first.pid and emitted[-1].start_time is not None
        source.poll(emitted.append)  # the same process: nothing new
        assert len(emitted) == 1
        terminate(first)
        source.poll(emitted.append)
        assert emitted[-1].start_time is None  # no kubelet running (between stop and start)
        # A kubelet takes seconds to start; start times within SAME_START are one process
        # read two ways (psutil and the kubelet's own metric), so the new one starts later.
        time.sleep(SAME_START + 0.1)
        second = spawn(tmp_path)
        source.poll(emitted.append)
        assert emitted[-1].pid == second.pid
    finally:
        for proc in (first, second):
            if proc is not None:
                terminate(proc)
    for event in emitted:
        view.handle(event)
    assert view.restarts == 1


def test_no_such_process_is_reported_once():
    emitted: list[KubeletProcess] = []
    source = KubeletProcessSource(MonotonicWallClock(), process_name="no-such-proc-x")
    source.poll(emitted.append)
    source.poll(emitted.append)
    assert [(e.start_time, e.pid) for e in emitted] == [(None, None)]
    view = KubeletView()
    view.handle(emitted[0])
    assert view.restarts == 0


def test_scans_back_off_while_no_kubelet_runs(monkeypatch):
    """A node without a kubelet stays idle: 30 checks cost 6 process-table scans, not 30."""
    import exporter.sources.kubelet_process as module
    scans: list[int] = []
    check = 0
    monkeypatch.setattr(module, "find_process", lambda name: scans.append(check))
    source = KubeletProcessSource(MonotonicWallClock(), process_name="none")
    for check in range(30):
        source.poll(lambda event: None)
    assert scans == [0, 1, 3, 7, 15, 25]  # gaps 1, 2, 4, 8, then at most 10


def test_one_start_read_two_ways_is_not_a_restart():
    view = KubeletView()
    for start in (1000.0, 1000.01, 999.995, 1030.0):  # psutil, the metric, psutil, a restart
        view.handle(KubeletProcess(2000.0, start, None))
    assert view.restarts == 1
