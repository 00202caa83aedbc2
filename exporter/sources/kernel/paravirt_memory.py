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

import os
import re
import time
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
from exporter.sources.kernel.memory_blocks import read_hardware
from exporter.sources.kernel.memory_devices import (
    lowerable_bytes,
    plugged_by_block,
    read_fd,
    virtio_mem_ranges,
)
from exporter.sources.registry import KERNEL, SourceSpec, register
from exporter.sources.wake import STATE_INTERVAL, PokedSource
from exporter.untrusted import read_text

VIRTIO_BALLOON_F_DEFLATE_ON_OOM = 2  # include/uapi/linux/virtio_balloon.h
BALLOON_INTERVAL = 1.0  # s between balloon reads while a balloon is bound
MAX_DEVICES = 64  # more virtio-mem devices than this in one guest is not a guest
# A /dev/kmsg record: "PRIO,SEQ,USEC,FLAGS;MESSAGE". Facility 0 (PRIO < 8) is the kernel's own:
# a process writing to /dev/kmsg gets LOG_USER at least, so it cannot forge these.
_REQUESTED = re.compile(rb"(?m)^[0-7],\d+,\d+,[^;]*;virtio_mem (virtio\d+): "
                        rb"requested size: 0x([0-9a-f]{1,16})$")
# Logged once, at the driver's probe (drivers/virtio/virtio_mem.c virtio_mem_init): a
# requested size is a multiple of it. Gone from the ring on a host that logged much since.
_BLOCK_SIZE = re.compile(rb"(?m)^[0-7],\d+,\d+,[^;]*;virtio_mem (virtio\d+): "
                         rb"device block size: 0x([0-9a-f]{1,16})$")
KMSG_READS = 4096  # records read from /dev/kmsg per wake-up at most (one per read(2))
KMSG_RECORD = 8192  # the kernel's own bound on a record


def requested_sizes(text: bytes, pattern: re.Pattern[bytes] = _REQUESTED) -> dict[str, int]:
    """The last "requested size" virtio_mem logged per device, from /dev/kmsg records (with
    `pattern` _BLOCK_SIZE: its device block size)."""
    return {m.group(1).decode(): int(m.group(2), 16) for m in pattern.finditer(text)}


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
        self._block_sizes: dict[str, int] = {}
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
        text = b"\n".join(got)
        new = requested_sizes(text)
        changed = any(self._requested.get(k) != v for k, v in new.items())
        self._requested.update(new)
        self._block_sizes.update(requested_sizes(text, _BLOCK_SIZE))
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
        text = read_fd(self._iomem).decode(errors="replace")
        block_size = self._block_size()
        regions = [r for r in virtio_mem_ranges(text) if r[0] in names][:MAX_DEVICES]
        if not regions:
            return ()
        hw = read_hardware(str(self.sysfs))
        state = {b.number: (b.online, b.zones) for b in hw.blocks}
        found = []
        for name, start, size, children in regions:
            blocks = tuple(plugged_by_block(children, block_size, self._flags))
            found.append(VirtioMemDevice(name, start, size, sum(p for _, p in blocks),
                                         self._requested.get(name), blocks,
                                         lowerable_bytes(blocks, block_size, state),
                                         self._block_sizes.get(name)))
        return tuple(found)

    def _flags(self, offset: int, length: int) -> bytes | None:
        if self._kpageflags < 0:
            return None
        return self._pread(self._kpageflags, length, offset)

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

