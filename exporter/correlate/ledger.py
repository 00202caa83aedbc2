"""The kernel ledger: what every source saw, each transition counted once.

Several sources see the same transition (BPF, then the uevent, then the sysfs reconciler's
diff), in any order, and any of them may miss some (a full ring buffer, ENOBUFS, a flap faster
than a sysfs read). Per unit and direction we count what each source saw; a transition is new
when some source's count goes past the best count so far, so the total is the maximum over
sources: no double counting, and a transition any one source saw is not lost. Durations come
only from BPF, which never duplicates itself, so each BPF record's duration is observed.

Memory no block moved (virtio-mem sub-blocks, balloons: a Transition with a `mechanism`) is the
exception. The kprobes and the MemTotal poll see those changes at different grains: the poll
merges two that come within its interval, catches one half of a flap, reads a block's pages
as moving before the block's state says so; the kprobes miss what came before they attached.
Counted per source with the largest kept, the source ahead swallowed the other's next real
changes (the lab: a virtio-mem plug the kprobes saw was in no episode, the poll's count being
ahead). So one source is believed for them at a time: the one whose managed-page programs are
both attached (MANAGED_PAGE_PROGRAMS), else any (the poll, where no kprobe loads).
Pure: no I/O, no clock.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from exporter.correlate.histogram import KERNEL_BUCKETS, Histogram
from exporter.events import (
    MANAGED_PAGE_PROGRAMS,
    Direction,
    Event,
    EventsLost,
    KernelSnapshot,
    MalformedInput,
    ProgramStatus,
    Resource,
    Result,
    SourceStatus,
    Transition,
)

UnitKey = tuple[Resource, int, Direction, Result]
# The other events the ledger keeps something of, beyond their count.
_KEPT = (KernelSnapshot, SourceStatus, ProgramStatus, EventsLost, MalformedInput)


@dataclass
class SourceState:
    up: bool
    reason: str = ""


@dataclass
class KernelLedger:
    # The counts every event or transition moves are plain dicts: on Python 3.11 a Counter's
    # subscripts cost three times a dict's (a dict subclass misses the interpreter's fast path).
    seen: dict[str, dict[UnitKey, int]] = field(default_factory=dict)  # per source
    best: dict[UnitKey, int] = field(default_factory=dict)
    transitions: dict[tuple[Resource, Direction, Result], int] = field(default_factory=dict)
    durations: dict[tuple[Resource, Direction], Histogram] = field(default_factory=dict)
    snapshot: KernelSnapshot | None = None
    events: dict[str, int] = field(default_factory=dict)  # per source, every kind
    lost: Counter[str] = field(default_factory=Counter)
    malformed: Counter[str] = field(default_factory=Counter)
    sources: dict[str, SourceState] = field(default_factory=dict)
    programs: dict[str, SourceState] = field(default_factory=dict)
    program_sources: dict[str, str | None] = field(default_factory=dict)  # who reported each
    # Per source, the time of the last event it delivered (any kind): how stale it is, where
    # source_up alone cannot say (a watch that is "up" and silent).
    last_event: dict[str, float] = field(default_factory=dict)
    # Units the kernel changed while no exporter ran, found at start (correlate/down_changes.py).
    down_changes: Counter[tuple[Resource, Direction]] = field(default_factory=Counter)

    def handle(self, event: Event, source: str | None = None) -> bool:
        """Record the event; True when the correlator should act on it (new, not a duplicate).

        `source` names who delivered it when the event itself does not say (KernelSnapshot
        from sysfs, Kubernetes events from their watches)."""
        when: object
        if type(event) is Transition:  # half of all events: no getattr() that misses
            name, when = event.source or source, event.end
        else:
            name = getattr(event, "source", None) or source
            when = getattr(event, "time", None) or getattr(event, "end", None)
        if name:
            self.events[name] = self.events.get(name, 0) + 1
            if isinstance(when, (int, float)) and when > self.last_event.get(name, 0.0):
                self.last_event[name] = float(when)
        if isinstance(event, Transition):
            return self._transition(event)
        if not isinstance(event, _KEPT):
            return True  # Node and pod updates, and the like: counted above, nothing more
        if isinstance(event, KernelSnapshot):
            self.snapshot = event
        elif isinstance(event, SourceStatus):
            self.sources[event.source] = SourceState(event.up, event.reason)
        elif isinstance(event, ProgramStatus):
            self.programs[event.program] = SourceState(event.attached, event.reason)
            self.program_sources[event.program] = name
        elif isinstance(event, EventsLost):
            self.lost[event.source] += event.count
        elif isinstance(event, MalformedInput):
            self.malformed[event.source] += 1
        return True

    def _transition(self, t: Transition) -> bool:
        # t.duration (only BPF knows the start), without the call; a CPU's or a block's own:
        # memory no block moved (t.mechanism: a balloon filling for seconds) is no transition
        # of the kernel's hotplug code
        if t.start is not None and t.mechanism is None:
            self._histogram(t.resource, t.direction).observe(max(0.0, t.end - t.start))
        key = (t.resource, t.unit, t.direction, t.result)
        seen = self.seen.get(t.source)
        if seen is None:
            seen = self.seen[t.source] = {}
        count = seen.get(key, 0) + 1
        seen[key] = count
        if t.mechanism is not None:  # no block moved: the believed source's alone (above)
            believed = self.managed_pages_source()
            if believed is not None and t.source != believed:
                return False
        elif count <= self.best.get(key, 0):
            return False
        self.best[key] = count
        counted = (t.resource, t.direction, t.result)
        self.transitions[counted] = self.transitions.get(counted, 0) + 1
        return True

    def managed_pages_source(self) -> str | None:
        """The source whose kprobes see the managed page count move (both programs attached),
        or None: then every source's managed-page changes are taken."""
        states = [self.programs.get(p) for p in MANAGED_PAGE_PROGRAMS]
        if not all(state is not None and state.up for state in states):
            return None
        sources = {self.program_sources.get(p) for p in MANAGED_PAGE_PROGRAMS}
        return sources.pop() if len(sources) == 1 else None

    def _histogram(self, resource: Resource, direction: Direction) -> Histogram:
        histogram = self.durations.get((resource, direction))
        if histogram is None:  # not setdefault: that would build a Histogram on every call
            histogram = self.durations[(resource, direction)] = Histogram(KERNEL_BUCKETS)
        return histogram
