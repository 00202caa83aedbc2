"""The record the BPF programs write, read back: the user side of bpf/hotplug.h.

One record per CPU or memory-block transition (struct hotplug_record): its layout as ctypes,
its kinds, the errno names of a failed step's return code, the cpuhp states a CPU's transition
ends at (what the loader passes the program as -DSTATE_ONLINE and -DSTATE_OFFLINE_DONE), and
the decoder that turns a record into a Transition. No I/O and no bcc: tests decode records
built here, and tests/unit/test_bpf_record.py checks this layout and these kinds against the
header itself.
"""
from __future__ import annotations

import ctypes
import errno
import os

from exporter.clock import MonotonicWallClock
from exporter.events import Direction, Resource, Result, Transition

# #define KIND_CPU / KIND_MEMORY / KIND_MANAGED in bpf/hotplug.h
KIND_CPU, KIND_MEMORY, KIND_MANAGED = 1, 2, 3
KINDS = {"KIND_CPU": KIND_CPU, "KIND_MEMORY": KIND_MEMORY, "KIND_MANAGED": KIND_MANAGED}


class HotplugRecord(ctypes.Structure):
    """Mirror of struct hotplug_record in bpf/hotplug.h."""

    _fields_ = [
        ("start_ns", ctypes.c_uint64),
        ("end_ns", ctypes.c_uint64),
        ("pfn", ctypes.c_uint64),
        ("nr_pages", ctypes.c_uint64),
        ("kind", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("online", ctypes.c_int32),
        ("ret", ctypes.c_int32),
        ("failed_state", ctypes.c_int32),
        ("steps", ctypes.c_uint32),
    ]


RECORD_SIZE = ctypes.sizeof(HotplugRecord)


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
    """A failed step's return code by its errno name (-16 and 16: EBUSY)."""
    code = -ret if ret < 0 else ret
    return errno.errorcode.get(code, f"ret={ret}")


class RecordDecoder:
    """Turns raw records into Transitions: names states, maps pfns to memory blocks."""

    def __init__(
        self,
        clock: MonotonicWallClock,
        states: dict[int, str],
        block_size: int,
        page_size: int = os.sysconf("SC_PAGE_SIZE"),
    ):
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
            source="bpf",
            resource=resource,
            unit=int(unit),
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
