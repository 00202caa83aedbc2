"""Observers of exporter state: an in-process agent with a timing sink, and periodic scrapers.

The in-process agent is the real exporter.agent.Agent with the real sources; the only addition
is a sink (the public Sink interface) that notes when each transition reached the correlator's
state. That gives kernel-end -> state latency without polling, whose own CPU use would delay
the very thing it measures on a 2-CPU machine with one CPU offline.
"""
from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

from bench.procs import Scraper
from exporter.agent import Agent
from exporter.app import build_agent
from exporter.clock import MonotonicWallClock
from exporter.config.options import Options
from exporter.correlate.model import EpisodeUpdate, UpdateKind
from exporter.events import Transition


@dataclass(frozen=True)
class Arrival:
    wall: float  # agent clock (wall seconds on CLOCK_MONOTONIC) when the state had it
    transition: Transition


class ArrivalSink:
    """Notes each transition the correlator took in (an episode opened or grew with it)."""

    def __init__(self, clock):
        self.clock = clock
        self.arrivals: list[Arrival] = []
        self.lock = threading.Condition()

    def on_event(self, event) -> None:
        pass

    def on_update(self, update: EpisodeUpdate) -> None:
        if update.kind in (UpdateKind.OPENED, UpdateKind.TRANSITION):
            now = self.clock.now()
            with self.lock:
                self.arrivals.append(Arrival(now, update.episode.transitions[-1]))
                self.lock.notify_all()

    def close(self) -> None:
        pass

    def count(self) -> int:
        with self.lock:
            return len(self.arrivals)

    def wait_beyond(self, count: int, timeout: float) -> bool:
        """Block (GIL released) until more than `count` arrivals, or timeout."""
        with self.lock:
            return self.lock.wait_for(lambda: len(self.arrivals) > count, timeout)

    def snapshot(self) -> list[Arrival]:
        with self.lock:
            return list(self.arrivals)


class InProcessAgent:
    """exporter.agent.Agent running in a thread of this process, kernel sources only."""

    def __init__(self, sources: tuple[str, ...]):
        self._options = Options(sources=sources, kubernetes="off", no_journal=True)
        self._clock = MonotonicWallClock()
        self.sink = ArrivalSink(self._clock)
        self.agent: Agent | None = None
        self.stop = threading.Event()

    @property
    def clock(self):
        return self._clock

    def __enter__(self) -> "InProcessAgent":
        self.agent = build_agent(self._options, self._clock, sinks=(self.sink,)).agent
        self.thread = threading.Thread(target=self.agent.run, args=(self.stop,),
                                       name="bench-agent", daemon=True)
        self.thread.start()
        if not self.agent.alive.wait(10):
            raise RuntimeError("in-process agent did not start")
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.agent.wake()
        self.thread.join(15)


@dataclass(frozen=True)
class Sample:
    t0: float  # time.monotonic() when the scrape was sent
    t1: float  # ... and when its body was read
    state: object


class PeriodicScraper(threading.Thread):
    """Scrapes like Prometheus does: every `interval` seconds from a random phase."""

    def __init__(self, port: int, interval: float, extract, seed: int = 0):
        super().__init__(name=f"scrape-{interval:g}s", daemon=True)
        self.port = port
        self.interval = interval
        self.extract = extract
        self.samples: list[Sample] = []
        self.errors = 0
        self.halt = threading.Event()
        self.phase = random.Random(seed).uniform(0, interval)

    def run(self) -> None:
        scraper = Scraper(self.port)
        next_at = time.monotonic() + self.phase
        try:
            while not self.halt.wait(max(0.0, next_at - time.monotonic())):
                t0 = time.monotonic()
                try:
                    text = scraper.get()
                except OSError:
                    self.errors += 1
                else:
                    self.samples.append(Sample(t0, time.monotonic(), self.extract(text)))
                next_at += self.interval
        finally:
            scraper.close()

    def finish(self) -> list[Sample]:
        self.halt.set()
        self.join(10)
        return self.samples
