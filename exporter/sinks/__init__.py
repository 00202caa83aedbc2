"""Sinks: where events and episode updates go (journal, traces, metrics).

The agent drives every sink through `Sink`: `on_event` sees each raw event before the correlator
acts on it (the journal queues it for its writer thread, which commits within milliseconds),
`on_update` each EpisodeUpdate the correlator returns, `close` flushes on SIGTERM. A sink never
blocks the agent on I/O.
"""
from __future__ import annotations

from typing import Protocol

from exporter.correlate.model import EpisodeUpdate
from exporter.events import Event


class Sink(Protocol):
    def on_event(self, event: Event) -> None: ...

    def on_update(self, update: EpisodeUpdate) -> None: ...

    def close(self) -> None: ...
