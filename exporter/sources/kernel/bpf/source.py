"""BPF source: the cpuhp tracepoints, the memory online/offline probes and the managed page
count (virtio-mem sub-blocks, balloons: managed_pages.py beside it).

The BPF C in bpf/ aggregates in the kernel (one record per CPU or memory-block transition).
bcc compiles, loads and attaches it in a short-lived child process (loader.py beside this file
says why and how), which hands the map, program and perf-event fds back; this module never
imports bcc. The programs are listed in programs.py, the record and its decoder are record.py.
This module reads the ring buffer through libbpf (libbpf.py) on an epoll wait with no timeout
(a stop wakes it through a pipe), decodes records into Transitions and counts what the ring
buffer dropped. Kernel CLOCK_MONOTONIC stamps become wall time in one place:
Clock.from_ktime_ns.
"""

from __future__ import annotations

import collections
import ctypes
import os
import select
import time
from pathlib import Path

from exporter import privileges
from exporter.clock import MonotonicWallClock
from exporter.config.options import PROCFS_ROOT, SYSFS_ROOT, Opt
from exporter.config.types import PowerOfTwo
from exporter.events import (
    Event,
    EventsLost,
    MalformedInput,
    ProgramStatus,
    SourceStatus,
)
from exporter.sources.base import Emit, Source, SourceUnavailable
from exporter.sources.kernel.bpf import libbpf
from exporter.sources.kernel.bpf.check import bpf_check
from exporter.sources.kernel.bpf.loader import Loaded, LoadError, load
from exporter.sources.kernel.bpf.programs import (
    CPUHP_PROGRAMS,
    KPROBES,
    MANAGED_PROBES,
    MEMORY_PROBES,
    program_cflags,
    program_text,
)
from exporter.sources.kernel.bpf.record import (
    KIND_MANAGED,
    RECORD_SIZE,
    HotplugRecord,
    RecordDecoder,
)
from exporter.sources.kernel.bpf.requirements import TRACEFS, requirements
from exporter.sources.kernel.managed_pages import SETTLE_SECONDS, Attribution, Settler
from exporter.sources.kernel.sysfs import read_hotplug_states
from exporter.sources.registry import KERNEL, SourceContext, SourceSpec, register
from exporter.untrusted import read_text

STORM_WAKES = 10  # this many wake-ups within a second is a flap storm, not a resize
STORM_BATCH_SECONDS = 0.5  # ... then records are read in batches this far apart
STORM_HOLD_SECONDS = 2.0  # ... until no record came for this long after a batch
# 256 KiB: thousands of records; a flap storm makes ~60/s
RINGBUF_PAGES: Opt[int] = Opt(
    "ringbuf_pages",
    ("--ringbuf-pages",),
    64,
    "BPF ring buffer size in pages (a power of two).",
    PowerOfTwo(),
)


def printable_program(states: dict[int, str], ringbuf_pages: int = RINGBUF_PAGES.default) -> str:
    """The BPF C as it will be compiled, for `--print-bpf`."""
    flags = " ".join(program_cflags(states, ringbuf_pages))
    return f"// cflags: {flags}\n{program_text()}"


def preflight() -> None:
    """Raise SourceUnavailable with the fix when bcc cannot compile and attach here."""
    for req in requirements():
        if not req.ok:
            raise SourceUnavailable(req.detail, req.fix)


class BpfSource(Source):
    name = "bpf"

    def __init__(
        self,
        clock: MonotonicWallClock,
        ringbuf_pages: int = RINGBUF_PAGES.default,
        sysfs: str = "/sys",
        procfs: str = "/proc",
    ):
        super().__init__(clock)
        self.wall_clock = clock  # RecordDecoder converts kernel times with it
        self.ringbuf_pages = ringbuf_pages
        self.sysfs = Path(sysfs)
        self.loaded: Loaded | None = None
        self.ring: libbpf.RingBuffer | None = None
        self.attached: dict[str, tuple[bool, str]] = {}
        self._lost_seen = 0
        self._batch: list[Event] = []  # what the ring's callbacks decoded in one consume()
        self._wake_r, self._wake_w = -1, -1
        # The managed page count (managed.bpf.c): settled into one Transition per change.
        self.managed = Settler(self.name)
        self.attribution = Attribution(sysfs, procfs)

    def open(self) -> None:
        preflight()
        try:
            states = read_hotplug_states(self.sysfs)
            block_file = self.sysfs / "devices/system/memory/block_size_bytes"
            block_size = int(read_text(block_file, 64), 16) if block_file.exists() else 0
        except (OSError, ValueError) as e:
            raise SourceUnavailable(f"cannot read the cpuhp states or memory block size: {e}",
                                    "point --path.sysfs at the host's sysfs") from e
        self.decoder = RecordDecoder(self.wall_clock, states, block_size)
        try:
            self.loaded = load(
                program_text(),
                program_cflags(states, self.ringbuf_pages),
                KPROBES,
                (TRACEFS / "kprobe_events").exists(),
            )
        except LoadError as e:
            raise SourceUnavailable(
                f"bcc could not compile or load bpf/: {e}",
                "run `node-resize-exporter check` for what is missing",
            ) from e
        self.attached = dict(self.loaded.attached)
        # One line per reason, not one per probe: all four fail together on a kernel without
        # kprobes.
        unattached: dict[str, list[str]] = {}
        for prog, (ok, reason) in self.attached.items():
            if not ok and (prog in MEMORY_PROBES or prog in MANAGED_PROBES):
                unattached.setdefault(reason, []).append(prog)
        for reason, progs in unattached.items():
            self.log.info("memory probes %s not attached: %s", ", ".join(progs), reason)
        try:
            self.ring = libbpf.RingBuffer(self.loaded.maps["records"], self._on_sample)
        except (OSError, KeyError) as e:
            self.close()
            raise SourceUnavailable(
                f"cannot read the BPF ring buffer through libbpf: {e}", libbpf.FIX
            ) from e
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)

    def reports_cpu_transitions(self) -> bool:
        """Every cpuhp program attached: each CPU transition comes as one record."""
        return self.ring is not None and all(
            self.attached.get(prog, (False, ""))[0] for prog in CPUHP_PROGRAMS)

    def loop(self, emit: Emit) -> None:
        assert self.ring is not None
        now = self.clock.now()
        for prog, (ok, reason) in self.attached.items():
            emit(ProgramStatus(prog, ok, now, reason))
        emit(SourceStatus(self.name, True, now))
        poller = select.poll()
        poller.register(self.ring.epoll_fd(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        woken: collections.deque[float] = collections.deque(maxlen=STORM_WAKES)
        storm_until = 0.0
        while not self.stopping.is_set():
            # No timeout: nothing to do until a record arrives or stop() writes; while a
            # managed-page change settles, its sum is read every SETTLE_SECONDS.
            poller.poll(SETTLE_SECONDS * 1000 if self.managed.pending else None)
            self._drain(emit)
            if self.managed.pending:
                self._settle_managed(emit)
            now = time.monotonic()
            woken.append(now)
            if now < storm_until or (len(woken) == STORM_WAKES and woken[-1] - woken[0] < 1.0):
                # A flap storm: let records gather and take them in batches (the ring holds
                # ~4000; a storm makes ~60 a second). Each wake-up here wakes the agent too,
                # and costs 2-5 ms of CPU next to a CPU online on the CI VMs (bench/README.md,
                # "Per-transition CPU"); counts stay exact, only later by <= the batch. The
                # storm lasts while records keep coming: batches are not wake-ups in a second.
                storm_until = now + STORM_HOLD_SECONDS
                self.stopping.wait(STORM_BATCH_SECONDS)
        self._drain(emit)  # what arrived while stopping still counts

    def _drain(self, emit: Emit) -> None:
        assert self.ring is not None
        batch: list[Event] = []
        self._batch = batch
        consumed = self.ring.consume()
        # The whole batch is decoded before the first event is handed on: handing each on as
        # it is decoded woke the agent at the first and had the two threads take the GIL in
        # turns for the rest, each turn a context switch (in the online window, the dearest
        # moment: bench/README.md, "Per-transition CPU").
        for event in batch:
            emit(event)
        if consumed:
            # Records are lost only while the ring is full, i.e. while records wait in it, so
            # reading the counter after each batch sees every loss with no timer.
            self._report_lost(emit)

    def _on_sample(self, data: int, size: int) -> None:
        """One record, still in the ring: copy it out (64 bytes) and decode into the batch."""
        batch = self._batch
        if size < RECORD_SIZE:
            batch.append(
                MalformedInput(
                    self.name,
                    f"ring buffer record of {size} bytes, expected {RECORD_SIZE}",
                    self.clock.now(),
                )
            )
            return
        rec = HotplugRecord.from_buffer_copy(ctypes.string_at(data, RECORD_SIZE))
        if rec.kind == KIND_MANAGED:  # a wake-up: the sum in the map is the news
            self.managed.wake(self.wall_clock.from_ktime_ns(rec.start_ns))
            return
        try:
            batch.append(self.decoder.decode(rec))
        except ValueError as e:
            batch.append(MalformedInput(self.name, str(e), self.clock.now()))

    def _settle_managed(self, emit: Emit) -> None:
        """Read the managed page sum; once it stood still SETTLE_SECONDS, re-arm the wake-up
        and report the change (a change racing the re-arm sends a new wake record)."""
        assert self.loaded is not None
        maps = self.loaded.maps
        if not self.managed.read(libbpf.lookup_s64(maps["managed"]), self.clock.now()):
            return
        libbpf.update_u64(maps["managed_armed"], 0)
        t = self.managed.finish(libbpf.lookup_s64(maps["managed"]), self.attribution.name())
        if t is not None:
            emit(t)

    def _report_lost(self, emit: Emit) -> None:
        assert self.loaded is not None
        total = libbpf.lookup_u64(self.loaded.maps["lost"])
        if total > self._lost_seen:
            emit(EventsLost(self.name, total - self._lost_seen, self.clock.now()))
            self._lost_seen = total

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        if self._wake_w >= 0:
            os.write(self._wake_w, b"x")  # wake the poll now
        super().stop(timeout)

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        if self.loaded is not None:
            self.loaded.close()  # the perf-event fds go: every probe and tracepoint detaches
            self.loaded = None
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1


def _bpf(ctx: SourceContext) -> BpfSource:
    return BpfSource(ctx.clock, RINGBUF_PAGES.of(ctx.options), SYSFS_ROOT.of(ctx.options),
                     PROCFS_ROOT.of(ctx.options))


register(
    SourceSpec(
        "bpf",
        KERNEL,
        "cpuhp tracepoints and memory online/offline probes (bcc)",
        _bpf,
        order=20,
        options=(RINGBUF_PAGES,),
        lossy=True,  # the ring buffer full: counted by the kernel side
        capabilities_after_start=privileges.bpf_capabilities_after_start,
        reports_cpu_transitions=True,
        check=bpf_check,
    )
)
