"""The plan speaks virtio-mem: read from a tree shaped like the lab guest's (/proc/iomem,
/proc/kpageflags, sysfs, /dev/kmsg), the plan's account of a virtio-mem device is the paravirt
source's (lowerable_bytes is the gauge's number), a partly plugged block gives its plugged
bytes (its PageOffline pages are the device's, not the kernel's), and the hypervisor action
sets the requested size, with the rollback that sets it back."""
from __future__ import annotations

import json
import struct
from dataclasses import replace
from pathlib import Path

import jsonschema

from exporter.clock import FakeClock
from exporter.plan.answer import answer
from exporter.plan.model import Change
from exporter.plan.planner import Inputs
from exporter.sources.kernel.memory_blocks import PageFlagsReader, read_hardware
from exporter.sources.kernel.memory_devices import KPF_OFFLINE, with_logged
from exporter.sources.kernel.paravirt_memory import ParavirtMemorySource
from testkit.forecast import GiB, MiB, snapshot

BLOCK = 128 * MiB
SCHEMA = json.loads((Path(__file__).parents[2] / "docs/plan.schema.json").read_text())
# virtio4's region at 5 GiB, two blocks added from it (40, 41); virtio5 nothing plugged
IOMEM = """\
00000000-00000fff : Reserved
00100000-1ffdffff : System RAM
100000000-13fffffff : System RAM
140000000-15fffffff : virtio4
  140000000-14fffffff : System RAM (virtio_mem)
160000000-17fffffff : virtio5
"""
KPF_LRU, KPF_BUDDY, KPF_SLAB = 1 << 5, 1 << 10, 1 << 7


def _guest(root: Path, zone41: str = "Normal", slab_in_41: bool = False,
           device_block: int = 0x200000) -> tuple[str, str]:
    """Block 40 whole, in ZONE_MOVABLE (free pages); block 41 in `zone41` with 32 MiB plugged
    (LRU pages, or one slab page among them) and its other 96 MiB unplugged (PageOffline)."""
    proc, sys_ = root / "proc", root / "sys"
    proc.mkdir(parents=True)
    (proc / "iomem").write_text(IOMEM)
    (proc / "meminfo").write_text("MemAvailable:    4194304 kB\n")
    with open(proc / "kpageflags", "wb") as f:
        f.seek(40 * BLOCK // 4096 * 8)
        f.write(struct.pack("<Q", KPF_BUDDY) * (BLOCK // 4096))
        lru = struct.pack("<Q", KPF_LRU) * (32 * MiB // 4096)
        if slab_in_41:
            lru = struct.pack("<Q", KPF_SLAB) + lru[8:]
        f.write(lru)
        f.write(struct.pack("<Q", 1 << KPF_OFFLINE) * (96 * MiB // 4096))
    (root / "kmsg").write_bytes(
        b"6,12,1000,-;virtio_mem virtio4: device block size: 0x%x\n" % device_block
        + b"6,301,144456000,-;virtio_mem virtio4: requested size: 0xa000000\n")
    memory = sys_ / "devices/system/memory"
    memory.mkdir(parents=True)
    (memory / "block_size_bytes").write_text("8000000\n")
    for n, zone in ((8, "DMA32"), (40, "Movable"), (41, zone41)):
        (memory / f"memory{n}").mkdir()
        (memory / f"memory{n}" / "state").write_text("online\n")
        (memory / f"memory{n}" / "valid_zones").write_text(zone + "\n")
    for dev in ("virtio4", "virtio5"):
        (sys_ / "bus/virtio/drivers/virtio_mem" / dev).mkdir(parents=True)
    pci = sys_ / "devices/pci0000:00/0000:00:05.0/virtio4"
    pci.mkdir(parents=True)
    (sys_ / "bus/virtio/devices").mkdir(parents=True)
    (sys_ / "bus/virtio/devices/virtio4").symlink_to(pci)
    return str(sys_), str(proc)


def _gauge(root: Path, sysfs: str, procfs: str):
    source = ParavirtMemorySource(FakeClock(5.0), sysfs, procfs, str(root / "kmsg"))
    source.open()
    out: list = []
    try:
        source.read(out.append)
    finally:
        source.close()
    [event] = out
    return event


def _plan(sysfs: str, procfs: str, memory: int, event=None):
    hw = read_hardware(sysfs, procfs)
    if event is not None:
        hw = replace(hw, devices=with_logged(hw.devices, {
            d.name: (d.requested_bytes, d.block_size) for d in event.virtio_mem}))
    snap = replace(snapshot(2, 1 * GiB + 160 * MiB),
                   memory_blocks_online=frozenset(b.number for b in hw.blocks))
    with PageFlagsReader(hw.block_size, procfs) as reader:
        return answer(Change(0, memory), Inputs(snap, hw, no_kubelet=True), node="n",
                      now=0.0, page_flags=reader.read, page_budget=64)


def test_the_plan_and_the_gauge_agree_and_the_hypervisor_sets_the_requested_size(tmp_path):
    sysfs, procfs = _guest(tmp_path)
    event = _gauge(tmp_path, sysfs, procfs)
    [dev, _] = event.virtio_mem
    assert (dev.name, dev.plugged_bytes, dev.lowerable_bytes, dev.requested_bytes,
            dev.block_size) == ("virtio4", 160 * MiB, 128 * MiB, 160 * MiB, 2 * MiB)
    p = _plan(sysfs, procfs, -256 * MiB, event)
    doc = p.json()
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    [taken] = doc["memory"]["devices"]
    # The gauge's number, the same function: offline and ZONE_MOVABLE plugged memory
    assert taken["virtio_mem"] == {
        "region_bytes": 512 * MiB, "plugged_bytes": 160 * MiB, "requested_bytes": 160 * MiB,
        "lowerable_bytes": dev.lowerable_bytes, "pci_address": "0000:00:05.0",
        "block_size": 2 * MiB}
    # Block 41's 96 MiB of PageOffline pages are the device's unplugged sub-blocks, not
    # "other kernel" pages: its 32 MiB of LRU pages move and it gives exactly those.
    assert p.memory_take == (41, 40) and taken["bytes"] == 160 * MiB
    assert doc["memory"]["short_bytes"] == 96 * MiB and p.verdict == "harmful"
    assert p.capacity_after["memory"] == 1 * GiB
    [act] = [a for a in doc["actions"] if a["do"] == "hypervisor_remove"]
    assert act["requested_size_bytes"] == 0
    assert act["hypervisor_rollback"] == {"requested_size_bytes": 160 * MiB}
    writes = [a["path"] for a in doc["actions"] if a["do"] == "write"]
    assert act["order"] > max(a["order"] for a in doc["actions"] if a["do"] == "write")
    assert writes == [f"/sys/devices/system/memory/memory{n}/state" for n in (41, 40)]


def test_what_the_device_can_give_back_is_chosen_and_a_kernel_zone_never_promised(tmp_path):
    sysfs, procfs = _guest(tmp_path, slab_in_41=True)
    event = _gauge(tmp_path, sysfs, procfs)
    p = _plan(sysfs, procfs, -128 * MiB, event)
    assert p.safe and p.memory_take == (40,)
    [act] = [a.json(0) for a in p.actions if a.do == "hypervisor_remove"]
    assert act["requested_size_bytes"] == 32 * MiB and act["requested_size_less_bytes"] == BLOCK
    # Asked for more than it can give: the slab page keeps block 41, and the answer says so.
    p = _plan(sysfs, procfs, -256 * MiB, event)
    assert p.verdict == "harmful" and p.memory_take == (40,)
    assert [(r.unit, r.reason) for r in p.refusals if r.unit != 8] == [(41, "unmovable_pages")]
    assert p.memory_devices[0].virtio_mem.lowerable_bytes == event.virtio_mem[0].lowerable_bytes


def test_without_the_driver_log_the_requested_size_is_lowered_from_what_is_plugged(tmp_path):
    sysfs, procfs = _guest(tmp_path, zone41="Movable")
    event = _gauge(tmp_path, sysfs, procfs)
    assert event.virtio_mem[0].lowerable_bytes == 160 * MiB  # both blocks movable
    p = _plan(sysfs, procfs, -256 * MiB)  # the CLI: no /dev/kmsg read
    [taken] = p.memory_devices
    assert taken.virtio_mem.requested_bytes is None and taken.bytes == 160 * MiB
    assert taken.virtio_mem.lowerable_bytes == 160 * MiB
    [act] = [a.json(0) for a in p.actions if a.do == "hypervisor_remove"]
    assert act["requested_size_bytes"] == 0
    assert act["hypervisor_rollback"] == {"requested_size_bytes": 160 * MiB}
    # Whether it gives a memory block at a time (sub-block mode) is only in the driver's log
    assert any("block size was not read" in u for u in p.unjudged)


def test_in_big_block_mode_a_big_block_goes_whole_or_is_not_offered(tmp_path):
    """256 MiB device blocks: blocks 40 and 41 are one big block, which the driver removes
    whole. Block 41's slab page keeps it, so block 40 alone is not offered either."""
    sysfs, procfs = _guest(tmp_path, slab_in_41=True, device_block=256 * MiB)
    p = _plan(sysfs, procfs, -128 * MiB, _gauge(tmp_path, sysfs, procfs))
    assert p.verdict == "harmful" and p.memory_take == () and p.memory_short_bytes == BLOCK


def test_a_sub_block_change_moves_the_generation(tmp_path):
    """Sub-blocks unplugged from an online block change no block: the generation an
    orchestrator echoes still moves (the device's plugged size is in it)."""
    sysfs, procfs = _guest(tmp_path)
    first = _plan(sysfs, procfs, -128 * MiB).generation
    assert _plan(sysfs, procfs, -128 * MiB).generation == first
    with open(Path(procfs) / "kpageflags", "r+b") as f:  # 2 MiB more of block 40 unplugged
        f.seek(40 * BLOCK // 4096 * 8)
        f.write(struct.pack("<Q", 1 << KPF_OFFLINE) * (2 * MiB // 4096))
    assert _plan(sysfs, procfs, -128 * MiB).generation != first
