"""CPUs in the hypervisor's units: package (socket), die, core, thread, NUMA node, APIC id.

QEMU and KubeVirt add and remove CPUs by socket/core/thread (`query-hotpluggable-cpus` names
each slot by socket-id, die-id, core-id, thread-id); Linux names them cpuN. The kernel's
topology (Documentation/ABI/stable/sysfs-devices-system-cpu): cpuN/topology/
physical_package_id, die_id, core_id and thread_siblings_list, shown for online CPUs only;
the NUMA node is the cpuN/nodeM link; the APIC id is /proc/cpuinfo's `apicid` (online CPUs
only). An offline CPU keeps what was read while it was online only if the caller keeps it:
here its topology reads as unknown (None). Reads are bounded; a hostile value reads as
unknown, never fails the read.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from exporter.sources.kernel.sysfs import parse_cpu_list
from exporter.untrusted import read_text

CPUINFO_MAX = 8 << 20  # bytes of /proc/cpuinfo read at most (about 1.5 KiB a CPU)
_ID_MAX = 1 << 31



@dataclass(frozen=True)
class CpuPlace:
    cpu: int
    package: int | None = None  # physical_package_id: the socket
    die: int | None = None
    core: int | None = None  # core_id (unique within its package and die)
    thread: int | None = None  # this CPU's rank among its thread siblings (0 first)
    siblings: tuple[int, ...] = ()  # thread siblings, itself included
    node: int | None = None  # NUMA node
    apic_id: int | None = None

    @property
    def core_key(self) -> tuple[int | None, int | None, int | None]:
        return (self.package, self.die, self.core)

    def json(self) -> dict[str, object]:
        return {"cpu": self.cpu, "socket": self.package, "die": self.die, "core": self.core,
                "thread": self.thread, "siblings": list(self.siblings), "node": self.node,
                "apic_id": self.apic_id}


def _int(path: str) -> int | None:
    try:
        value = int(read_text(path, 64).strip())
    except (OSError, ValueError):
        return None
    return value if 0 <= value < _ID_MAX else None


def _cpu_list(path: str) -> tuple[int, ...]:
    try:
        return tuple(sorted(parse_cpu_list(read_text(path, 65536).strip())))
    except (OSError, ValueError):
        return ()


def _node(cpu_dir: str) -> int | None:
    try:
        for name in os.listdir(cpu_dir):
            if name.startswith("node") and name[4:].isdigit():
                return int(name[4:])
    except OSError:
        return None
    return None


def apic_ids(cpuinfo: str) -> dict[int, int]:
    """CPU number -> APIC id, from /proc/cpuinfo's `processor` and `apicid` lines."""
    out: dict[int, int] = {}
    cpu: int | None = None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "processor":
            cpu = int(value) if value.isdigit() and len(value) < 10 else None
        elif key == "apicid" and cpu is not None and value.isdigit() and len(value) < 10:
            out[cpu] = int(value)
    return out


def read_topology(cpus: Iterable[int], sysfs: str = "/sys",
                  procfs: str = "/proc") -> dict[int, CpuPlace]:
    """Where each of `cpus` sits; unknown parts None."""
    try:
        apic = apic_ids(read_text(os.path.join(procfs, "cpuinfo"), CPUINFO_MAX))
    except (OSError, ValueError):
        apic = {}
    out: dict[int, CpuPlace] = {}
    for c in sorted(set(cpus)):
        base = os.path.join(sysfs, f"devices/system/cpu/cpu{c}")
        topo = os.path.join(base, "topology")
        siblings = _cpu_list(os.path.join(topo, "thread_siblings_list"))
        out[c] = CpuPlace(c, _int(os.path.join(topo, "physical_package_id")),
                          _int(os.path.join(topo, "die_id")),
                          _int(os.path.join(topo, "core_id")),
                          siblings.index(c) if c in siblings else None,
                          siblings, _node(base), apic.get(c))
    return out
