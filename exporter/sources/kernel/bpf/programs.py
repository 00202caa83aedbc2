"""The BPF programs, listed once: what bpf/ holds, what each program attaches to, and the
text and flags bcc compiles. The source loads these, the loader child checks the tracepoint
ones attached, and the requirements (`check`, the source's pre-flight) look for the same
tracepoints. No bcc here.
"""
from __future__ import annotations

from exporter.sources.kernel.bpf.files import bpf_dir
from exporter.sources.kernel.bpf.record import cpuhp_targets

BPF_DIR = bpf_dir()  # the installed copy, or the checkout's bpf/
HEADER = "hotplug.h"
PROGRAM_FILES = ("cpuhp.bpf.c", "memory.bpf.c", "managed.bpf.c")
# TRACEPOINT_PROBE(cpuhp, NAME) in cpuhp.bpf.c: bcc names each program after its tracepoint,
# in the cpuhp tracepoint group.
CPUHP_GROUP = "cpuhp"
CPUHP_PROGRAMS = ("cpuhp_enter", "cpuhp_multi_enter", "cpuhp_exit")
MEMORY_PROBES = {  # program name in memory.bpf.c -> (kernel function, is return probe)
    "online_pages_enter": ("online_pages", False),
    "online_pages_return": ("online_pages", True),
    "offline_pages_enter": ("offline_pages", False),
    "offline_pages_return": ("offline_pages", True),
}
# managed.bpf.c: the managed page count moving outside a block transition (virtio-mem
# sub-blocks, balloons); exporter/sources/kernel/managed_pages.py says what becomes of it.
MANAGED_PROBES = {
    "managed_adjust_enter": ("adjust_managed_page_count", False),
    "managed_online_enter": ("generic_online_page", False),
}
KPROBES = {**MEMORY_PROBES, **MANAGED_PROBES}  # every kprobe the loader attaches
# in hotplug.h: the ring buffer and the count of failed reserves; in managed.bpf.c: the running
# sum of managed page deltas and the flag that says a wake record is out
MAPS = ("records", "lost", "managed", "managed_armed")


def program_text() -> str:
    """bpf/*.c as one text: bcc rewrites TRACEPOINT_PROBE only in the main text, not in
    #included files, so the shared header is inlined once and the includes dropped."""
    parts = [(BPF_DIR / HEADER).read_text()]
    for name in PROGRAM_FILES:
        text = (BPF_DIR / name).read_text()
        parts.append(text.replace(f'#include "{HEADER}"', f"/* {name} */"))
    return "\n".join(parts)


def program_cflags(states: dict[int, str], ringbuf_pages: int) -> list[str]:
    online, offline_done = cpuhp_targets(states)
    return [
        f"-DSTATE_ONLINE={online}",
        f"-DSTATE_OFFLINE_DONE={offline_done}",
        f"-DRINGBUF_PAGES={ringbuf_pages}",
    ]
