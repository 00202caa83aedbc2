"""node_resize_memory_hot_added_blocks and node_resize_memory_blocks_by_zone come from the
kernel's state (zones, the blocks' device links, /proc/iomem), never from the events seen since
start: a collector made after the memory arrived (an exporter restarted, or started late) counts
it, and the count drops when the memory is moved to ZONE_MOVABLE or leaves. On a sysfs tree laid
out as the kernel lays it out, then on this machine's real one."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from prometheus_client import CollectorRegistry

from exporter.sinks.memory_zones_collector import (
    BY_ZONE,
    HOT_ADDED,
    READ_TTL,
    MemoryZonesCollector,
)
from exporter.sources.kernel.memory_blocks import read_hardware

IOMEM = """\
00100000-bfffffff : System RAM
100000000-13fffffff : System RAM
200000000-27fffffff : virtio3
  200000000-20fffffff : System RAM (virtio_mem)
"""


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _tree(root: Path) -> tuple[str, str, Path]:
    """Boot memory 0-31 (Normal, one block spanning zones), a DIMM PNP0C80:00 of blocks 40-47
    onlined into Normal, a virtio-mem device (virtio3) with blocks 64-65 in Movable."""
    sysfs, procfs = root / "sys", root / "proc"
    mem = sysfs / "devices/system/memory"
    mem.mkdir(parents=True)
    (mem / "block_size_bytes").write_text("8000000\n")
    acpi = sysfs / "devices/LNXSYSTM:00/LNXSYBUS:00/PNP0A06:00/PNP0C80:00"
    acpi.mkdir(parents=True)
    (acpi / "path").write_text("\\_SB_.MHPC.MP00\n")
    (sysfs / "bus/acpi/devices").mkdir(parents=True)
    os.symlink(acpi, sysfs / "bus/acpi/devices/PNP0C80:00")
    for n, zones in [*[(n, "Normal") for n in range(32)], (31, "none"),
                     *[(n, "Normal") for n in range(40, 48)],
                     *[(n, "Movable") for n in range(64, 66)]]:
        d = mem / f"memory{n}"
        d.mkdir(exist_ok=True)
        (d / "state").write_text("online\n")
        (d / "valid_zones").write_text(f"{zones}\n")
        if 40 <= n < 48 and not (d / "firmware_node").exists():
            os.symlink(acpi, d / "firmware_node")
    procfs.mkdir()
    (procfs / "iomem").write_text(IOMEM)
    return str(sysfs), str(procfs), mem


def _values(collector: MemoryZonesCollector) -> dict[tuple[str, str], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    return {(s.name, s.labels["zone"]): s.value
            for family in registry.collect() for s in family.samples}


def test_memory_added_before_start_counts_by_its_device_and_zone(tmp_path):
    """No event was ever seen (a new collector: the exporter restarted, or started after the
    hot-add): the DIMM's blocks in Normal and the virtio-mem blocks in Movable are counted; boot
    memory never is."""
    sysfs, procfs, _ = _tree(tmp_path)
    got = _values(MemoryZonesCollector(sysfs, procfs))
    assert got == {(BY_ZONE, "Normal"): 31 + 8, (BY_ZONE, "none"): 1, (BY_ZONE, "Movable"): 2,
                   (HOT_ADDED, "Normal"): 8, (HOT_ADDED, "Movable"): 2}


def test_the_count_follows_the_kernel_when_the_memory_moves_or_leaves(tmp_path):
    sysfs, procfs, mem = _tree(tmp_path)
    clock = Clock()
    collector = MemoryZonesCollector(sysfs, procfs, clock)
    assert _values(collector)[(HOT_ADDED, "Normal")] == 8
    # Offlined and onlined again as movable: kept until the read expires, then Movable.
    for n in range(40, 48):
        (mem / f"memory{n}" / "valid_zones").write_text("Movable\n")
    assert _values(collector)[(HOT_ADDED, "Normal")] == 8
    clock.now += READ_TTL
    got = _values(collector)
    assert (HOT_ADDED, "Normal") not in got and got[(HOT_ADDED, "Movable")] == 10
    # The DIMM ejected: its blocks are gone from sysfs, and so is its count.
    for n in range(40, 48):
        shutil.rmtree(mem / f"memory{n}")
    clock.now += READ_TTL
    got = _values(collector)
    assert got[(HOT_ADDED, "Movable")] == 2 and got[(BY_ZONE, "Movable")] == 2
    assert collector.reads == 3


def test_offline_blocks_and_a_node_without_memory_hotplug_count_nothing(tmp_path):
    sysfs, procfs, mem = _tree(tmp_path)
    for n in range(40, 48):
        (mem / f"memory{n}" / "state").write_text("offline\n")
    got = _values(MemoryZonesCollector(sysfs, procfs))
    assert (HOT_ADDED, "Normal") not in got and got[(BY_ZONE, "Normal")] == 31
    (mem / "block_size_bytes").unlink()
    assert _values(MemoryZonesCollector(sysfs, procfs)) == {}


def test_this_machines_kernel():
    """The real sysfs: every online block counted once by zone; hot-added blocks only where the
    kernel links a block to a memory device (none on a machine booted with all its memory)."""
    hw = read_hardware()
    got = _values(MemoryZonesCollector())
    online = sum(b.online for b in hw.blocks)
    assert sum(v for (name, _), v in got.items() if name == BY_ZONE) == online
    linked = sum(1 for b in hw.blocks if b.online and os.path.islink(
        f"/sys/devices/system/memory/memory{b.number}/firmware_node"))
    iomem = Path("/proc/iomem").read_text()
    if "virtio_mem" not in iomem:
        assert sum(v for (name, _), v in got.items() if name == HOT_ADDED) == linked
