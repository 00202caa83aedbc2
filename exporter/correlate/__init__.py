"""The correlator: kernel ledger (each transition once) + episode tracker. Pure, clock injected.

    events ──► KernelLedger (counts, de-duplicates) ──► EpisodeTracker (episodes) ──► updates
"""
from __future__ import annotations

from exporter.clock import Clock
from exporter.correlate.episodes import CorrelatorConfig, EpisodeTracker
from exporter.correlate.ledger import KernelLedger
from exporter.correlate.model import Episode, EpisodeUpdate
from exporter.events import Event, Transition

__all__ = ["Correlator", "CorrelatorConfig"]


class Correlator:
    def __init__(self, config: CorrelatorConfig, clock: Clock):
        self.ledger = KernelLedger()
        self.tracker = EpisodeTracker(config, clock)

    def handle(self, event: Event, source: str | None = None) -> list[EpisodeUpdate]:
        if not self.ledger.handle(event, source):
            if isinstance(event, Transition) and event.start is not None:
                # A duplicate that knows more (BPF's kernel times after a uevent got there
                # first): let the episode keep the better record.
                self.tracker.enrich(event)
            return []
        return self.tracker.handle(event)

    def tick(self) -> list[EpisodeUpdate]:
        return self.tracker.tick()

    def resume(self, episodes: list[Episode]) -> None:
        self.tracker.resume(episodes)
