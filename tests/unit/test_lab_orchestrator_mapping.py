"""The lab's hypervisor side of the reference client: from what a plan names (a DIMM's slot and
start address, a CPU's socket/die/core/thread) to the QEMU device to `device_del`, on the shapes
QEMU 7.2's query-memory-devices and query-hotpluggable-cpus answered in the lab (x86,
-smp 1,maxcpus=2: one socket of two cores, no die-id; the guest's cpu1 reads package 0, die 0,
core 1, siblings "1", APIC id 1)."""
from __future__ import annotations

import pytest

from lab.qmp import CpuSlot
from lab.scenarios_orchestrator import qemu_cpu_id, qemu_dimm_id

DIMMS = [{"type": "dimm", "data": {"id": "dimm1", "slot": 0, "addr": 5368709120,
                                   "size": 1 << 30, "node": 0, "memdev": "/objects/mem-dimm1",
                                   "hotplugged": True, "hotpluggable": True}},
         {"type": "dimm", "data": {"id": "orch-dimm0", "slot": 1, "addr": 6442450944,
                                   "size": 1 << 30, "node": 0, "memdev": "/objects/mem-x",
                                   "hotplugged": True, "hotpluggable": True}}]
X86 = "qemu64-x86_64-cpu"
SLOTS = [CpuSlot(X86, {"core-id": 1, "thread-id": 0, "node-id": 0, "socket-id": 0},
                 "/machine/peripheral/orch-cpu1"),
         CpuSlot(X86, {"core-id": 0, "thread-id": 0, "node-id": 0, "socket-id": 0},
                 "/machine/unattached/device[0]")]


def test_a_dimm_is_found_by_its_slot_and_start():
    assert qemu_dimm_id(DIMMS, {"slot": 1, "start": 6442450944}) == "orch-dimm0"
    assert qemu_dimm_id(DIMMS, {"slot": 0}) == "dimm1"


@pytest.mark.parametrize("device", [{"slot": 1, "start": 5368709120}, {"slot": 3}, {}])
def test_a_dimm_that_does_not_match_exactly_is_never_guessed(device):
    with pytest.raises(LookupError):
        qemu_dimm_id(DIMMS, device)


def test_a_vcpu_is_found_by_socket_core_thread():
    place = {"cpu": 1, "socket": 0, "die": 0, "core": 1, "thread": 0, "apic_id": 1}
    assert qemu_cpu_id(SLOTS, place) == "orch-cpu1"


@pytest.mark.parametrize("place,why", [
    ({"socket": 0, "die": 0, "core": 0, "thread": 0}, "boot CPU"),
    ({"socket": 0, "die": 1, "core": 1, "thread": 0}, "no single"),  # no die-id 1 here
    ({"socket": 0, "die": 0, "core": None, "thread": 0}, "no single"),  # topology unknown
    ({"socket": 1, "die": 0, "core": 1, "thread": 0}, "no single"),
    ({"socket": 0, "die": 0, "core": 1, "thread": 1}, "no single"),
])
def test_a_vcpu_not_matched_exactly_or_a_boot_cpu_is_refused(place, why):
    with pytest.raises(LookupError, match=why):
        qemu_cpu_id(SLOTS, place)


def test_a_free_slot_is_never_a_match():
    free = [CpuSlot(X86, {"socket-id": 0, "core-id": 1, "thread-id": 0}, None)]
    with pytest.raises(LookupError):
        qemu_cpu_id(free, {"socket": 0, "die": 0, "core": 1, "thread": 0})
