"""The lab's hypervisor side of the reference client: from what a plan names (a DIMM's slot and
start address, a CPU's socket/die/core/thread) to the QEMU device to `device_del`, on the shapes
QEMU 7.2's query-memory-devices and query-hotpluggable-cpus answer with (x86, -smp 1,maxcpus=2:
no die-id)."""
from __future__ import annotations

import pytest

from lab.qmp import CpuSlot
from lab.scenarios_orchestrator import qemu_cpu_id, qemu_dimm_id

DIMMS = [{"type": "dimm", "data": {"id": "dimm1", "slot": 1, "addr": 4831838208,
                                   "size": 1 << 30, "node": 0, "memdev": "/objects/mem-dimm1",
                                   "hotplugged": True, "hotpluggable": True}},
         {"type": "dimm", "data": {"id": "orch-dimm0", "slot": 2, "addr": 5905580032,
                                   "size": 1 << 30, "node": 0, "memdev": "/objects/mem-x",
                                   "hotplugged": True, "hotpluggable": True}}]
X86 = "qemu64-x86_64-cpu"
SLOTS = [CpuSlot(X86, {"socket-id": 1, "core-id": 0, "thread-id": 0},
                 "/machine/peripheral/orch-cpu1"),
         CpuSlot(X86, {"socket-id": 0, "core-id": 0, "thread-id": 0},
                 "/machine/unattached/device[0]")]


def test_a_dimm_is_found_by_its_slot_and_start():
    assert qemu_dimm_id(DIMMS, {"slot": 2, "start": 5905580032}) == "orch-dimm0"
    assert qemu_dimm_id(DIMMS, {"slot": 1}) == "dimm1"


@pytest.mark.parametrize("device", [{"slot": 2, "start": 4831838208}, {"slot": 3}, {}])
def test_a_dimm_that_does_not_match_exactly_is_never_guessed(device):
    with pytest.raises(LookupError):
        qemu_dimm_id(DIMMS, device)


def test_a_vcpu_is_found_by_socket_core_thread():
    place = {"cpu": 1, "socket": 1, "die": 0, "core": 0, "thread": 0, "apic_id": 1}
    assert qemu_cpu_id(SLOTS, place) == "orch-cpu1"


@pytest.mark.parametrize("place,why", [
    ({"socket": 0, "die": 0, "core": 0, "thread": 0}, "boot CPU"),
    ({"socket": 1, "die": 1, "core": 0, "thread": 0}, "no single"),  # no die-id 1 here
    ({"socket": 1, "die": 0, "core": None, "thread": 0}, "no single"),  # topology unknown
    ({"socket": 2, "die": 0, "core": 0, "thread": 0}, "no single"),
])
def test_a_vcpu_not_matched_exactly_or_a_boot_cpu_is_refused(place, why):
    with pytest.raises(LookupError, match=why):
        qemu_cpu_id(SLOTS, place)


def test_a_free_slot_is_never_a_match():
    free = [CpuSlot(X86, {"socket-id": 1, "core-id": 0, "thread-id": 0}, None)]
    with pytest.raises(LookupError):
        qemu_cpu_id(free, {"socket": 1, "die": 0, "core": 0, "thread": 0})
