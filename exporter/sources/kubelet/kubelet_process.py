"""The kubelet process and its start time, to see kubelet restarts.

Restarting the kubelet is today's only way to make it resync capacity after a hotplug (no
released kubelet resyncs live), and a restart can fail (see kubelet_checkpoint.py). The kubelet
is found by its process name through psutil where the exporter shares the host's PID namespace
(hostPID: true, the kubelet-state component of deploy/); a new start time is a restart. A check
is one stat of /proc/<pid>; the whole process table is scanned only while no kubelet is known.

The source is up only while it sees a kubelet process: without hostPID none is visible, and it
reports down saying so (the episodes' `resynced_by` is then "unknown", unless the kubelet's
metrics give its start time).
"""
from __future__ import annotations

import math
import re

import psutil  # type: ignore[import-untyped]

from exporter.clock import Clock
from exporter.config.options import PROCFS_ROOT
from exporter.events import KubeletProcess, SourceStatus
from exporter.sources.base import Emit, Source
from exporter.sources.registry import KUBERNETES, SourceSpec, register

KUBELET = "kubelet"
# s between checks that the kubelet process is the same one (one stat of /proc/PID): a restarted
# kubelet takes seconds to post its Node, so its new start time is seen before the resync
INTERVAL = 1.0
MAX_SCAN_GAP = 10  # checks (of INTERVAL) between scans while none is found


# The kubelet's own /metrics carries its start time (client_golang's process collector): the
# fallback where the exporter does not share the host's PID namespace. One line of a text of
# megabytes, found without parsing it all again (the kubelet metrics source parses it once).
_START_LINE = re.compile(rb"^process_start_time_seconds ([0-9.eE+]+)\s*$", re.MULTILINE)


def start_time_from_metrics(body: bytes) -> float | None:
    match = _START_LINE.search(body)
    if match is None:
        return None
    try:
        value = float(match.group(1))
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def find_process(name: str) -> tuple[int, float] | None:
    """(pid, start time in wall seconds) of the oldest process called `name`, or None."""
    found: list[tuple[float, int]] = []
    try:
        for proc in psutil.process_iter(["name", "create_time"]):
            info = proc.info
            if info.get("name") == name and info.get("create_time") is not None:
                found.append((float(info["create_time"]), proc.pid))
    except (OSError, IndexError):  # --path.procfs is no process table (psutil: IndexError)
        return None
    if not found:
        return None
    start, pid = min(found)
    return pid, start


def start_time_of(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


class KubeletProcessSource(Source):
    name = "kubelet_process"

    def __init__(self, clock: Clock, *, process_name: str = KUBELET,
                 interval: float = INTERVAL, procfs_root: str = "/proc") -> None:
        super().__init__(clock)
        # --path.procfs: psutil reads the process table from one module-wide path (its
        # documented knob for a host /proc mounted elsewhere); this source is its only user.
        psutil.PROCFS_PATH = procfs_root
        self.process_name = process_name
        self.interval = interval
        self._pid: int | None = None
        self._start: float | None = None
        self._emitted = False
        self._up: bool | None = None
        # A process-table scan costs ~3 ms (90 processes): while no kubelet runs, scans back
        # off from every check to every MAX_SCAN_GAP checks, so a node without one stays idle.
        self._scan_gap = 0
        self._until_scan = 0

    def loop(self, emit: Emit) -> None:
        while not self.stopping.is_set():
            self.poll(emit)
            self.stopping.wait(self.interval)

    def poll(self, emit: Emit) -> None:
        start = start_time_of(self._pid) if self._pid is not None else None
        if start is None or start != self._start:  # gone, or the pid was reused
            if self._pid is not None:
                self._scan_gap = self._until_scan = 0  # just vanished: a restart, look now
            if self._until_scan > 0:
                self._until_scan -= 1
                return
            found = find_process(self.process_name)
            self._pid, start = found if found else (None, None)
            self._scan_gap = 0 if found else min(MAX_SCAN_GAP, max(1, self._scan_gap * 2))
            self._until_scan = 0 if found else self._scan_gap - 1
        self._report(emit, start is not None)
        if self._emitted and start == self._start:
            return
        self._start, self._emitted = start, True
        emit(KubeletProcess(self.clock.now(), start, self._pid))

    def _report(self, emit: Emit, seen: bool) -> None:
        """Up while a kubelet process is seen, down (once, with the reason) while none is."""
        if seen is self._up:
            return
        self._up = seen
        if seen:
            reason = f"watching the {self.process_name!r} process (pid {self._pid})"
        else:
            reason = (f"no {self.process_name!r} process visible in {psutil.PROCFS_PATH}: "
                      "without hostPID the kubelet is in another PID namespace (deploy the "
                      "kubelet-state component, or give --kubelet-metrics-url)")
        emit(SourceStatus(self.name, seen, self.clock.now(), reason))


register(SourceSpec(
    "kubelet_process", KUBERNETES, "the kubelet process's start time (psutil, hostPID)",
    lambda ctx: KubeletProcessSource(ctx.clock, procfs_root=PROCFS_ROOT.of(ctx.options)), order=62))
