"""What the kernel says about each CPU's and memory block's chance to leave: read on demand
(a plan, a scrape of the unpluggable gauges), never per event.

- CPUs: a CPU is hotpluggable when sysfs gives it an `online` file (cpu0 on x86 has none);
- memory blocks: `state`, `valid_zones` (an online block: the zone it is in, or `none` when it
  spans zones, which the kernel refuses to offline; an offline one: the zones it may join),
  `removable` (1 on every kernel since 5.7 whatever the block holds: read, but it predicts
  nothing), the memory_hotplug module's parameters and `auto_online_blocks`;
- /proc/kpageflags for one block (8 bytes per 4 KiB page, 256 KiB for a 128 MiB block): the
  pages' flags, counted by value. Only for the blocks a plan asks about, at most a budget of
  blocks per call: it is the costly read (about 8 ms a block).

The pure planner (exporter/plan/) reads these through its own protocols; nothing here judges.
"""
from __future__ import annotations

import os
import stat
from array import array
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from exporter.sources.kernel.cpu_topology import CpuPlace, read_topology
from exporter.sources.kernel.memory_devices import MemoryDevices, read_devices
from exporter.sources.kernel.sysfs import parse_block_state, parse_cpu_list
from exporter.untrusted import read_text

PAGE_SIZE = 4096
KPAGEFLAGS_BLOCKS_MAX = 64  # blocks whose page flags one call reads at most (16 MiB at 128 MiB)
_BLOCKS_MAX = 65536  # memory blocks read at most (8 TiB of 128 MiB blocks)
# block_size_bytes is a power of two: 128 MiB to 2 GiB on x86-64, 256 MiB on s390 and
# POWER, up to 1 GiB on arm64. Anything outside 1 MiB..64 GiB is not a block size (2^56 made
# the page-flag read ask for 2^47 pages at once).
BLOCK_SIZE_MIN, BLOCK_SIZE_MAX = 1 << 20, 1 << 36


@dataclass(frozen=True)
class MemoryBlock:
    number: int
    online: bool
    zones: tuple[str, ...]  # valid_zones' words; () when the file is missing
    removable: bool | None = None
    # Page flags (kpageflags values) -> pages, None when not read.
    page_flags: Counter[int] | None = None


@dataclass(frozen=True)
class HotplugHardware:
    """The CPUs and memory blocks as hotplug sees them."""

    cpus_hotpluggable: frozenset[int]  # CPUs with an `online` file
    block_size: int  # bytes; 0: no memory hotplug in sysfs
    blocks: tuple[MemoryBlock, ...]  # by number
    auto_online: str = ""  # auto_online_blocks: what a hot-added block becomes
    online_policy: str = ""  # memory_hotplug.online_policy (contig-zones, auto-movable)
    truncated: bool = False  # more blocks than _BLOCKS_MAX: the rest not read
    devices: MemoryDevices | None = None  # None: not read (read_hardware without procfs)
    cpu_places: Mapping[int, CpuPlace] = field(default_factory=dict)
    mem_available: int | None = None  # /proc/meminfo MemAvailable, bytes; None: not read
    # What could not be read, by the plan's input name (kernel, memory_devices,
    # mem_available), with why
    not_read: Mapping[str, str] = field(default_factory=dict)
    # The CPUs online when it was read (the topology of an offline CPU is not all there)
    cpus_online: frozenset[int] = frozenset()


def _text(path: str) -> str | None:
    try:
        return read_text(path, 4096).strip()
    except (OSError, ValueError):
        return None


def read_cpus(sysfs: str = "/sys") -> tuple[frozenset[int], frozenset[int]]:
    """(every cpuN sysfs shows, those with an `online` file)."""
    root = os.path.join(sysfs, "devices/system/cpu")
    every, out = set(), set()
    try:
        entries = list(os.scandir(root))
    except OSError:
        return frozenset(), frozenset()
    for entry in entries:
        name = entry.name
        if name.startswith("cpu") and name[3:].isdigit() and len(name) < 10:
            every.add(int(name[3:]))
            if os.path.exists(os.path.join(entry.path, "online")):
                out.add(int(name[3:]))
    return frozenset(every), frozenset(out)



def block_size_of(text: str | None) -> tuple[int, str]:
    """(block size, "") from block_size_bytes' text, or (0, why it is not one)."""
    if not text:
        return 0, ""
    try:
        size = int(text, 16)
    except ValueError:
        return 0, f"block_size_bytes {text[:40]!r} is not a hexadecimal number"
    if not BLOCK_SIZE_MIN <= size <= BLOCK_SIZE_MAX or size & (size - 1):
        return 0, (f"block_size_bytes {text[:40]!r} is not a memory block size (a power of "
                   f"two from {BLOCK_SIZE_MIN} to {BLOCK_SIZE_MAX} bytes)")
    return size, ""


def mem_available(procfs: str) -> int | None:
    """/proc/meminfo's MemAvailable in bytes, None when it cannot be read."""
    text = _text(os.path.join(procfs, "meminfo"))
    for line in (text or "").splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if key == "MemAvailable" and parts and parts[0].isdigit() and len(parts[0]) < 16:
            return int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return None


def read_hardware(sysfs: str = "/sys", procfs: str | None = None) -> HotplugHardware:
    """CPUs and memory blocks now; with `procfs`, also the removable devices, the CPUs'
    topology and MemAvailable. Never raises for what the tree holds: a block whose state
    cannot be read is named in `not_read` and left out."""
    every, cpus = read_cpus(sysfs)
    try:
        cpus_on = parse_cpu_list(_text(os.path.join(sysfs, "devices/system/cpu/online")) or "")
    except ValueError:
        cpus_on = frozenset()
    places = read_topology(every, sysfs, procfs) if procfs is not None else {}
    available = mem_available(procfs) if procfs is not None else None
    not_read: dict[str, str] = {}
    if procfs is not None and available is None:
        not_read["mem_available"] = f"no MemAvailable in {procfs}/meminfo"
    mem = os.path.join(sysfs, "devices/system/memory")
    size, bad = block_size_of(_text(os.path.join(mem, "block_size_bytes")))
    if bad:
        not_read["kernel"] = bad
    if size <= 0:
        return HotplugHardware(cpus, 0, (), cpu_places=places, mem_available=available,
                               not_read=not_read, cpus_online=cpus_on)
    numbers: list[int] = []
    try:
        for entry in os.scandir(mem):
            if entry.name.startswith("memory") and entry.name[6:].isdigit():
                numbers.append(int(entry.name[6:]))
    except OSError:
        pass
    numbers.sort()
    truncated = len(numbers) > _BLOCKS_MAX
    blocks = []
    unread: list[int] = []
    for n in numbers[:_BLOCKS_MAX]:
        base = os.path.join(mem, f"memory{n}")
        state = _text(os.path.join(base, "state"))
        online = None if state is None else parse_block_state(state)
        if online is None:
            unread.append(n)
            continue
        zones = _text(os.path.join(base, "valid_zones"))
        removable = _text(os.path.join(base, "removable"))
        blocks.append(MemoryBlock(n, online, tuple(zones.split()) if zones else (),
                                  None if removable is None else removable == "1"))
    kernel = []
    if unread:
        kernel.append(f"the state of memory block(s) {_numbers(unread)} (not a readable "
                      "file, or not a state the kernel writes): left out")
    if truncated:
        kernel.append(f"memory blocks past the first {_BLOCKS_MAX}")
    if kernel:
        not_read["kernel"] = "; ".join(kernel)
    devices = None
    if procfs is not None:
        devices = read_devices([b.number for b in blocks], size, sysfs, procfs,
                               {b.number: (b.online, b.zones) for b in blocks})
        if devices.not_read:
            not_read["memory_devices"] = "; ".join(devices.not_read)
    params = os.path.join(sysfs, "module/memory_hotplug/parameters")
    return HotplugHardware(cpus, size, tuple(blocks),
                           _text(os.path.join(mem, "auto_online_blocks")) or "",
                           _text(os.path.join(params, "online_policy")) or "", truncated,
                           devices, places, available, not_read, cpus_on)


def _numbers(ns: list[int], most: int = 8) -> str:
    return " ".join(map(str, ns[:most])) + (f" and {len(ns) - most} more" if len(ns) > most
                                            else "")


class PageFlagsReader:
    """/proc/kpageflags for whole memory blocks (root only). `read(block)` is the flags of
    its pages counted by value, or None when the file cannot be read."""

    def __init__(self, block_size: int, procfs: str = "/proc") -> None:
        self.path = os.path.join(procfs, "kpageflags")
        self.pages = block_size // PAGE_SIZE
        self.read_blocks = 0  # how many blocks were read (tests, bench)
        self._fd: int | None = None

    def __enter__(self) -> "PageFlagsReader":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def read(self, block: int) -> Counter[int] | None:
        if self.pages <= 0:
            return None
        try:
            if self._fd is None:
                # Non-blocking, and only a regular file: --path.procfs names a tree the
                # exporter does not control (a FIFO there would block the open forever).
                fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    os.close(fd)
                    return None
                self._fd = fd
            data = os.pread(self._fd, self.pages * 8, block * self.pages * 8)
        except OSError:
            return None
        if len(data) != self.pages * 8:
            return None
        self.read_blocks += 1
        flags = array("Q")
        flags.frombytes(data)
        return Counter(flags)


def with_page_flags(block: MemoryBlock, reader: PageFlagsReader) -> MemoryBlock:
    return MemoryBlock(block.number, block.online, block.zones, block.removable,
                       reader.read(block.number))


def exists(sysfs: str = "/sys") -> bool:
    return Path(sysfs, "devices/system/memory/block_size_bytes").exists()
