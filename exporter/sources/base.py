"""What every source is: something that starts, emits typed events, and stops."""
from __future__ import annotations

import logging
import threading
from typing import Callable

from exporter.clock import Clock
from exporter.events import Event, SourceStatus

Emit = Callable[[Event], None]


class SourceUnavailable(Exception):
    """A source cannot start here. `reason` says what is wrong, `fix` what to do about it."""

    def __init__(self, reason: str, fix: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.reason} (fix: {self.fix})" if self.fix else self.reason


class Source:
    """A source runs its own daemon thread and pushes events through `emit`.

    Subclasses implement `open()` (may raise SourceUnavailable: called in the caller's thread so
    `--source X` can fail fast with the reason) and `loop(emit)` (runs until `stopping` is set).
    """

    name = "source"

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.log = logging.getLogger(f"exporter.sources.{self.name}")

    def open(self) -> None:
        """Acquire what the source needs; raise SourceUnavailable with a fix if it cannot."""

    def loop(self, emit: Emit) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release what open() acquired (called once, after the thread ended)."""

    def start(self, emit: Emit) -> None:
        self._thread = threading.Thread(target=self._run, args=(emit,), name=self.name,
                                        daemon=True)
        self._thread.start()

    def _run(self, emit: Emit) -> None:
        try:
            self.loop(emit)
        except Exception:  # a source dying must not take the agent down: say so and stop
            self.log.exception("source %s failed", self.name)
            emit(SourceStatus(self.name, False, self.clock.now(), "crashed; see log"))

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.close()
