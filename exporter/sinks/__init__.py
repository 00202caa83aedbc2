"""Sinks: where events and episode updates go (journal, traces, metrics).

The agent drives every sink through `Sink`: `on_event` sees each raw event before the correlator
acts on it (the journal queues it for its writer thread, which commits within milliseconds),
`on_update` each EpisodeUpdate the correlator returns, `close` flushes on SIGTERM. A sink never
blocks the agent on I/O.

A sink whose writes can fail declares its `name` (a class attribute, e.g. `name = "journal"`):
its `errors` are shown as node_resize_exporter_sink_errors_total{sink=NAME}, and its `up` (if it
has one) as node_resize_exporter_sink_up. The collectors describe themselves through the
registry's own auto_describe (the composition root's CollectorRegistry(auto_describe=True)):
a family registered twice is refused at start-up, not exposed twice.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Protocol

from prometheus_client.registry import Collector

from exporter.correlate.model import EpisodeUpdate
from exporter.events import DeviceChange, Event, Resource, Transition


class Sink(Protocol):
    def on_event(self, event: Event) -> None: ...

    def on_update(self, update: EpisodeUpdate) -> None: ...

    def close(self) -> None: ...


class PokingSink(Collector):
    """A sink and a Collector in one over a pure view, fed in the agent's thread and rendered at
    scrape time under the sink's own lock. After a kernel event it pokes the sources that must
    re-read (the kernel changes a cpuset or a checkpoint's meaning without any notification):
    `POKED` names them, with the resources whose events concern each (a re-read after any
    other is a wasted wake-up, in a CPU flap storm right in the online window)."""

    POKED: ClassVar[dict[str, frozenset[Resource]]] = {}

    def __init__(self, pokes: Iterable[tuple[frozenset[Resource], Callable[[], None]]] = ()
                 ) -> None:
        self.lock = threading.Lock()
        self._pokes = list(pokes)

    @classmethod
    def attach(cls, agent: Any) -> Any:
        """Built for a running agent: pokes its re-reading sources, and is one of its sinks."""
        sink = cls([(cls.POKED[s.name], s.poke) for s in agent.sources if s.name in cls.POKED])
        agent.add_sink(sink)
        return sink

    def feed(self, event: Event) -> None:
        """Hand the event to the view (called under the lock)."""
        raise NotImplementedError

    def on_event(self, event: Event) -> None:
        with self.lock:
            self.feed(event)
        # A kernel event, not the sysfs snapshot that follows each one: one re-read per event.
        if isinstance(event, (Transition, DeviceChange)):
            for resources, poke in self._pokes:
                if event.resource in resources:
                    poke()

    def on_update(self, update: EpisodeUpdate) -> None:
        pass  # judged from the kernel's truth and the kubelet's files, not from episodes

    def close(self) -> None:
        pass
