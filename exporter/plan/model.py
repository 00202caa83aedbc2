"""The plan's vocabulary: the change asked for (parsed, with the fix for a bad one), what the
planner reads (protocols the kernel readers' types satisfy), and the answer (a Plan, its JSON).

Pure: no I/O, no clock.
"""
from __future__ import annotations

import datetime
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from exporter.kube.quantity import parse_quantity


class BadChange(ValueError):
    """A change that cannot be planned; the message says what to pass instead."""


CPU_UNITS = ("cpu", "core", "socket")


@dataclass(frozen=True)
class Change:
    cpus: int = 0  # CPUs (or whole cores, sockets: cpu_unit) to add (> 0) or take away (< 0)
    memory: int = 0  # bytes to add (> 0) or take away (< 0)
    cpu_unit: str = "cpu"  # CPU_UNITS: what `cpus` counts

    def words(self) -> str:
        """The change as the user would type it: "cpu -2", "cpu -1core", "memory -4Gi"."""
        out = []
        if self.cpus:
            unit = "" if self.cpu_unit == "cpu" else self.cpu_unit
            out.append(f"cpu {self.cpus:+d}{unit}")
        if self.memory:
            out.append(f"memory {'-' if self.memory < 0 else '+'}{size(abs(self.memory))}")
        return ", ".join(out)


def size(n: int) -> str:
    """Bytes as the largest quantity that says them exactly, binary first: 4Gi, 384Mi, 1T
    (as typed: 10^12), 1000 bytes."""
    for suffix, unit in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("T", 10**12),
                         ("G", 10**9), ("M", 10**6), ("Ki", 1 << 10), ("k", 1000)):
        if n and n % unit == 0:
            return f"{n // unit}{suffix}"
    return f"{n} bytes"


def plural(n: int, word: str, many: str = "") -> str:
    """"1 CPU", "2 CPUs", "1 pod", "3 pods"."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


_CPU = re.compile(r"([+-][0-9]{1,6})(cpu|core|socket)?s?")
_SIGNED = re.compile(r"([+-])(.+)")


def parse_change(cpu: str | None, memory: str | None) -> Change:
    """`--cpu -2`, `--memory -4Gi` (the query's `cpu=-2&memory=-4Gi`) -> Change; BadChange
    names the fix."""
    if (cpu is None or cpu == "") and (memory is None or memory == ""):
        raise BadChange("no change given: ask for cpu -N or +N (CPUs) and/or memory -SIZE or "
                        "+SIZE (bytes or a quantity such as 4Gi), for example cpu -1 and "
                        "memory -2Gi")
    cpus, unit = 0, "cpu"
    if cpu is not None and cpu != "":
        m_cpu = _CPU.fullmatch(cpu.strip())
        if m_cpu is None:
            raise BadChange(f"cpu {cpu[:40]!r}: a whole number of CPUs with its sign, such as "
                            "-2 (take two away) or +2 (add two), or of whole cores or sockets "
                            "(-1core, -1socket); CPUs hotplug one at a time, so no fractions")
        cpus, unit = int(m_cpu.group(1)), m_cpu.group(2) or "cpu"
    mem = 0
    if memory is not None and memory != "":
        m = _SIGNED.fullmatch(memory.strip())
        if m is None:
            raise BadChange(f"memory {memory[:40]!r}: a size with its sign, such as -4Gi "
                            "(take 4 GiB away) or +512Mi (add), in bytes or a Kubernetes "
                            "quantity (Ki, Mi, Gi, Ti)")
        try:
            value = parse_quantity(m.group(2))
        except ValueError:
            raise BadChange(f"memory {memory[:40]!r}: {m.group(2)[:40]!r} is not a size; use "
                            "bytes or a Kubernetes quantity such as 512Mi or 4Gi") from None
        if not math.isfinite(value) or value != int(value):
            raise BadChange(f"memory {memory[:40]!r}: a whole number of bytes")
        mem = int(value) * (-1 if m.group(1) == "-" else 1)
    if cpus == 0 and mem == 0:
        raise BadChange("the change is zero: pass a CPU count or a size other than 0")
    return Change(cpus, mem, unit)


# ---------------------------------------------------------------- what the planner reads


class BlockLike(Protocol):
    """One memory block as sysfs shows it (exporter/sources/kernel/memory_blocks.py)."""

    @property
    def number(self) -> int: ...

    @property
    def online(self) -> bool: ...

    @property
    def zones(self) -> tuple[str, ...]: ...

    @property
    def page_flags(self) -> Mapping[int, int] | None: ...


class HardwareLike(Protocol):
    @property
    def cpus_hotpluggable(self) -> frozenset[int]: ...

    @property
    def block_size(self) -> int: ...

    @property
    def blocks(self) -> Sequence[BlockLike]: ...

    @property
    def auto_online(self) -> str: ...

    @property
    def devices(self) -> Any: ...  # MemoryDevices (sources/kernel/memory_devices.py) or None

    @property
    def cpu_places(self) -> Mapping[int, Any]: ...  # CpuPlace by CPU (cpu_topology.py)

    @property
    def mem_available(self) -> int | None: ...  # /proc/meminfo MemAvailable, bytes

    @property
    def not_read(self) -> Mapping[str, str]: ...  # input name -> why it was not read


# ---------------------------------------------------------------- the answer

SCHEMA_ID = "urn:node-resize-exporter:plan"  # docs/plan.schema.json's $id
SCHEMA_VERSION = 2  # 1: the unversioned answer of 0.2.0; 2: this one (docs/plan.schema.json)
VERDICTS = ("safe", "harmful", "unknown")
# KEP-3953 has named its gate both ways; an answer names each, as the kubelet reported it.
LIVE_RESIZE_GATES = ("InPlaceNodeResourceResize", "NodeResourceHotPlug")


@dataclass(frozen=True)
class Refusal:
    resource: str  # "cpu" or "memory"
    unit: int  # CPU number or memory block number
    reason: str  # a closed set: see REFUSAL_REASONS
    detail: str

    def json(self) -> dict[str, Any]:
        return {"resource": self.resource, "unit": self.unit, "reason": self.reason,
                "detail": self.detail}


REFUSAL_REASONS = ("no_online_file", "spans_zones", "unmovable_pages", "holes",
                   "pages_not_read", "zones_not_read", "state_not_read", "dma",
                   "boot_memory", "device_kept")


@dataclass(frozen=True)
class RejectedPod:
    namespace: str
    name: str
    reason: str
    uid: str = ""
    owner_kind: str = ""  # its controller's kind (ReplicaSet, DaemonSet, ...); "": none/unknown
    pdb_blocked: bool | None = None  # a PodDisruptionBudget blocks its eviction; None: unread

    def json(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "name": self.name, "uid": self.uid,
                "owner_kind": self.owner_kind or None, "reason": self.reason,
                "pdb_blocked": self.pdb_blocked}


@dataclass(frozen=True)
class StaleContainer:
    namespace: str
    pod: str
    container: str
    kind: str
    detail: str

    def json(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "pod": self.pod, "container": self.container,
                "kind": self.kind, "detail": self.detail}


@dataclass(frozen=True)
class DeviceTake:
    """A memory device the change removes (or, `whole` False, cannot: `kept_by` says which of
    its blocks keep it)."""

    id: str
    kind: str  # dimm, virtio-mem
    blocks: tuple[int, ...]  # its online blocks to offline
    bytes: int  # what the hypervisor gets back
    whole: bool = True
    kept_by: tuple[int, ...] = ()
    slot: int | None = None
    start: int = 0
    acpi_path: str = ""

    def json(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "blocks": list(self.blocks),
                "bytes": self.bytes, "whole": self.whole, "kept_by": list(self.kept_by),
                "slot": self.slot, "start": self.start, "acpi_path": self.acpi_path or None}


@dataclass(frozen=True)
class Action:
    """One machine-readable step: `do` what, on what, how to undo it."""

    do: str  # ACTIONS
    path: str = ""  # the file to write (write), or delete (delete)
    value: str = ""  # what to write
    rollback: tuple[tuple[str, str], ...] = ()  # (path, value) writes that undo it
    detail: Mapping[str, Any] = field(default_factory=dict)
    says: str = ""  # the step in words (`steps`)

    def json(self, order: int) -> dict[str, Any]:
        out: dict[str, Any] = {"order": order, "do": self.do}
        if self.path:
            out["path"] = self.path
        if self.value:
            out["value"] = self.value
        out["rollback"] = [{"do": "write", "path": p, "value": v} for p, v in self.rollback]
        out.update(self.detail)
        return out


ACTIONS = ("cordon", "evict", "write", "hypervisor_remove", "hypervisor_add", "stop_kubelet",
           "delete", "start_kubelet", "restart_kubelet", "wait_for_capacity", "uncordon")


@dataclass(frozen=True)
class Plan:
    change: Change
    cpu_take: tuple[int, ...] = ()
    cpu_add: tuple[int, ...] = ()  # offline CPUs to online
    cpu_short: int = 0  # CPUs asked for that no safe candidate (removal) or slot (add) covers
    memory_take: tuple[int, ...] = ()
    memory_add: tuple[int, ...] = ()  # offline blocks to online
    memory_blocks_needed: int = 0
    memory_short_bytes: int = 0  # what the devices found leave uncovered
    block_size: int = 0
    capacity_after: Mapping[str, int] = field(default_factory=dict)  # cpu count, memory bytes
    rejected_pods: tuple[RejectedPod, ...] = ()
    rejected_total: int = 0
    rejected_by_reason: Mapping[str, int] = field(default_factory=dict)
    rejected_now: int = 0  # rejected at today's capacity already (not the change's doing)
    stale_containers: tuple[StaleContainer, ...] = ()
    refusals: tuple[Refusal, ...] = ()
    refusals_total: int = 0
    # None: the kubelet's checkpoints (or its configuration) were not read: nobody can say
    kubelet_restarts: bool | None = True
    kubelet_problem: str = ""
    kubelet_picks_up_without_restart: bool = False
    kubernetes: bool = False  # pods and the Node were considered
    running_containers: bool = False  # running containers were considered
    steps: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    # What the answer depends on and was not read ("pods: the API server is unreachable"): a
    # plan that cannot say is not safe.
    unjudged: tuple[str, ...] = ()
    # What the Node's status.allocatable should show after the kubelet's restart: the
    # capacity less its reservations (milli-CPU, bytes); empty without the Node.
    allocatable_after: Mapping[str, int] = field(default_factory=dict)
    # The contract's frame (docs/plan.schema.json): set by whoever answers (plan/answer.py).
    node: str = ""
    time: float = 0.0
    generation: str = ""
    asked_generation: str = ""  # the generation the client echoed ("": none)
    memory_devices: tuple[DeviceTake, ...] = ()
    cpu_places: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    actions: tuple[Action, ...] = ()
    inputs: Mapping[str, str] = field(default_factory=dict)  # input -> "read" or why not
    gates: Mapping[str, bool | None] = field(default_factory=dict)
    impossible: str = ""  # more than the machine has, or can have (with the most it can)
    memory_move_bytes: int = 0  # in-use memory the taken blocks hold (migrated elsewhere)
    memory_available_after: int | None = None  # MemAvailable less what is taken; None: unread
    other_harm: tuple[str, ...] = ()  # the planner's other reasons (the memory that stays)
    # "namespace/name" of each pod the actions evict -> whether a PodDisruptionBudget makes
    # the API server refuse its eviction (plan/eviction.py); empty: budgets not read
    pdb: Mapping[str, Any] = field(default_factory=dict)

    @property
    def memory_bytes(self) -> int:
        return len(self.memory_take or self.memory_add) * self.block_size

    @property
    def harm(self) -> tuple[str, ...]:
        """Why the change would hurt or cannot be done, one short phrase each."""
        out = [self.impossible] if self.impossible else []
        if self.rejected_total:
            out.append(f"{plural(self.rejected_total, 'pod')} rejected at the kubelet's "
                       "next restart")
        if self.stale_containers:
            out.append(f"{plural(len(self.stale_containers), 'running container')} left "
                       "stale")
        if self.kubelet_restarts is False:
            out.append("the kubelet would not restart")
        if self.cpu_short:
            out.append(f"{plural(self.cpu_short, 'CPU')} cannot be "
                       f"{'taken' if self.change.cpus < 0 else 'added'} safely")
        if self.memory_short_bytes:
            out.append(f"{size(self.memory_short_bytes)} of memory cannot be "
                       f"{'taken' if self.change.memory < 0 else 'added'} as asked")
        return tuple(out) + self.other_harm

    @property
    def verdict(self) -> str:
        """harmful when it would hurt (whatever else is unknown), unknown when something it
        depends on was not read, safe only when everything was read and nothing hurts."""
        if self.harm:
            return "harmful"
        return "unknown" if self.unjudged or self.kubelet_restarts is None else "safe"

    @property
    def safe(self) -> bool:
        return self.verdict == "safe"

    @property
    def stale(self) -> bool | None:
        """The node changed since the generation the client echoed (None: none echoed)."""
        if not self.asked_generation:
            return None
        return self.asked_generation != self.generation

    def json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_ID,
            "schema_version": SCHEMA_VERSION,
            "node": self.node or None,
            "time": _rfc3339(self.time),
            "generation": self.generation,
            "stale": self.stale,
            "verdict": self.verdict,
            "safe": self.safe,
            "harm": list(self.harm),
            "unknown": list(self.unjudged)
            + ([] if self.kubelet_restarts is not None else
               [f"the kubelet's restart: {self.kubelet_problem}"]),
            "inputs": dict(sorted(self.inputs.items())),
            "change": {"cpu": self.change.cpus, "cpu_unit": self.change.cpu_unit,
                       "memory_bytes": self.change.memory},
            "cpu": {"take": list(self.cpu_take), "add": list(self.cpu_add),
                    "short": self.cpu_short,
                    "places": [dict(self.cpu_places[c]) for c in self.cpu_take + self.cpu_add
                               if c in self.cpu_places]},
            "memory": {"take": list(self.memory_take), "add": list(self.memory_add),
                       "devices": [d.json() for d in self.memory_devices],
                       "bytes": self.memory_bytes, "block_size": self.block_size,
                       "blocks_needed": self.memory_blocks_needed,
                       "short_bytes": self.memory_short_bytes,
                       "move_bytes": self.memory_move_bytes,
                       "available_after_bytes": self.memory_available_after},
            "capacity_after": {"cpu": int(self.capacity_after.get("cpu", 0)),
                               "memory_bytes": int(self.capacity_after.get("memory", 0))},
            "allocatable_after": ({"cpu_millis": int(self.allocatable_after["cpu"]),
                                   "memory_bytes": int(self.allocatable_after["memory"])}
                                  if self.allocatable_after else None),
            "pods": {"rejected": [p.json() for p in self.rejected_pods],
                     "rejected_total": self.rejected_total,
                     "rejected_by_reason": {k: v for k, v in
                                            sorted(self.rejected_by_reason.items()) if v},
                     "rejected_now": self.rejected_now},
            "stale_containers": [c.json() for c in self.stale_containers],
            "refusals": [r.json() for r in self.refusals],
            "refusals_total": self.refusals_total,
            "kubelet": {"restarts": self.kubelet_restarts,
                        "problem": self.kubelet_problem or None,
                        "picks_up_without_restart": self.kubelet_picks_up_without_restart,
                        "live_resize_gates": {g: self.gates.get(g) for g in LIVE_RESIZE_GATES}},
            "considered": {"kubernetes": self.kubernetes,
                           "running_containers": self.running_containers},
            "actions": [a.json(i) for i, a in enumerate(self.actions, 1)],
            "steps": list(self.steps),
            "notes": list(self.notes),
        }


def _rfc3339(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")
