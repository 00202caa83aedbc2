"""The kubelet process and its start time, to see kubelet restarts.

Restarting the kubelet is today's only way to make it resync capacity after a hotplug (no
released kubelet resyncs live), and a restart can fail (see kubelet_checkpoint.py). The kubelet
is found by its process name where the exporter shares the host's PID namespace (hostPID: true,
the kubelet-state component of deploy/); a new start time is a restart. A check is one read of
/proc/<pid>/stat; the whole process table is scanned only while no kubelet is known.

The process table is read here, not through psutil: two fields of /proc/<pid>/stat (the name
and the start time, as psutil computes it: boot time + start ticks / CLK_TCK) cost psutil's
1.4 MB of imports in every pod (bench/README.md, "The pod's bill"), and the --path.procfs root
is then this source's own instead of psutil's one module-wide PROCFS_PATH.

Not any process named kubelet: a pod can run one (a kind or k3s node in a pod, a decoy), and
the oldest of that name would hide the real kubelet's restarts. A process in a kubepods
cgroup (any pod's container), or in another PID namespace than the table's PID 1 (a pod
without hostPID; where PID 1's cannot be read, the exporter's own, the host's with hostPID),
is not the node's kubelet (not_the_node_kubelet); the oldest of the others is.

The source is up only while it sees a kubelet process: without hostPID none is visible, and it
reports down saying so (the episodes' `resynced_by` is then "unknown", unless the kubelet's
metrics give its start time).
"""
from __future__ import annotations

import math
import os
import re

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


STAT_BYTES = 4096  # /proc/<pid>/stat is one line of ~300 bytes
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")  # the unit of its start time (USER_HZ, 100)


def _name_and_ticks(procfs: str, pid: int) -> tuple[bytes, int] | None:
    """The name (comm) and start time (clock ticks after boot) in /proc/<pid>/stat, or None
    when the process is gone or the line is not one. comm is whatever the process named itself
    (spaces and parentheses included): it ends at the line's last ')'."""
    try:
        with open(f"{procfs}/{pid}/stat", "rb") as f:
            line = f.read(STAT_BYTES)
    except OSError:
        return None
    head, sep, rest = line.rpartition(b")")
    fields = rest.split()
    if not sep or b"(" not in head or len(fields) < 20:
        return None
    try:
        return head.partition(b"(")[2], int(fields[19])  # field 22 of proc(5), after comm
    except ValueError:
        return None


def boot_time(procfs: str) -> float | None:
    """The boot time in wall seconds (`btime` of /proc/stat), or None."""
    try:
        with open(f"{procfs}/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


CGROUP_BYTES = 16 * 1024  # /proc/<pid>/cgroup: a line per v1 hierarchy, paths of ~200 bytes


def _pid_namespace(procfs: str, pid: int | str) -> str | None:
    """The PID namespace a process is in ("pid:[4026531836]"), or None when it cannot be read
    (gone, or no ptrace access to it)."""
    try:
        return os.readlink(f"{procfs}/{pid}/ns/pid")
    except OSError:
        return None


def not_the_node_kubelet(procfs: str, pid: int, host_namespace: str | None) -> bool:
    """True for a process that cannot be the node's kubelet: in a kubepods cgroup (a pod's
    container) or in a PID namespace other than `host_namespace` (PID 1's of the table)."""
    try:
        with open(f"{procfs}/{pid}/cgroup", "rb") as f:
            if b"kubepods" in f.read(CGROUP_BYTES):
                return True
    except OSError:
        pass
    if host_namespace is None:
        return False
    namespace = _pid_namespace(procfs, pid)
    return namespace is not None and namespace != host_namespace


def find_process(name: str, procfs: str = "/proc",
                 booted: float | None = None) -> tuple[int, float] | None:
    """(pid, start time in wall seconds) of the oldest process called `name` that can be the
    node's (not_the_node_kubelet), or None (also when `procfs` is no process table).
    `booted`: boot_time(procfs), if already read."""
    booted = booted if booted is not None else boot_time(procfs)
    try:
        pids = [int(entry) for entry in os.listdir(procfs) if entry.isdigit()]
    except OSError:
        return None
    if booted is None:
        return None
    wanted = name.encode()
    found: list[tuple[int, int]] = []
    for pid in pids:
        got = _name_and_ticks(procfs, pid)
        if got is not None and got[0] == wanted:
            found.append((got[1], pid))
    if found:
        # PID 1's namespace; where it cannot be read (no ptrace access to it), the reader's own:
        # with hostPID, the host's.
        host = _pid_namespace(procfs, 1) or _pid_namespace(procfs, "self")
        found = [(ticks, pid) for ticks, pid in found
                 if not not_the_node_kubelet(procfs, pid, host)]
    if not found:
        return None
    ticks, pid = min(found)
    return pid, booted + ticks / CLOCK_TICKS


def start_time_of(pid: int, procfs: str = "/proc", booted: float | None = None) -> float | None:
    booted = booted if booted is not None else boot_time(procfs)
    got = _name_and_ticks(procfs, pid)
    return None if booted is None or got is None else booted + got[1] / CLOCK_TICKS


class KubeletProcessSource(Source):
    name = "kubelet_process"

    def __init__(self, clock: Clock, *, process_name: str = KUBELET,
                 interval: float = INTERVAL, procfs_root: str = "/proc") -> None:
        super().__init__(clock)
        self.procfs_root = procfs_root  # --path.procfs: a host /proc mounted elsewhere
        # Read once: /proc/stat is a line per CPU and its interrupt counts, computed per read
        # (tens of KB on a large node), and btime does not change while the node is up.
        self._booted: float | None = None
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
        if self._booted is None:
            self._booted = boot_time(self.procfs_root)
        start = start_time_of(self._pid, self.procfs_root, self._booted) \
            if self._pid is not None else None
        if start is None or start != self._start:  # gone, or the pid was reused
            if self._pid is not None:
                self._scan_gap = self._until_scan = 0  # just vanished: a restart, look now
            if self._until_scan > 0:
                self._until_scan -= 1
                return
            found = find_process(self.process_name, self.procfs_root, self._booted)
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
            reason = (f"no {self.process_name!r} process visible in {self.procfs_root}: "
                      "without hostPID the kubelet is in another PID namespace (deploy the "
                      "kubelet-state component, or give --kubelet-metrics-url)")
        emit(SourceStatus(self.name, seen, self.clock.now(), reason))


register(SourceSpec(
    "kubelet_process", KUBERNETES, "the kubelet process's start time (/proc, hostPID)",
    lambda ctx: KubeletProcessSource(ctx.clock, procfs_root=PROCFS_ROOT.of(ctx.options)), order=62))
