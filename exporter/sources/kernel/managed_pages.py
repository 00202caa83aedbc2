"""Memory that comes and goes without a memory block: virtio-mem sub-blocks and balloons.

A virtio-mem device in sub-block mode plugs and unplugs parts of memory blocks that stay online;
a virtio-balloon without deflate-on-oom takes pages out of the managed page count one by one
(Hyper-V's balloon does the same). MemTotal (totalram_pages) moves; no block changes state, no
uevent is sent, online_pages()/offline_pages() are not called. So these changes are seen where
the kernel moves the managed page count (bpf/managed.bpf.c: kprobes on
adjust_managed_page_count() and generic_online_page(), calls inside a block's own transition
skipped), and settled here into one Transition per change: resource memory, unit MANAGED_UNIT
(no block), direction by the sign, nr_pages the pages moved, `mechanism` naming what moved them.

Where the kernel has no kprobes (the hosts here: CONFIG_KPROBES=n), or the bpf source could not
load them, the `managed_pages` source below reads MemTotal every --managed-pages.interval and
reports a move of MemTotal between two reads in which no memory block changed state
(bench/README.md, "virtio-mem and virtio-balloon": its cost and latency). The ledger believes
one of the two at a time: the kprobes while both their programs are attached, else the poll
(correlate/ledger.py says why), and the transition pokes the sysfs reconciler, so the kernel
capacity gauge follows at once.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from exporter.clock import Clock
from exporter.config.options import PROCFS_ROOT, SYSFS_ROOT, Opt
from exporter.config.types import Seconds
from exporter.events import Direction, MalformedInput, Resource, Result, SourceStatus, Transition
from exporter.sources.base import Emit, Source
from exporter.sources.kernel.sysfs import SysfsReader, parse_meminfo
from exporter.sources.registry import KERNEL, SourceContext, SourceSpec, register
from exporter.untrusted import read_text

MANAGED_UNIT = -1  # a Transition's unit when no memory block moved (never a block number)
SETTLE_SECONDS = 0.2  # a change is over when the page count stood still this long
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")

# What moved the managed page count, in an episode's detail and a Transition's `mechanism`.
VIRTIO_MEM = "virtio-mem"
VIRTIO_BALLOON = "virtio-balloon"
BALLOON = "balloon"  # a balloon driver other than virtio's (Hyper-V, VMware)
UNKNOWN = "managed pages"


@dataclass(frozen=True)
class Drivers:
    """Devices bound to the paravirtual memory drivers (/sys/bus/virtio/drivers/<name>/)."""

    virtio_mem: int = 0
    virtio_balloon: int = 0

    @classmethod
    def read(cls, sysfs: str | Path = "/sys") -> "Drivers":
        base = Path(sysfs) / "bus/virtio/drivers"

        def bound(name: str) -> int:
            try:
                return sum(1 for e in os.scandir(base / name) if e.name.startswith("virtio"))
            except OSError:
                return 0

        return cls(bound("virtio_mem"), bound("virtio_balloon"))


def balloon_pages(vmstat_text: str) -> int:
    """Pages balloons hold now: /proc/vmstat balloon_inflate - balloon_deflate (counted since
    boot by every balloon driver, CONFIG_BALLOON_COMPACTION); 0 where the lines are absent."""
    counts: dict[str, int] = {}
    for line in vmstat_text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("balloon_inflate", "balloon_deflate"):
            try:
                counts[name] = int(value)
            except ValueError:
                continue
    return max(0, counts.get("balloon_inflate", 0) - counts.get("balloon_deflate", 0))


def read_balloon_pages(procfs: str | Path = "/proc") -> int:
    try:
        return balloon_pages(read_text(Path(procfs) / "vmstat"))
    except (OSError, ValueError):
        return 0


def mechanism(balloon_moved: bool, drivers: Drivers) -> str:
    """Who moved the managed page count: a balloon when the balloon counters moved with it,
    else virtio-mem where such a device is. virtio-mem moves it in both of its modes: sub-block
    mode plugs and unplugs parts of online blocks; big-block mode (and sub-block mode for a
    whole block) takes a block's pages out ("fake offline") before offlining and removing the
    block, whose own offline then moves MemTotal by nothing: the pages are counted here, once,
    and the block's transition says it went."""
    if balloon_moved:
        return VIRTIO_BALLOON if drivers.virtio_balloon else BALLOON
    if drivers.virtio_mem:
        return VIRTIO_MEM
    return UNKNOWN


@dataclass
class Settler:
    """Turns a running sum of page deltas into one Transition per settled change. Pure: the
    caller reads the sum and the clock. `taken` is the part of the sum already reported."""

    source: str
    taken: int = 0
    seen: int = 0
    first: float | None = None  # when the change being settled began
    last_move: float | None = None  # when its sum was last seen to move

    @property
    def pending(self) -> bool:
        return self.first is not None

    def wake(self, at: float) -> None:
        """The kernel said the count moved (a wake record's time)."""
        if self.first is None:
            self.first = at
        self.last_move = max(at, self.last_move or at)

    def read(self, total: int, now: float) -> bool:
        """The sum as read now; True when the change has settled (call finish())."""
        if total != self.seen:
            self.seen = total
            if self.first is None:
                self.first = now
            self.last_move = now
        return self.first is not None and self.last_move is not None \
            and now - self.last_move >= SETTLE_SECONDS

    def cancel(self) -> None:
        """Drop the change not yet settled (the poll: a block moved meanwhile)."""
        self.first = self.last_move = None
        self.seen = self.taken

    def finish(self, total: int, what: str) -> Transition | None:
        """Report what moved since the last report (None when it came back to where it was)."""
        start, end = self.first, self.last_move
        self.first = self.last_move = None
        delta, self.taken, self.seen = total - self.taken, total, total
        if delta == 0 or start is None or end is None:
            return None
        return Transition(self.source, Resource.MEMORY, MANAGED_UNIT,
                          Direction.ONLINE if delta > 0 else Direction.OFFLINE, Result.SUCCESS,
                          end=end, start=start, nr_pages=abs(delta), mechanism=what)


class Attribution:
    """Names the mechanism of each settled change from the balloon counters and the drivers."""

    def __init__(self, sysfs: str | Path = "/sys", procfs: str | Path = "/proc"):
        self.sysfs, self.procfs = sysfs, procfs
        self._balloon = read_balloon_pages(procfs)

    def name(self) -> str:
        now = read_balloon_pages(self.procfs)
        moved, self._balloon = now != self._balloon, now
        return mechanism(moved, Drivers.read(self.sysfs))


# ------------------------------------------------------------------ the fallback: MemTotal polled


def kprobes_here(sysfs: str | Path = "/sys") -> bool:
    """The perf kprobe PMU exists (CONFIG_KPROBE_EVENTS): the bpf source's probes can attach."""
    return (Path(sysfs) / "bus/event_source/devices/kprobe").exists()


class ManagedPagesPoll(Source):
    """MemTotal read every `interval` where no kprobe can see the managed page count move."""

    name = "managed_pages"

    def __init__(self, clock: Clock, interval: float = 1.0, sysfs: str = "/sys",
                 procfs: str = "/proc"):
        super().__init__(clock)
        self.interval = interval
        self.reader = SysfsReader(sysfs, procfs)
        self.meminfo = Path(procfs) / "meminfo"
        self.attribution = Attribution(sysfs, procfs)
        self.settler = Settler(self.name)
        self._bytes = 0
        self._blocks: frozenset[int] = frozenset()

    def _mem_total(self) -> int:
        return parse_meminfo(read_text(self.meminfo)).get("MemTotal", 0)

    def open(self) -> None:
        self.reader.check()
        self._bytes = self._mem_total()
        self._blocks = self.reader.memory_blocks()[1]

    def loop(self, emit: Emit) -> None:
        now = self.clock.now()
        emit(SourceStatus(self.name, True, now, f"MemTotal read every {self.interval:g} s"))
        while not self.stopping.wait(self.interval):
            try:
                self.poll(emit)
            except (OSError, ValueError) as e:
                emit(MalformedInput(self.name, f"{self.meminfo}: {e}"[:300], self.clock.now()))

    def poll(self, emit: Emit) -> None:
        """One read: a MemTotal move with the same blocks online, before and after MemTotal
        was read, is a managed-page change.

        While MemTotal stands still and nothing is settling, that one read is all (the block
        states are a directory of hundreds of files). Else the block states are read on both
        sides of MemTotal: onlining blocks one after another moves MemTotal between two reads,
        and a MemTotal read after blocks that were still coming made their pages look like a
        change no block made (the lab: a virtio-mem big-block plug of 8 blocks reported as
        "+768 MiB" of sub-blocks). A block that moved drops a change not yet settled: its
        pages may be that block's."""
        if self._mem_total() == self._bytes and not self.settler.pending:
            return
        blocks = self.reader.memory_blocks()[1]
        mem = self._mem_total()
        if self.reader.memory_blocks()[1] != blocks or blocks != self._blocks:
            self._blocks, self._bytes = blocks, mem  # a block's own transition: not ours
            self.settler.cancel()
            return
        if mem == self._bytes:
            if self.settler.pending:  # stood still since the last read: settled
                t = self.settler.finish(self.settler.seen, self.attribution.name())
                if t is not None:
                    emit(t)
            return
        moved = (mem - self._bytes) // PAGE_SIZE
        self._bytes = mem
        self.settler.read(self.settler.seen + moved, self.clock.now())


MANAGED_PAGES_INTERVAL: Opt[float] = Opt(
    "managed_pages_interval", ("--managed-pages.interval",), 1.0,
    "Seconds between MemTotal reads where no kprobe sees the managed page count move "
    "(virtio-mem sub-blocks, balloons).", Seconds())


def _poll(ctx: SourceContext) -> ManagedPagesPoll:
    # It polls beside the bpf source too: the kprobes may not load on a kernel that has them
    # (no headers, a compile that timed out), and one source cannot see whether another's
    # programs attached. Beside them it costs 34 us of CPU a second (bench/README.md) and
    # counts nothing: while both managed-page programs are attached the ledger takes the
    # kprobes' changes alone (exporter/correlate/ledger.py).
    return ManagedPagesPoll(ctx.clock, MANAGED_PAGES_INTERVAL.of(ctx.options),
                            SYSFS_ROOT.of(ctx.options), PROCFS_ROOT.of(ctx.options))


register(SourceSpec(
    "managed_pages", KERNEL, "MemTotal polled for managed-page changes where no kprobe sees them",
    _poll, order=60, options=(MANAGED_PAGES_INTERVAL,)))
