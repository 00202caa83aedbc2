"""What the kernel changed while the exporter was not running (issue 16, item 14).

A SIGKILL (or an OOM kill, a node reboot) can come a few milliseconds after a transition, before
its event reached the journal; and nothing at all is seen while the process is down. The
journal still holds the kernel state the process last knew: its last KernelSnapshot (the sysfs
reconciler journals one after every kernel event) and the transitions journaled after it. At
start the composition root compares that with what sysfs says now; each CPU or memory block in
another state is one change while down, counted once in
`node_resize_exporter_down_changes_total{resource,direction}` and logged. Pure functions.
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
    """The state the last process knew: the last snapshot among `events` (journal order), with
    the successful transitions after it applied. None without a snapshot."""
    cpus: set[int] | None = None
    blocks: set[int] = set()
    for event in events:
        if isinstance(event, KernelSnapshot):
            cpus, blocks = set(event.cpus_online), set(event.memory_blocks_online)
        elif isinstance(event, Transition) and cpus is not None \
                and event.result is Result.SUCCESS:
            units = cpus if event.resource is Resource.CPU else blocks
            if event.direction is Direction.ONLINE:
                units.add(event.unit)
            else:
                units.discard(event.unit)
    if cpus is None:
        return None
    return KernelState(frozenset(cpus), frozenset(blocks))


def changes_while_down(before: KernelState | None,
                       now: KernelSnapshot) -> Counter[tuple[Resource, Direction]]:
    """Units whose state differs between `before` and `now`, by resource and direction."""
    out: Counter[tuple[Resource, Direction]] = Counter()
    if before is None:
        return out
    for resource, was, is_ in ((Resource.CPU, before.cpus_online, now.cpus_online),
                               (Resource.MEMORY, before.memory_blocks_online,
                                now.memory_blocks_online)):
        if is_ - was:
            out[(resource, Direction.ONLINE)] += len(is_ - was)
        if was - is_:
            out[(resource, Direction.OFFLINE)] += len(was - is_)
    return out
