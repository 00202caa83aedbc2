"""Memory in the hypervisor's units: which removable device each memory block belongs to.

A hypervisor never removes a 128 MiB memory block; it removes a device. Three kinds exist:

- an ACPI memory device (PNP0C80, QEMU's pc-dimm, a bare-metal hot-pluggable DIMM): the kernel
  binds each of its memory blocks to it (drivers/acpi/acpi_memhotplug.c acpi_bind_memblk ->
  drivers/acpi/glue.c acpi_bind_one), which shows in sysfs as the block's `firmware_node` link
  to the ACPI device, and the device's `physical_nodeN` links back. The device goes only when
  every one of its blocks is offline (ACPI eject);
- a virtio-mem device: its driver (drivers/virtio/virtio_mem.c) claims its whole region in
  /proc/iomem under the device's name (`virtioN`) and adds the plugged part beneath it as
  `System RAM (virtio_mem)`. The hypervisor shrinks it by lowering its requested size; the
  driver then offlines and unplugs what it can (in device blocks, which the kernel does not
  show: the memory block is the unit here);
- boot memory: every other block. No hypervisor can unplug it: offlining it shrinks the node
  and gives nobody anything.

A block's zone: valid_zones (memory_blocks.py); the planner keeps what lies below 4 GiB
(DMA/DMA32) whatever its zone says. Reads are bounded: a hostile tree (a link
loop, a FIFO, a huge /proc/iomem) leaves a block as boot memory, never fails the read.
"""
from __future__ import annotations

import dataclasses
import os
import re
import stat
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from exporter.untrusted import read_text

ACPI_MEMORY_HID = "PNP0C80"
VIRTIO_MEM_DEVICE_ID = 0x18  # include/uapi/linux/virtio_ids.h VIRTIO_ID_MEM
IOMEM_MAX = 4 << 20  # bytes of /proc/iomem read at most
PAGE_SIZE = 4096
KPF_OFFLINE = 23  # include/uapi/linux/kernel-page-flags.h: PageOffline (an unplugged sub-block)
DMA32_LIMIT = 1 << 32  # below 4 GiB: ZONE_DMA/DMA32 on x86-64, never given back
_IOMEM_LINE = re.compile(r"( *)([0-9a-fA-F]+)-([0-9a-fA-F]+) : (.*)")
_VIRTIO_NAME = re.compile(r"virtio[0-9]{1,6}")

KIND_DIMM = "dimm"
KIND_VIRTIO_MEM = "virtio-mem"
KIND_BOOT = "boot"


@dataclass(frozen=True)
class MemoryDevice:
    """One unit a hypervisor adds or removes (or boot memory, which it does not)."""

    id: str  # "PNP0C80:00", "virtio0", "boot"
    kind: str  # KIND_DIMM, KIND_VIRTIO_MEM or KIND_BOOT
    blocks: tuple[int, ...]  # memory block numbers, ascending
    start: int = 0  # physical address of the region (bytes)
    size: int = 0  # bytes: the region (virtio-mem), the blocks (DIMM, boot)
    plugged: int = 0  # bytes the kernel was given (virtio-mem: its System RAM; others: size)
    acpi_path: str = ""  # the firmware's name for a DIMM (QEMU: \\_SB_.MHPC.MP<slot>)
    slot: int | None = None  # a QEMU DIMM's slot, from its ACPI path (query-memory-devices)
    nodes: tuple[int, ...] = ()  # NUMA nodes of its blocks
    # virtio-mem: (memory block, plugged bytes in it) of every block added from its region
    # (sub-blocks unplugged again, PageOffline, are not plugged; () when its page flags were
    # not read), and how far its requested size can be lowered with the guest honouring it
    # (lowerable_bytes(): the same number as node_resize_virtio_mem_lowerable_bytes).
    block_plugged: tuple[tuple[int, int], ...] = ()
    lowerable: int = 0
    # What the hypervisor asked it for and its device block size, as its driver logged them
    # (/dev/kmsg, read by paravirt_memory.py; None: not known here).
    requested: int | None = None
    # The driver works in sub-blocks of a memory block when this is smaller than one, else in
    # big blocks of this size that go whole (its ranges in /proc/iomem are merged: only the
    # log tells the two apart).
    device_block_size: int | None = None
    # virtio-mem: the PCI function the virtio device sits on (QEMU's query-pci names the
    # virtio-mem-pci device there); "" when not on PCI or not shown.
    pci_address: str = ""

    @property
    def removable(self) -> bool:
        """A hypervisor can take it (boot memory: no)."""
        return self.kind != KIND_BOOT

    @property
    def partial(self) -> bool:
        """It can shrink by a block (virtio-mem); a DIMM goes whole or not at all."""
        return self.kind == KIND_VIRTIO_MEM


@dataclass(frozen=True)
class MemoryDevices:
    devices: tuple[MemoryDevice, ...]  # removable ones first (by id), boot memory last
    block_device: Mapping[int, str] = field(default_factory=dict)  # block -> device id
    block_node: Mapping[int, int] = field(default_factory=dict)  # block -> NUMA node
    block_size: int = 0
    not_read: tuple[str, ...] = ()  # what could not be read (the devices may be incomplete)

    def device_of(self, block: int) -> MemoryDevice | None:
        wanted = self.block_device.get(block, "boot")
        return next((d for d in self.devices if d.id == wanted), None)

    def by_id(self, device_id: str) -> MemoryDevice | None:
        return next((d for d in self.devices if d.id == device_id), None)


def _text(path: str) -> str | None:
    try:
        return read_text(path, 4096).strip()
    except (OSError, ValueError):
        return None


def _link_name(path: str) -> str | None:
    try:
        return os.path.basename(os.readlink(path))
    except (OSError, ValueError):
        return None


def _node_of(block_dir: str) -> int | None:
    try:
        for name in os.listdir(block_dir):
            if name.startswith("node") and name[4:].isdigit():
                return int(name[4:])
    except OSError:
        return None
    return None


def _slot(acpi_path: str) -> int | None:
    """QEMU names its DIMMs \\_SB_.MHPC.MPxx (hw/acpi/memory_hotplug.c: "MP%02X", the slot)."""
    m = re.fullmatch(r".*\.MP([0-9A-Fa-f]{2})", acpi_path)
    return int(m.group(1), 16) if m else None


# /proc/iomem shows real addresses only to a reader whose file was opened with CAP_SYS_ADMIN
# (kernel/resource.c checks the opener's credentials, file->f_cred), and the exporter drops
# it after start: hold_iomem() opens the file before the drop, read_iomem() reads that open
# file again from offset 0 (a seq_file regenerates its content per read) for the life of
# the process.
_HELD: dict[str, int] = {}
_HELD_LOCK = threading.Lock()


def hold_iomem(procfs: str = "/proc") -> bool:
    """Open procfs/iomem now, to be read by read_iomem() after the privilege drop."""
    path = os.path.join(procfs, "iomem")
    with _HELD_LOCK:
        if path in _HELD:
            return True
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return False
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return False
        _HELD[path] = fd
        return True


def release_iomem(procfs: str = "/proc") -> None:
    with _HELD_LOCK:
        fd = _HELD.pop(os.path.join(procfs, "iomem"), None)
    if fd is not None:
        os.close(fd)


def read_fd(fd: int, limit: int = IOMEM_MAX) -> bytes:
    """An open /proc file's content from offset 0, at most `limit` bytes."""
    out = bytearray()
    while len(out) < limit:
        chunk = os.pread(fd, min(1 << 20, limit - len(out)), len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def read_iomem(procfs: str = "/proc") -> str:
    """/proc/iomem through the file held open (hold_iomem), else opened now."""
    path = os.path.join(procfs, "iomem")
    with _HELD_LOCK:
        fd = _HELD.get(path)
        if fd is not None:
            return read_fd(fd).decode(errors="replace")
    return read_text(path, IOMEM_MAX)


def addresses_hidden(iomem: str) -> bool:
    """Every range reads 0-0: the file was opened without CAP_SYS_ADMIN."""
    ranges = parse_iomem(iomem)
    return bool(ranges) and all(start == 0 and end == 0 for _, start, end, _ in ranges)


def offline_pages(flags: bytes) -> int:
    """How many of these /proc/kpageflags entries (8 bytes each) have KPF_OFFLINE set: bit 7
    of byte 2 of each little-endian entry, counted in C (bytes.translate, bytes.count), not in
    a Python loop (seconds of CPU per read in the lab's emulated guest)."""
    whole = flags[:len(flags) // 8 * 8]
    return whole[KPF_OFFLINE // 8::8].translate(_HAS_OFFLINE_BIT).count(1)


_HAS_OFFLINE_BIT = bytes(b >> (KPF_OFFLINE % 8) & 1 for b in range(256))


def plugged_by_block(children: Iterable[tuple[int, int]], block_size: int,
                     flags: Callable[[int, int], bytes | None]) -> list[tuple[int, int]]:
    """(memory block, plugged bytes) of each block added from a virtio-mem region: memory is
    added in whole memory blocks; sub-blocks unplugged again are PageOffline. `flags(offset,
    length)` reads /proc/kpageflags (None: not readable, the block counted whole)."""
    out: list[tuple[int, int]] = []
    for child_start, child_size in children:
        step = block_size if block_size > 0 else child_size
        for at in range(child_start, child_start + child_size, step):
            plugged = min(step, child_start + child_size - at)
            got = flags(at // PAGE_SIZE * 8, plugged // PAGE_SIZE * 8)
            if got is not None:
                plugged -= offline_pages(got) * PAGE_SIZE
            out.append((at // step if block_size > 0 else -1, plugged))
    return out


def lowerable_bytes(plugged: Iterable[tuple[int, int]], block_size: int,
                    state: Mapping[int, tuple[bool, tuple[str, ...]]]) -> int:
    """How far a virtio-mem device's requested size can be lowered with the guest honouring
    it: its plugged memory in blocks the kernel can empty, i.e. offline blocks and blocks
    online in ZONE_MOVABLE (the driver migrates movable pages away; a kernel zone holds
    unmovable pages the driver cannot move, so memory there is counted as staying, even
    where part of it would go: never a "safe" the guest would not honour), never below
    4 GiB. `state`: block -> (online, valid_zones). One definition for the gauge
    (node_resize_virtio_mem_lowerable_bytes) and the plan."""
    total = 0
    for number, bytes_ in plugged:
        known = state.get(number)
        if known is None or (block_size > 0 and number * block_size < DMA32_LIMIT):
            continue
        online, zones = known
        if not online or zones == ("Movable",):
            total += bytes_
    return total


_PCI = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


def _pci_of(sysfs: str, name: str) -> str:
    """The PCI address a virtio device sits on: /sys/bus/virtio/devices/virtioN links into
    its PCI function's directory (.../0000:00:05.0/virtioN)."""
    try:
        parent = os.path.basename(os.path.dirname(os.path.realpath(
            os.path.join(sysfs, "bus/virtio/devices", name))))
    except (OSError, ValueError):
        return ""
    return parent if _PCI.fullmatch(parent) else ""


def parse_iomem(text: str) -> list[tuple[int, int, int, str]]:
    """/proc/iomem as (depth, start, end inclusive, name); lines that do not parse skipped."""
    out = []
    for line in text.splitlines():
        m = _IOMEM_LINE.fullmatch(line)
        if m is not None:
            out.append((len(m.group(1)) // 2, int(m.group(2), 16), int(m.group(3), 16),
                        m.group(4).strip()))
    return out


def virtio_mem_ranges(iomem: str) -> list[tuple[str, int, int, list[tuple[int, int]]]]:
    """(device name, start, size, [(start, size) of each `System RAM (virtio_mem)` range]) of
    each region /proc/iomem names virtioN, plugged or not: what the driver added from it,
    range by range (exporter/sources/kernel/paravirt_memory.py reads each range's PageOffline
    pages, the sub-blocks unplugged again, from /proc/kpageflags)."""
    found: dict[str, tuple[int, int, list[tuple[int, int]]]] = {}
    inside: tuple[str, int] | None = None  # the virtioN region being read, its depth
    for depth, start, end, name in parse_iomem(iomem):
        if inside is not None and depth <= inside[1]:
            inside = None
        if inside is None and _VIRTIO_NAME.fullmatch(name):
            inside = (name, depth)
            found.setdefault(name, (start, end - start + 1, []))
        elif inside is not None and name == "System RAM (virtio_mem)":
            found[inside[0]][2].append((start, end - start + 1))
    return [(name, s, size, ranges) for name, (s, size, ranges) in found.items()]


def virtio_mem_regions(iomem: str) -> list[tuple[str, int, int, int]]:
    """(device name, start, size, plugged bytes) of each virtio-mem device /proc/iomem shows:
    a region named virtioN holding `System RAM (virtio_mem)` ranges. In sub-block mode part of
    a range may be unplugged again (paravirt_memory.py subtracts it)."""
    out = []
    for name, start, size, ranges in virtio_mem_ranges(iomem):
        plugged = sum(n for _, n in ranges)
        if plugged:
            out.append((name, start, size, plugged))
    return out


def with_logged(devices: MemoryDevices,
                logged: Mapping[str, tuple[int | None, int | None]]) -> MemoryDevices:
    """`devices` with what the virtio-mem driver logged per device (requested size, device
    block size: paravirt_memory.py reads /dev/kmsg, which the plan does not)."""
    if not logged:
        return devices
    return dataclasses.replace(devices, devices=tuple(
        dataclasses.replace(d, requested=logged[d.id][0], device_block_size=logged[d.id][1])
        if d.kind == KIND_VIRTIO_MEM and d.id in logged else d for d in devices.devices))


def read_devices(blocks: Iterable[int], block_size: int, sysfs: str = "/sys",
                 procfs: str = "/proc",
                 state: Mapping[int, tuple[bool, tuple[str, ...]]] | None = None
                 ) -> MemoryDevices:
    """Which device holds each of `blocks` (the numbers memory_blocks.read_hardware found);
    with `state` (block -> online, valid_zones), a virtio-mem device's plugged memory per
    block (/proc/kpageflags, root) and how far it can be lowered."""
    numbers = sorted(set(blocks))
    mem = os.path.join(sysfs, "devices/system/memory")
    not_read: list[str] = []
    owner: dict[int, str] = {}
    node: dict[int, int] = {}
    dimm_blocks: dict[str, list[int]] = {}
    for n in numbers:
        base = os.path.join(mem, f"memory{n}")
        nd = _node_of(base)
        if nd is not None:
            node[n] = nd
        acpi = _link_name(os.path.join(base, "firmware_node"))
        if acpi is not None and acpi.startswith(ACPI_MEMORY_HID + ":"):
            owner[n] = acpi
            dimm_blocks.setdefault(acpi, []).append(n)
    devices: list[MemoryDevice] = []
    acpi_root = os.path.join(sysfs, "bus/acpi/devices")
    for name, own in sorted(dimm_blocks.items()):
        path = _text(os.path.join(acpi_root, name, "path")) or ""
        size = len(own) * block_size
        devices.append(MemoryDevice(name, KIND_DIMM, tuple(own), own[0] * block_size, size,
                                    size, path, _slot(path),
                                    tuple(sorted({node[b] for b in own if b in node}))))
    iomem = ""
    if block_size > 0:
        try:
            iomem = read_iomem(procfs)
        except (OSError, ValueError) as e:
            not_read.append(f"/proc/iomem ({e}): virtio-mem devices not found")
        if addresses_hidden(iomem):
            not_read.append("/proc/iomem shows no addresses (opened without CAP_SYS_ADMIN): "
                            "virtio-mem devices not found")
            iomem = ""
    regions = [r for r in virtio_mem_ranges(iomem) if r[0] not in dimm_blocks
               and sum(n for _, n in r[3]) > 0]
    flags = _FlagsReader(procfs) if regions and state is not None else None
    try:
        for name, start, size, children in regions:
            own = [n for n in numbers if n not in owner
                   and start <= n * block_size and (n + 1) * block_size <= start + size]
            for n in own:
                owner[n] = name
            per_block: tuple[tuple[int, int], ...] = ()
            lowerable = 0
            if flags is not None and state is not None:
                per_block = tuple(plugged_by_block(children, block_size, flags))
                lowerable = lowerable_bytes(per_block, block_size, state)
            devices.append(MemoryDevice(
                name, KIND_VIRTIO_MEM, tuple(own), start, size,
                sum(p for _, p in per_block) if per_block else sum(n for _, n in children),
                nodes=tuple(sorted({node[b] for b in own if b in node})),
                block_plugged=per_block, lowerable=lowerable,
                pci_address=_pci_of(sysfs, name)))
    finally:
        if flags is not None:
            flags.close()
    boot = [n for n in numbers if n not in owner]
    if boot:
        devices.append(MemoryDevice("boot", KIND_BOOT, tuple(boot), boot[0] * block_size,
                                    len(boot) * block_size, len(boot) * block_size,
                                    nodes=tuple(sorted({node[b] for b in boot if b in node}))))
    return MemoryDevices(tuple(devices), owner, node, block_size, tuple(not_read))


class _FlagsReader:
    """pread of /proc/kpageflags for plugged_by_block(); None per read when not readable."""

    def __init__(self, procfs: str) -> None:
        try:
            self.fd = os.open(os.path.join(procfs, "kpageflags"),
                              os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
            if not stat.S_ISREG(os.fstat(self.fd).st_mode):
                os.close(self.fd)
                self.fd = -1
        except OSError:
            self.fd = -1

    def __call__(self, offset: int, length: int) -> bytes | None:
        if self.fd < 0:
            return None
        try:
            got = os.pread(self.fd, length, offset)
        except OSError:
            return None
        return got if len(got) == length else None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
