"""The open-episode indexes (exporter/correlate/index.py, deadlines.py): an event touches only
the episodes it concerns, and no deadline entry is ever later than the decision it stands for.

Cost is counted in work done (calls into the per-episode paths), not in time: bench/ has the
timings."""
from __future__ import annotations

from exporter.correlate.model import Episode, Outcome, Phase, UpdateKind
from exporter.events import Change, Direction, Resource, Result, Transition
from testkit.correlator_stream import T0, Stream

CPU, MEM = Resource.CPU, Resource.MEMORY


def waiting_plugs(n: int) -> list[Episode]:
    """n CPU hot-plugs done long ago, each waiting for a resync the kubelet never does."""
    out = []
    for k in range(n):
        end = T0 + 1 + k * 3.0
        t = Transition("bpf", CPU, 1, Direction.ONLINE, Result.SUCCESS, end=end, start=end - 0.01)
        out.append(Episode(id=f"cpu-inc-{k}", resource=CPU, change=Change.INCREASE,
                           opened=end - 0.01, transitions=[t], kernel_done=end,
                           kernel_before=1.0, kernel_after=2.0, kubelet_before=1.0,
                           phase=Phase.RESYNC))
    return out


def test_events_that_change_nothing_touch_no_waiting_episode():
    s = Stream(kubernetes=True, resync_deadline=1e9)
    s.at(1_000_000.0)
    s.node(1_000_000.0, cpu=1)
    s.resume(waiting_plugs(1000))
    s.snapshot(1_000_000.0, cpus=2)  # the first snapshot after a resume dates each once
    before = s.correlator.episodes_looked_at
    offset = 1_000_000.0
    for _ in range(10):
        offset += 1.0
        s.snapshot(offset, cpus=2)  # the kernel still has 2, the Node still says 1
        s.node(offset, cpu=1)  # a heartbeat
        s.pod(offset, "a")
        s.tick(offset)
    assert s.correlator.episodes_looked_at == before
    assert s.correlator.episodes_open() == 1000 and s.ended() == []


def test_a_memory_episode_beside_a_thousand_cpu_ones_is_decided_alone():
    s = Stream(kubernetes=True, resync_deadline=1e9)
    s.at(1_000_000.0)
    s.node(1_000_000.0, cpu=1)
    s.resume(waiting_plugs(1000))
    s.snapshot(1_000_000.0, cpus=2)
    before = s.correlator.episodes_looked_at
    s.transition(1_000_001.0, MEM, 7, Direction.OFFLINE)
    s.transition(1_000_003.5, MEM, 7, Direction.ONLINE)  # supersedes the unplug (resyncing)
    s.tick(1_000_010.0)  # the plug's kernel phase closes: it waits for its resync too
    # Two memory episodes, each looked at a few times (opened, closed, its resync checked):
    # none of the thousand CPU ones.
    assert s.correlator.episodes_looked_at - before < 20
    assert [ep.outcome for ep in s.ended()] == [Outcome.SUPERSEDED]
    assert s.correlator.episodes_open() == 1001


def test_a_resync_decides_every_waiting_episode_of_that_resource():
    s = Stream(kubernetes=True, resync_deadline=1e9)
    s.at(1_000_000.0)
    s.node(1_000_000.0, cpu=1)
    s.resume(waiting_plugs(50))
    s.snapshot(1_000_000.0, cpus=2)
    updates = s.node(1_000_001.0, cpu=2)  # the kubelet restarted
    assert [u.kind for u in updates] == [UpdateKind.RESYNCED, UpdateKind.ENDED] * 50
    assert [u.episode.id for u in updates[::2]] == [f"cpu-inc-{k}" for k in range(50)]
    assert s.correlator.episodes_open() == 0


def test_a_kubelet_that_moves_to_a_wrong_value_brings_every_mismatch_forward():
    """The mismatch deadline depends on the Node: when it moves, each waiting episode's entry
    must come forward (a late entry would decide it at the resync deadline instead)."""
    s = Stream(kubernetes=True, resync_deadline=1e9, readmission_settle=10.0)
    s.at(1_000_000.0)
    s.node(1_000_000.0, cpu=1)
    s.resume(waiting_plugs(20))
    s.snapshot(1_000_000.0, cpus=2)
    s.node(1_000_005.0, cpu=3)  # moved, but not to the kernel's 2
    assert s.tick(1_000_014.5) == []
    ended = s.tick(1_000_015.0)
    assert [u.episode.outcome for u in ended] == [Outcome.MISMATCH] * 20
    assert {u.episode.ended for u in ended} == {T0 + 1_000_015.0}  # 10 s after it moved


def test_no_deadline_entry_is_late_under_random_streams():
    """Replays the property-test streams and checks the index's one invariant after each
    event: every open episode has a heap entry at or before its next decision (a Node or a
    snapshot can bring a mismatch forward: the entry must come with it)."""
    from hypothesis import given, settings

    from testkit.correlator_plans import build, configs, steps

    @settings(max_examples=150, deadline=None)
    @given(config=configs, plan=steps)
    def run(config, plan):
        s = Stream(config)
        tracker = s.correlator._tracker
        for advance, lag, step in plan:
            s.clock.advance(advance)
            events = ([build(("snapshot", *step[1:]), s.clock.now() - lag),
                       build(("node", *step[1:]), s.clock.now())] if step[0] == "restart"
                      else [build(step, s.clock.now() - lag)])
            for event in events:
                s.push_tick() if event is None else s.push(event)
                for track in tracker._open.tracks():
                    due = tracker._deadlines.next_decision(track).due
                    assert track.scheduled <= due, track.ep.id

    run()
