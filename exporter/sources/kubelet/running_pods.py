"""The running containers' cgroups and processes: what the kubelet gave each container when
it created it (cpuset, CPU quota, memory and swap limits, the OOM score adjustment of its
processes), read back so exporter/correlate/running_pods_view.py can judge them against today's
kernel. A resize changes none of these: the kubelet does not revisit running containers.

Where (under --cgroup-root; the kubelet's cgroupfs and systemd drivers, cgroup v1 and v2):

    v1 cgroupfs  <root>/<controller>/kubepods/[burstable|besteffort/]pod<uid>/<container id>/
    v1 systemd   <root>/<controller>/kubepods.slice/[kubepods-burstable.slice/]
                     kubepods-burstable-pod<uid, _ for ->.slice/cri-containerd-<id>.scope
    v2           the same without <controller>/ (the root has cgroup.controllers)

The processes: the lowest PID in the container's cgroup.procs (its init; runc sets the score
there and children inherit it), its /proc/PID/oom_score_adj under --path.procfs: with
`hostPID` in a pod (deploy/components/kubelet-state).

Bounded work on a hostile or huge tree: at most --running-pods.max-containers containers and
a fixed number of directory entries and seconds per scan (the containers past the budget are
not read: guaranteed pods come first, then burstable, then besteffort; the scan says it was
truncated, counted as malformed input). Every file is read through exporter/untrusted.py:
non-blocking (a FIFO planted in the tree is refused at once, never waited on), not through a
link, size-capped, and within the scan's time budget, which is checked inside each read too,
not only between containers. A scan that ran out of time, or has not finished within its
budget (a read the kernel holds), reports the source down until one completes. A cpuset is
parsed range by range with ids below the kernel's largest NR_CPUS (8192) and the same text
gives the same set object, so a thousand containers of the shared pool hold one set. Directory
names must match whole (a name with a trailing newline is not the container's). A process or
container that exits mid-read is skipped silently (that race is normal); a file that is
unreadable or does not parse is counted, and each scan that had any says so once
(MalformedInput: the agent logs the first, then at debug level). Rescans run after CPU and
memory events (the agent's kubelet sink pokes) and on a slow timer, but never closer together
than --running-pods.min-interval: a hotplug storm costs one scan per interval, not one per
event. A scan is emitted only when it differs from the last (the journal keeps every event).
"""
from __future__ import annotations

import errno
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import click

from exporter.clock import Clock
from exporter.config.options import PROCFS_ROOT, Opt
from exporter.config.types import Seconds
from exporter.events import (
    ContainerCgroup,
    MalformedInput,
    Resource,
    RunningContainers,
    SourceStatus,
)
from exporter.sources.base import Emit
from exporter.sources.kubelet.kubepods_cgroup import CGROUP_ROOT
from exporter.sources.registry import KUBERNETES, SourceSpec, register
from exporter.sources.wake import STATE_INTERVAL, PokedSource
from exporter.untrusted import OutOfTime, Refused, read_bytes

KUBEPODS = ("kubepods.slice", "kubepods")  # systemd driver, cgroupfs driver
MAX_CONTAINERS = 4096
MAX_ENTRIES_PER_CONTAINER = 8  # directory entries a scan may look at, per container allowed
SCAN_SECONDS = 2.0  # wall-clock budget of one scan
MIN_INTERVAL = 2.0
MAX_FILE = 4096  # bytes read of a value file (a number, "max", "QUOTA PERIOD")
CPUSET_MAX = 64 * 1024  # a cpuset of 8192 CPUs written one by one fits (the kubepods reader's)
NR_CPUS_MAX = 8192  # the largest NR_CPUS a kernel is built with: no cpuset names a CPU past it
CPUSETS_KEPT = 256  # distinct cpuset texts, and sets, remembered (each parsed once, shared)
MEMBERS_PER_SCAN = 4 * NR_CPUS_MAX  # CPUs in the distinct cpuset sets one scan makes, at most
WATCHDOG_GRACE = 5.0  # s past the scan's budget before a scan that has not ended is down
PIDS_READ = 64 * 1024  # bytes of cgroup.procs read: thousands of PIDs, the lowest among them
PIDS_TRIED = 8  # processes tried when the first ones exit while being read
UNLIMITED = 1 << 62  # v1 writes "no limit" as PAGE_COUNTER_MAX pages (9223372036854771712)
QOS_NAMES = ("burstable", "besteffort")

# pod<uid> (cgroupfs) or kubepods[-qos]-pod<uid with _>.slice (systemd)
# (matched whole: `$` would also match before a trailing newline)
_POD = re.compile(r"(?:pod|kubepods(?:-burstable|-besteffort)?-pod)([0-9a-fA-F_-]{1,64})"
                  r"(?:\.slice)?")
# <id> (cgroupfs) or <runtime>-<id>.scope (systemd); crio-conmon-<id>.scope is the monitor
_CONTAINER = re.compile(r"(?:(?:cri-containerd|crio|docker|containerd)-)?([0-9a-f]{12,128})"
                        r"(?:\.scope)?")
_CPU_RANGE = re.compile(r"(\d{1,5})(?:-(\d{1,5}))?")


class Unreadable(Exception):
    """A file that exists and could not be read or parsed: counted, skipped."""


class ScanOutOfTime(Exception):
    """The scan's time budget ran out (inside a read or between containers)."""


def parse_cpuset(text: str) -> tuple[tuple[int, int], ...]:
    """A cpuset ("0-3,8,10-11") as sorted, merged (first, last) ranges, never expanded:
    ValueError for anything else or a CPU id of NR_CPUS_MAX or more."""
    ranges: list[tuple[int, int]] = []
    text = text.strip()
    if not text:
        return ()
    for part in text.split(","):
        m = _CPU_RANGE.fullmatch(part.strip())
        if m is None:
            raise ValueError(f"{part.strip()[:20]!r} is not a CPU or a CPU range")
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        if last < first or last >= NR_CPUS_MAX:
            raise ValueError(f"{part.strip()[:20]!r}: CPU ids run from 0 to "
                             f"{NR_CPUS_MAX - 1} (the kernel's largest NR_CPUS)")
        ranges.append((first, last))
    ranges.sort()
    merged = [ranges[0]]
    for first, last in ranges[1:]:
        if first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(last, merged[-1][1]))
        else:
            merged.append((first, last))
    return tuple(merged)


class CpusetCache:
    """cpuset text -> its set of CPUs, shared by value: every text is parsed to its ranges
    once, and one frozenset serves every container whose cpuset names the same CPUs, however
    it is written ("0-8191" and "0-8191,5" are one set, not two of 8,192 ints each). Bounded:
    the sets a scan makes hold at most MEMBERS_PER_SCAN CPUs in all (a real node's are its
    exclusive CPUs and its shared pool: two sets of NR_CPUS_MAX at most, a third while the
    pool changes); a container whose cpuset would make more is unreadable (ValueError)."""

    def __init__(self, kept: int = CPUSETS_KEPT) -> None:
        self.kept = kept
        self._texts: dict[str, frozenset[int]] = {}
        self._values: dict[tuple[tuple[int, int], ...], frozenset[int]] = {}
        self._held = 0  # CPUs in the sets of _values
        self._made = 0  # CPUs in the sets made this scan

    def new_scan(self) -> None:
        self._made = 0

    def cpus(self, text: str) -> frozenset[int]:
        key = text.strip()
        found = self._texts.get(key)
        if found is not None:
            return found
        ranges = parse_cpuset(key)
        found = self._values.get(ranges)
        if found is None:
            size = sum(last - first + 1 for first, last in ranges)
            if self._made + size > MEMBERS_PER_SCAN:
                raise ValueError(f"more than {MEMBERS_PER_SCAN} CPUs in the distinct cpusets "
                                 "of one scan (no node pins its CPUs so many ways)")
            if self._held + size > MEMBERS_PER_SCAN or len(self._values) >= self.kept:
                self._values.clear()
                self._held = 0
            found = self._values[ranges] = frozenset(
                c for first, last in ranges for c in range(first, last + 1))
            self._held += size
            self._made += size
        if len(self._texts) >= self.kept:
            self._texts.clear()
        self._texts[key] = found
        return found


@dataclass(frozen=True)
class Layout:
    """Where the kubepods hierarchy is: the directory the containers are enumerated in and,
    per value, the hierarchy it is read from (v1: one per controller; v2: all the same).
    Paths are strings: a scan joins thousands of them, and pathlib costs a third of it."""

    version: int
    walk: str
    cpuset: str | None
    cpu: str | None
    memory: str | None


def find_layout(root: str | Path) -> Layout | None:
    root = str(root)
    if os.path.exists(f"{root}/cgroup.controllers"):
        for name in KUBEPODS:
            if os.path.isdir(f"{root}/{name}"):
                top = f"{root}/{name}"
                return Layout(2, top, top, top, top)
        return None
    found: dict[str, str | None] = {}
    for controller in ("memory", "cpuset", "cpu"):
        found[controller] = next((f"{root}/{controller}/{n}" for n in KUBEPODS
                                  if os.path.isdir(f"{root}/{controller}/{n}")), None)
    walk = found["memory"] or found["cpuset"] or found["cpu"]
    if walk is None:
        return None
    return Layout(1, walk, found["cpuset"], found["cpu"], found["memory"])


@dataclass
class Reads:
    """What one scan's reads share: its deadline (monotonic; None: none) and the cpuset sets."""

    deadline: float | None = None
    cpusets: CpusetCache = field(default_factory=CpusetCache)
    out_of_time: bool = False  # the scan stopped at the deadline

    def text(self, path: str, cap: int = MAX_FILE) -> str | None:
        """The file's text; None when it does not exist (gone, or not this controller's).
        Non-blocking, not through a link, at most `cap` bytes, within the deadline (checked
        inside the read too): ScanOutOfTime past it."""
        try:
            data = read_bytes(path, cap, follow=False, deadline=self.deadline)
        except FileNotFoundError:
            return None
        except OutOfTime:
            raise ScanOutOfTime(path) from None
        except Refused as e:
            raise Unreadable(f"{path}: {e.reason}") from None
        except OSError as e:
            if e.errno in (errno.ENODEV, errno.ESRCH):  # a cgroup or process removed under us
                return None
            raise Unreadable(f"{path}: {e.strerror or e}") from None
        try:
            return data.decode("ascii")
        except UnicodeDecodeError:
            raise Unreadable(f"{path}: not text") from None


def _int(path: str, text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise Unreadable(f"{path}: {text.strip()[:40]!r} is not a number") from None


def read_oom_score_adj(procs: str, procfs: str, r: Reads) -> int | None:
    """The OOM score adjustment of the container's lowest PID still alive; None: no process
    (a container that exited, or a pause with none in this hierarchy)."""
    text = r.text(procs, PIDS_READ)
    if text is None:
        return None
    pids: list[int] = []
    for word in text.split():
        if not word.isdigit():
            raise Unreadable(f"{procs}: {word[:20]!r} is not a PID")
        pids.append(int(word))
    for pid in sorted(pids)[:PIDS_TRIED]:
        path = f"{procfs}/{pid}/oom_score_adj"
        value = r.text(path, 16)
        if value is None:
            continue  # exited while we read: the next one
        adj = _int(path, value)
        if not -1000 <= adj <= 1000:
            raise Unreadable(f"{path}: {adj} is outside -1000..1000")
        return adj
    return None


def read_container(layout: Layout, rel: str, procfs: str, r: Reads) -> dict[str, object]:
    """The values of one container cgroup (`rel`: its path under the kubepods directory),
    keyed as ContainerCgroup's fields; raises Unreadable (and ScanOutOfTime)."""
    out: dict[str, object] = {}
    v2 = layout.version == 2
    out["oom_score_adj"] = read_oom_score_adj(f"{layout.walk}/{rel}/cgroup.procs", procfs, r)
    if layout.cpuset is not None:
        path = f"{layout.cpuset}/{rel}/" + ("cpuset.cpus.effective" if v2 else "cpuset.cpus")
        text = r.text(path, CPUSET_MAX)
        if text is not None:
            try:
                out["cpus"] = r.cpusets.cpus(text)
            except ValueError as e:
                raise Unreadable(f"{path}: {e}") from None
    if layout.cpu is not None:
        out["cpu_limit"] = _cpu_limit(f"{layout.cpu}/{rel}", v2, r)
    if layout.memory is not None:
        memory = f"{layout.memory}/{rel}"
        limit = _limit(f"{memory}/memory.max" if v2 else f"{memory}/memory.limit_in_bytes", r)
        out["memory_limit"] = limit
        if v2:
            out["swap_limit"] = _limit(f"{memory}/memory.swap.max", r)
        else:
            # memsw is memory plus swap (absent without swapaccount); the kubelet sets it to
            # the memory limit on v1, which allows no swap.
            memsw = _limit(f"{memory}/memory.memsw.limit_in_bytes", r)
            if memsw is not None and limit is not None:
                out["swap_limit"] = max(0, memsw - limit)
    return out


def _limit(path: str, r: Reads) -> int | None:
    """A byte limit; None for none ("max", v1's page-counter maximum) or no such file."""
    text = r.text(path)
    if text is None or text.strip() == "max":
        return None
    value = _int(path, text)
    if value < 0:
        raise Unreadable(f"{path}: negative")
    return None if value >= UNLIMITED else value


def _cpu_limit(directory: str, v2: bool, r: Reads) -> float | None:
    """Cores: the CFS quota over its period; None for no quota."""
    if v2:
        path = f"{directory}/cpu.max"
        text = r.text(path)
        if text is None:
            return None
        parts = text.split()
        if len(parts) != 2:
            raise Unreadable(f"{path}: {text.strip()[:40]!r} is not 'QUOTA PERIOD'")
        if parts[0] == "max":
            return None
        quota, period = _int(path, parts[0]), _int(path, parts[1])
    else:
        qpath, ppath = f"{directory}/cpu.cfs_quota_us", f"{directory}/cpu.cfs_period_us"
        qtext, ptext = r.text(qpath), r.text(ppath)
        if qtext is None or ptext is None:
            return None
        quota, period = _int(qpath, qtext), _int(ppath, ptext)
        if quota < 0:  # -1: no quota
            return None
    if period <= 0 or quota <= 0:
        raise Unreadable(f"{directory}: CFS quota {quota} over period {period}")
    return quota / period


def _pod_uid(name: str) -> str | None:
    m = _POD.fullmatch(name)
    return m.group(1).replace("_", "-") if m else None


def _container_id(name: str) -> str | None:
    if name.startswith("crio-conmon-"):
        return None
    m = _CONTAINER.fullmatch(name)
    return m.group(1) if m else None


def _subdirs(path: str, budget: list[int]) -> Iterator[str]:
    """Names of the sub-directories of `path`, while the entry budget lasts."""
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                if budget[0] <= 0:
                    return
                budget[0] -= 1
                try:
                    if entry.is_dir(follow_symlinks=False):
                        yield entry.name
                except OSError:
                    continue
    except (FileNotFoundError, NotADirectoryError):
        return


def container_dirs(walk: str, budget: list[int]) -> Iterator[tuple[str, str, str, str]]:
    """(qos, pod uid, container id, path relative to `walk`) of each container cgroup:
    guaranteed pods (directly under kubepods) first, then burstable, then besteffort."""
    qos_dirs: list[tuple[str, str]] = [("guaranteed", "")]
    for name in _subdirs(walk, budget):
        for qos in QOS_NAMES:
            if name in (qos, f"kubepods-{qos}.slice"):
                qos_dirs.append((qos, f"{name}/"))
    for qos, qrel in qos_dirs:
        for pod_name in _subdirs(f"{walk}/{qrel}", budget):
            uid = _pod_uid(pod_name)
            if uid is None:
                continue
            for cname in _subdirs(f"{walk}/{qrel}{pod_name}", budget):
                cid = _container_id(cname)
                if cid is not None:
                    yield qos, uid, cid, f"{qrel}{pod_name}/{cname}"


def scan(root: str | Path, procfs: str | Path, now: float, *,
         max_containers: int = MAX_CONTAINERS, seconds: float = SCAN_SECONDS,
         problems: list[str] | None = None, reads: Reads | None = None) -> RunningContainers:
    """One bounded scan. `problems` collects what was unreadable (for the caller's one log
    line per scan); never raises for what the tree holds. `reads` (the source's, to share
    cpuset sets from scan to scan) gets the deadline, and says whether it ran out."""
    layout = find_layout(root)
    if layout is None:
        return RunningContainers(now, 0)
    procfs = str(procfs)
    r = reads if reads is not None else Reads()
    r.deadline, r.out_of_time = time.monotonic() + seconds, False
    r.cpusets.new_scan()
    budget = [max(64, max_containers * MAX_ENTRIES_PER_CONTAINER)]
    found: list[ContainerCgroup] = []
    skipped, truncated = 0, False
    for qos, uid, cid, rel in container_dirs(layout.walk, budget):
        if len(found) >= max_containers:
            truncated = True
            break
        try:
            if time.monotonic() > r.deadline:
                raise ScanOutOfTime(rel)
            values = read_container(layout, rel, procfs, r)
        except Unreadable as e:
            skipped += 1
            if problems is not None and len(problems) < 3:
                problems.append(str(e))
            continue
        except ScanOutOfTime:
            truncated = r.out_of_time = True
            if problems is not None:
                problems.insert(0, f"the scan's time budget ({seconds:g} s) ran out after "
                                f"{len(found)} containers")
            break
        found.append(ContainerCgroup(uid, cid, qos, **values))  # type: ignore[arg-type]
    if budget[0] <= 0:
        truncated = True
    found.sort(key=lambda c: (c.qos, c.pod_uid, c.container_id))
    return RunningContainers(now, layout.version, tuple(found), truncated, skipped)


NO_KUBEPODS = ("no kubepods cgroup found under {root}: the host's cgroup tree is not mounted "
               "there, or no kubelet runs (fix: mount the host's /sys/fs/cgroup read-only and "
               "pass it as --cgroup-root)")


class RunningPodsSource(PokedSource):
    name = "running_pods"

    def __init__(self, clock: Clock, root: str, procfs: str = "/proc", *,
                 max_containers: int = MAX_CONTAINERS, min_interval: float = MIN_INTERVAL,
                 interval: float = STATE_INTERVAL, seconds: float = SCAN_SECONDS,
                 watchdog_grace: float = WATCHDOG_GRACE) -> None:
        super().__init__(clock)
        self.root, self.procfs = root, procfs
        self.max_containers = max_containers
        self.min_interval = min_interval
        self.interval = interval
        self.seconds = seconds  # a scan's time budget
        self.watchdog_grace = watchdog_grace
        self._last: RunningContainers | None = None
        self._reads = Reads()  # the cpuset sets, shared from scan to scan
        self._status_lock = threading.Lock()
        self._up = True  # as the loop says at start

    def _set_up(self, emit: Emit, up: bool, reason: str) -> None:
        with self._status_lock:
            if up == self._up:
                return
            self._up = up
        emit(SourceStatus(self.name, up, self.clock.now(), reason))

    def up_reason(self) -> str:
        return f"reading containers under {self.root}"

    def read(self, emit: Emit) -> None:
        started = time.monotonic()
        now = self.clock.now()
        problems: list[str] = []
        # A read the kernel holds (the budget is checked inside reads, but a read that never
        # returns cannot check it): down from another thread once the scan is overdue.
        overdue = self.seconds + self.watchdog_grace
        watchdog = threading.Timer(overdue, self._set_up, (
            emit, False, f"a scan of {self.root} has not completed in {overdue:g} s (its budget "
            f"is {self.seconds:g} s): a read of the cgroup tree or /proc does not return"))
        watchdog.daemon = True
        watchdog.start()
        try:
            event = scan(self.root, self.procfs, now, max_containers=self.max_containers,
                         seconds=self.seconds, problems=problems, reads=self._reads)
        finally:
            watchdog.cancel()
        if not event.cgroup_version:
            # Not "no containers": nothing of the kubelet's cgroups is visible here. Down
            # with the reason; no scan is handed on (the series stay absent), except one
            # that empties what an earlier scan found.
            self._set_up(emit, False, NO_KUBEPODS.format(root=self.root))
            if self._last is not None and self._last.cgroup_version:
                self._last = event
                emit(event)
            return
        if self._reads.out_of_time:
            self._set_up(emit, False, f"a scan of {self.root} did not complete within its "
                         f"{self.seconds:g} s budget ({problems[0]}); the containers past it "
                         "are not judged")
        else:
            self._set_up(emit, True, self.up_reason())
        if event.skipped or event.truncated:
            what = [f"{event.skipped} container(s) unreadable"] if event.skipped else []
            if event.truncated:
                what.append(f"scan stopped at {len(event.containers)} containers (budget)")
            emit(MalformedInput(self.name, "; ".join(what + problems), now))
        last = self._last
        if last is None or _key(last) != _key(event):
            self._last = event
            emit(event)
        # Pokes that came during the scan or the gap wait: one rescan after it, not one each.
        rest = self.min_interval - (time.monotonic() - started)
        if rest > 0:
            self.stopping.wait(rest)


def _key(event: RunningContainers) -> tuple[object, ...]:
    return (event.cgroup_version, event.containers, event.truncated, event.skipped)


RUNNING_PODS_MAX_CONTAINERS: Opt[int] = Opt(
    "running_pods_max_containers", ("--running-pods.max-containers",), MAX_CONTAINERS,
    "Containers read per scan of the kubepods cgroups (those past it are not judged; 0: do not "
    "read the running containers).", click.IntRange(0, 1_000_000))
RUNNING_PODS_MIN_INTERVAL: Opt[float] = Opt(
    "running_pods_min_interval", ("--running-pods.min-interval",), MIN_INTERVAL,
    "Seconds at least between two scans of the running containers, however many kernel events "
    "ask for one.", Seconds())

register(SourceSpec(
    "running_pods", KUBERNETES, "the running containers' cgroups and OOM scores",
    lambda ctx: RunningPodsSource(ctx.clock, CGROUP_ROOT.of(ctx.options),
                                  PROCFS_ROOT.of(ctx.options),
                                  max_containers=RUNNING_PODS_MAX_CONTAINERS.of(ctx.options),
                                  min_interval=RUNNING_PODS_MIN_INTERVAL.of(ctx.options)),
    wanted=lambda options: bool(CGROUP_ROOT.of(options))
    and RUNNING_PODS_MAX_CONTAINERS.of(options) > 0, order=62,
    options=(RUNNING_PODS_MAX_CONTAINERS, RUNNING_PODS_MIN_INTERVAL),
    poked_by=frozenset({Resource.CPU, Resource.MEMORY})))
