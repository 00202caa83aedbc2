"""The plan on this machine's real kernel: its memory blocks and page flags as sysfs and
/proc/kpageflags give them, and the kernel asked. A block the plan takes is offlined and a
block it expects refused is tried, under the machine-wide hotplug lock, each online again at
once (bench/plan_kernel.py measures every block; this checks the prediction on a few)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.plan.planner import BlockVerdict, judge_blocks
from exporter.sources.kernel.memory_blocks import PageFlagsReader, read_hardware
from exporter.sources.kernel.sysfs import SysfsReader
from testkit import kernel

pytestmark = pytest.mark.kernel
MEM = Path("/sys/devices/system/memory")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="kpageflags and hotplug need root")


def test_every_memory_block_is_read_with_its_zone_and_state():
    if not MEM.exists():
        pytest.skip("no memory hotplug in sysfs")
    with kernel.hotplug_lock():  # no block changes state between the two reads
        hw = read_hardware()
        on_disk = {int(p.name[6:]): (p / "state").read_text().strip()
                   for p in MEM.glob("memory[0-9]*")}
    assert hw.block_size == int((MEM / "block_size_bytes").read_text(), 16)
    assert {b.number: ("online" if b.online else "offline") for b in hw.blocks} == \
        {n: ("online" if s == "online" else "offline") for n, s in on_disk.items()}
    for b in hw.blocks:
        assert b.zones and set(b.zones) <= {"DMA", "DMA32", "Normal", "Movable", "Device",
                                            "none"}, b
    assert hw.auto_online == (MEM / "auto_online_blocks").read_text().strip()
    assert 0 not in hw.cpus_hotpluggable or Path("/sys/devices/system/cpu/cpu0/online").exists()


@needs_root
def test_page_flags_cover_each_page_of_a_block_once():
    hw = read_hardware()
    with PageFlagsReader(hw.block_size) as reader:
        for b in hw.blocks[:4]:
            flags = reader.read(b.number)
            assert flags is not None and sum(flags.values()) == hw.block_size // 4096


@needs_root
def test_a_block_judged_to_go_goes_and_one_judged_refused_is_refused():
    """The block verdicts under the plan (its devices are made of them), on the real kernel:
    here every block is boot memory, so the plan itself offers none (the next test)."""
    with kernel.hotplug_lock():
        verdicts = _judge_every_block()
        going = [v.number for v in verdicts if v.ok]
        if not going:
            # A host up for hours has slab pages in every block (measured: 166 of 168 above
            # 4 GiB). Reclaimable slab given back (dentries, inodes), free pages gathered, some
            # block holds movable pages only again; judged again, on what the kernel has now.
            os.sync()
            Path("/proc/sys/vm/drop_caches").write_text("3")
            Path("/proc/sys/vm/compact_memory").write_text("1")
            verdicts = _judge_every_block()
            going = [v.number for v in verdicts if v.ok]
        assert going, "no block is judged to go: the kernel cannot be asked"
        refused = [v.number for v in verdicts if v.reason == "unmovable_pages"][:1]
        for number, expected in [(going[0], True)] + [(n, False) for n in refused]:
            block = kernel.MemoryBlock(number)
            try:
                err = kernel.write_sysfs(block.path, "offline")
                assert (err == 0) == expected, (number, os.strerror(err) if err else "went")
            finally:
                block.set_online(True)


def _judge_every_block() -> list[BlockVerdict]:
    hw = read_hardware()
    with PageFlagsReader(hw.block_size) as reader:
        return judge_blocks(hw, reader.read, budget=len(hw.blocks))


@needs_root
def test_the_plan_command_on_this_machine_changes_nothing():
    with kernel.hotplug_lock():  # no other test's hotplug meanwhile
        _plan_changes_nothing()


def _plan_changes_nothing() -> None:
    before = sorted((p.name, (p / "state").read_text()) for p in MEM.glob("memory[0-9]*"))
    cpus = Path("/sys/devices/system/cpu/online").read_text()
    done = subprocess.run([sys.executable, "-m", "exporter", "plan", "--memory", "-1Gi",
                           "--cpu", "-1", "--kubernetes", "off", "--output", "json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1, 3), done.stderr
    assert sorted((p.name, (p / "state").read_text()) for p in MEM.glob("memory[0-9]*")) \
        == before
    assert Path("/sys/devices/system/cpu/online").read_text() == cpus


@needs_root
def test_on_boot_memory_alone_the_plan_offers_nothing_and_its_answer_validates():
    """This VM's memory is all boot memory: no hypervisor can unplug it, so `plan --memory`
    takes none and says why (exit 1), in an answer docs/plan.schema.json validates."""
    import json

    import jsonschema

    from exporter.sources.kernel.memory_devices import KIND_BOOT, read_devices
    with kernel.hotplug_lock():
        hw = read_hardware()
        if any(d.kind != KIND_BOOT for d in read_devices([b.number for b in hw.blocks],
                                                          hw.block_size).devices):
            pytest.skip("this machine has removable memory")
        done = subprocess.run([sys.executable, "-m", "exporter", "plan", "--memory", "-1Gi",
                               "--output", "json"], capture_output=True, text=True,
                              timeout=120)
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    schema = json.loads((Path(__file__).parents[2] / "docs/plan.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)
    assert doc["verdict"] == "harmful" and doc["memory"]["take"] == []
    assert [r["reason"] for r in doc["refusals"]] == ["boot_memory"]


def test_this_machines_memory_devices_and_cpu_topology_are_read_as_the_kernel_shows_them():
    """The devices cover every block once; a block is a DIMM's exactly when the kernel links
    it to an ACPI memory device; the CPU topology agrees with /proc/cpuinfo."""
    from exporter.sources.kernel.cpu_topology import read_topology
    from exporter.sources.kernel.memory_devices import read_devices
    if not MEM.exists():
        pytest.skip("no memory hotplug in sysfs")
    with kernel.hotplug_lock():
        hw = read_hardware()
        found = read_devices([b.number for b in hw.blocks], hw.block_size)
        online = SysfsReader().read(0.0).cpus_online
        places = read_topology(online)
    owned = [n for d in found.devices for n in d.blocks]
    assert sorted(owned) == sorted(b.number for b in hw.blocks)
    for b in hw.blocks:
        link = MEM / f"memory{b.number}" / "firmware_node"
        in_dimm = link.exists() and os.path.basename(os.readlink(link)).startswith("PNP0C80")
        assert (found.block_device.get(b.number, "").startswith("PNP0C80")) == in_dimm
    cpuinfo = Path("/proc/cpuinfo").read_text()
    for c in online:
        p = places[c]
        assert p.package == int((Path(f"/sys/devices/system/cpu/cpu{c}/topology/"
                                      "physical_package_id")).read_text())
        assert c in p.siblings and p.core is not None and p.node is not None
        assert f"apicid\t\t: {p.apic_id}\n" in cpuinfo
