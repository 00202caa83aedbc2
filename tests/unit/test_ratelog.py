"""The one rate-limited log: a kind (or a foreign logger's message) once per interval, then
how many were held back; bounded however many kinds outsiders can make up."""
from __future__ import annotations

import logging

import pytest

from exporter.ratelog import MAX_KINDS, RateLimitedLog, RateLimitFilter, rate_limit_loggers


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


class Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def lines(self) -> list[str]:
        return [r.getMessage() for r in self.records]


@pytest.fixture
def logger(request):
    log = logging.getLogger(f"test.ratelog.{request.node.name}")
    keep = Keep()
    log.addHandler(keep)
    log.setLevel(logging.DEBUG)
    log.propagate = False
    yield log, keep
    log.removeHandler(keep)
    log.filters.clear()


def test_a_kind_once_per_interval_then_the_count_held_back(logger):
    log, keep = logger
    clock = Clock()
    notes = RateLimitedLog(log, interval=60.0, clock=clock)
    assert notes.note("lost", "watch lost (%s)", "reset", level=logging.INFO)
    for _ in range(41):
        assert not notes.note("lost", "watch lost (%s)", "reset", level=logging.INFO)
    assert notes.note("gone", "a 100% different kind")  # no args: a % is literal
    assert keep.lines() == ["watch lost (reset)", "a 100% different kind"]
    clock.t = 59.9
    assert not notes.note("lost", "watch lost (%s)", "eof")
    clock.t = 75.0
    assert notes.note("lost", "watch lost (%s)", "eof", level=logging.INFO)
    assert keep.lines()[-1] == "watch lost (eof) (and 42 more like it in the last 75s)"
    assert keep.records[-1].levelno == logging.INFO


def test_flush_tells_a_burst_that_stopped_once_its_interval_is_over(logger):
    log, keep = logger
    clock = Clock()
    notes = RateLimitedLog(log, interval=60.0, clock=clock)
    for why in ("queue full", "queue full", "queue full", "spam"):
        notes.note(why, "dropped (%s)", why, level=logging.WARNING)
    assert notes.flush() == 0  # within the interval: nothing yet
    clock.t = 61.0
    assert notes.flush() == 1
    assert keep.lines()[-1] == "dropped (queue full) (and 1 more like it in the last 61s)"
    assert notes.flush(force=True) == 0  # told once
    notes.note("spam", "dropped (%s)", "spam")  # logged: the interval of "spam" is over
    notes.note("spam", "dropped (%s)", "spam")
    assert notes.flush(force=True) == 1 and keep.lines()[-1] == "dropped (spam)"


def test_made_up_kinds_share_one_entry_past_the_bound(logger):
    log, keep = logger
    notes = RateLimitedLog(log, interval=60.0, clock=Clock())
    for i in range(10 * MAX_KINDS):
        notes.note(f"tls:{i}", "handshake failed: %d", i)
    assert len(keep.records) == MAX_KINDS + 1  # every new kind past the bound is "other"


def test_the_filter_rate_limits_a_logger_we_do_not_own_and_drops_its_traceback(logger):
    log, keep = logger
    clock = Clock()
    limiter = RateLimitFilter(interval=60.0, clock=clock)
    rate_limit_loggers((log.name,), limiter)
    rate_limit_loggers((log.name,), limiter)  # idempotent
    assert log.filters == [limiter]
    for i in range(100):
        try:
            raise ValueError("bad header")
        except ValueError:
            log.warning("Failed to parse headers (url=%s): %s", f"/v1/traces?{i}", "junk",
                        exc_info=True)
    log.error("Failed to export span batch code: %s", 503)
    assert keep.lines() == ["Failed to parse headers (url=/v1/traces?0): junk",
                            "Failed to export span batch code: 503"]
    assert all(r.exc_info is None for r in keep.records)
    clock.t = 90.0
    log.warning("Failed to parse headers (url=%s): %s", "/v1/traces", "junk")
    assert keep.lines()[-1] == ("Failed to parse headers (url=/v1/traces): junk "
                                "(and 99 more like it in the last 90s)")
    limiter.reset()
    log.error("Failed to export span batch code: %s", 503)
    assert len(keep.records) == 4
