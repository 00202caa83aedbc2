"""What the kernel changed while the exporter was not running.

A SIGKILL (or an OOM kill, a node reboot) can come a few milliseconds after a transition, before
its event reached the journal; and nothing at all is seen while the process is down. The
journal still holds the kernel state the process last counted: the snapshot the sysfs
reconciler read at that process's start and the transitions journaled after it (the journal's
last_kernel_events). Not the newest snapshot: one read from sysfs just after a transition whose
event was still queued at the kill is ahead of what the process counted, and comparing it with
sysfs would lose that change. At start the composition root compares the counted state with
what sysfs says now; each CPU or memory block in another state is one change while down,
counted once in `node_resize_exporter_down_changes_total{resource,direction}` and logged. The
next process journals its own start snapshot, so a change counted while down is not counted
again after another restart. Pure functions.

The state is computed by kernel time, not by the order events were journaled in: several
sources deliver the same transition at different moments (a BPF batch for an earlier cycle can
arrive after the uevent of a later one), so in arrival order a late duplicate would flip a unit
back to a state the kernel had already left. Per unit, the newest observation wins: the
snapshot (read at its `time`) or a successful transition that ended after it, the latest `end`.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from exporter.events import Direction, Event, KernelSnapshot, Resource, Result, Transition


@dataclass(frozen=True)
class KernelState:
    cpus_online: frozenset[int]
    memory_blocks_online: frozenset[int]


def state_at_stop(events: Iterable[Event]) -> KernelState | None:
    """The state the last process knew: the newest snapshot among `events` (by its time), with
    the successful transitions that ended after it applied in kernel-time order (`end`), so the
    order they arrived or were journaled in does not matter. None without a snapshot."""
    snapshot: KernelSnapshot | None = None
    transitions: list[Transition] = []
    for event in events:
        if isinstance(event, KernelSnapshot):
            if snapshot is None or event.time >= snapshot.time:
                snapshot = event
        elif isinstance(event, Transition) and event.result is Result.SUCCESS:
            transitions.append(event)
    if snapshot is None:
        return None
    cpus, blocks = set(snapshot.cpus_online), set(snapshot.memory_blocks_online)
    for t in sorted((t for t in transitions if t.end >= snapshot.time), key=lambda t: t.end):
        units = cpus if t.resource is Resource.CPU else blocks
        if t.direction is Direction.ONLINE:
            units.add(t.unit)
        else:
            units.discard(t.unit)
    return KernelState(frozenset(cpus), frozenset(blocks))


def changes_while_down(before: KernelState | None,
                       now: KernelSnapshot) -> Counter[tuple[Resource, Direction]]:
    """Units whose state differs between `before` and `now`, by resource and direction.

    Bounded by what the host has: the journal is a file, and a snapshot naming 8,192 CPUs on
    a 4-CPU host is not 8,188 CPUs taken offline. CPUs: only the host's possible CPUs (fixed
    at boot). Memory blocks: a block whose directory left sysfs while no exporter ran went
    offline (virtio-mem and DIMM removal take blocks away whole), so such blocks count, but at
    most as many as the host has now: a forged list of 65,536 blocks on an 8-block host counts
    8 at most."""
    out: Counter[tuple[Resource, Direction]] = Counter()
    if before is None:
        return out
    cpus = now.cpus_possible | now.cpus_present | now.cpus_online | now.cpus_offline
    blocks = now.memory_blocks_online | now.memory_blocks_offline
    for resource, was, is_, gone in (
            (Resource.CPU, before.cpus_online & cpus, now.cpus_online, 0),
            (Resource.MEMORY, before.memory_blocks_online & blocks, now.memory_blocks_online,
             min(len(before.memory_blocks_online - blocks), len(blocks)))):
        if is_ - was:
            out[(resource, Direction.ONLINE)] += len(is_ - was)
        if len(was - is_) + gone:
            out[(resource, Direction.OFFLINE)] += len(was - is_) + gone
    return out
