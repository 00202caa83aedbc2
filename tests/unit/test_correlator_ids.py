"""Episode ids: short and human, unique, the same on every replay; the old form
from journals written before still reads."""
from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.correlate.ids import ALPHABET, IdMaker, episode_id, parse_id
from exporter.correlate.model import UpdateKind
from exporter.events import Change, Direction, Resource
from testkit.correlator_stream import Stream

CPU, MEM = Resource.CPU, Resource.MEMORY
NEW_FORM = re.compile(r"^(cpu|memory)-(inc|dec)-\d{8}-\d{6}-[0-9a-hjkmnp-tv-z]{4}(-\d+)?$")


def test_the_id_says_what_and_when_in_utc():
    # 2026-11-23 10:37:00.5 UTC; 500000 us = 15 * 32**3 + 8 * 32**2 + 9 * 32: "f890"
    opened = 1795430220.5
    assert episode_id(CPU, Change.DECREASE, opened) == "cpu-dec-20261123-103700-f890"
    assert episode_id(MEM, Change.INCREASE, opened) == "memory-inc-20261123-103700-f890"
    assert parse_id("cpu-dec-20261123-103700-f890").opened == opened


def test_ids_from_a_stream_are_short_and_replay_identically():
    def run() -> list[str]:
        s = Stream(kubernetes=False)
        for k in range(6):
            s.transition(1.0 + 5 * k, CPU, 1, Direction.OFFLINE if k % 2 else Direction.ONLINE)
            s.transition(1.25 + 5 * k, MEM, 7, Direction.ONLINE if k % 2 else Direction.OFFLINE)
        s.tick(100.0)
        return [u.episode.id for u in s.updates if u.kind is UpdateKind.OPENED]

    first = run()
    assert first == run()
    assert len(set(first)) == len(first) == 12
    assert all(NEW_FORM.match(i) and len(i) <= len("memory-dec-20231114-221320-y8xv")
               for i in first), first


def test_a_flap_within_one_microsecond_keeps_ids_apart():
    # No coalescing window: each transition opens an episode and supersedes the one before
    # (with a window, a flap joins the open episode instead: test_correlator_storm.py).
    s = Stream(kubernetes=False, coalesce_window=0.0)
    for direction in (Direction.ONLINE, Direction.OFFLINE, Direction.ONLINE, Direction.OFFLINE,
                      Direction.ONLINE):
        s.transition(1.0, CPU, 2, direction, duration=0.0)
    ids = [u.episode.id for u in s.updates if u.kind is UpdateKind.OPENED]
    assert ids[2] == ids[0] + "-2" and ids[4] == ids[0] + "-3" and ids[3] == ids[1] + "-2"
    assert [parse_id(i).n for i in ids] == [1, 1, 2, 2, 3]


@settings(max_examples=500, deadline=None)
@given(opened=st.floats(0.0, 7e9),  # 1970 .. 2191: where a float still holds microseconds
       resource=st.sampled_from([CPU, MEM]), change=st.sampled_from(list(Change)))
def test_every_opening_microsecond_has_its_own_id_and_reads_back(opened, resource, change):
    """The id is (resource, change, microsecond) written out: parse_id gets all three back,
    so two ids are equal only when those are (as unique as the old decimal form)."""
    made = episode_id(resource, change, opened)
    assert NEW_FORM.match(made)
    parsed = parse_id(made)
    assert parsed is not None
    assert (parsed.resource, parsed.change, parsed.opened_us) == (resource, change,
                                                                 int(opened * 1e6))


def test_old_ids_from_existing_journals_still_read():
    old = parse_id("cpu-decrease-1795420060000000")
    assert old is not None and old.resource is CPU and old.change is Change.DECREASE
    assert old.opened_us == 1795420060_000000 and old.n == 1
    assert parse_id("memory-increase-1700000000123456-2").n == 2
    # Resumed from a journal, an episode keeps its old id to the end.
    s = Stream(kubernetes=False)
    first = Stream(kubernetes=True)
    first.snapshot(0, cpus=2)
    first.transition(1.0, CPU, 2, Direction.ONLINE)
    first.tick(4.0)
    [kept] = first.open_episodes()
    kept.id = "cpu-increase-1700000000992187"
    s.resume([kept])
    s.tick(10.0)
    assert [ep.id for ep in s.ended()] == ["cpu-increase-1700000000992187"]


def test_hostile_times_give_an_id_not_a_crash():
    maker = IdMaker()
    for t in (1e20, -1e20, 0.0, -0.5, 2**62, 253402300800.0):
        made = maker.make(CPU, Change.INCREASE, t)
        assert made.startswith("cpu-inc-")
        parsed = parse_id(made)
        assert parsed is not None and parsed.opened_us == int(t * 1e6)
    assert parse_id("not-an-id") is None and parse_id("cpu-dec-20261323-103700-f890") is None
    assert parse_id("cpu-dec-20261123-103700-zzzz") is None  # past a second's microseconds
    assert set(ALPHABET) == set("0123456789abcdefghjkmnpqrstvwxyz")
