"""A thread-safe event collector for source tests: `emit` for the source, `wait_for` for the test.

`wait_for` blocks until a matching event arrives (or fails after a generous bound so a broken
source cannot hang the suite); it asserts on what arrived, never on how fast.
"""
from __future__ import annotations

import threading
from typing import Callable, TypeVar

T = TypeVar("T")


class EventLog:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.events: list = []

    def emit(self, event) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def of(self, kind: type[T]) -> list[T]:
        with self._cond:
            return [e for e in self.events if isinstance(e, kind)]

    def wait_for(self, kind: type[T], where: Callable[[T], bool] = lambda e: True,
                 count: int = 1, bound: float = 20.0) -> T:
        """The `count`-th event of `kind` matching `where`."""
        def found():
            hits = [e for e in self.events if isinstance(e, kind) and where(e)]
            return hits[count - 1] if len(hits) >= count else None

        with self._cond:
            if not self._cond.wait_for(lambda: found() is not None, timeout=bound):
                raise AssertionError(f"no {kind.__name__} matching the condition arrived; "
                                     f"got: {self.events!r}")
            return found()


def wait_until(predicate: Callable[[], bool], what: str, bound: float = 20.0) -> None:
    """Poll a condition on another object (a fake server's request log, a counter)."""
    import time

    deadline = time.monotonic() + bound
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.01)


def started_sources(make):
    """A fixture body for sources a test starts: yields `start(*args, **kwargs)`, which builds a
    source with `make(*args, **kwargs)`, opens it and starts it into a new EventLog, returning
    (source, log); every source started is stopped afterwards and its thread must be gone."""
    started = []

    def start(*args, **kwargs):
        log = EventLog()
        source = make(*args, **kwargs)
        source.open()
        source.start(log.emit)
        started.append(source)
        return source, log

    yield start
    for source in started:
        source.stop()
        assert not source._thread.is_alive()
