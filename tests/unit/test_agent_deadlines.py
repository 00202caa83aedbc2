"""The running agent sleeps until the correlator's next deadline or an event: an open episode
ends at its coalescing window's end, decided by one wake-up at that instant, not found by a
tick every quarter of a second."""
from __future__ import annotations

import dataclasses
import threading

from exporter.agent import Agent
from exporter.clock import MonotonicWallClock
from exporter.config.decide import correlator_config
from exporter.config.options import Options
from exporter.correlate.correlator import Correlator
from exporter.correlate.model import EpisodeUpdate, UpdateKind
from exporter.events import Direction, Event, Resource, Result, Transition

WINDOW = 1.5  # s: the coalescing window of this test's correlator


class Updates:
    """A sink that keeps the updates and says when an episode ended."""

    def __init__(self) -> None:
        self.got: list[EpisodeUpdate] = []
        self.ended = threading.Event()

    def on_event(self, event: Event) -> None:
        pass

    def on_update(self, update: EpisodeUpdate) -> None:
        self.got.append(update)
        if update.kind is UpdateKind.ENDED:
            self.ended.set()

    def close(self) -> None:
        pass


def test_an_open_episode_ends_at_its_deadline_with_one_wake_up_for_it():
    clock = MonotonicWallClock()
    config = dataclasses.replace(correlator_config(Options(), False), coalesce_window=WINDOW)
    correlator = Correlator(config, clock)
    ticks: list[float] = []
    tick = correlator.tick

    def counted_tick() -> list[EpisodeUpdate]:
        ticks.append(clock.now())
        return tick()

    correlator.tick = counted_tick  # type: ignore[method-assign]
    sink = Updates()
    agent = Agent(correlator, [], [sink], clock)  # type: ignore[list-item]
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    runner.start()
    try:
        assert agent.alive.wait(30)
        end = clock.now()
        agent.queue.put(("uevent", Transition("uevent", Resource.CPU, 1, Direction.OFFLINE,
                                              Result.SUCCESS, end=end)))
        assert sink.ended.wait(60)
        decided_at = clock.now()
    finally:
        stop.set()
        agent.wake()
        runner.join(30)
    ended = [u.episode for u in sink.got if u.kind is UpdateKind.ENDED]
    assert len(ended) == 1
    # Decided once the window after the last transition ran out, dated at the kernel's end
    # (no Kubernetes: kernel_only), as the correlator decides it whenever tick() runs.
    assert ended[0].kernel_done == ended[0].ended == end
    assert ended[0].outcome == "kernel_only"
    assert end + WINDOW <= decided_at
    # Before the deadline the agent looked once, after the event (nothing due then); a tick
    # every 0.25 s would have looked about six times.
    early = [t for t in ticks if t < end + WINDOW]
    assert len(early) <= 2, ticks
