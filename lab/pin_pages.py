"""Guest-side: put unmovable kernel pages into chosen memory blocks, and hold them.

The lab's "a DIMM the plan refuses" needs a hot-added DIMM, onlined into a kernel zone, that
really holds pages the kernel cannot move. Pipe buffers are such pages: fs/pipe.c allocates them
with GFP_HIGHUSER (no __GFP_MOVABLE: never ZONE_MOVABLE, never migrated, not on an LRU list), so
has_unmovable_pages() makes offline_pages() fail with EBUSY at once (no migration loop). Freshly
onlined pages sit at the tail of the free lists and unmovable allocations only take a movable
pageblock when their own lists are empty. So first the rest of ZONE_NORMAL's free memory is
taken by huge pages (vm.nr_hugepages: the kernel allocates them at once, nothing is copied),
then pipes are filled in steps until one of the target blocks holds enough pipe pages (or a
bound is hit), then the huge pages are given back. A pipe page is known by its flags and its
content: /proc/kpageflags shows it in use and neither LRU, slab, free nor huge, and /proc/kcore
(the direct map, by physical address) shows it full of this run's random pattern. Flags alone
also match free pages on the per-CPU lists and a block's own memmap, and the guest then gave a
"pinned" block back (2 of 4 lab runs). Without the huge pages
the pipes had to fill all of ZONE_NORMAL first: 0.4-1.3 GiB copied, 13-150 s under TCG.

    python -m lab.pin_pages READY_FILE [--movable-too] BLOCK [BLOCK...]     (root, in the guest)

--movable-too: the huge pages fill ZONE_MOVABLE's free memory too (a guest with movable memory
beside the targets: huge pages come from there first).

Writes READY_FILE (JSON: bytes held, the pipe pages found per target block (counted up to
WANT_PAGES), ok) and then holds the pipes until SIGTERM; the pages go back to the kernel when the
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


class Kcore:
    """Physical memory read through /proc/kcore's RAM segments (ELF64 program headers: a
    PT_LOAD whose p_paddr is the physical address of its direct-map range; the others carry
    p_paddr -1). Opened afresh for each look: the kernel rebuilds the headers after memory
    is onlined."""

    def __init__(self) -> None:
        self.f = open("/proc/kcore", "rb", buffering=0)
        head = self.f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:
            raise RuntimeError("/proc/kcore is not ELF64")
        phoff, = struct.unpack_from("<Q", head, 32)
        phentsize, phnum = struct.unpack_from("<HH", head, 54)
        self.f.seek(phoff)
        table = self.f.read(phentsize * phnum)
        self.ram: list[tuple[int, int, int]] = []  # (paddr, size, file offset)
        for i in range(phnum):
            p_type, _, offset, _, paddr, _, memsz, _ = struct.unpack_from(
                "<IIQQQQQQ", table, i * phentsize)
            if p_type == 1 and paddr != (1 << 64) - 1:
                self.ram.append((paddr, memsz, offset))

    def read(self, phys: int, size: int) -> bytes:
        for paddr, memsz, offset in self.ram:
            if paddr <= phys and phys + size <= paddr + memsz:
                return os.pread(self.f.fileno(), size, offset + phys - paddr)
        return b""

    def close(self) -> None:
        self.f.close()


def pinned_pages(blocks: list[int], pattern: bytes) -> dict[int, int]:
    """Pipe pages per block, up to WANT_PAGES each: in use, neither free, LRU, slab nor huge
    (kpageflags), and holding `pattern` (kcore). Contiguous candidates are read in one go."""
    pages = int((MEM_ROOT / "block_size_bytes").read_text(), 16) // PAGE
    out = {}
    kcore = Kcore()
    try:
        with open("/proc/kpageflags", "rb") as f:
            for n in blocks:
                f.seek(n * pages * 8)
                flags = [v for (v,) in struct.iter_unpack("<Q", f.read(pages * 8))]
                found, i = 0, 0
                while i < pages and found < WANT_PAGES:
                    if flags[i] & NOT_PINNED:
                        i += 1
                        continue
                    j = i
                    while j < pages and j - i < 256 and not flags[j] & NOT_PINNED:
                        j += 1
                    data = kcore.read((n * pages + i) * PAGE, (j - i) * PAGE)
                    found += sum(1 for k in range(0, len(data), PAGE)
                                 if data[k:k + PAGE] == pattern)
                    i = j
                out[n] = found
    finally:
        kcore.close()
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
    pattern = os.urandom(PAGE)  # this run's: no page holds it before a pipe does
    chunk = pattern * (PIPE_BYTES // PAGE)
    fds: list[int] = []
    held = 0
    t0 = time.monotonic()
    huge = take_the_rest(blocks, movable)
    try:
        while True:
            counts = pinned_pages(blocks, pattern)
            done = {"bytes": held, "pinned": counts, "huge_pages": huge,
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
