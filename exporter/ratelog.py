"""Log a repeated condition once per interval, then how many times it was held back.

What outsiders can cause (clients that vanish, bad handshakes, a collector that resets every
connection, an API server that expires every watch, a disk that stalls the journal) must not be
able to flood the log. Two ways in, one rule:

- `RateLimitedLog(logger).note(kind, message, *args)`: for our own code. The first note of a
  kind is logged; later ones within `interval` seconds are only counted, and the first one
  after it says how many were held back. `flush()` says what is still held back (at close, or
  from a worker's idle tick, so a burst that ends is not left untold).
- `RateLimitFilter()`: a `logging.Filter` for loggers we do not own (the OpenTelemetry SDK's,
  urllib3's). The same rule per logger and message template, and a record's traceback is
  dropped: a failed export says it in one line, not forty.

Kinds are bounded (past `max_kinds`, new ones share the kind "other"), so a caller that puts
outside text into the kind cannot grow the table.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

INTERVAL = 60.0
MAX_KINDS = 64
OTHER = "other"


@dataclass
class _Kind:
    logged_at: float
    held: int = 0
    # The last message held back, for flush(): (message, args, level).
    last: tuple[str, tuple[object, ...], int] | None = None


class _Tally:
    """kind -> when it was last let through and how many were held back since: the one rule
    both ways in share. Thread-safe."""

    def __init__(self, interval: float, clock: Callable[[], float], max_kinds: int) -> None:
        self.interval = interval
        self.clock = clock
        self.max_kinds = max_kinds
        self._lock = threading.Lock()
        self._kinds: dict[str, _Kind] = {}

    def admit(self, kind: str, held_as: tuple[str, tuple[object, ...], int] | None = None
              ) -> tuple[bool, int, float]:
        """(let through?, held back before this one, seconds since the last let through)."""
        now = self.clock()
        with self._lock:
            if kind not in self._kinds and len(self._kinds) >= self.max_kinds:
                kind = OTHER
            entry = self._kinds.get(kind)
            if entry is not None and now - entry.logged_at < self.interval:
                entry.held += 1
                entry.last = held_as
                return False, 0, 0.0
            self._kinds[kind] = _Kind(now)
        if entry is None:
            return True, 0, 0.0
        return True, entry.held, now - entry.logged_at

    def take_held(self, force: bool
                  ) -> list[tuple[str, int, float, tuple[str, tuple[object, ...], int]]]:
        """Every kind with notes held back whose interval is over (any, with `force`) and a
        message to say them with; reset to none held."""
        now = self.clock()
        out = []
        with self._lock:
            for kind, entry in self._kinds.items():
                due = force or now - entry.logged_at >= self.interval
                if due and entry.held and entry.last is not None:
                    out.append((kind, entry.held, now - entry.logged_at, entry.last))
                    entry.held, entry.last, entry.logged_at = 0, None, now
        return out

    def clear(self) -> None:
        with self._lock:
            self._kinds.clear()


def _held_suffix(held: int, seconds: float) -> str:
    return f" (and {held} more like it in the last {int(seconds)}s)"


class RateLimitedLog:
    """note(kind, message, *args): log it unless this kind was logged less than `interval`
    seconds ago; the first note after the interval says how many were held back."""

    def __init__(self, logger: logging.Logger, interval: float = INTERVAL,
                 clock: Callable[[], float] = time.monotonic, max_kinds: int = MAX_KINDS):
        self.logger = logger
        self.interval = interval
        self._tally = _Tally(interval, clock, max_kinds)

    def note(self, kind: str, message: str, *args: object, level: int = logging.DEBUG,
             exc_info: bool = False) -> bool:
        """True when logged now; False when only counted."""
        admitted, held, seconds = self._tally.admit(kind, (message, args, level))
        if not admitted:
            return False
        if held:
            message += _held_suffix(held, seconds)
        self.logger.log(level, message, *args, exc_info=exc_info)
        return True

    def flush(self, force: bool = False) -> int:
        """Log what is held back (the last message of each such kind, with the count) where
        the interval is over, or all of it with `force` (at close), so a burst that stopped
        is told; returns how many lines were logged."""
        held = self._tally.take_held(force)
        for _kind, count, seconds, (message, args, level) in held:
            self.logger.log(level, message + _held_suffix(count - 1, seconds) if count > 1
                            else message, *args)
        return len(held)


class RateLimitFilter(logging.Filter):
    """A logging.Filter for loggers we do not own: a record (by logger name and message
    template) passes once per `interval`, the first one after says how many were held back,
    and its traceback is dropped. Add one instance to each noisy logger:

        logging.getLogger("urllib3.connectionpool").addFilter(FILTER)
    """

    def __init__(self, interval: float = INTERVAL, clock: Callable[[], float] = time.monotonic,
                 max_kinds: int = 256) -> None:
        super().__init__()
        self.interval = interval
        self._tally = _Tally(interval, clock, max_kinds)

    def filter(self, record: logging.LogRecord) -> bool:
        admitted, held, seconds = self._tally.admit(f"{record.name}\0{str(record.msg)[:200]}")
        if not admitted:
            return False
        if held:
            record.msg = f"{record.msg}{_held_suffix(held, seconds)}"
        # The traceback of a failed export says nothing the message does not: one line.
        record.exc_info = None
        record.exc_text = None
        return True

    def reset(self) -> None:
        """Forget what was let through (tests start from a clean slate)."""
        self._tally.clear()


def rate_limit_loggers(names: tuple[str, ...], limiter: RateLimitFilter) -> None:
    """Add `limiter` to each named logger once (idempotent)."""
    for name in names:
        logger = logging.getLogger(name)
        if limiter not in logger.filters:
            logger.addFilter(limiter)
