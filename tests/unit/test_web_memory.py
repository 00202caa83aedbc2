"""exporter/web/memory.py: the heap is trimmed after a burst of closed connections, at most
once per interval, and not for the odd scrape."""
from __future__ import annotations

from exporter.web.memory import TRIM_AFTER, TRIM_INTERVAL, Trimmer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_is_trimmed_once_and_scrapes_are_not():
    clock, calls = Clock(), []
    trimmer = Trimmer(clock, trim=lambda pad: calls.append(pad) or 1, delay=1.0)
    delays = [trimmer.closed() for _ in range(TRIM_AFTER - 1)]
    assert delays == [None] * (TRIM_AFTER - 1)  # a few scrapers' connections: nothing
    assert trimmer.closed() == 1.0  # the burst's 64th: trim a second from now
    assert all(trimmer.closed() is None for _ in range(500))  # pending: once
    trimmer.trim()
    assert calls == [0]
    clock.now += 1
    delays = [trimmer.closed() for _ in range(TRIM_AFTER)]
    # A flood that goes on: the next trim waits for the interval.
    assert delays[-1] == TRIM_INTERVAL - 1


def test_without_glibc_nothing_is_scheduled():
    trimmer = Trimmer(Clock(), trim=None)
    trimmer._trim = None
    assert all(trimmer.closed() is None for _ in range(1000))
