"""Sinks: where events and episode updates go (journal, traces, metrics).

The agent drives every sink through `Sink`: `on_event` sees each raw event before the correlator
acts on it (the journal queues it for its writer thread, which commits within milliseconds),
`on_update` each EpisodeUpdate the correlator returns, `close` flushes on SIGTERM. A sink never
blocks the agent on I/O.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

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
