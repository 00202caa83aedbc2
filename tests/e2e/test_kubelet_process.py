"""Kubelet restarts, seen as a new start time of a real process found by name in /proc."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from exporter.clock import MonotonicWallClock
from exporter.correlate.kubelet_view import SAME_START, KubeletView
from exporter.events import KubeletProcess, SourceStatus
from exporter.sources.kubelet.kubelet_process import KubeletProcessSource, start_time_from_metrics
from testkit.exporter_proc import terminate

NAME = f"nrek{os.getpid()}"[:15]  # a process name no other test or host process has


def spawn(tmp_path: Path) -> subprocess.Popen:
    """A real process whose name (comm) is NAME: the kernel takes it from the file run."""
    exe = tmp_path / NAME
    if not exe.exists():
        exe.symlink_to(shutil.which("sleep"))
    return subprocess.Popen([str(exe), "600"])


def _of(kind, emitted: list) -> list:
    return [e for e in emitted if isinstance(e, kind)]


def test_a_new_process_is_a_restart_and_the_same_one_is_not(tmp_path):
    emitted: list = []
    source = KubeletProcessSource(MonotonicWallClock(), process_name=NAME)
    view = KubeletView()
    first = spawn(tmp_path)
    second = None
    try:
        source.poll(emitted.append)
        seen = _of(KubeletProcess, emitted)
        assert seen[-1].pid == first.pid and seen[-1].start_time is not None
        source.poll(emitted.append)  # the same process: nothing new
        assert len(_of(KubeletProcess, emitted)) == 1
        terminate(first)
        source.poll(emitted.append)
        # no kubelet running (between stop and start)
        assert _of(KubeletProcess, emitted)[-1].start_time is None
        # A kubelet takes seconds to start; start times within SAME_START are one process
        # read two ways (/proc and the kubelet's own metric), so the new one starts later.
        time.sleep(SAME_START + 0.1)
        second = spawn(tmp_path)
        source.poll(emitted.append)
        assert _of(KubeletProcess, emitted)[-1].pid == second.pid
    finally:
        for proc in (first, second):
            if proc is not None:
                terminate(proc)
    for event in emitted:
        view.handle(event)
    assert view.restarts == 1
    # Up only while it sees one: up, down while none ran, up again.
    assert [e.up for e in _of(SourceStatus, emitted)] == [True, False, True]


def test_no_such_process_is_reported_once_and_the_source_is_down():
    """Without hostPID no kubelet process is visible: the source says so and is down (not up
    "looking" forever), once."""
    emitted: list = []
    source = KubeletProcessSource(MonotonicWallClock(), process_name="no-such-proc-x")
    source.poll(emitted.append)
    source.poll(emitted.append)
    assert [(e.start_time, e.pid) for e in _of(KubeletProcess, emitted)] == [(None, None)]
    [down] = _of(SourceStatus, emitted)
    assert not down.up and "no 'no-such-proc-x' process visible" in down.reason
    assert "hostPID" in down.reason and "--kubelet-metrics-url" in down.reason
    view = KubeletView()
    view.handle(_of(KubeletProcess, emitted)[0])
    assert view.restarts == 0


def test_scans_back_off_while_no_kubelet_runs(monkeypatch):
    """A node without a kubelet stays idle: 30 checks cost 6 process-table scans, not 30."""
    import exporter.sources.kubelet.kubelet_process as module
    scans: list[int] = []
    at = [0]  # the check number the fake scan records
    monkeypatch.setattr(module, "find_process",
                        lambda name, procfs, booted: scans.append(at[0]))
    source = KubeletProcessSource(MonotonicWallClock(), process_name="none")
    for n in range(30):
        at[0] = n
        source.poll(lambda event: None)
    assert scans == [0, 1, 3, 7, 15, 25]  # gaps 1, 2, 4, 8, then at most 10


def test_one_start_read_two_ways_is_not_a_restart():
    view = KubeletView()
    for start in (1000.0, 1000.01, 999.995, 1030.0):  # /proc, the metric, /proc, a restart
        view.handle(KubeletProcess(2000.0, start, None))
    assert view.restarts == 1


def test_start_time_from_the_kubelets_own_metrics():
    body = (b"# HELP process_start_time_seconds Start time of the process since unix epoch.\n"
            b"# TYPE process_start_time_seconds gauge\n"
            b"process_start_time_seconds 1.76388613231e+09\n"
            b'kubernetes_feature_enabled{name="BalloonPod",stage="ALPHA"} 0\n')
    assert start_time_from_metrics(body) == 1763886132.31
    assert start_time_from_metrics(b"process_start_time_seconds NaN\n") is None
    assert start_time_from_metrics(b'process_start_time_seconds{x="y"} 5\n') is None
    assert start_time_from_metrics(b"no such line\n" * 1000) is None


def test_kubelet_metrics_source_reports_a_restart_without_hostpid():
    """No PID namespace shared: the kubelet metrics source (a real HTTP server on loopback)
    carries the start time, and a new one is a restart."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from exporter.sources.kubelet.kubelet_metrics import KubeletMetricsSource

    answer = {"body": b"process_start_time_seconds 1000\n"}

    class Kubelet(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(answer["body"])))
            self.end_headers()
            self.wfile.write(answer["body"])

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Kubelet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    emitted: list = []
    source = KubeletMetricsSource(MonotonicWallClock(),
                                  url=f"http://127.0.0.1:{server.server_address[1]}/metrics")
    try:
        source.poll(emitted.append)
        source.poll(emitted.append)  # the same kubelet: nothing new
        answer["body"] = b"process_start_time_seconds 1030\n"
        source.poll(emitted.append)
    finally:
        source.close()
        server.shutdown()
        server.server_close()
    starts = [e.start_time for e in emitted if isinstance(e, KubeletProcess)]
    assert starts == [1000.0, 1030.0]
    view = KubeletView()
    for event in emitted:
        view.handle(event)
    assert view.restarts == 1


def test_the_process_table_is_read_from_path_procfs(tmp_path):
    """--path.procfs (a host /proc mounted elsewhere): the process table is read there."""
    import pytest

    elsewhere, empty = tmp_path / "host-proc", tmp_path / "empty"
    elsewhere.mkdir()
    empty.mkdir()
    if subprocess.run(["mount", "-t", "proc", "proc", str(elsewhere)]).returncode != 0:
        pytest.fail("mounting a procfs needs root (CI runs as root)")
    proc = spawn(tmp_path)
    try:
        found: list = []
        KubeletProcessSource(MonotonicWallClock(), process_name=NAME,
                             procfs_root=str(elsewhere)).poll(found.append)
        assert [e.pid for e in _of(KubeletProcess, found)] == [proc.pid]
        nothing: list = []
        KubeletProcessSource(MonotonicWallClock(), process_name=NAME,
                             procfs_root=str(empty)).poll(nothing.append)
        # no process table there: not found
        assert [e.pid for e in _of(KubeletProcess, nothing)] == [None]
    finally:
        terminate(proc)
        subprocess.run(["umount", str(elsewhere)])


def test_name_and_start_time_are_what_psutil_reads(tmp_path):
    """The source reads /proc/<pid>/stat itself (psutil cost every pod 1.4 MB of imports): the
    start time it computes is psutil's create_time() to the tick, for a process whose name
    holds what could fool a parser of that line (spaces and parentheses)."""
    import psutil

    from exporter.sources.kubelet.kubelet_process import CLOCK_TICKS, find_process, start_time_of
    tricky = "a) 1 2 (b"
    exe = tmp_path / tricky
    exe.symlink_to(shutil.which("sleep"))
    proc = subprocess.Popen([str(exe), "600"])
    try:
        assert psutil.Process(proc.pid).name() == tricky  # the kernel's comm, as psutil reads it
        found = find_process(tricky)
        assert found is not None and found[0] == proc.pid
        want = psutil.Process(proc.pid).create_time()
        assert abs(found[1] - want) < 1.0 / CLOCK_TICKS, (found, want)
        assert start_time_of(proc.pid) == found[1]
        mine = start_time_of(os.getpid())
        assert mine is not None and abs(mine - psutil.Process().create_time()) < 1.0 / CLOCK_TICKS
    finally:
        terminate(proc)
    assert start_time_of(proc.pid) is None  # gone (reaped by terminate)
    assert find_process(tricky) is None


def test_a_pods_process_named_kubelet_does_not_hide_the_kubelets_restarts(tmp_path):
    """L7 (issue 36): a decoy of the same name, started first (the oldest) in a PID namespace
    of its own (a pod without hostPID), and the node's process restarted: the source follows
    the node's process, and its restart is counted. Before, the oldest process of that name
    was "the kubelet": the decoy, and the restart was never seen."""
    exe = tmp_path / NAME
    exe.symlink_to(shutil.which("sleep"))
    decoy = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", str(exe), "600"])
    first = second = None
    emitted: list = []
    try:
        from exporter.sources.kubelet.kubelet_process import _name_and_ticks, find_process
        from testkit.exporter_proc import poll_until

        def decoys() -> list[int]:
            return [int(p) for p in os.listdir("/proc") if p.isdigit()
                    and (_name_and_ticks("/proc", int(p)) or (b"",))[0] == NAME.encode()]

        poll_until(decoys, bool, 10, 0.02, lambda d: AssertionError("no decoy ran"))
        assert find_process(NAME) is None  # only the decoy runs: no kubelet
        time.sleep(0.05)  # the decoy is the oldest by a few clock ticks
        first = spawn(tmp_path)
        source = KubeletProcessSource(MonotonicWallClock(), process_name=NAME)
        source.poll(emitted.append)
        assert _of(KubeletProcess, emitted)[-1].pid == first.pid
        terminate(first)
        time.sleep(SAME_START + 0.1)
        second = spawn(tmp_path)
        source.poll(emitted.append)
        assert _of(KubeletProcess, emitted)[-1].pid == second.pid
    finally:
        for proc in (first, second, decoy):
            if proc is not None:
                terminate(proc)
    view = KubeletView()
    for event in emitted:
        view.handle(event)
    assert view.restarts == 1
