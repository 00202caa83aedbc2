"""Sinks: where events and episode updates go (journal, traces, metrics).

The agent drives every sink through `Sink`: `on_event` sees each raw event before the correlator
acts on it (the journal queues it for its writer thread, which commits within milliseconds),
`on_update` each EpisodeUpdate the correlator returns, `close` flushes on SIGTERM. A sink never
blocks the agent on I/O.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any, Protocol

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from exporter.correlate.model import EpisodeUpdate
from exporter.events import Event


class Sink(Protocol):
    def on_event(self, event: Event) -> None: ...

    def on_update(self, update: EpisodeUpdate) -> None: ...

    def close(self) -> None: ...


class SelfDescribing(Collector):
    """A Collector that describes itself by what it renders now. client_python compares a
    collector's names with those already registered only when its describe() names them, so
    one collector registered twice, or two that render the same family, are refused at
    register() (start-up) instead of exposing a family twice. A family that appears later
    (a histogram after its first observation) is not in the comparison."""

    def describe(self) -> Iterable[Metric]:
        return list(self.collect())


class ViewSink(SelfDescribing):
    """A sink and a Collector in one over a pure view, fed in the agent's thread and rendered at
    scrape time under the sink's own lock. The sources that feed it re-read after kernel events
    because they say so (their `poked_by`, exporter/sources/registry.py): the agent pokes them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    @classmethod
    def attach(cls, agent: Any) -> Any:
        """Built for a running agent, as one of its sinks."""
        sink = cls()
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
