"""virtio-mem devices and the balloon as the guest kernel shows them, and their gauges: read
from a fixture tree shaped like the lab guest's (/proc/iomem, /proc/kpageflags, /proc/vmstat,
/sys/bus/virtio), absent where there is no such device."""
from __future__ import annotations

import struct
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from exporter.clock import FakeClock
from exporter.events import ParavirtMemory, VirtioMemDevice
from exporter.sinks.paravirt_collector import ParavirtSink
from exporter.sources.kernel.memory_devices import KPF_OFFLINE, offline_pages, virtio_mem_ranges
from exporter.sources.kernel.paravirt_memory import ParavirtMemorySource, deflate_on_oom

MiB = 1 << 20
# The lab guest's /proc/iomem with vmem0 (sub-block) plugged to 160 MiB: two blocks added,
# the second with 32 MiB of its 128 plugged; vmem1 (big-block) with nothing plugged.
IOMEM = """\
00000000-00000fff : Reserved
00100000-1ffdffff : System RAM
  01000000-01e01d31 : Kernel code
100000000-11fffffff : System RAM
140000000-15fffffff : virtio4
  140000000-14fffffff : System RAM (virtio_mem)
160000000-17fffffff : virtio5
380000000-3ffffffff : PCI Bus 0000:00
"""


def test_virtio_mem_ranges_finds_the_regions_and_what_was_added_from_them():
    assert virtio_mem_ranges(IOMEM) == [
        ("virtio4", 0x140000000, 512 * MiB, [(0x140000000, 256 * MiB)]),
        ("virtio5", 0x160000000, 512 * MiB, []),
    ]
    assert virtio_mem_ranges("garbage\n") == []


def test_offline_pages_counts_the_kpf_offline_bit():
    flags = struct.pack("<4Q", 1 << KPF_OFFLINE, 0, 1 << KPF_OFFLINE | 1 << 10, 1 << 10)
    assert offline_pages(flags) == 2
    assert offline_pages(flags + b"\x01\x02") == 2  # a torn entry is not a page


@pytest.mark.parametrize("features,want", [("1000000000", False), ("1010000", True),
                                           ("10", None), ("10x000", None)])
def test_deflate_on_oom_is_feature_bit_2(features, want):
    assert deflate_on_oom(features) is want


def _guest(root: Path, balloon: bool = True, oom: bool = False, inflated: int = 0) -> None:
    proc = root / "proc"
    proc.mkdir(parents=True, exist_ok=True)
    (proc / "iomem").write_text(IOMEM)
    # kpageflags indexed by pfn: 96 MiB of vmem0's second added block is PageOffline
    # (unplugged sub-blocks); written sparse, as the kernel's file reads.
    first_offline = (0x140000000 + 160 * MiB) // 4096
    with open(proc / "kpageflags", "wb") as f:
        f.seek(first_offline * 8)
        f.write(struct.pack("<Q", 1 << KPF_OFFLINE) * (96 * MiB // 4096))
        f.truncate((0x160000000 // 4096) * 8)
    (proc / "vmstat").write_text(f"balloon_inflate {inflated}\nballoon_deflate 0\n")
    # /dev/kmsg records as the guest logged them: the last requested size per device counts
    (root / "kmsg").write_bytes(
        b"6,301,144456000,-;virtio_mem virtio4: requested size: 0x20000000\n"
        b"6,302,144457000,-;virtio_mem virtio4: plugged size: 0x0\n"
        b"6,310,158447925,-;virtio_mem virtio4: requested size: 0xa000000\n")
    memory = root / "sys/devices/system/memory"
    memory.mkdir(parents=True, exist_ok=True)
    (memory / "block_size_bytes").write_text("8000000\n")
    # vmem0's blocks: 40 whole (Movable), 41 with 32 MiB plugged (onlined into Normal)
    for n, zone in ((40, "Movable"), (41, "Normal")):
        (memory / f"memory{n}").mkdir(exist_ok=True)
        (memory / f"memory{n}" / "state").write_text("online\n")
        (memory / f"memory{n}" / "valid_zones").write_text(zone + "\n")
    drivers = root / "sys/bus/virtio/drivers"
    for dev in ("virtio4", "virtio5"):
        (drivers / "virtio_mem" / dev).mkdir(parents=True, exist_ok=True)
    if balloon:
        (drivers / "virtio_balloon" / "virtio3").mkdir(parents=True, exist_ok=True)
        dev = root / "sys/bus/virtio/devices/virtio3"
        dev.mkdir(parents=True, exist_ok=True)
        (dev / "features").write_text(("101" if oom else "100") + "0" * 61 + "\n")


def _read(root: Path) -> list:
    source = ParavirtMemorySource(FakeClock(5.0), str(root / "sys"), str(root / "proc"),
                                  str(root / "kmsg"))
    source.open()
    out: list = []
    try:
        source.read(out.append)
        source.read(out.append)  # nothing changed: no second event
    finally:
        source.close()
    return out


def test_the_source_reads_regions_plugged_memory_and_the_balloon(tmp_path):
    _guest(tmp_path, inflated=65536)
    [event] = _read(tmp_path)
    assert event == ParavirtMemory(
        5.0, (VirtioMemDevice("virtio4", 0x140000000, 512 * MiB, 160 * MiB, 160 * MiB,
                              blocks=((40, 128 * MiB), (41, 32 * MiB)),
                              lowerable_bytes=128 * MiB),
              VirtioMemDevice("virtio5", 0x160000000, 512 * MiB, 0)),
        balloon_bytes=256 * MiB, balloon_deflate_on_oom=False)


def test_no_devices_no_event_fields_and_no_series(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "iomem").write_text(IOMEM)
    (tmp_path / "proc" / "vmstat").write_text("nr_free_pages 1\n")
    [event] = _read(tmp_path)
    assert event == ParavirtMemory(5.0)
    sink = ParavirtSink()
    sink.on_event(event)
    registry = CollectorRegistry()
    registry.register(sink)
    families = {m.name: m.samples for m in registry.collect() if "virtio" in m.name}
    assert set(families) == {"node_resize_virtio_mem_region_bytes",
                             "node_resize_virtio_mem_plugged_bytes",
                             "node_resize_virtio_mem_requested_bytes",
                             "node_resize_virtio_mem_lowerable_bytes",
                             "node_resize_virtio_balloon_held_bytes"}
    assert not any(families.values())  # declared, no series


def test_the_gauges_show_what_the_source_read(tmp_path):
    _guest(tmp_path, oom=True, inflated=32768)
    sink = ParavirtSink()
    for event in _read(tmp_path):
        sink.on_event(event)
    registry = CollectorRegistry()
    registry.register(sink)
    value = registry.get_sample_value
    assert value("node_resize_virtio_mem_region_bytes", {"device": "virtio4"}) == 512 * MiB
    assert value("node_resize_virtio_mem_plugged_bytes", {"device": "virtio4"}) == 160 * MiB
    assert value("node_resize_virtio_mem_plugged_bytes", {"device": "virtio5"}) == 0
    # block 41 is in a kernel zone: its 32 MiB count as staying, never as lowerable
    assert value("node_resize_virtio_mem_lowerable_bytes", {"device": "virtio4"}) == 128 * MiB
    # what the hypervisor asked for, as the driver logged it; virtio5 never logged one: no
    # series rather than a guess
    assert value("node_resize_virtio_mem_requested_bytes", {"device": "virtio4"}) == 160 * MiB
    assert value("node_resize_virtio_mem_requested_bytes", {"device": "virtio5"}) is None
    assert value("node_resize_virtio_balloon_held_bytes",
                 {"deflate_on_oom": "true"}) == 128 * MiB


def test_lowerable_is_offline_and_movable_plugged_memory_only():
    from exporter.sources.kernel.memory_devices import lowerable_bytes
    plugged = ((40, 128 * MiB), (41, 32 * MiB), (42, 40 * MiB), (43, 0), (8, 128 * MiB))
    blocks = {40: (True, ("Movable",)), 41: (True, ("Normal",)),
              42: (False, ("Normal", "Movable")), 43: (True, ("none",)),
              8: (True, ("Movable",))}
    # block 8 lies below 4 GiB: never given back, whatever its zone says
    assert lowerable_bytes(plugged, 128 * MiB, blocks) == 168 * MiB
    assert lowerable_bytes(plugged, 128 * MiB, {}) == 0  # blocks unknown: nothing promised


def test_requested_sizes_are_the_last_logged_per_device():
    from exporter.sources.kernel.paravirt_memory import requested_sizes
    assert requested_sizes(b"6,1,2,-;virtio_mem virtio4: requested size: 0x10000000\n"
                           b"6,3,4,-;virtio_mem virtio5: requested size: 0x0\n"
                           b"6,5,6,-;virtio_mem virtio4: requested size: 0x0\n"
                           b"6,7,8,-;virtio_mem virtio4: requested size: 0xzz\n"
                           # written to /dev/kmsg by a process: LOG_USER, not the kernel's
                           b"12,9,10,-;virtio_mem virtio5: requested size: 0x40000000\n"
                           ) == {"virtio4": 0, "virtio5": 0}
