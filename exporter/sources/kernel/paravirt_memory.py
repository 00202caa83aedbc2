"""The paravirtual memory devices of a guest: virtio-mem devices and the balloon.

What the hypervisor gave the VM and holds back is shown by no memory block: a virtio-mem
device's region is reserved in /proc/iomem under the virtio device's name ("virtio4"), the
memory added from it sits below as "System RAM (virtio_mem)", and in sub-block mode parts of
that are unplugged again and marked PageOffline (/proc/kpageflags bit KPF_OFFLINE); a balloon's
pages are counted in /proc/vmstat (balloon_inflate - balloon_deflate, every balloon driver).
The virtio-balloon's DEFLATE_ON_OOM feature (bit 2 of its features string) says whether the
guest gives the pages back under memory pressure. Read at start, after every memory event (the
agent pokes this source: a managed-page change or a block is exactly when these move) and on
a slow timer; one ParavirtMemory event when anything changed. A balloon with deflate-on-oom
moves no page count at all (its pages stay in MemTotal), so while a balloon driver is bound
/proc/vmstat alone is read every BALLOON_INTERVAL (bench/README.md: its cost).

What the hypervisor asked a virtio-mem device for is in no file, but the driver logs it at each
change ("virtio_mem virtio4: requested size: 0x10000000", drivers/virtio/virtio_mem.c):
/dev/kmsg is read from where it stands (its whole ring at start), without blocking, at every
wake-up, bounded per read.

/proc/iomem shows real addresses only to a reader whose file was opened with CAP_SYS_ADMIN,
/dev/kmsg only to one opened with CAP_SYSLOG (dmesg_restrict), and the exporter drops both after
start: the files are opened once in open() and read again (iomem and kpageflags from offset 0:
seq_file and kpageflags regenerate their content per read).
"""
from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path

from exporter.clock import Clock
from exporter.config.options import PROCFS_ROOT, SYSFS_ROOT
from exporter.events import (
    MalformedInput,
    ParavirtMemory,
    Resource,
    SourceStatus,
    VirtioMemDevice,
)
from exporter.sources.base import Emit
from exporter.sources.kernel.managed_pages import PAGE_SIZE, balloon_pages
from exporter.sources.kernel.memory_blocks import MemoryBlock, read_hardware
from exporter.sources.kernel.memory_devices import IOMEM_MAX, virtio_mem_ranges
from exporter.sources.registry import KERNEL, SourceSpec, register
from exporter.sources.wake import STATE_INTERVAL, PokedSource
from exporter.untrusted import read_text

KPF_OFFLINE = 23  # include/uapi/linux/kernel-page-flags.h
VIRTIO_BALLOON_F_DEFLATE_ON_OOM = 2  # include/uapi/linux/virtio_balloon.h
BALLOON_INTERVAL = 1.0  # s between balloon reads while a balloon is bound
MAX_DEVICES = 64  # more virtio-mem devices than this in one guest is not a guest
# A /dev/kmsg record: "PRIO,SEQ,USEC,FLAGS;MESSAGE". Facility 0 (PRIO < 8) is the kernel's own:
# a process writing to /dev/kmsg gets LOG_USER at least, so it cannot forge these.
_REQUESTED = re.compile(rb"(?m)^[0-7],\d+,\d+,[^;]*;virtio_mem (virtio\d+): "
                        rb"requested size: 0x([0-9a-f]{1,16})$")
KMSG_READS = 4096  # records read from /dev/kmsg per wake-up at most (one per read(2))
KMSG_RECORD = 8192  # the kernel's own bound on a record


def requested_sizes(text: bytes) -> dict[str, int]:
    """The last "requested size" virtio_mem logged per device, from /dev/kmsg records."""
    return {m.group(1).decode(): int(m.group(2), 16) for m in _REQUESTED.finditer(text)}


# KPF_OFFLINE is bit 7 of byte 2 of each little-endian 8-byte entry: 0/1 per byte value, so a
# block's 32768 entries are counted in C (bytes.translate, bytes.count), not in a Python loop,
# which cost seconds of CPU per read in the lab's emulated guest.
_OFFLINE_BYTE = KPF_OFFLINE // 8
_HAS_OFFLINE_BIT = bytes(b >> (KPF_OFFLINE % 8) & 1 for b in range(256))


def offline_pages(flags: bytes) -> int:
    """How many of these /proc/kpageflags entries (8 bytes each) have KPF_OFFLINE set."""
    whole = flags[:len(flags) // 8 * 8]
    return whole[_OFFLINE_BYTE::8].translate(_HAS_OFFLINE_BIT).count(1)


def deflate_on_oom(features: str) -> bool | None:
    """The virtio features string (one character per bit, bit 0 first)."""
    bits = features.strip()
    if len(bits) <= VIRTIO_BALLOON_F_DEFLATE_ON_OOM or set(bits) - {"0", "1"}:
        return None
    return bits[VIRTIO_BALLOON_F_DEFLATE_ON_OOM] == "1"


class ParavirtMemorySource(PokedSource):
    name = "paravirt_memory"
    interval = STATE_INTERVAL

    def __init__(self, clock: Clock, sysfs: str = "/sys", procfs: str = "/proc",
                 kmsg: str = "/dev/kmsg"):
        super().__init__(clock)
        self.sysfs, self.procfs, self.kmsg = Path(sysfs), Path(procfs), Path(kmsg)
        self.drivers = self.sysfs / "bus/virtio/drivers"
        self._iomem = -1
        self._kpageflags = -1
        self._kmsg = -1
        self._requested: dict[str, int] = {}
        self._last: ParavirtMemory | None = None

    def open(self) -> None:
        for attr, path in (("_iomem", self.procfs / "iomem"),
                           ("_kpageflags", self.procfs / "kpageflags"), ("_kmsg", self.kmsg)):
            try:
                setattr(self, attr, os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK))
            except OSError:
                pass  # not root, or no such file: what it tells is not shown

    def read_kmsg(self) -> bool:
        """New "requested size" lines of virtio_mem; True when one changed a device's."""
        if self._kmsg < 0:
            return False
        got = []
        for _ in range(KMSG_READS):
            try:
                chunk = os.read(self._kmsg, KMSG_RECORD)
            except BlockingIOError:
                break
            except BrokenPipeError:  # records overwritten before we read them: go on
                continue
            except OSError:
                break
            if not chunk:
                break
            if b"virtio_mem" in chunk:
                got.append(chunk)
        new = requested_sizes(b"\n".join(got))
        changed = any(self._requested.get(k) != v for k, v in new.items())
        self._requested.update(new)
        return changed

    def up_reason(self) -> str:
        return "virtio-mem regions (/proc/iomem) and balloon pages (/proc/vmstat)"

    def _bound(self, driver: str) -> list[str]:
        try:
            return sorted(e.name for e in os.scandir(self.drivers / driver)
                          if e.name.startswith("virtio"))[:MAX_DEVICES]
        except OSError:
            return []

    def _pread(self, fd: int, size: int, offset: int) -> bytes:
        return os.pread(fd, size, offset)

    def _block_size(self) -> int:
        try:
            return int(read_text(self.sysfs / "devices/system/memory/block_size_bytes", 64), 16)
        except (OSError, ValueError):
            return 0

    def devices(self) -> tuple[VirtioMemDevice, ...]:
        names = frozenset(self._bound("virtio_mem"))
        if not names or self._iomem < 0:
            return ()
        text = self._pread(self._iomem, IOMEM_MAX, 0).decode(errors="replace")
        block_size = self._block_size()
        found = []
        regions = [r for r in virtio_mem_ranges(text) if r[0] in names][:MAX_DEVICES]
        for name, start, size, children in regions:
            blocks: list[tuple[int, int]] = []
            for child_start, child_size in children:
                # Memory is added from the region in whole memory blocks; sub-blocks unplugged
                # again are PageOffline.
                step = block_size if block_size > 0 else child_size
                for at in range(child_start, child_start + child_size, step):
                    plugged = min(step, child_start + child_size - at)
                    if self._kpageflags >= 0:
                        flags = self._pread(self._kpageflags, plugged // PAGE_SIZE * 8,
                                            at // PAGE_SIZE * 8)
                        plugged -= offline_pages(flags) * PAGE_SIZE
                    blocks.append((at // step if block_size > 0 else -1, plugged))
            found.append(VirtioMemDevice(name, start, size, sum(p for _, p in blocks),
                                         self._requested.get(name), tuple(blocks)))
        if not found:
            return ()
        zones = {b.number: b for b in read_hardware(str(self.sysfs)).blocks}
        return tuple(dataclasses.replace(d, lowerable_bytes=lowerable_bytes(d, zones))
                     for d in found)

    def balloon(self) -> tuple[int | None, bool | None]:
        bound = self._bound("virtio_balloon")
        if not bound:
            return None, None
        try:
            oom = deflate_on_oom(read_text(self.sysfs / "bus/virtio/devices" / bound[0] /
                                           "features", 4096))
        except (OSError, ValueError):
            oom = None
        return balloon_pages(read_text(self.procfs / "vmstat")) * PAGE_SIZE, oom

    def loop(self, emit: Emit) -> None:
        emit(SourceStatus(self.name, True, self.clock.now(), self.up_reason()))
        full_at = 0.0
        while not self.stopping.is_set():
            now = time.monotonic()
            requested = self.read_kmsg()
            everything = self._last is None or now - full_at >= self.interval or requested
            self.read(emit, everything)
            if everything:
                full_at = now
            balloon = self._last is not None and self._last.balloon_bytes is not None
            poked, _ = self.waker.wait(BALLOON_INTERVAL if balloon else self.interval)
            if poked:
                full_at = 0.0  # a memory event: everything again

    def read(self, emit: Emit, everything: bool = True) -> None:
        now = self.clock.now()
        last = self._last
        if everything:
            self.read_kmsg()
        try:
            held, oom = self.balloon()
            devices = self.devices() if everything or last is None else last.virtio_mem
            event = ParavirtMemory(now, devices, held, oom)
        except (OSError, ValueError) as e:
            emit(MalformedInput(self.name, f"paravirtual memory: {e}"[:300], now))
            return
        if last is None or (event.virtio_mem, event.balloon_bytes, event.balloon_deflate_on_oom) \
                != (last.virtio_mem, last.balloon_bytes, last.balloon_deflate_on_oom):
            self._last = event
            emit(event)

    def close(self) -> None:
        for fd in (self._iomem, self._kpageflags, self._kmsg):
            if fd >= 0:
                os.close(fd)
        self._iomem = self._kpageflags = self._kmsg = -1
        super().close()


register(SourceSpec(
    "paravirt_memory", KERNEL, "virtio-mem devices and balloons (/proc/iomem, /proc/vmstat)",
    lambda ctx: ParavirtMemorySource(ctx.clock, SYSFS_ROOT.of(ctx.options),
                                     PROCFS_ROOT.of(ctx.options)),
    order=75, selectable=False, poked_by=frozenset({Resource.MEMORY})))


def lowerable_bytes(device: VirtioMemDevice, blocks: Mapping[int, MemoryBlock]) -> int:
    """How far the device's requested size can be lowered with the guest honouring it: its
    plugged memory in blocks the kernel can empty, i.e. offline blocks and blocks online in
    ZONE_MOVABLE (the driver migrates movable pages away; a kernel zone holds unmovable pages
    the driver cannot move, so memory there is counted as staying, even where part of it
    would go: never a "safe" the guest would not honour). For the planner (exporter/plan/):
    `blocks` as exporter/sources/kernel/memory_blocks.read_hardware() reads them."""
    total = 0
    for number, plugged in device.blocks:
        block = blocks.get(number)
        if block is not None and (not block.online or block.zones == ("Movable",)):
            total += plugged
    return total
