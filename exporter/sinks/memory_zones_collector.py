"""Memory by zone, and the hot-added memory that may never leave, from the kernel's own state.

A hypervisor gives memory as devices (ACPI DIMMs, virtio-mem) and takes it back only when the
kernel can offline every block of them; a block the kernel onlined into a kernel zone (Normal)
may hold unmovable pages and be refused (EBUSY) for good, while one in ZONE_MOVABLE only holds
pages the kernel can migrate. Two families, read from sysfs at scrape time (at most every
READ_TTL seconds), never from the events seen since start, so they say the same after an
exporter restart and for memory added before the exporter ran, and drop when the memory goes:

- node_resize_memory_blocks_by_zone{zone}: online blocks by the zone they are in (valid_zones;
  none: the block spans zones, which the kernel refuses to offline);
- node_resize_memory_hot_added_blocks{zone}: the online blocks of a removable device, which the
  kernel's device model names (exporter/sources/kernel/memory_devices.py: a block's
  firmware_node link to its ACPI memory device, a virtio-mem device's region in /proc/iomem),
  by zone. Boot memory is never counted: no hypervisor can take it back.

Only the zones this node has get a series (a series per zone at 0 on every node of a fleet would
say nothing); a node without memory hotplug in sysfs has none.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter.readnow import HotplugHardware, MemoryDevices, read_devices, read_hardware

READ_TTL = 10.0  # seconds a read of the blocks and devices is kept
ZONES = ("DMA", "DMA32", "Normal", "Movable", "none")  # anything else is "other"

BY_ZONE = "node_resize_memory_blocks_by_zone"
HOT_ADDED = "node_resize_memory_hot_added_blocks"
BY_ZONE_HELP = ("Online memory blocks by the zone they are in (valid_zones; none: spans zones). "
                "Only Movable ones can be counted on to leave again.")
HOT_ADDED_HELP = ("Online memory blocks of hot-pluggable devices (ACPI DIMMs by the kernel's "
                  "firmware_node links, virtio-mem regions), by zone, from the kernel's state: "
                  "in a zone other than Movable they may never leave again.")


def zone_of(block: Any) -> str:
    zone = block.zones[0] if len(block.zones) == 1 else "none"
    return zone if zone in ZONES else "other"


def counts(hw: HotplugHardware, devices: MemoryDevices | None
           ) -> tuple[dict[str, int], dict[str, int]]:
    """(online blocks by zone, online blocks of removable devices by zone)."""
    by_zone: dict[str, int] = {}
    added: dict[str, int] = {}
    removable = set()
    if devices is not None:
        removable = {b for d in devices.devices if d.removable for b in d.blocks}
    for block in hw.blocks:
        if block.online:
            zone = zone_of(block)
            by_zone[zone] = by_zone.get(zone, 0) + 1
            if block.number in removable:
                added[zone] = added.get(zone, 0) + 1
    return by_zone, added


def read_zones(sysfs: str, procfs: str) -> tuple[HotplugHardware, MemoryDevices | None]:
    hw = read_hardware(sysfs)
    if not hw.block_size:
        return hw, None
    return hw, read_devices([b.number for b in hw.blocks], hw.block_size, sysfs, procfs)


class MemoryZonesCollector(Collector):
    """The two families, read when scraped (kept READ_TTL seconds)."""

    def __init__(self, sysfs: str = "/sys", procfs: str = "/proc",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sysfs, self.procfs, self.clock = sysfs, procfs, clock
        self._lock = threading.Lock()  # one read at a time; concurrent scrapes share it
        self._read: tuple[float, tuple[dict[str, int], dict[str, int]]] | None = None
        self.reads = 0

    def values(self) -> tuple[dict[str, int], dict[str, int]]:
        with self._lock:
            now = self.clock()
            if self._read is None or now - self._read[0] >= READ_TTL:
                self._read = (now, counts(*read_zones(self.sysfs, self.procfs)))
                self.reads += 1
            return self._read[1]

    def collect(self) -> Iterable[Metric]:
        by_zone, added = self.values()
        blocks = GaugeMetricFamily(BY_ZONE, BY_ZONE_HELP, labels=["zone"])
        hot = GaugeMetricFamily(HOT_ADDED, HOT_ADDED_HELP, labels=["zone"])
        for zone, n in by_zone.items():
            blocks.add_metric([zone], n)
        for zone, n in added.items():
            hot.add_metric([zone], n)
        yield blocks
        yield hot
