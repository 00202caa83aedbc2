"""End to end: a real cpu1 episode through a running exporter, its journal, its trace.

- the trace an OTLP/HTTP receiver gets has the kernel's times (within a millisecond of the
  transition the journal recorded), the span tree and the resource attributes;
- SIGKILL while the episode is open, restart on the same journal: the episode is resumed, ends,
  and is exported as a trace exactly once;
- a full disk under the journal is counted in /metrics while /metrics keeps serving.
"""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from exporter.events import Direction, Resource
from exporter.sinks.journal.reader import JournalReader
from testkit.exporter_proc import RunningExporter
from testkit.fakes.otlp import HttpReceiver

pytestmark = pytest.mark.kernel

MS = 1_000_000


def wait_until(predicate, timeout: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not met in {timeout}s")
        time.sleep(0.1)


def journal_episodes(path):
    if not path.exists():
        return []
    j = JournalReader(path)
    try:
        return j.episodes()
    finally:
        j.close()


def cpu1_episodes(path, direction: Direction, ended: bool):
    return [ep for ep in journal_episodes(path)
            if ep.resource is Resource.CPU and ep.change is direction.change
            and any(t.unit == 1 for t in ep.transitions) and (ep.ended is not None) == ended]


def exporter(journal, rx, *extra):
    return RunningExporter(
        "--journal", str(journal), "--kubernetes", "off", *extra, journal=True,
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint, "NODE_NAME": "e2e-node",
             "OTEL_BSP_SCHEDULE_DELAY": "200"})


def test_real_cpu1_episode_trace_has_kernel_times(cpu1, tmp_path):
    journal = tmp_path / "journal.db"
    with HttpReceiver() as rx:
        with exporter(journal, rx, "--coalesce-window", "0.5") as exp:
            cpu1.set_online(False)
            try:
                (ep,) = wait_until(lambda: cpu1_episodes(journal, Direction.OFFLINE, True),
                                   what="cpu1 offline episode ended in the journal")
            finally:
                cpu1.set_online(True)
            assert exp.stop() == 0  # SIGTERM flushes the trace
        spans = rx.received.wait_spans(2)
    roots = [s for s in spans if s.parent_span_id == b""
             and s.attributes["node_resize.episode.id"] == ep.id]
    assert len(roots) == 1
    root = roots[0]
    assert root.name == "episode cpu decrease"
    assert root.attributes["node_resize.outcome"] == ep.outcome.value
    assert root.resource["service.name"] == "node-resize-exporter"
    assert root.resource["k8s.node.name"] == "e2e-node"
    assert root.resource["host.name"] == os.uname().nodename
    kernel = [s for s in spans if s.name == "kernel.transition" and s.parent_span_id ==
              root.span_id]
    assert len(kernel) == len(ep.transitions) >= 1
    # The transition as the journal holds it (its raw event, converted from CLOCK_MONOTONIC
    # once at the source) is what the span carries, to the millisecond.
    tr = ep.transitions[0]
    span = next(s for s in kernel if s.attributes["hotplug.cpu.id"] == 1)
    assert span.attributes["hotplug.direction"] == "offline"
    assert span.attributes["hotplug.result"] == "success"
    assert abs(span.end_ns - tr.end * 1e9) <= MS
    start = tr.start if tr.start is not None else tr.end
    assert abs(span.start_ns - start * 1e9) <= MS
    assert abs(root.start_ns - ep.opened * 1e9) <= MS
    assert abs(root.end_ns - ep.ended * 1e9) <= MS
    # The raw transition events are in the journal too, before any episode was built.
    j = JournalReader(journal)
    raw = [e for e in j.events() if type(e).__name__ == "Transition" and e.unit == 1]
    j.close()
    assert any(abs(e.end - tr.end) < 1e-6 for e in raw)


def test_sigkill_mid_episode_then_restart_resumes_and_traces_once(cpu1, tmp_path):
    journal = tmp_path / "journal.db"
    window = "4"  # the episode stays open (coalescing) this long after the transition
    with HttpReceiver() as rx:
        first = exporter(journal, rx, "--coalesce-window", window).start()
        try:
            cpu1.set_online(False)
            (open_ep,) = wait_until(lambda: cpu1_episodes(journal, Direction.OFFLINE, False),
                                    what="open cpu1 episode in the journal")
            first.proc.kill()  # SIGKILL: no close, no flush
            first.proc.wait(10)
        finally:
            first.stop()
            first.tmp.cleanup()
            cpu1.set_online(True)
        assert cpu1_episodes(journal, Direction.OFFLINE, True) == []
        with exporter(journal, rx, "--coalesce-window", window) as second:
            (done,) = wait_until(lambda: [e for e in cpu1_episodes(journal, Direction.OFFLINE,
                                                                   True) if e.id == open_ep.id],
                                 what="resumed episode ended")
            assert "resumed 1 open episode" in second.logs()
            assert second.stop() == 0
        # Restart once more: an ended, exported episode must not be traced again.
        with exporter(journal, rx, "--coalesce-window", window) as third:
            time.sleep(1.0)
            assert third.stop() == 0
        spans = rx.received.wait_spans(2)
    assert done.opened == open_ep.opened and done.transitions[0] == open_ep.transitions[0]
    roots = [s for s in spans if s.parent_span_id == b""
             and s.attributes.get("node_resize.episode.id") == open_ep.id]
    assert len(roots) == 1
    assert abs(roots[0].start_ns - open_ep.opened * 1e9) <= MS
    j = JournalReader(journal)
    assert j.is_exported(open_ep.id)
    j.close()


def test_full_journal_disk_is_counted_while_metrics_serve(tmp_path):
    disk = tmp_path / "full"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "nre-e2e", str(disk)],
                   check=True)
    try:
        fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        with RunningExporter("--journal", str(disk / "journal.db"), "--kubernetes", "off",
                             journal=True) as exp:
            scrape = exp.wait_for(lambda s: (s.value("node_resize_exporter_sink_errors_total",
                                                     sink="journal") or 0) > 0)
            first = scrape.value("node_resize_exporter_sink_errors_total", sink="journal")
            assert scrape.total("node_resize_exporter_build_info",
                                version=_version()) == 1
            assert exp.stop() == 0
            logs = exp.logs()
        assert first >= 1
        assert "write failed" in logs and "journal" in logs
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _version() -> str:
    import exporter
    return exporter.__version__
