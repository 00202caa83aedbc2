"""A flap storm is one episode: opposite transitions of a resource within the coalescing window
join the open episode (README, "Flap storms"), which counts every one and keeps a bounded sample;
the transition counters still count each. A storm of 10,000 transitions keeps the correlator's
state and the episode's journal row bounded."""
from __future__ import annotations

import tracemalloc

from exporter import codec
from exporter.correlate.index import TRANSITIONS_KEPT
from exporter.correlate.model import Outcome, UpdateKind
from exporter.events import Change, Direction, Resource, Result, Transition
from testkit.correlator_stream import T0, Stream

CPU = Resource.CPU
ON, OFF = Direction.ONLINE, Direction.OFFLINE


def _storm(s: Stream, cycles: int, start: float = 1.0, step: float = 0.0625,
           uevents: bool = True) -> float:
    """cpu1 out and back `cycles` times, each transition from BPF and again from a uevent
    (start-less, a little later: the ledger drops it, the episode keeps the kernel's record)."""
    t = start
    for k in range(2 * cycles):
        direction = OFF if k % 2 == 0 else ON
        s.transition(t, CPU, 1, direction)
        if uevents:
            s.feed(t + 0.001, Transition("uevent", CPU, 1, direction, Result.SUCCESS,
                                         end=T0 + t + 0.001))
        t += step
    return t


def test_a_flap_storm_is_one_episode_with_its_counts():
    s = Stream(kubernetes=False)
    s.snapshot(0, cpus=2)
    last = _storm(s, 100)
    s.tick(last + 5.0)
    [ep] = s.ended()
    assert ep.flapping and ep.change is Change.DECREASE
    assert (ep.offline_transitions, ep.online_transitions) == (100, 100)
    assert ep.outcome is Outcome.KERNEL_ONLY
    assert ep.opened == T0 + 1.0 - 0.0078125
    assert ep.kernel_done == T0 + last - 0.0625  # the last transition's end
    assert ep.transitions[-1].direction is ON  # the final state: back online
    assert "flapping: 100 offline and 100 online transitions" in ep.detail
    assert "ended online" in ep.detail
    # Every transition counted, once each (the uevent duplicates are not).
    assert s.metrics.ledger.transitions == {(CPU, OFF, Result.SUCCESS): 100,
                                            (CPU, ON, Result.SUCCESS): 100}
    kinds = [u.kind for u in s.updates]
    assert kinds.count(UpdateKind.OPENED) == 1 and kinds.count(UpdateKind.ENDED) == 1
    assert s.stats.unplug_requests == {CPU: 1} and s.stats.resync_requests == {}


def test_opposite_changes_further_apart_than_the_window_are_separate_episodes():
    s = Stream(kubernetes=False, coalesce_window=2.0)
    s.snapshot(0, cpus=2)
    s.transition(1.0, CPU, 1, OFF)
    s.transition(3.5, CPU, 1, ON)  # the unplug's kernel phase closed at 3.0
    s.tick(10.0)
    assert [(ep.change, ep.flapping) for ep in s.ended()] == [
        (Change.DECREASE, False), (Change.INCREASE, False)]


def test_a_refused_transition_starts_no_flap_but_joins_one():
    s = Stream(kubernetes=False)
    s.snapshot(0, cpus=2)
    s.transition(1.0, CPU, 1, OFF)
    s.transition(1.25, CPU, 1, ON, Result.FAILED, error="EBUSY")  # its own episode
    assert s.correlator.episodes_open() == 2
    s.transition(1.5, CPU, 2, ON)  # a flap: joins the unplug
    s.transition(1.75, CPU, 2, OFF, Result.FAILED, error="EBUSY")  # joins the flap
    s.tick(10.0)
    ended = {ep.change: ep for ep in s.ended()}
    assert ended[Change.INCREASE].outcome is Outcome.KERNEL_FAILED
    storm = ended[Change.DECREASE]
    assert storm.flapping and storm.transitions_seen == 3
    assert "1 of 3 transitions failed" in storm.detail


def test_ten_thousand_transitions_keep_the_state_and_the_journal_row_bounded():
    s = Stream(kubernetes=True, resync_deadline=1e9)
    s.snapshot(0, cpus=2)
    s.node(0, cpu=2)
    s.updates = []  # (the Stream keeps every update; this test looks at the correlator)
    last = _storm(s, 500, uevents=False)  # warm up: the sample is full, the ids recorded
    s.updates = []
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    last = _storm(s, 5000, start=last, uevents=True)  # 10,000 transitions, 20,000 records
    # Past the sample, one update (one journal row rewrite) per 64 transitions.
    assert len(s.updates) == 10_000 // 64, len(s.updates)
    s.updates = []
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    [ep] = s.open_episodes()
    assert (ep.offline_transitions, ep.online_transitions) == (5500, 5500)
    assert len(ep.transitions) == TRANSITIONS_KEPT
    # The sample: the first half, then the latest (in order, the last one last).
    assert ep.transitions[0].end == T0 + 1.0 and ep.transitions[-1].end == T0 + last - 0.0625
    assert all(t.start is not None for t in ep.transitions)  # the kernel's records kept
    # No per-transition growth: 10,000 more transitions cost less than 100 bytes each, the
    # ledger's bounded de-duplication memory included.
    assert grown < 1_000_000, grown
    row = codec.dumps(ep)
    assert len(row) < 64 * 1024, len(row)  # the episode's journal row (README: <= 64 KiB)
    s.tick(last + 5.0)  # the storm ends (back online: the Node still agrees)
    assert s.correlator.episodes_open() <= 1


def test_episode_copy_keeps_every_field():
    """Episode.copy() lists the fields itself: each set to a value unlike its default must come
    through, and the copy's lists must be its own."""
    import dataclasses

    from exporter.correlate.model import Episode, Phase, PodOutcome, PodVerdict

    values = {"id": "x", "resource": Resource.MEMORY, "change": Change.DECREASE, "opened": 1.0,
              "transitions": [Transition("bpf", CPU, 1, OFF, Result.SUCCESS, end=2.0)],
              "phase": Phase.READMISSION, "resynced_by": "kubelet_live", "detail": "d",
              "pods": [PodOutcome(3.0, "ns", "p", "u", PodVerdict.KEPT, "Running")],
              "outcome": Outcome.MISMATCH}
    fields = dataclasses.fields(Episode)
    for k, f in enumerate(fields):  # numbers for the rest, each different
        values.setdefault(f.name, 10 + k)
    ep = Episode(**values)
    copy = ep.copy()
    assert copy == ep and copy is not ep
    assert all(getattr(copy, f.name) == values[f.name] for f in fields)
    assert copy.transitions is not ep.transitions and copy.pods is not ep.pods
