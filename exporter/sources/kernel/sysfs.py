"""The sysfs/procfs reconciler: the truth every gauge is set from.

Reads /sys/devices/system/cpu/{online,offline,present,possible}, memory block states and
block_size_bytes, and /proc/meminfo at start, after every kernel event (the agent pokes it) and
on a slow timer, so a missed or lost event can never leave a wrong gauge. A CPU or memory block
whose state changed between two reads, with no event seen for it, becomes a Transition from
source "sysfs" (the ledger counts it once whoever else saw it).

Every file is read bounded and non-blocking (exporter/untrusted.py): `--path.sysfs` and
`--path.procfs` may name odd trees, and a FIFO there hung start-up. A tree that cannot be read
or parsed at start is an exit 2 with the fix (the reconciler is what every gauge is set from);
later, the source is down with the reason, the failure counted as malformed, and it is up again
at the next good read.
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from exporter.checks import OK, WARN, Check
from exporter.clock import Clock
from exporter.config.options import PROCFS_ROOT, SYSFS_ROOT, Opt
from exporter.config.types import Seconds
from exporter.events import (
    Direction,
    KernelSnapshot,
    MalformedInput,
    Resource,
    Result,
    SourceStatus,
    Transition,
)
from exporter.sources.base import Emit, Source, SourceUnavailable
from exporter.sources.registry import KERNEL, SOURCES, SourceContext, SourceSpec, register
from exporter.untrusted import read_text

# ------------------------------------------------------------------ parsers (pure)


MAX_CPUS = 1 << 16  # the kernel's NR_CPUS tops out at 8192; a bigger id is not a CPU list


def parse_block_state(text: str) -> bool | None:
    """Whether a memory block's `state` says online: True, False, or None for a text the
    kernel does not write (left out, as an unreadable block is). drivers/base/memory.c
    state_show writes "online", "offline" or, while an offline is in progress,
    "going-offline": the block is still online then (its pages are there, MemTotal counts
    them) and stays so when the kernel refuses the offline (EBUSY). Read as offline, a poll
    during a refused offline was an offline and an online that never happened."""
    state = text.strip()
    if state in ("online", "going-offline"):
        return True
    if state == "offline":
        return False
    return None


def parse_cpu_list(text: str) -> frozenset[int]:
    """Kernel CPU list syntax: "0-3,8,10-11" (also used by cpusets). Empty means none.

    ValueError on anything else, including ids of MAX_CPUS or more: "0-4294967295" would
    otherwise be a set of four billion ints.
    """
    cpus: set[int] = set()
    text = text.strip()
    if not text:
        return frozenset()
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            a, b = int(lo), int(hi)
            if a < 0 or b < a or b >= MAX_CPUS:
                raise ValueError(f"bad CPU range {part!r}")
            cpus.update(range(a, b + 1))
        else:
            n = int(part)
            if n < 0 or n >= MAX_CPUS:
                raise ValueError(f"bad CPU number {part!r}")
            cpus.add(n)
    return frozenset(cpus)


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo -> {field: value}; "kB" values become bytes, counts stay counts."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        if ":" not in line:
            continue
        key, rest = line.split(":", 1)
        fields = rest.split()
        if not fields:
            continue
        value = int(fields[0])
        if len(fields) > 1 and fields[1] == "kB":
            value *= 1024
        out[key.strip()] = value
    return out


def parse_hotplug_states(text: str) -> dict[int, str]:
    """/sys/devices/system/cpu/hotplug/states: " 85: ap:offline" lines -> {85: "ap:offline"}."""
    states: dict[int, str] = {}
    for line in text.splitlines():
        if ":" not in line:
            continue
        num, name = line.split(":", 1)
        states[int(num.strip())] = name.strip()
    return states


def read_hotplug_states(sysfs: str | Path = "/sys") -> dict[int, str]:
    """The cpuhp state table of this kernel: the one reader, for the BPF program's constants,
    `--print-bpf` and the sysfs reconciler alike."""
    return parse_hotplug_states(read_text(Path(sysfs) / "devices/system/cpu/hotplug/states"))


HUGEPAGE_RESOURCES = {2 * 1024 * 1024: Resource.HUGEPAGES_2MI,
                      1024 * 1024 * 1024: Resource.HUGEPAGES_1GI}


# ------------------------------------------------------------------ reading the tree


class SysfsReader:
    """Reads one KernelSnapshot from a sysfs and a procfs root (fixture trees in tests)."""

    def __init__(self, sysfs: str = "/sys", procfs: str = "/proc"):
        self.cpu_dir = Path(sysfs) / "devices/system/cpu"
        self.mem_dir = Path(sysfs) / "devices/system/memory"
        self.hugepages_dir = Path(sysfs) / "kernel/mm/hugepages"
        self.meminfo = Path(procfs) / "meminfo"

    def check(self) -> None:
        for p in (self.cpu_dir / "online", self.meminfo):
            if not os.access(p, os.R_OK):
                raise SourceUnavailable(f"cannot read {p}",
                                        "mount sysfs and procfs (in a container: mount the "
                                        "host's /sys read-only)")

    def _cpus(self, name: str) -> frozenset[int]:
        path = self.cpu_dir / name
        try:
            return parse_cpu_list(read_text(path))
        except FileNotFoundError:
            return frozenset()

    def memory_blocks(self) -> tuple[int, frozenset[int], frozenset[int]]:
        try:
            text = read_text(self.mem_dir / "block_size_bytes", 64)
        except FileNotFoundError:
            return 0, frozenset(), frozenset()
        size = int(text.strip(), 16)
        if size <= 0:
            raise ValueError(f"block_size_bytes {text.strip()[:20]!r} is not a size")
        online: set[int] = set()
        offline: set[int] = set()
        for entry in os.scandir(self.mem_dir):
            if not entry.name.startswith("memory") or not entry.name[6:].isdigit():
                continue
            try:
                state = read_text(os.path.join(entry.path, "state"), 64).strip()
            except FileNotFoundError:
                continue  # block removed between scandir and open
            except (OSError, ValueError):
                # Not a readable state file (a FIFO, a link loop, a folder: refused unread):
                # the block is left out, as the plan's hardware read names it; one hostile
                # block never fails the whole read.
                continue
            is_online = parse_block_state(state)
            if is_online is not None:
                (online if is_online else offline).add(int(entry.name[6:]))
        return size, frozenset(online), frozenset(offline)

    def hugepages(self, meminfo: dict[str, int]) -> dict[Resource, int]:
        out: dict[Resource, int] = {}
        if self.hugepages_dir.exists():
            for d in self.hugepages_dir.iterdir():  # hugepages-2048kB, hugepages-1048576kB
                try:
                    size = int(d.name.split("-")[1].removesuffix("kB")) * 1024
                    count = int(read_text(d / "nr_hugepages", 64))
                except (ValueError, IndexError, OSError):
                    continue
                if size in HUGEPAGE_RESOURCES:
                    out[HUGEPAGE_RESOURCES[size]] = count * size
        elif "HugePages_Total" in meminfo and "Hugepagesize" in meminfo:
            size = meminfo["Hugepagesize"]
            if size in HUGEPAGE_RESOURCES:
                out[HUGEPAGE_RESOURCES[size]] = meminfo["HugePages_Total"] * size
        return out

    def read(self, now: float) -> KernelSnapshot:
        meminfo = parse_meminfo(read_text(self.meminfo))
        online = self._cpus("online")
        offline = self._cpus("offline")
        block_size, blocks_on, blocks_off = self.memory_blocks()
        return KernelSnapshot(
            time=now,
            cpus_online=online,
            cpus_offline=offline,
            cpus_present=self._cpus("present") or online,
            cpus_possible=self._cpus("possible") or online | offline,
            memory_block_size=block_size,
            memory_blocks_online=blocks_on,
            memory_blocks_offline=blocks_off,
            mem_total_bytes=meminfo.get("MemTotal", 0),
            swap_total_bytes=meminfo.get("SwapTotal", 0),
            hugepages_bytes=self.hugepages(meminfo),
        )

    def read_cpus(self, now: float, previous: KernelSnapshot) -> KernelSnapshot:
        """After a CPU event: the four CPU lists afresh, the rest from `previous`. CPU hotplug
        changes no memory block, MemTotal or hugepage count, and the ~200 memory-block state
        files were 90% of the reconciler's time in a flap storm (bench/README.md, profile)."""
        online = self._cpus("online")
        offline = self._cpus("offline")
        return dataclasses.replace(
            previous, time=now, cpus_online=online, cpus_offline=offline,
            cpus_present=self._cpus("present") or online,
            cpus_possible=self._cpus("possible") or online | offline)


def diff_transitions(before: KernelSnapshot, after: KernelSnapshot) -> list[Transition]:
    """CPUs and memory blocks whose state differs between two snapshots."""
    out: list[Transition] = []

    def emit(resource: Resource, units: Iterable[int], direction: Direction) -> None:
        for unit in sorted(units):
            out.append(Transition("sysfs", resource, unit, direction, Result.SUCCESS,
                                  end=after.time))

    emit(Resource.CPU, after.cpus_online - before.cpus_online, Direction.ONLINE)
    emit(Resource.CPU, before.cpus_online - after.cpus_online, Direction.OFFLINE)
    # A hot-added block may appear already online (memhp_default_state), a removed one vanish:
    # both went through online_pages / offline_pages, so both are transitions.
    emit(Resource.MEMORY, after.memory_blocks_online - before.memory_blocks_online,
         Direction.ONLINE)
    emit(Resource.MEMORY, before.memory_blocks_online - after.memory_blocks_online,
         Direction.OFFLINE)
    return out


# ------------------------------------------------------------------ the source


MIN_GAP = 0.05  # seconds between two reads, however many events poke
# In a storm (poked again within STORM_WINDOW of the last poked read) reads are spaced
# STORM_GAP apart: each read then costs 2-5 ms of CPU on the CI VMs, because code that runs
# right after a CPU comes online runs ~50x slower there (bench/README.md, "Per-transition
# CPU"), and the transitions themselves are counted from BPF and uevents, not from these
# reads; the gauges trail the kernel by at most STORM_GAP while it lasts. STORM_WINDOW is
# longer than the gap, so a storm stays one until the pokes stop.
STORM_GAP = 1.0
STORM_WINDOW = 2.0


class SysfsSource(Source):
    name = "sysfs"

    def __init__(self, clock: Clock, interval: float = 30.0, sysfs: str = "/sys",
                 procfs: str = "/proc", emit_transitions: bool = True):
        super().__init__(clock)
        self.interval = interval
        # False when sysfs is not a chosen event source: it still sets every gauge.
        self.emit_transitions = emit_transitions
        self.reader = SysfsReader(sysfs, procfs)
        self._poke = threading.Event()
        self._everything = False  # a poke asked for more than the CPU lists
        self._poked_read = -STORM_WINDOW  # time.monotonic() of the last read a poke asked for
        self._last: KernelSnapshot | None = None
        self._down = False  # the last read failed: reported down until one succeeds

    def open(self) -> None:
        self.reader.check()
        try:
            self._last = self.reader.read(self.clock.now())
        except (OSError, ValueError) as e:
            raise SourceUnavailable(f"cannot read the CPU and memory state: {e}",
                                    "point --path.sysfs and --path.procfs at the host's sysfs "
                                    "and procfs (mounted read-only in a container)") from e

    @property
    def initial(self) -> KernelSnapshot | None:
        return self._last

    def poke(self, resource: Resource | None = None) -> None:
        """Re-read soon: a kernel event arrived (called from the agent thread). After CPU
        events only the CPU lists are read again; after anything else, everything."""
        if resource is not Resource.CPU:
            self._everything = True
        self._poke.set()

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        self._poke.set()  # wake the timer wait now, not at the next interval
        super().stop(timeout)

    def loop(self, emit: Emit) -> None:
        emit(SourceStatus(self.name, True, self.clock.now()))
        if self._last is not None:
            emit(self._last)
        while not self.stopping.is_set():
            timed_out = not self._poke.wait(self.interval)
            # In a flap storm every transition pokes (BPF, then its uevent): one read per
            # gap covers them all, and the gauges trail the kernel by at most that.
            now = time.monotonic()
            storm = not timed_out and now - self._poked_read < STORM_WINDOW
            self.stopping.wait(STORM_GAP if storm else MIN_GAP)
            if not timed_out:
                self._poked_read = now
            self._poke.clear()  # before taking the flag: a later poke sets both again
            everything, self._everything = self._everything or timed_out, False
            if self.stopping.is_set():
                return
            self.reconcile(emit, cpus_only=not everything)

    def reconcile(self, emit: Emit, cpus_only: bool = False) -> None:
        try:
            now = self.clock.now()
            if cpus_only and self._last is not None:
                snap = self.reader.read_cpus(now, self._last)
            else:
                snap = self.reader.read(now)
        except (OSError, ValueError) as e:
            reason = f"reading sysfs/procfs: {e}"[:300]
            emit(MalformedInput(self.name, reason, self.clock.now()))
            if not self._down:  # once per outage, not every read
                self._down = True
                self.log.warning("sysfs down: %s", reason)
                emit(SourceStatus(self.name, False, self.clock.now(), reason))
            return
        if self._down:
            self._down = False
            emit(SourceStatus(self.name, True, self.clock.now(), "sysfs/procfs readable again"))
        if self._last is not None and self.emit_transitions:
            for t in diff_transitions(self._last, snap):
                emit(t)
        self._last = snap
        emit(snap)


def _check(source: Source) -> list[Check]:
    """Opens as `run` opens it; a kernel without memory hotplug in sysfs is said too."""
    assert isinstance(source, SysfsSource)
    found = source.check("sysfs/procfs, the truth at each read")
    mem = source.reader.mem_dir / "block_size_bytes"
    if found[0].status == OK and not mem.exists():
        found.append(Check("sysfs", WARN, "no memory hotplug in sysfs",
                           "a kernel with CONFIG_MEMORY_HOTPLUG to see memory blocks"))
    return found


def _sysfs(ctx: SourceContext) -> SysfsSource:
    # The reconciler always runs (it sets every gauge); it reports the transitions it sees
    # between reads only when sysfs is a chosen event source.
    chosen = SOURCES.of(ctx.options)
    return SysfsSource(ctx.clock, SYSFS_INTERVAL.of(ctx.options), SYSFS_ROOT.of(ctx.options),
                       PROCFS_ROOT.of(ctx.options),
                       emit_transitions=chosen == ("auto",) or "sysfs" in chosen)


SYSFS_INTERVAL: Opt[float] = Opt(
    "sysfs_interval", ("--sysfs-interval",), 30.0,
    "Seconds between sysfs/procfs re-reads (also re-read after every event).", Seconds())

register(SourceSpec(
    "sysfs", KERNEL, "sysfs/procfs, the truth at each read", _sysfs, order=10,
    options=(SYSFS_INTERVAL,),
    reconciles=True, poked_by=frozenset(Resource), check=_check))
