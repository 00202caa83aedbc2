"""Guest-side: put unmovable kernel pages into chosen memory blocks, and hold them.

The lab's "a DIMM the plan refuses" needs a hot-added DIMM, onlined into a kernel zone, that
really holds pages the kernel cannot move. Pipe buffers are such pages: fs/pipe.c allocates them
with GFP_HIGHUSER (no __GFP_MOVABLE: never ZONE_MOVABLE, never migrated, not on an LRU list), so
has_unmovable_pages() makes offline_pages() fail with EBUSY at once (no migration loop). Freshly
onlined pages sit at the tail of the free lists and unmovable allocations only take a movable
pageblock when their own lists are empty. So first the rest of ZONE_NORMAL's free memory is
taken by huge pages (vm.nr_hugepages: the kernel allocates them at once, nothing is copied),
then pipes are filled in steps until /proc/kpageflags shows in-use, non-LRU pages in one of the
target blocks (or a bound is hit), then the huge pages are given back. Without the huge pages
the pipes had to fill all of ZONE_NORMAL first: 0.4-1.3 GiB copied, 13-150 s under TCG.

    python -m lab.pin_pages READY_FILE [--movable-too] BLOCK [BLOCK...]     (root, in the guest)

--movable-too: the huge pages fill ZONE_MOVABLE's free memory too (a guest with movable memory
beside the targets: huge pages come from there first).

Writes READY_FILE (JSON: bytes held, the in-use non-LRU pages the pipes added per target
block, ok) and then holds the pipes until SIGTERM; the pages go back to the kernel when the
process exits.
Standard library only.
"""
from __future__ import annotations

import fcntl
import json
import os
import resource
import signal
import struct
import sys
import time
from pathlib import Path

MEM_ROOT = Path("/sys/devices/system/memory")
PAGE = 4096
PIPE_BYTES = 4 << 20  # per pipe (root may exceed pipe-max-size)
STEP_BYTES = 16 << 20  # filled between two looks at the target blocks
WANT_PAGES = 512  # a pageblock's worth of pinned pages in one target block (per-CPU lists: fewer)
MIN_AVAILABLE_KB = 96 << 10  # never fill past this much MemAvailable: the guest must live on
F_SETPIPE_SZ = 1031
HUGE_PAGE = 2 << 20
NR_HUGEPAGES = Path("/proc/sys/vm/nr_hugepages")
# include/uapi/linux/kernel-page-flags.h: what an in-use, unmovable page has none of
KPF_LRU, KPF_SLAB, KPF_BUDDY, KPF_HUGE, KPF_NOPAGE = 1 << 5, 1 << 7, 1 << 10, 1 << 17, 1 << 20
NOT_PINNED = KPF_LRU | KPF_SLAB | KPF_BUDDY | KPF_HUGE | KPF_NOPAGE


def mem_available_kb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    return 0


def pinned_pages(blocks: list[int]) -> dict[int, int]:
    """In-use pages that are neither free, LRU, slab nor huge, per block (kpageflags)."""
    pages = int((MEM_ROOT / "block_size_bytes").read_text(), 16) // PAGE
    out = {}
    with open("/proc/kpageflags", "rb") as f:
        for n in blocks:
            f.seek(n * pages * 8)
            data = f.read(pages * 8)
            out[n] = sum(1 for (v,) in struct.iter_unpack("<Q", data) if not v & NOT_PINNED)
    return out


def zone_free_pages(zone: str) -> int:
    """nr_free_pages of a zone, from /proc/zoneinfo (all nodes)."""
    total, current = 0, None
    for line in Path("/proc/zoneinfo").read_text().splitlines():
        if line.startswith("Node "):
            current = line.split()[-1]
        elif current == zone and line.split()[:1] == ["nr_free_pages"]:
            total += int(line.split()[1])
    return total


def free_in(blocks: list[int]) -> int:
    """Free pages in the target blocks (kpageflags BUDDY)."""
    pages = int((MEM_ROOT / "block_size_bytes").read_text(), 16) // PAGE
    free = 0
    with open("/proc/kpageflags", "rb") as f:
        for n in blocks:
            f.seek(n * pages * 8)
            free += sum(1 for (v,) in struct.iter_unpack("<Q", f.read(pages * 8))
                        if v & KPF_BUDDY)
    return free


def take_the_rest(blocks: list[int], movable: bool = False) -> int:
    """Huge pages for ZONE_NORMAL's free memory outside the target blocks; how many. Huge pages
    are movable allocations, which ZONE_MOVABLE serves first: with `movable`, its free memory
    is added (else the pipes fill what they leave of ZONE_NORMAL first)."""
    spare = zone_free_pages("Normal") + (zone_free_pages("Movable") if movable else 0) \
        - free_in(blocks) - (32 << 20) // PAGE
    want = max(0, spare * PAGE // HUGE_PAGE)
    NR_HUGEPAGES.write_text(str(want))
    return int(NR_HUGEPAGES.read_text())


def fill(blocks: list[int], movable: bool = False) -> tuple[list[int], dict]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    chunk = b"\xa5" * PIPE_BYTES
    fds: list[int] = []
    held = 0
    t0 = time.monotonic()
    huge = take_the_rest(blocks, movable)
    # What the blocks hold before a pipe is filled is not ours (a block's own memmap when
    # onlined with memmap_on_memory: 512 pages of a 128 MiB block, in use and flagless; pages
    # on the per-CPU free lists): only the rise the pipes make counts as pinned.
    before = pinned_pages(blocks)
    try:
        while True:
            counts = {n: max(0, c - before[n]) for n, c in pinned_pages(blocks).items()}
            done = {"bytes": held, "pinned": counts, "before": before, "huge_pages": huge,
                    "seconds": round(time.monotonic() - t0, 2)}
            if max(counts.values()) >= WANT_PAGES:
                return fds, {"ok": True, **done}
            if mem_available_kb() < MIN_AVAILABLE_KB or len(fds) + 2 > hard:
                return fds, {"ok": False, **done,
                             "why": "MemAvailable or file descriptors ran out first"}
            held += fill_step(fds, chunk)
    finally:
        NR_HUGEPAGES.write_text("0")


def fill_step(fds: list[int], chunk: bytes) -> int:
    """STEP_BYTES more in new pipes; the bytes written."""
    held = 0
    while held < STEP_BYTES:
        r, w = os.pipe()
        fds += [r, w]
        size = fcntl.fcntl(w, F_SETPIPE_SZ, PIPE_BYTES)
        os.set_blocking(w, False)
        written = 0
        try:
            while written < size:
                written += os.write(w, chunk[: size - written])
        except BlockingIOError:
            pass
        held += written
    return held


def main(argv: list[str]) -> int:
    ready = Path(argv[0])
    movable = "--movable-too" in argv[1:]
    blocks = [int(a) for a in argv[1:] if a != "--movable-too"]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    fds, result = fill(blocks, movable)
    tmp = ready.with_name(f".{ready.name}.tmp")
    tmp.write_text(json.dumps(result))
    os.rename(tmp, ready)
    while True:  # hold the pages until told to stop
        time.sleep(3600)
    return 0  # not reached: SIGTERM exits


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
