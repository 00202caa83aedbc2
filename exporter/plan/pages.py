"""Will the kernel empty a memory block? Its pages' /proc/kpageflags values, judged as
mm/memory_hotplug.c offline_pages() and mm/page_isolation.c would judge them.

offline_pages() refuses with EINVAL a block that spans two zones (valid_zones `none`) or has
holes, then isolates the range: has_unmovable_pages() fails it (EBUSY) at the first page that is
reserved, slab, a page table, or any other in-use page that is neither on an LRU list nor
movable (kernel allocations: vmalloc, stacks, buffers); free pages (buddy) and LRU pages pass,
and are then migrated. In ZONE_MOVABLE the kernel allows no unmovable allocation, so a movable
block is judged by its zone alone.

What this cannot know (bench/README.md measures how often it matters): pages pinned for
long (RDMA, io_uring fixed buffers, vfio) look like LRU pages but never migrate, and the offline
then loops until a signal; pages on per-CPU free lists look in use (no flag) but are drained
first; pages allocated or freed between the read and the offline.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# include/uapi/linux/kernel-page-flags.h, and the kernel-internal bits fs/proc/page.c exports
KPF_LRU, KPF_SLAB, KPF_BUDDY = 1 << 5, 1 << 7, 1 << 10
KPF_HUGE = 1 << 17
KPF_OFFLINE = 1 << 23  # PageOffline: a virtio-mem sub-block unplugged again (or a balloon's)
KPF_NOPAGE, KPF_PGTABLE = 1 << 20, 1 << 26
KPF_RESERVED = 1 << 32

MOVABLE_ZONE = "Movable"
PAGE_SIZE = 4096


@dataclass(frozen=True)
class PageCounts:
    free: int = 0
    lru: int = 0  # in use, migratable
    reserved: int = 0
    slab: int = 0
    page_tables: int = 0
    other: int = 0  # in use, not on an LRU list: the kernel's own
    holes: int = 0
    # PageOffline: in a virtio-mem block, sub-blocks its driver unplugged (the device's, not
    # the kernel's: its memory notifier lets offline_pages() pass them); elsewhere a balloon
    # driver's pages, counted as unmovable by judge_block
    offline: int = 0

    @property
    def unmovable(self) -> int:
        return self.reserved + self.slab + self.page_tables + self.other

    def describe(self) -> str:
        parts = [f"{n} {what}" for n, what in (
            (self.reserved, "reserved"), (self.slab, "slab"), (self.page_tables, "page-table"),
            (self.other, "other kernel"), (self.holes, "missing"),
            (self.offline, "PageOffline")) if n]
        return ", ".join(parts) + " pages"


def count_pages(flags: Mapping[int, int]) -> PageCounts:
    """Pages by kind, from their flags counted by value."""
    free = lru = reserved = slab = tables = other = holes = offline = 0
    # A tail page carries its folio's flags (fs/proc/page.c reads the folio), so one rule
    # fits heads, tails and small pages.
    for value, n in flags.items():
        if value & KPF_NOPAGE:
            holes += n
        elif value & KPF_BUDDY:
            free += n
        elif value & KPF_OFFLINE:
            offline += n
        elif value & KPF_RESERVED:
            reserved += n
        elif value & KPF_SLAB:
            slab += n
        elif value & KPF_PGTABLE:
            tables += n
        elif value & (KPF_LRU | KPF_HUGE):  # hugetlb folios migrate too
            lru += n
        else:
            other += n
    return PageCounts(free, lru, reserved, slab, tables, other, holes, offline)
