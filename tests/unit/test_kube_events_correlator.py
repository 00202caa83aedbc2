"""The Event correlator behaves as client-go's (tools/record/events_cache.go): a repeat is sent
under the same key (a PATCH of count), more than 10 messages of one reason in 10 minutes are
combined, and the spam filter lets 25 through per object, then one per 5 minutes."""
from __future__ import annotations

from exporter.sinks.kube_events import (
    AGGREGATE_MAX,
    SPAM_BURST,
    EventCorrelator,
    event_object,
)


def _event(message: str, reason: str = "ResizeResynced") -> dict:
    return event_object("n1", "Normal", reason, message, now=0)


def test_the_same_event_again_is_sent_under_the_same_key():
    c = EventCorrelator()
    first = c.aggregate(_event("cpu hot-unplug: Node capacity now 1 core (2 s)"), 0.0)
    again = c.aggregate(_event("cpu hot-unplug: Node capacity now 1 core (2 s)"), 1.0)
    other = c.aggregate(_event("cpu hot-unplug: Node capacity now 1 core (3 s)"), 2.0)
    assert first == again != other


def test_more_than_ten_messages_of_one_reason_are_combined():
    c = EventCorrelator()
    keys, objs = [], []
    for k in range(AGGREGATE_MAX + 3):
        obj = _event(f"took {k} s")
        keys.append(c.aggregate(obj, float(k)))
        objs.append(obj)
    assert len(set(keys[:AGGREGATE_MAX - 1])) == AGGREGATE_MAX - 1  # each its own Event
    assert len(set(keys[AGGREGATE_MAX - 1:])) == 1  # then one, combined
    assert objs[-1]["message"] == f"(combined from similar events): took {AGGREGATE_MAX + 2} s"
    # Another reason is not combined with these; ten minutes later it starts over.
    assert c.aggregate(_event("x", reason="CPUHotPlug"), 20.0)[-1] == "x"
    assert c.aggregate(_event("took 99 s"), 20.0 + 601)[-1] == "took 99 s"


def test_the_spam_filter_lets_25_through_then_one_per_five_minutes():
    c = EventCorrelator()
    allowed = [c.allow(_event(f"m{k}"), 0.0) for k in range(SPAM_BURST + 5)]
    assert allowed == [True] * SPAM_BURST + [False] * 5
    assert not c.allow(_event("m"), 299.0)
    assert c.allow(_event("m"), 301.0) and not c.allow(_event("m"), 302.0)
    # Another object has its own bucket.
    other = event_object("n2", "Normal", "ResizeResynced", "m", now=0)
    assert c.allow(other, 302.0)
