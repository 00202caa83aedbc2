"""The BPF record's contract, written once on each side and checked against each other: the
kinds and the struct layout in bpf/hotplug.h against exporter/sources/kernel/bpf/record.py, and
the program list in programs.py against the C that defines the programs."""
from __future__ import annotations

import ctypes
import re

import pytest

from exporter.clock import MonotonicWallClock
from exporter.events import Direction, Resource, Result
from exporter.sources.kernel.bpf import programs
from exporter.sources.kernel.bpf.record import (
    KIND_CPU,
    KIND_MANAGED,
    KIND_MEMORY,
    KINDS,
    RECORD_SIZE,
    HotplugRecord,
    RecordDecoder,
    errno_name,
)

HEADER = (programs.BPF_DIR / programs.HEADER).read_text()
C_TYPES = {"u64": ctypes.c_uint64, "u32": ctypes.c_uint32, "s32": ctypes.c_int32,
           "s64": ctypes.c_int64}


def test_the_kinds_are_the_headers():
    defined = {name: int(value) for name, value in
               re.findall(r"^#define (KIND_\w+) (\d+)$", HEADER, re.MULTILINE)}
    assert defined == KINDS == {"KIND_CPU": KIND_CPU, "KIND_MEMORY": KIND_MEMORY,
                                "KIND_MANAGED": KIND_MANAGED}


def test_the_record_layout_is_the_headers():
    body = re.search(r"struct hotplug_record \{(.*?)\};", HEADER, re.DOTALL)
    assert body is not None
    fields = re.findall(r"^\s*(\w+)\s+(\w+);", body.group(1), re.MULTILINE)
    assert [(name, C_TYPES[kind]) for kind, name in fields] == HotplugRecord._fields_
    # natural alignment on both sides: the same size, no padding between the fields
    assert RECORD_SIZE == sum(ctypes.sizeof(C_TYPES[kind]) for kind, _ in fields) == 56


def test_every_listed_program_is_defined_in_the_c_and_no_other():
    text = programs.program_text()
    tracepoints = re.findall(r"TRACEPOINT_PROBE\((\w+),\s*(\w+)\)", text)
    assert tracepoints == [(programs.CPUHP_GROUP, p) for p in programs.CPUHP_PROGRAMS]
    functions = set(re.findall(r"^int (\w+)\(struct pt_regs \*ctx", text, re.MULTILINE))
    assert functions == set(programs.KPROBES)
    maps = re.findall(r"BPF_(?:RINGBUF_OUTPUT|ARRAY)\((\w+),", text)
    assert tuple(maps) == programs.MAPS
    assert '#include "hotplug.h"' not in text  # inlined once: bcc rewrites only the main text


def _record(**fields) -> HotplugRecord:
    return HotplugRecord.from_buffer_copy(bytes(HotplugRecord(**fields)))


def test_decodes_a_cpu_record_and_names_a_failed_state():
    decoder = RecordDecoder(MonotonicWallClock(), {85: "ap:offline", 217: "online"}, 1 << 27)
    t = decoder.decode(_record(start_ns=10, end_ns=20, kind=KIND_CPU, cpu=3, online=0, ret=-16,
                               failed_state=85, steps=7))
    assert (t.resource, t.unit, t.direction, t.result) == (
        Resource.CPU, 3, Direction.OFFLINE, Result.FAILED)
    assert (t.failed_state, t.error, t.steps, t.pfn) == ("85 (ap:offline)", "EBUSY", 7, None)


def test_decodes_a_memory_record_into_its_block():
    decoder = RecordDecoder(MonotonicWallClock(), {}, 1 << 27, page_size=4096)
    t = decoder.decode(_record(kind=KIND_MEMORY, pfn=5 * 32768, nr_pages=32768, online=1))
    assert (t.resource, t.unit, t.result, t.steps) == (Resource.MEMORY, 5, Result.SUCCESS, None)
    assert (t.pfn, t.nr_pages) == (5 * 32768, 32768)


def test_an_unknown_kind_is_refused():
    decoder = RecordDecoder(MonotonicWallClock(), {}, 0)
    with pytest.raises(ValueError, match="unknown record kind 9"):
        decoder.decode(_record(kind=9))


@pytest.mark.parametrize("ret, name", [(-16, "EBUSY"), (16, "EBUSY"), (-12, "ENOMEM"),
                                       (-99999, "ret=-99999")])
def test_errno_names(ret, name):
    assert errno_name(ret) == name
