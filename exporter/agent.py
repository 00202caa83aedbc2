"""The running agent: sources -> one queue -> correlator -> sinks.

Sources run in their own threads and only put typed events on the queue. This thread alone
feeds the correlator (under the lock the Collector takes to render), so the correlator itself
needs no locking and stays pure.
"""
from __future__ import annotations

import gc
import logging
import queue
import sys
import threading
from collections.abc import Iterable
from typing import Any, Callable

from exporter.clock import Clock
from exporter.correlate.correlator import Correlator
from exporter.events import (
    DeviceChange,
    Event,
    MalformedInput,
    Resource,
    SourceStatus,
    Transition,
)
from exporter.sinks import Sink
from exporter.sinks.episode_log import EpisodeLog
from exporter.sources.base import Source

log = logging.getLogger(__name__)
# The loop sleeps until the correlator's next deadline (an open episode's coalescing window,
# resync deadline or settle window) or an event, whichever comes first: a decision is taken at
# its own instant whenever tick() runs, so waking earlier would change nothing but the CPU.
# With no deadline (no episode open) it sleeps until an event (or wake()); the bound only
# guards a caller that sets its stop event without wake().
IDLE_SECONDS = 30.0
# A thread woken by an event waits for the GIL at most this long while another runs
# Python (a scrape rendering, a sysfs read); CPython's default of 5 ms bounds the detection
# tail far above the 1 ms target. Forced switches happen only while a thread waits; 0.5 ms
# cost ~20% more CPU in a flap storm (source threads woken by one uevent take turns).
SWITCH_INTERVAL = 0.001
_WAKE = ("", None)  # put by wake(): look at the stop event now


class Agent:
    """Moves events from the sources' threads through the correlator to the sinks.

    Everything it works with is built elsewhere (exporter/app.py) and handed in: the sources
    already opened, the correlator, the sinks in the order they must see each event (the
    journal first: an event is handed to its writer queue before it is acted on; the writer
    thread commits it, so no sink call here waits for a disk), and the sources to poke after a
    kernel event of another source, each with the resources whose events concern it (their
    `poked_by`: the sysfs reconciler after every one; a re-read after any other is a wasted
    wake-up, in a CPU flap storm right in the online window).
    """

    def __init__(self, correlator: Correlator, sources: list[Source], sinks: list[Sink],
                 clock: Clock, *, pokes: Iterable[tuple[Source, frozenset[Resource]]] = (),
                 down: tuple[SourceStatus, ...] = ()) -> None:
        self.correlator = correlator
        self.sources = list(sources)
        self.sinks = list(sinks)
        self.clock = clock
        self.pokes = [(source.name, resources, source.poke) for source, resources in pokes]
        # SimpleQueue (C, no Condition): half the per-event cost of queue.Queue in the storm
        # profile, and put() is reentrant, so wake() is safe from a signal handler.
        self.queue: queue.SimpleQueue[tuple[str, Event | None]] = queue.SimpleQueue()
        self.lock = threading.Lock()  # the Collector renders under it
        self.alive = threading.Event()
        self._malformed_logged: set[str] = set()
        self._down_logged: set[str] = set()  # sources whose down the log has said
        self.episode_log = EpisodeLog()  # the episode lines in the log (bounded)
        self._version = 0  # bumped whenever the correlator's state may have changed
        for status in down:  # sources that could not open: their series say so from the start
            self._process(status.source, status, quiet=True)
        # Every other source is "not up yet" until it says otherwise, so each has its
        # source_up series from the first scrape: an API server that never answers is a 0
        # an alert can see, not a missing series.
        said = {s.source for s in down}
        for source in self.sources:
            if source.name not in said:
                self._process(source.name, SourceStatus(source.name, False, clock.now(),
                                                        "starting"), quiet=True)

    def close_sources(self) -> None:
        """Release what the opened sources hold, when start-up fails before run()."""
        for source in self.sources:
            source.close()

    def add_sink(self, sink: Sink) -> None:
        """A sink built after start-up (traces: after the privilege drop)."""
        self.sinks.append(sink)

    def run(self, stop: threading.Event) -> None:
        for source in self.sources:
            source.start(self._emitter(source.name))
        sys.setswitchinterval(SWITCH_INTERVAL)
        # What start-up built lives as long as the process (modules, libraries, the sources).
        # Frozen out of the collector's reach, a full collection walks only what events created
        # since; otherwise it walks ~46k objects (9-13 ms measured), GIL held, on whichever
        # thread trips it: a detection-latency outlier.
        gc.collect()
        gc.freeze()
        self.alive.set()
        try:
            while not stop.is_set():
                try:
                    name, event = self.queue.get(timeout=self._until_due())
                except queue.Empty:
                    pass
                else:
                    if event is not None:
                        self._process(name, event)
                # Only with nothing queued: the events still waiting may be older than now, and
                # each decides what fell due before it (Correlator.handle), at its own time. A
                # tick at now first would close a kernel phase (and split a flap storm) before
                # the transitions that join it were read, whenever the agent falls behind.
                if self.queue.empty():
                    self._tick()
        finally:
            self.alive.clear()
            self.shutdown()

    def shutdown(self) -> None:
        for source in self.sources:
            source.stop()  # BPF: detaches every probe
        while True:  # what the sources said before stopping still counts
            try:
                name, event = self.queue.get_nowait()
            except queue.Empty:
                break
            if event is not None:
                self._process(name, event)
        for sink in self.sinks:
            try:
                sink.close()
            except Exception:
                log.exception("closing sink %s", type(sink).__name__)
        self.episode_log.close()

    def wake(self) -> None:
        """Make run() look at its stop event now; safe from a signal handler."""
        self.queue.put(_WAKE)

    def state_version(self) -> int:
        """Changes whenever what /metrics shows may have changed (lets scrapes share a render)."""
        return self._version

    def _emitter(self, name: str) -> Callable[[Event], None]:
        put = self.queue.put
        return lambda event: put((name, event))

    def _process(self, name: str, event: Event, quiet: bool = False) -> None:
        if isinstance(event, MalformedInput):
            self._log_malformed(event)
        elif isinstance(event, SourceStatus) and not quiet:
            self._log_source(event)
        for sink in self.sinks:  # the journal queues the raw event before it is acted on
            self._call(sink.on_event, event)
        with self.lock:
            updates = self.correlator.handle(event, name)
            self._version += 1
        for update in updates:
            self._call(self.episode_log.on_update, update)
            for sink in self.sinks:
                self._call(sink.on_update, update)
        if isinstance(event, (Transition, DeviceChange)):
            # Re-read what the kernel may have changed without telling (never the source that
            # told: the reconciler's own transitions come from its re-read).
            for source, resources, poke in self.pokes:
                if source != name and event.resource in resources:
                    poke(event.resource)

    def _log_source(self, event: SourceStatus) -> None:
        """A source's state change, logged here once (the sources emit only changes): down with
        its reason, and up again after a logged down. Fields for a JSON log: source, up."""
        fields = {"source": event.source, "up": event.up}
        if not event.up and event.reason:
            self._down_logged.add(event.source)
            log.warning("source %s down: %s", event.source, event.reason,
                        extra={**fields, "reason": event.reason})
        elif event.up and event.source in self._down_logged:
            self._down_logged.discard(event.source)
            log.info("source %s up again", event.source, extra=fields)

    def _log_malformed(self, event: MalformedInput) -> None:
        # The first from each source at warning (someone must look), the rest at debug: a
        # stream of garbage must not flood the log; the counter has the totals.
        level = logging.DEBUG if event.source in self._malformed_logged else logging.WARNING
        self._malformed_logged.add(event.source)
        log.log(level, "malformed input from %s (counted, skipped): %s", event.source,
                event.detail)

    def _until_due(self) -> float:
        """Seconds until the correlator's next deadline (0: due now), at most IDLE_SECONDS."""
        return min(IDLE_SECONDS, max(0.0, self.correlator.next_due() - self.clock.now()))

    def _tick(self) -> None:
        with self.lock:
            updates = self.correlator.tick()
            if updates:
                self._version += 1
        for update in updates:
            self._call(self.episode_log.on_update, update)
            for sink in self.sinks:
                self._call(sink.on_update, update)

    @staticmethod
    def _call(fn: Callable[[Any], object], arg: Any) -> None:
        try:
            fn(arg)
        except Exception:  # a sink failing must not stop the agent or the other sinks
            log.exception("sink %s failed", getattr(fn, "__qualname__", fn))
