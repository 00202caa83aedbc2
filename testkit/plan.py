"""A small sysfs/procfs tree for plan tests: CPUs (cpu0 without an online file, as on x86) and
memory blocks with their state and valid_zones, as the kernel lays them out; a plan sink wired
to an agent as the composition root wires it."""
from __future__ import annotations

from pathlib import Path

from exporter.agent import Agent
from exporter.clock import FakeClock
from exporter.correlate.correlator import Correlator
from exporter.events import (
    CpuManagerCheckpoint,
    Event,
    MemoryManagerCheckpoint,
    RunningContainers,
    SourceStatus,
)
from exporter.sinks.kubelet_collector import KubeletSink
from exporter.sinks.plan_collector import PlanSink, SharedViews
from exporter.sinks.running_pods_collector import RunningPodsSink
from testkit.correlator import config
from testkit.forecast import T

BLOCK = 128 * 2**20


def fake_host(root: Path, *, cpus: int = 2, offline: tuple[int, ...] = (),
              blocks: dict[int, tuple[str, str]] | None = None,
              mem_total_kb: int = 24684084, auto_online: str = "offline",
              virtio_mem: range | None = None,
              dimms: dict[str, range] | None = None) -> tuple[str, str]:
    """(sysfs, procfs) roots. `blocks`: number -> (state, valid_zones). The blocks in
    `virtio_mem` are a virtio-mem device's (virtio0: its region in /proc/iomem, all plugged),
    those of each `dimms` range an ACPI memory device's (the kernel's firmware_node links);
    the others are boot memory, which no plan takes."""
    sys_root, proc_root = root / "sys", root / "proc"
    cpu = sys_root / "devices/system/cpu"
    cpu.mkdir(parents=True)
    online = [c for c in range(cpus) if c not in offline]
    ranges = {"online": online, "offline": list(offline), "present": list(range(cpus)),
              "possible": list(range(cpus))}
    for name, members in ranges.items():
        (cpu / name).write_text(",".join(map(str, members)) + "\n")
    for c in range(cpus):
        (cpu / f"cpu{c}").mkdir()
        if c:  # the boot CPU has no online file
            (cpu / f"cpu{c}" / "online").write_text("0\n" if c in offline else "1\n")
    mem = sys_root / "devices/system/memory"
    mem.mkdir(parents=True)
    (mem / "block_size_bytes").write_text(f"{BLOCK:x}\n")
    (mem / "auto_online_blocks").write_text(auto_online + "\n")
    for n, (state, zones) in (blocks or {}).items():
        d = mem / f"memory{n}"
        d.mkdir()
        (d / "state").write_text(state + "\n")
        (d / "valid_zones").write_text(zones + "\n")
        (d / "removable").write_text("1\n")
    for name, r in (dimms or {}).items():
        acpi = sys_root / f"devices/LNXSYSTM:00/LNXSYBUS:00/PNP0A06:00/{name}"
        acpi.mkdir(parents=True)
        (acpi / "path").write_text(f"\\_SB_.MHPC.MP{int(name[-2:], 16):02X}\n")
        (sys_root / "bus/acpi/devices").mkdir(parents=True, exist_ok=True)
        (sys_root / "bus/acpi/devices" / name).symlink_to(acpi)
        for n in r:
            if (mem / f"memory{n}").is_dir():
                (mem / f"memory{n}" / "firmware_node").symlink_to(acpi)
    iomem = "00100000-bfffffff : System RAM\n"
    if virtio_mem is not None:
        start, end = virtio_mem.start * BLOCK, virtio_mem.stop * BLOCK - 1
        iomem += f"{start:x}-{end:x} : virtio0\n  {start:x}-{end:x} : System RAM (virtio_mem)\n"
    proc_root.mkdir()
    (proc_root / "meminfo").write_text(f"MemTotal: {mem_total_kb} kB\nMemAvailable: "
                                       f"{mem_total_kb * 3 // 4} kB\nSwapTotal: 0 kB\n")
    (proc_root / "iomem").write_text(iomem)
    return str(sys_root), str(proc_root)


def plan_agent(sysfs: str, procfs: str, *, kubernetes: bool = True) -> tuple[Agent, PlanSink]:
    """An agent without sources and its plan sink, wired as exporter/app.py serve wires them:
    the plan reads the Correlator's forecast and the running-pods sink's view. The gauges'
    thread is not started: a test calls sink.refresh() where the thread would run."""
    clock = FakeClock(T)
    agent = Agent(Correlator(config(kubernetes=kubernetes), clock), [], [], clock)
    running, kubelet = RunningPodsSink.attach(agent), KubeletSink.attach(agent)
    sink = PlanSink.attach(agent, SharedViews.of(agent, running, kubelet), sysfs, procfs,
                          kubernetes=kubernetes)
    return agent, sink


def kubelet_read(agent: Agent, containers: tuple = ()) -> None:
    """What the kubelet's sources report on a node with no checkpoint files (read: none) and
    the running containers scanned (`containers`), so a plan has read all it depends on."""
    handle(agent, CpuManagerCheckpoint(T, "/var/lib/kubelet/cpu_manager_state", False),
           MemoryManagerCheckpoint(T, "/var/lib/kubelet/memory_manager_state", False),
           RunningContainers(T, 2, tuple(containers)))


def pods_listed(agent: Agent) -> None:
    """The pod source's first list done (it reports up), as kube_pods says after listing: from
    here on the forecast counts as having seen the pods."""
    handle(agent, SourceStatus("kube_pods", True, T))


def handle(agent: Agent, *events: Event) -> None:
    """Each event as the agent's loop hands it on: to every sink, then to the Correlator."""
    for event in events:
        agent._process("test", event)
