"""The plan's vocabulary: the change asked for (parsed, with the fix for a bad one), what the
planner reads (protocols the kernel readers' types satisfy), and the answer (a Plan, its JSON).

Pure: no I/O, no clock.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from exporter.kube.quantity import parse_quantity


class BadChange(ValueError):
    """A change that cannot be planned; the message says what to pass instead."""


@dataclass(frozen=True)
class Change:
    cpus: int = 0  # CPUs to add (> 0) or take away (< 0)
    memory: int = 0  # bytes to add (> 0) or take away (< 0)


_CPU = re.compile(r"[+-][0-9]{1,6}")
_SIGNED = re.compile(r"([+-])(.+)")


def parse_change(cpu: str | None, memory: str | None) -> Change:
    """`--cpu -2`, `--memory -4Gi` (the query's `cpu=-2&memory=-4Gi`) -> Change; BadChange
    names the fix."""
    if (cpu is None or cpu == "") and (memory is None or memory == ""):
        raise BadChange("no change given: ask for cpu -N or +N (CPUs) and/or memory -SIZE or "
                        "+SIZE (bytes or a quantity such as 4Gi), for example cpu -1 and "
                        "memory -2Gi")
    cpus = 0
    if cpu is not None and cpu != "":
        text = cpu.strip()
        if not _CPU.fullmatch(text):
            raise BadChange(f"cpu {cpu[:40]!r}: a whole number of CPUs with its sign, such as "
                            "-2 (take two away) or +2 (add two); CPUs hotplug one at a time, "
                            "so no fractions")
        cpus = int(text)
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
    return Change(cpus, mem)


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


# ---------------------------------------------------------------- the answer


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
                   "pages_not_read")


@dataclass(frozen=True)
class RejectedPod:
    namespace: str
    name: str
    reason: str

    def json(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "name": self.name, "reason": self.reason}


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
class Plan:
    change: Change
    cpu_take: tuple[int, ...] = ()
    cpu_add: tuple[int, ...] = ()  # offline CPUs to online
    cpu_short: int = 0  # CPUs asked for that no safe candidate (removal) or slot (add) covers
    memory_take: tuple[int, ...] = ()
    memory_add: tuple[int, ...] = ()  # offline blocks to online
    memory_blocks_needed: int = 0
    memory_short_bytes: int = 0  # what the blocks found leave uncovered
    block_size: int = 0
    capacity_after: Mapping[str, float] = field(default_factory=dict)  # cpu cores, bytes
    rejected_pods: tuple[RejectedPod, ...] = ()
    rejected_total: int = 0
    rejected_by_reason: Mapping[str, int] = field(default_factory=dict)
    rejected_now: int = 0  # rejected at today's capacity already (not the change's doing)
    stale_containers: tuple[StaleContainer, ...] = ()
    refusals: tuple[Refusal, ...] = ()
    refusals_total: int = 0
    kubelet_restarts: bool = True
    kubelet_problem: str = ""
    kubelet_picks_up_without_restart: bool = False
    kubernetes: bool = False  # pods and the Node were considered
    running_containers: bool = False  # running containers were considered
    steps: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    # What should have been judged and could not be (the API server unreachable): a plan
    # that cannot say is not safe.
    unjudged: tuple[str, ...] = ()
    # What the Node's status.allocatable should show after the kubelet's restart: the
    # capacity less its reservations (cores, bytes); empty without the Node.
    allocatable_after: Mapping[str, float] = field(default_factory=dict)

    @property
    def memory_bytes(self) -> int:
        return len(self.memory_take or self.memory_add) * self.block_size

    @property
    def harm(self) -> tuple[str, ...]:
        """Why the change would hurt, one short phrase each (empty: it would not)."""
        out = list(self.unjudged)
        if self.rejected_total:
            out.append(f"{self.rejected_total} pod(s) rejected at the kubelet's next restart")
        if self.stale_containers:
            out.append(f"{len(self.stale_containers)} running container(s) left stale")
        if not self.kubelet_restarts:
            out.append("the kubelet would not restart")
        if self.cpu_short:
            out.append(f"{self.cpu_short} CPU(s) cannot be "
                       f"{'taken' if self.change.cpus < 0 else 'added'} safely")
        if self.memory_short_bytes:
            out.append(f"{self.memory_short_bytes} bytes of memory cannot be "
                       f"{'taken' if self.change.memory < 0 else 'added'} as asked")
        return tuple(out)

    @property
    def safe(self) -> bool:
        return not self.harm

    def json(self) -> dict[str, Any]:
        return {
            "safe": self.safe,
            "harm": list(self.harm),
            "change": {"cpu": self.change.cpus, "memory_bytes": self.change.memory},
            "cpu": {"take": list(self.cpu_take), "add": list(self.cpu_add),
                    "short": self.cpu_short},
            "memory": {"take": list(self.memory_take), "add": list(self.memory_add),
                       "bytes": self.memory_bytes, "block_size": self.block_size,
                       "blocks_needed": self.memory_blocks_needed,
                       "short_bytes": self.memory_short_bytes},
            "capacity_after": dict(self.capacity_after),
            "allocatable_after": dict(self.allocatable_after),
            "rejected_pods": [p.json() for p in self.rejected_pods],
            "rejected_total": self.rejected_total,
            "rejected_by_reason": {k: v for k, v in self.rejected_by_reason.items() if v},
            "rejected_now": self.rejected_now,
            "stale_containers": [c.json() for c in self.stale_containers],
            "refusals": [r.json() for r in self.refusals],
            "refusals_total": self.refusals_total,
            "kubelet": {"restarts": self.kubelet_restarts,
                        "problem": self.kubelet_problem or None,
                        "picks_up_without_restart": self.kubelet_picks_up_without_restart},
            "considered": {"kubernetes": self.kubernetes,
                           "running_containers": self.running_containers},
            "steps": list(self.steps),
            "notes": list(self.notes),
            "unjudged": list(self.unjudged),
        }
