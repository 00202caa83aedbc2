"""GET /plan names a hot-added CPU by its topology at once: the plan sink's cached hardware
(HARDWARE_TTL) is dropped by a CPU transition, as by a memory one. Found by the lab's
orchestrator scenario: a vCPU hot-added and onlined was named with every topology field null
for up to 10 s, so no hypervisor slot could be matched."""
from __future__ import annotations

from pathlib import Path

from exporter.events import Direction, Resource, Result, Transition
from testkit.forecast import T
from testkit.plan import fake_host, plan_agent


def _place(sysfs: str, cpu: int, core: int) -> None:
    topo = Path(sysfs) / f"devices/system/cpu/cpu{cpu}/topology"
    topo.mkdir(parents=True, exist_ok=True)
    for name, value in (("physical_package_id", 0), ("die_id", 0), ("core_id", core),
                        ("thread_siblings_list", cpu)):
        (topo / name).write_text(f"{value}\n")


def test_a_cpu_transition_drops_the_cached_topology(tmp_path):
    sysfs, procfs = fake_host(tmp_path, cpus=2)
    _, sink = plan_agent(sysfs, procfs, kubernetes=False)
    assert sink.hardware().cpu_places[1].core is None  # read before the CPU's topology shows
    _place(sysfs, 1, core=7)  # the vCPU came online: the kernel shows where it sits
    sink.on_event(Transition("uevent", Resource.CPU, 1, Direction.ONLINE, Result.SUCCESS, T))
    assert sink.hardware().cpu_places[1].core == 7
