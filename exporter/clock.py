"""One time axis for the whole agent.

Kernel timestamps (bpf_ktime_get_ns) are CLOCK_MONOTONIC. Spans, the journal and metrics want
wall-clock time. We capture the offset between the two once, at start, and derive every
timestamp from CLOCK_MONOTONIC plus that offset: a kernel record and a watch delivery land on
the same axis, and a later wall-clock jump (NTP step, operator `date -s`) cannot make an
episode run backwards.
"""
from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...


class MonotonicWallClock:
    """Wall-clock seconds, anchored once, advancing with CLOCK_MONOTONIC."""

    def __init__(self) -> None:
        # Take the pair tightly together; the error is the gap between the two calls (~1 us).
        mono_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        wall_ns = time.time_ns()
        self._offset_ns = wall_ns - mono_ns

    def now(self) -> float:
        return self.from_ktime_ns(time.clock_gettime_ns(time.CLOCK_MONOTONIC))

    def from_ktime_ns(self, ktime_ns: int) -> float:
        """The one place kernel CLOCK_MONOTONIC nanoseconds become wall-clock seconds."""
        return (ktime_ns + self._offset_ns) / 1e9


class FakeClock:
    """A clock tests move by hand."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> float:
        self.t += seconds
        return self.t
