"""Sinks: where events and episode updates go (journal, traces, metrics).

The agent drives every sink through `Sink`: `on_event` sees each raw event before the correlator
acts on it (the journal queues it for its writer thread, which commits within milliseconds),
`on_update` each EpisodeUpdate the correlator returns, `close` flushes on SIGTERM. A sink never
blocks the agent on I/O.

A sink whose writes can fail is `Reporting`: it declares its `name` (a class attribute, e.g.
`name = "journal"`) and counts its `errors`, shown as
node_resize_exporter_sink_errors_total{sink=NAME}; one that can be down as a whole also has a
boolean `up`, shown as node_resize_exporter_sink_up. The views (kubelet, running pods, plan)
write nothing: no name, no errors, no series. The collectors describe themselves through the
registry's own auto_describe (the composition root's CollectorRegistry(auto_describe=True)):
a family registered twice is refused at start-up, not exposed twice.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any, ClassVar, Protocol, Self

from prometheus_client.registry import Collector

from exporter.correlate.model import EpisodeUpdate
from exporter.events import Event


class Sink(Protocol):
    def on_event(self, event: Event) -> None: ...

    def on_update(self, update: EpisodeUpdate) -> None: ...

    def close(self) -> None: ...


class Reporting(Protocol):
    """A sink whose writes can fail (the journal, traces, Events)."""

    name: ClassVar[str]  # the `sink` label
    errors: int  # writes it could not make


def reporting(sinks: Iterable[object]) -> list[tuple[str, Any]]:
    """The sinks that report (a `name` of their class, and `errors`), with their names."""
    out = []
    for sink in sinks:
        name = getattr(type(sink), "name", None)
        if isinstance(name, str) and name and isinstance(getattr(sink, "errors", None), int):
            out.append((name, sink))
    return out


def up_of(sink: object) -> bool | None:
    """A reporting sink's `up`; None when it cannot be down as a whole."""
    up = getattr(sink, "up", None)
    return up if isinstance(up, bool) else None


class ViewSink(Collector):
    """A sink and a Collector in one over a pure view, fed in the agent's thread and rendered at
    scrape time under the sink's own lock. The sources that feed it re-read after kernel events
    because they say so (their `poked_by`, exporter/sources/registry.py): the agent pokes them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    @classmethod
    def attach(cls, agent: Any, *args: Any, **kwargs: Any) -> Self:
        """Built for a running agent (`args` and `kwargs` to the constructor), as one of its
        sinks."""
        sink = cls(*args, **kwargs)
        agent.add_sink(sink)
        return sink

    def feed(self, event: Event) -> None:
        """Hand the event to the view (called under the lock)."""
        raise NotImplementedError

    def on_event(self, event: Event) -> None:
        with self.lock:
            self.feed(event)

    def on_update(self, update: EpisodeUpdate) -> None:
        pass  # judged from the kernel's truth and the kubelet's files, not from episodes

    def close(self) -> None:
        pass
