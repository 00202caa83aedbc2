"""Memory in the hypervisor's units (ACPI DIMMs from the kernel's device links, virtio-mem
regions from /proc/iomem, boot memory) and CPUs with their topology, read from a sysfs tree
laid out as the kernel lays it out."""
from __future__ import annotations

import os
from pathlib import Path

from exporter.plan.planner import whole
from exporter.sources.kernel.cpu_topology import apic_ids, read_topology
from exporter.sources.kernel.memory_devices import (
    KIND_BOOT,
    KIND_DIMM,
    KIND_VIRTIO_MEM,
    read_devices,
    virtio_mem_regions,
)

BLOCK = 128 << 20
IOMEM = """\
00000000-00000fff : Reserved
00100000-bfffffff : System RAM
  01000000-02209987 : Kernel code
100000000-13fffffff : System RAM
140000000-17fffffff : PNP0C80:00
  140000000-17fffffff : System RAM
200000000-27fffffff : virtio3
  200000000-20fffffff : System RAM (virtio_mem)
  210000000-217ffffff : System RAM (virtio_mem)
280000000-2ffffffff : virtio4
4000000000-7fffffffff : PCI Bus 0000:00
  4000000000-400007ffff : virtio5
    4000000000-400007ffff : virtio-pci-modern
"""


def _tree(root: Path, boot: range, dimm: range, virtio: range) -> tuple[str, str]:
    sysfs, procfs = root / "sys", root / "proc"
    mem = sysfs / "devices/system/memory"
    acpi = sysfs / "devices/LNXSYSTM:00/LNXSYBUS:00/PNP0A06:00/PNP0C80:00"
    acpi.mkdir(parents=True)
    (acpi / "path").write_text("\\_SB_.MHPC.MP02\n")
    (sysfs / "bus/acpi/devices").mkdir(parents=True)
    os.symlink(acpi, sysfs / "bus/acpi/devices/PNP0C80:00")
    (sysfs / "devices/system/node/node0").mkdir(parents=True)
    for n in (*boot, *dimm, *virtio):
        d = mem / f"memory{n}"
        d.mkdir(parents=True)
        (d / "state").write_text("online\n")
        os.symlink(sysfs / "devices/system/node/node0", d / "node0")
        if n in dimm:
            os.symlink(acpi, d / "firmware_node")
    procfs.mkdir()
    (procfs / "iomem").write_text(IOMEM)
    return str(sysfs), str(procfs)


def test_blocks_belong_to_their_dimm_their_virtio_mem_device_or_boot_memory(tmp_path):
    boot, dimm, virtio = range(0, 40), range(40, 48), range(64, 67)
    sysfs, procfs = _tree(tmp_path, boot, dimm, virtio)
    found = read_devices([*boot, *dimm, *virtio], BLOCK, sysfs, procfs)
    kinds = {d.id: d for d in found.devices}
    assert set(kinds) == {"PNP0C80:00", "virtio3", "boot"}
    d = kinds["PNP0C80:00"]
    assert (d.kind, d.blocks, d.start, d.size, d.acpi_path, d.slot, d.nodes) == (
        KIND_DIMM, tuple(dimm), 40 * BLOCK, 8 * BLOCK, "\\_SB_.MHPC.MP02", 2, (0,))
    v = kinds["virtio3"]
    assert (v.kind, v.blocks, v.start, v.size, v.plugged) == (
        KIND_VIRTIO_MEM, tuple(virtio), 0x200000000, 2 << 30, 384 << 20)
    b = kinds["boot"]
    assert (b.kind, b.blocks, b.removable) == (KIND_BOOT, tuple(boot), False)
    assert found.devices[-1].id == "boot"
    assert found.device_of(41) == d and found.device_of(3) == b and found.device_of(65) == v
    assert found.not_read == ()


def test_a_hostile_tree_leaves_blocks_as_boot_memory_and_never_fails(tmp_path):
    sysfs, procfs = _tree(tmp_path, range(0, 2), range(0), range(0))
    mem = Path(sysfs, "devices/system/memory/memory1")
    os.symlink(mem / "loop", mem / "loop2")
    os.symlink(mem / "loop2", mem / "loop")
    os.symlink(mem / "loop", mem / "firmware_node")  # a link loop where the DIMM link goes
    os.remove(Path(procfs, "iomem"))
    os.mkfifo(Path(procfs, "iomem"))  # a FIFO where /proc/iomem goes
    found = read_devices([0, 1], BLOCK, sysfs, procfs)
    assert [d.id for d in found.devices] == ["boot"]
    assert "iomem" in found.not_read[0]


def test_virtio_mem_regions_count_only_plugged_system_ram():
    assert virtio_mem_regions(IOMEM) == [("virtio3", 0x200000000, 2 << 30, 384 << 20)]
    assert virtio_mem_regions("garbage\n  zz-1 : virtio9\n") == []


def test_cpus_carry_package_die_core_thread_node_and_apic_id(tmp_path):
    sysfs, procfs = tmp_path / "sys", tmp_path / "proc"
    # Two sockets of one core with two threads each: cpu0,cpu2 share a core, cpu1,cpu3 too.
    layout = {0: (0, 0, "0,2"), 1: (1, 0, "1,3"), 2: (0, 0, "0,2"), 3: (1, 0, "1,3")}
    for c, (pkg, core, sib) in layout.items():
        topo = sysfs / f"devices/system/cpu/cpu{c}/topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{pkg}\n")
        (topo / "die_id").write_text("0\n")
        (topo / "core_id").write_text(f"{core}\n")
        (topo / "thread_siblings_list").write_text(sib + "\n")
        (sysfs / f"devices/system/cpu/cpu{c}/node{pkg}").mkdir()
    (sysfs / "devices/system/cpu/cpu4").mkdir()  # offline: no topology
    (topo / "core_id").write_text("99999999999999999999\n")  # hostile: unknown, not a crash
    procfs.mkdir()
    (procfs / "cpuinfo").write_text("".join(
        f"processor\t: {c}\nvendor_id\t: GenuineIntel\napicid\t\t: {c * 2}\n\n"
        for c in range(4)))
    places = read_topology(range(5), str(sysfs), str(procfs))
    assert places[2].json() == {"cpu": 2, "socket": 0, "die": 0, "core": 0, "thread": 1,
                                "siblings": [0, 2], "node": 0, "apic_id": 4}
    assert places[3].core is None and places[3].package == 1
    assert places[4].json()["socket"] is None and places[4].apic_id is None
    assert sorted(whole(places, "core")) == [(0, 2), (1,)]
    assert sorted(whole(places, "socket")) == [(0, 2), (1, 3)]
    assert apic_ids("processor : 7\napicid : 14\nprocessor : x\napicid : 3\n") == {7: 14}


def test_iomem_without_addresses_is_named_not_read_never_taken_as_no_device(tmp_path):
    """/proc/iomem read through a file opened without CAP_SYS_ADMIN shows every range as
    0-0: its virtio-mem blocks would read as boot memory. Named as not read instead."""
    sysfs, procfs = _tree(tmp_path, range(0, 40), range(40, 48), range(64, 67))
    hidden = "".join(
        line.split(" : ")[0][:len(line) - len(line.lstrip())] + "00000000-00000000 : "
        + line.split(" : ")[1] + "\n" for line in IOMEM.splitlines())
    Path(procfs, "iomem").write_text(hidden)
    found = read_devices(range(0, 67), BLOCK, sysfs, procfs)
    assert "virtio3" not in {d.id for d in found.devices}
    assert any("CAP_SYS_ADMIN" in why for why in found.not_read), found.not_read


def test_a_held_iomem_is_read_again_from_the_file_opened_before(tmp_path):
    """hold_iomem() opens the file before the privilege drop; every read after it is of that
    open file (here: the path replaced afterwards, the held file still read)."""
    from exporter.sources.kernel.memory_devices import hold_iomem, read_iomem, release_iomem
    sysfs, procfs = _tree(tmp_path, range(0, 40), range(40, 48), range(64, 67))
    assert hold_iomem(procfs)
    try:
        os.rename(Path(procfs, "iomem"), Path(procfs, "iomem.old"))
        Path(procfs, "iomem").write_text("00000000-00000000 : System RAM\n")
        assert read_iomem(procfs) == IOMEM
        assert read_iomem(procfs) == IOMEM  # again, from offset 0
        found = read_devices(range(0, 67), BLOCK, sysfs, procfs)
        assert "virtio3" in {d.id for d in found.devices} and found.not_read == ()
    finally:
        release_iomem(procfs)
    assert read_iomem(procfs).startswith("00000000-00000000")
