"""BPF source: the cpuhp tracepoints and the memory online/offline probes, loaded with bcc.

The BPF C in bpf/ aggregates in the kernel (one record per CPU or memory-block transition);
this module only loads it, decodes records into Transitions and counts what the ring buffer
dropped. Kernel CLOCK_MONOTONIC stamps become wall time in one place: Clock.from_ktime_ns.
"""
from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

from exporter.bpf_files import bpf_dir
from exporter.clock import MonotonicWallClock
from exporter.events import (
    Direction, EventsLost, ProgramStatus, Resource, Result, SourceStatus, Transition,
)
from exporter.sources.base import Emit, Source, SourceUnavailable
from exporter.sources.sysfs import parse_hotplug_states
from exporter.sources.registry import KERNEL, SourceContext, SourceSpec, register

BPF_DIR = bpf_dir()  # the installed copy, or the checkout's bpf/
TRACEFS = Path("/sys/kernel/tracing")
KIND_CPU, KIND_MEMORY = 1, 2
CPUHP_PROGRAMS = ("cpuhp_enter", "cpuhp_multi_enter", "cpuhp_exit")
MEMORY_PROBES = {  # program name -> (kernel function, is return probe)
    "online_pages_enter": ("online_pages", False),
    "online_pages_return": ("online_pages", True),
    "offline_pages_enter": ("offline_pages", False),
    "offline_pages_return": ("offline_pages", True),
}
DEFAULT_RINGBUF_PAGES = 64  # 256 KiB: thousands of records; a flap storm makes ~60/s


class HotplugRecord(ctypes.Structure):
    """Mirror of struct hotplug_record in bpf/hotplug.h."""

    _fields_ = [
        ("start_ns", ctypes.c_uint64), ("end_ns", ctypes.c_uint64),
        ("pfn", ctypes.c_uint64), ("nr_pages", ctypes.c_uint64),
        ("kind", ctypes.c_uint32), ("cpu", ctypes.c_uint32),
        ("online", ctypes.c_int32), ("ret", ctypes.c_int32),
        ("failed_state", ctypes.c_int32), ("steps", ctypes.c_uint32),
    ]


def cpuhp_targets(states: dict[int, str]) -> tuple[int, int]:
    """(STATE_ONLINE, STATE_OFFLINE_DONE) from /sys/devices/system/cpu/hotplug/states.

    Going offline, the kernel never reports reaching state 0: the lowest prepare state,
    threads:prepare (CPUHP_CREATE_THREADS), has no teardown callback, so the last callback a
    CPU runs on its way down is the lowest named state above it.
    """
    online = next((n for n, name in states.items() if name == "online"), None)
    if online is None:
        raise ValueError("no 'online' state in hotplug/states")
    lower = sorted(n for n, name in states.items() if 0 < n < online and name != "threads:prepare")
    if not lower:
        raise ValueError("no prepare states in hotplug/states")
    return online, lower[0]


def errno_name(ret: int) -> str:
    code = -ret if ret < 0 else ret
    return errno.errorcode.get(code, f"ret={ret}")


class RecordDecoder:
    """Turns raw records into Transitions: names states, maps pfns to memory blocks."""

    def __init__(self, clock: MonotonicWallClock, states: dict[int, str], block_size: int,
                 page_size: int = os.sysconf("SC_PAGE_SIZE")):
        self.clock = clock
        self.states = states
        self.block_size = block_size
        self.page_size = page_size

    def decode(self, rec: HotplugRecord) -> Transition:
        failed = rec.ret != 0
        if rec.kind == KIND_CPU:
            resource, unit = Resource.CPU, rec.cpu
        elif rec.kind == KIND_MEMORY:
            resource = Resource.MEMORY
            unit = rec.pfn * self.page_size // self.block_size if self.block_size else rec.pfn
        else:
            raise ValueError(f"unknown record kind {rec.kind}")
        state = None
        if failed and rec.failed_state >= 0:
            state = f"{rec.failed_state} ({self.states.get(rec.failed_state, '?')})"
        return Transition(
            source="bpf", resource=resource, unit=int(unit),
            direction=Direction.ONLINE if rec.online else Direction.OFFLINE,
            result=Result.FAILED if failed else Result.SUCCESS,
            start=self.clock.from_ktime_ns(rec.start_ns),
            end=self.clock.from_ktime_ns(rec.end_ns),
            steps=rec.steps if rec.kind == KIND_CPU else None,
            failed_state=state,
            error=errno_name(rec.ret) if failed else None,
            pfn=rec.pfn if rec.kind == KIND_MEMORY else None,
            nr_pages=rec.nr_pages if rec.kind == KIND_MEMORY else None,
        )


def program_text() -> str:
    """bpf/*.c as one text: bcc rewrites TRACEPOINT_PROBE only in the main text, not in
    #included files, so the shared header is inlined once and the includes dropped."""
    parts = [(BPF_DIR / "hotplug.h").read_text()]
    for name in ("cpuhp.bpf.c", "memory.bpf.c"):
        text = (BPF_DIR / name).read_text()
        parts.append(text.replace('#include "hotplug.h"', f"/* {name} */"))
    return "\n".join(parts)


def program_cflags(states: dict[int, str], ringbuf_pages: int) -> list[str]:
    online, offline_done = cpuhp_targets(states)
    return [f"-DSTATE_ONLINE={online}", f"-DSTATE_OFFLINE_DONE={offline_done}",
            f"-DRINGBUF_PAGES={ringbuf_pages}"]


def printable_program(states: dict[int, str], ringbuf_pages: int = DEFAULT_RINGBUF_PAGES) -> str:
    """The BPF C as it will be compiled, for `--print-bpf`."""
    flags = " ".join(program_cflags(states, ringbuf_pages))
    return f"// cflags: {flags}\n{program_text()}"


def preflight() -> None:
    """Raise SourceUnavailable with the fix when bcc cannot compile and attach here."""
    if os.geteuid() != 0 and not os.access("/sys/kernel/tracing/events", os.R_OK):
        raise SourceUnavailable("not root and tracefs not readable",
                                "run as root, or grant CAP_BPF, CAP_PERFMON (kernel >= 5.8)")
    if not (TRACEFS / "events").exists():
        raise SourceUnavailable("tracefs is not mounted at /sys/kernel/tracing",
                                "mount -t tracefs nodev /sys/kernel/tracing")
    if not (TRACEFS / "events/cpuhp/cpuhp_exit").exists():
        raise SourceUnavailable("the kernel has no cpuhp tracepoints",
                                "use a kernel with CONFIG_HOTPLUG_CPU and CONFIG_TRACEPOINTS")
    build = Path(f"/lib/modules/{os.uname().release}/build")
    if not (build / "Makefile").exists() and not Path("/sys/kernel/kheaders.tar.xz").exists():
        raise SourceUnavailable(f"bcc needs kernel headers and {build} is missing",
                                "make run / scripts/setup.sh run installs linux-headers-amd64 "
                                "and links them (or load the kheaders module)")
    try:
        import bcc  # noqa: F401
    except ImportError as e:
        raise SourceUnavailable(f"cannot import bcc: {e}",
                                "apt-get install python3-bpfcc and run with /usr/bin/python3 "
                                "or a venv made with --system-site-packages") from e


class BpfSource(Source):
    name = "bpf"

    def __init__(self, clock: MonotonicWallClock, ringbuf_pages: int = DEFAULT_RINGBUF_PAGES,
                 sysfs: str = "/sys"):
        super().__init__(clock)
        self.ringbuf_pages = ringbuf_pages
        self.sysfs = Path(sysfs)
        self.bpf = None
        self.attached: dict[str, tuple[bool, str]] = {}
        self._lost_seen = 0

    def open(self) -> None:
        preflight()
        from bcc import BPF

        states = parse_hotplug_states(
            (self.sysfs / "devices/system/cpu/hotplug/states").read_text())
        block_file = self.sysfs / "devices/system/memory/block_size_bytes"
        block_size = int(block_file.read_text(), 16) if block_file.exists() else 0
        self.decoder = RecordDecoder(self.clock, states, block_size)
        try:
            self.bpf = BPF(text=program_text().encode(),  # bcc wants bytes (str is deprecated)
                           cflags=program_cflags(states, self.ringbuf_pages))
        except Exception as e:  # bcc raises bare Exceptions for compile and load failures
            raise SourceUnavailable(f"bcc could not compile or load bpf/: {e}",
                                    "run `node-resize-exporter check` for what is missing") from e
        for prog in CPUHP_PROGRAMS:  # TRACEPOINT_PROBE attaches at load
            self.attached[prog] = (True, "")
        self._attach_memory_probes()
        _return_freed_heap()

    def _attach_memory_probes(self) -> None:
        kprobes = (TRACEFS / "kprobe_events").exists()
        for prog, (func, is_return) in MEMORY_PROBES.items():
            if not kprobes:
                self.attached[prog] = (False, "kernel built without CONFIG_KPROBES")
                continue
            try:
                if is_return:
                    self.bpf.attach_kretprobe(event=func.encode(), fn_name=prog.encode())
                else:
                    self.bpf.attach_kprobe(event=func.encode(), fn_name=prog.encode())
                self.attached[prog] = (True, "")
            except Exception as e:
                self.attached[prog] = (False, f"attach to {func} failed: {e}")
                self.log.info("memory probe %s not attached: %s", prog, e)

    def loop(self, emit: Emit) -> None:
        now = self.clock.now()
        for prog, (ok, reason) in self.attached.items():
            emit(ProgramStatus(prog, ok, now, reason))
        emit(SourceStatus(self.name, True, now))

        def on_record(ctx, data, size):
            rec = ctypes.cast(data, ctypes.POINTER(HotplugRecord)).contents
            emit(self.decoder.decode(rec))

        self.bpf[b"records"].open_ring_buffer(on_record)
        while not self.stopping.is_set():
            self.bpf.ring_buffer_poll(200)
            self._report_lost(emit)

    def _report_lost(self, emit: Emit) -> None:
        total = int(self.bpf[b"lost"][ctypes.c_int(0)].value)
        if total > self._lost_seen:
            emit(EventsLost(self.name, total - self._lost_seen, self.clock.now()))
            self._lost_seen = total

    def close(self) -> None:
        if self.bpf is not None:
            self.bpf.cleanup()  # detaches every probe and tracepoint
            self.bpf = None


def _return_freed_heap() -> None:
    """Compiling with clang/LLVM leaves ~45 MB of freed heap that glibc keeps for reuse; the
    agent never compiles again, so hand it back (anonymous memory 52 -> 23 MiB measured)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def _bpf(ctx: SourceContext) -> BpfSource:
    return BpfSource(ctx.clock, ctx.options.ringbuf_pages, ctx.options.sysfs_root)


register(SourceSpec("bpf", KERNEL, "cpuhp tracepoints and memory online/offline probes (bcc)",
                    _bpf, order=20))
