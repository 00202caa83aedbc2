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

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from exporter.untrusted import read_text

ACPI_MEMORY_HID = "PNP0C80"
VIRTIO_MEM_DEVICE_ID = 0x18  # include/uapi/linux/virtio_ids.h VIRTIO_ID_MEM
IOMEM_MAX = 4 << 20  # bytes of /proc/iomem read at most
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


def parse_iomem(text: str) -> list[tuple[int, int, int, str]]:
    """/proc/iomem as (depth, start, end inclusive, name); lines that do not parse skipped."""
    out = []
    for line in text.splitlines():
        m = _IOMEM_LINE.fullmatch(line)
        if m is not None:
            out.append((len(m.group(1)) // 2, int(m.group(2), 16), int(m.group(3), 16),
                        m.group(4).strip()))
    return out


def virtio_mem_regions(iomem: str) -> list[tuple[str, int, int, int]]:
    """(device name, start, size, plugged bytes) of each virtio-mem device /proc/iomem shows:
    a region named virtioN holding `System RAM (virtio_mem)` ranges."""
    found: dict[str, list[int]] = {}  # name -> [start, size, plugged]
    inside: tuple[str, int] | None = None  # the virtioN region being read, its depth
    for depth, start, end, name in parse_iomem(iomem):
        if inside is not None and depth <= inside[1]:
            inside = None
        if inside is None and _VIRTIO_NAME.fullmatch(name):
            inside = (name, depth)
            found.setdefault(name, [start, end - start + 1, 0])
        elif inside is not None and name == "System RAM (virtio_mem)":
            found[inside[0]][2] += end - start + 1
    return [(name, s, size, plugged) for name, (s, size, plugged) in found.items() if plugged]


def read_devices(blocks: Iterable[int], block_size: int, sysfs: str = "/sys",
                 procfs: str = "/proc") -> MemoryDevices:
    """Which device holds each of `blocks` (the numbers memory_blocks.read_hardware found)."""
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
            iomem = read_text(os.path.join(procfs, "iomem"), IOMEM_MAX)
        except (OSError, ValueError) as e:
            not_read.append(f"/proc/iomem ({e}): virtio-mem devices not found")
    for name, start, size, plugged in virtio_mem_regions(iomem):
        if name in dimm_blocks:
            continue
        own = [n for n in numbers if n not in owner
               and start <= n * block_size and (n + 1) * block_size <= start + size]
        for n in own:
            owner[n] = name
        devices.append(MemoryDevice(name, KIND_VIRTIO_MEM, tuple(own), start, size, plugged,
                                    nodes=tuple(sorted({node[b] for b in own if b in node}))))
    boot = [n for n in numbers if n not in owner]
    if boot:
        devices.append(MemoryDevice("boot", KIND_BOOT, tuple(boot), boot[0] * block_size,
                                    len(boot) * block_size, len(boot) * block_size,
                                    nodes=tuple(sorted({node[b] for b in boot if b in node}))))
    return MemoryDevices(tuple(devices), owner, node, block_size, tuple(not_read))
