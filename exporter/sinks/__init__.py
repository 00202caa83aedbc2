"""Sinks: where events and episode updates go (journal, traces, metrics).

The agent drives every sink through `Sink`: `on_event` sees each raw event before the correlator
acts on it (so the journal holds it even if the process dies while acting), `on_update` each
EpisodeUpdate the correlator returns, `close` flushes on SIGTERM.
"""
from __future__ import annotations

from typing import Protocol

from exporter.correlate.model import EpisodeUpdate
from exporter.events import Event


class Sink(Protocol):
    def on_event(self, event: Event) -> None: ...

    def on_update(self, update: EpisodeUpdate) -> None: ...

    def close(self) -> None: ...
