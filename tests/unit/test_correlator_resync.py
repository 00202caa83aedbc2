"""Episode correlator, kernel and resync phases: synthetic streams on a fake clock."""
from __future__ import annotations

from exporter.correlate.model import Outcome, Phase, UpdateKind
from exporter.events import Change, Direction, Resource, Result
from testkit.correlator_stream import BLOCK, T0, GiB, MiB, Stream

CPU, MEM = Resource.CPU, Resource.MEMORY
ON, OFF = Direction.ONLINE, Direction.OFFLINE
UP, DOWN = (CPU, Change.INCREASE), (CPU, Change.DECREASE)


def plug_eight_cpus(s: Stream) -> float:
    """cpus 2..9 come online 0.125 s apart; returns the last end (kernel done) as an offset."""
    for k in range(8):
        end = 1.0 + 0.125 * k
        s.transition(end, CPU, 2 + k, ON)
        s.snapshot(end + 0.0625, cpus=3 + k)
    return 1.0 + 0.125 * 7


def test_eight_cpus_coalesce_into_one_request_and_resync_after_3s():
    s = Stream(kubernetes=True)
    s.snapshot(0, cpus=2)
    s.node(0.5, cpu=2)
    done = plug_eight_cpus(s)

    opened = [u for u in s.updates if u.kind is UpdateKind.OPENED]
    assert len(opened) == 1
    assert s.stats.resync_requests == {CPU: 1}
    assert s.stats.unplug_requests == {}

    assert s.tick(done + 1.0) == []  # the coalescing window is still open
    [kernel_done] = s.tick(done + 2.0)
    assert kernel_done.kind is UpdateKind.KERNEL_DONE
    assert kernel_done.episode.kernel_done == T0 + done
    assert kernel_done.episode.kernel_before == 2 and kernel_done.episode.kernel_after == 10
    assert len(kernel_done.episode.transitions) == 8

    s.node(done + 2.5, cpu=2)  # a status heartbeat with the old value changes nothing
    assert s.open_episodes()[0].phase is Phase.RESYNC
    updates = s.node(done + 3.0, cpu=10)
    assert [u.kind for u in updates] == [UpdateKind.RESYNCED, UpdateKind.ENDED]
    ep = updates[-1].episode
    assert ep.outcome is Outcome.CONVERGED and ep.resync_seconds == 3.0
    # Opened at T0 + 0.9921875 s = 2023-11-14 22:13:20.992187 UTC; 992187 us is y8xv in base32.
    assert ep.id == "cpu-inc-20231114-221320-y8xv"

    hist = s.stats.resync_duration[UP]
    assert hist.n == 1 and hist.total == 3.0
    cumulative = dict(hist.cumulative())
    assert cumulative["1.0"] == 0 and cumulative["5.0"] == 1 and cumulative["+Inf"] == 1
    assert s.stats.resync_duration[DOWN].n == 0
    assert s.stats.resync_errors == {}
    assert s.correlator.episodes_open() == 0
    assert s.view.drift() == {CPU: 0.0, MEM: 0.0}


def test_transitions_further_apart_than_the_window_are_two_episodes():
    s = Stream(kubernetes=True)
    s.snapshot(0, cpus=2)
    s.transition(1.0, CPU, 2, ON)
    s.transition(3.5, CPU, 3, ON)  # 2.5 s after the first: its window had closed
    assert s.stats.resync_requests == {CPU: 2}
    assert [u.kind for u in s.updates] == [UpdateKind.OPENED, UpdateKind.KERNEL_DONE,
                                           UpdateKind.OPENED]
    assert len({e.id for e in s.open_episodes()}) == 2


def test_node_update_before_the_kernel_phase_closed_still_counts():
    s = Stream(kubernetes=True)
    s.snapshot(0, cpus=2)
    s.node(0, cpu=2)
    s.transition(1.0, CPU, 2, ON)
    s.snapshot(1.0625, cpus=3)
    s.node(1.25, cpu=3)  # a kubelet with the KEP: fast, inside the coalescing window
    assert s.open_episodes()[0].phase is Phase.KERNEL
    updates = s.tick(3.0)
    assert [u.kind for u in updates] == [UpdateKind.KERNEL_DONE, UpdateKind.RESYNCED,
                                         UpdateKind.ENDED]
    assert updates[-1].episode.resync_seconds == 0.25
    assert s.stats.resync_duration[UP].total == 0.25


def test_kubelet_never_resyncs_times_out_and_drift_stays():
    """Today's common case: the running kubelet keeps advertising the old capacity."""
    s = Stream(kubernetes=True, resync_deadline=600.0)
    s.snapshot(0, cpus=2)
    s.node(0, cpu=2)
    s.transition(10.0, CPU, 1, OFF, duration=0.03125)
    s.snapshot(10.0625, cpus=1)
    assert s.view.drift() == {CPU: -1.0, MEM: 0.0}
    s.tick(12.0)
    assert s.view.drift_seconds() == {CPU: 12.0 - 10.0625, MEM: 0.0}
    for minute in range(1, 10):  # heartbeats with the stale value
        s.node(10.0 + 60 * minute, cpu=2)
    assert s.tick(609.5) == []
    [ended] = s.tick(610.0)
    ep = ended.episode
    assert ep.outcome is Outcome.RESYNC_TIMEOUT and ep.ended == T0 + 610.0
    assert ep.kubelet_after == 2 and ep.kernel_after == 1
    assert ep.detail == "Node capacity cpu 2 cores did not reach the kernel's 1 core within 600 s"
    assert s.stats.unplug_requests == {CPU: 1}
    assert s.stats.unplug_errors == {(CPU, "resync_timeout"): 1}
    assert s.stats.resync_errors == {}
    assert s.stats.resync_duration[DOWN].n == 0
    # The episode is over; the drift is not, and its age keeps growing with the clock.
    assert s.view.drift() == {CPU: -1.0, MEM: 0.0}
    s.at(1000.0625)
    assert s.view.drift_seconds()[CPU] == 990.0
    s.at(2000.0625)
    assert s.view.drift_seconds()[CPU] == 1990.0
    # A kubelet restart fixes it: drift and its age drop to zero.
    s.node(2001.0, cpu=1)
    assert s.view.drift() == {CPU: 0.0, MEM: 0.0}
    assert s.view.drift_seconds() == {CPU: 0.0, MEM: 0.0}


def test_deadline_is_decided_at_its_instant_not_at_the_next_tick():
    s = Stream(kubernetes=True, resync_deadline=60.0)
    s.snapshot(0, cpus=2)
    s.node(0, cpu=2)
    s.transition(1.0, CPU, 1, OFF)
    s.snapshot(1.0625, cpus=1)
    # No tick ran; a matching Node update arriving after the deadline must not resync it.
    updates = s.node(70.0, cpu=1)
    assert [u.episode.outcome for u in updates if u.kind is UpdateKind.ENDED] == \
        [Outcome.RESYNC_TIMEOUT]
    assert updates[-1].episode.ended == T0 + 61.0
    assert s.stats.resync_duration[DOWN].n == 0


def test_kubelet_settles_on_a_wrong_value_is_a_mismatch():
    s = Stream(kubernetes=True, readmission_settle=10.0)
    s.snapshot(0, cpus=2)
    s.node(0, cpu=2)
    s.transition(1.0, CPU, 2, ON)
    s.transition(1.25, CPU, 3, ON)
    s.snapshot(1.5, cpus=4)
    s.tick(3.25)
    s.node(20.0, cpu=3)  # the kubelet moved, but not to the kernel's 4
    assert s.tick(29.5) == []
    [ended] = s.tick(30.0)
    ep = ended.episode
    assert ep.outcome is Outcome.MISMATCH and ep.ended == T0 + 30.0
    assert ep.kubelet_after == 3 and ep.kernel_after == 4
    assert s.stats.resync_errors == {(CPU, "mismatch"): 1}
    assert s.stats.resync_requests == {CPU: 1}
    assert s.view.drift() == {CPU: 1.0, MEM: 0.0}


def test_mismatch_that_is_corrected_in_time_converges():
    s = Stream(kubernetes=True, readmission_settle=10.0)
    s.snapshot(0, cpus=2)
    s.node(0, cpu=2)
    s.transition(1.0, CPU, 2, ON)
    s.snapshot(1.5, cpus=3)
    s.node(20.0, cpu=4)
    s.node(25.0, cpu=3)
    [ep] = s.ended()
    assert ep.outcome is Outcome.CONVERGED and ep.resync_seconds == 24.0
    assert s.stats.resync_errors == {}


def test_mismatch_pending_at_the_deadline_is_a_mismatch():
    s = Stream(kubernetes=True, resync_deadline=60.0, readmission_settle=10.0)
    s.snapshot(0, cpus=2)
    s.node(0, cpu=2)
    s.transition(1.0, CPU, 1, OFF)
    s.snapshot(1.5, cpus=1)
    s.node(55.0, cpu=3)
    s.tick(100.0)
    [ep] = s.ended()
    assert ep.outcome is Outcome.MISMATCH and ep.ended == T0 + 61.0
    assert s.stats.unplug_errors == {(CPU, "mismatch"): 1}


def test_cpu_refused_by_cpuhp_is_kernel_failed():
    s = Stream(kubernetes=True)
    s.snapshot(0, cpus=2)
    s.node(0, cpu=2)
    s.transition(1.0, CPU, 1, OFF, result=Result.FAILED, failed_state="85 (ap:offline)",
                 error="ret=-16")
    s.snapshot(1.0625, cpus=2)
    [ended] = s.tick(3.0)
    ep = ended.episode
    assert ep.outcome is Outcome.KERNEL_FAILED and ep.ended == T0 + 1.0
    assert ep.detail == "cpu1 offline failed: cpuhp state 85 (ap:offline) ret=-16"
    assert s.stats.unplug_requests == {CPU: 1}
    assert s.stats.unplug_errors == {(CPU, "kernel_failed"): 1}
    assert s.stats.resync_duration[DOWN].n == 0


def test_memory_offline_refused_with_ebusy_is_kernel_failed():
    s = Stream(kubernetes=True)
    s.snapshot(0, mem=24 * GiB)
    s.node(0, mem=24 * GiB)
    for k, block in enumerate((150, 151, 152)):
        s.transition(1.0 + 0.25 * k, MEM, block, OFF, result=Result.FAILED, error="EBUSY")
    [ended] = s.tick(5.0)
    ep = ended.episode
    assert ep.outcome is Outcome.KERNEL_FAILED and len(ep.transitions) == 3
    assert ep.detail.startswith("memory block 150 offline failed: EBUSY")
    assert s.stats.unplug_requests == {MEM: 1}
    assert s.stats.unplug_errors == {(MEM, "kernel_failed"): 1}


def test_partial_failure_still_resyncs_to_what_the_kernel_did():
    s = Stream(kubernetes=True)
    s.snapshot(0, cpus=2)
    s.node(0, cpu=2)
    s.transition(1.0, CPU, 2, ON)
    s.transition(1.25, CPU, 3, ON, result=Result.FAILED, error="ret=-5")
    s.snapshot(1.5, cpus=3)
    s.tick(3.25)
    s.node(4.0, cpu=3)
    [ep] = s.ended()
    assert ep.outcome is Outcome.CONVERGED and ep.kernel_done == T0 + 1.0
    assert ep.resync_seconds == 3.0 and "1 of 2 transitions failed" in ep.detail
    assert s.stats.resync_errors == {}


def test_plug_then_unplug_before_resync_supersedes():
    s = Stream(kubernetes=True)
    s.snapshot(0, cpus=2)
    s.node(0, cpu=2)
    s.transition(1.0, CPU, 2, ON)
    s.snapshot(1.0625, cpus=3)
    s.tick(4.0)
    assert s.open_episodes()[0].phase is Phase.RESYNC
    s.transition(30.0, CPU, 2, OFF)
    s.snapshot(30.0625, cpus=2)
    [superseded] = s.ended()
    assert superseded.outcome is Outcome.SUPERSEDED and superseded.change is Change.INCREASE
    assert superseded.ended == T0 + 30.0 - 0.0078125
    assert s.stats.resync_requests == {CPU: 1}
    assert s.stats.unplug_requests == {CPU: 1}
    assert s.stats.resync_errors == {} and s.stats.unplug_errors == {}
    [down] = s.open_episodes()
    assert down.change is Change.DECREASE
    # The Node never moved, and the kernel is back where it was: the unplug is in sync at once.
    s.tick(33.0)
    assert s.open_episodes()[0].phase is Phase.READMISSION
    assert s.stats.resync_duration[DOWN].total == 0.0


def test_unplug_during_kernel_window_of_a_plug_joins_it_as_a_flap():
    s = Stream(kubernetes=True)
    s.snapshot(0, cpus=2)
    s.transition(1.0, CPU, 2, ON)
    s.transition(1.5, CPU, 2, OFF)
    assert s.ended() == [] and s.correlator.episodes_open() == 1
    [ep] = s.open_episodes()
    assert ep.flapping and (ep.online_transitions, ep.offline_transitions) == (1, 1)
    assert ep.change is Change.INCREASE  # what it opened with


def test_memory_within_tolerance_converges():
    s = Stream(kubernetes=True)
    s.snapshot(0, mem=24 * GiB)
    s.node(0, mem=24 * GiB)
    # virtio-mem style: 64 MiB added, under the 100 MiB jitter bound the kubelet is allowed.
    s.transition(1.0, MEM, 192, ON)
    s.snapshot(1.0625, mem=24 * GiB + 64 * MiB)
    s.tick(3.0)
    [ep] = s.ended()
    assert ep.outcome is Outcome.CONVERGED and ep.resync_seconds == 0.0
    assert s.stats.resync_duration[(MEM, Change.INCREASE)].n == 1
    assert s.view.drift() == {CPU: 0.0, MEM: 64.0 * MiB}
    assert s.view.drift_seconds() == {CPU: 0.0, MEM: 0.0}


def test_memory_outside_tolerance_does_not_converge():
    s = Stream(kubernetes=True, resync_deadline=600.0)
    s.snapshot(0, mem=24 * GiB)
    s.node(0, mem=24 * GiB)
    s.transition(1.0, MEM, 192, ON)
    s.snapshot(1.0625, mem=24 * GiB + BLOCK)  # 128 MiB > 100 MiB
    s.tick(3.0)
    assert s.ended() == [] and s.open_episodes()[0].phase is Phase.RESYNC
    s.node(100.0, mem=24 * GiB + 100 * MiB)  # inside tolerance of the kernel's value now
    [ep] = s.ended()
    assert ep.outcome is Outcome.CONVERGED and ep.resync_seconds == 99.0


def test_a_memory_timeout_says_its_bytes_in_binary_units():
    """The detail says memory as the Node does, never as a float ("2.59098e+10")."""
    s = Stream(kubernetes=True, resync_deadline=600.0)
    s.snapshot(0, mem=24 * GiB)
    s.node(0, mem=24 * GiB)
    s.transition(1.0, MEM, 192, ON)
    s.snapshot(1.0625, mem=24 * GiB + BLOCK)
    s.tick(601.0)
    [ep] = s.ended()
    assert ep.outcome is Outcome.RESYNC_TIMEOUT
    assert ep.detail == ("Node capacity memory 24 GiB did not reach the kernel's "
                                    "24704 MiB within 600 s")


def test_stale_snapshot_does_not_fake_a_resync():
    """Before the snapshot showing the new CPU arrives, kernel and Node agree on the old count."""
    s = Stream(kubernetes=True)
    s.snapshot(0, cpus=2)
    s.node(0, cpu=2)
    s.transition(1.0, CPU, 2, ON)
    s.tick(3.0)
    assert s.ended() == []
    s.snapshot(3.5, cpus=3)
    assert s.ended() == []
    s.node(5.0, cpu=3)
    assert s.ended()[0].resync_seconds == 4.0


def test_without_kubernetes_episodes_end_kernel_only():
    s = Stream(kubernetes=False)
    s.snapshot(0, cpus=2)
    s.transition(1.0, CPU, 1, OFF)
    s.snapshot(1.0625, cpus=1)
    [ended] = s.tick(3.0)
    ep = ended.episode
    assert ep.outcome is Outcome.KERNEL_ONLY and ep.ended == T0 + 1.0
    assert ep.kernel_before == 2 and ep.kernel_after == 1
    assert s.stats.unplug_requests == {CPU: 1}
    assert s.stats.unplug_errors == {}
    assert s.view.drift() == {} and s.view.kubelet_capacity() == {}
    assert s.view.effective() == {}


def test_resume_an_open_episode_then_complete_it():
    first = Stream(kubernetes=True)
    first.snapshot(0, cpus=2)
    first.node(0, cpu=2)
    first.transition(1.0, CPU, 2, ON)
    first.snapshot(1.0625, cpus=3)
    first.tick(4.0)
    [kept] = first.open_episodes()
    assert kept.phase is Phase.RESYNC

    # A restart: a new tracker, the journal's copy of the episode, fresh state from sources.
    second = Stream(kubernetes=True)
    second.at(50.0)
    second.resume([kept])
    assert [e.id for e in second.open_episodes()] == [kept.id]
    # Counted by the process that opened it, not again here.
    assert second.stats.resync_requests == {} and second.stats.episodes_open == 1
    second.snapshot(50.0, cpus=3)
    second.node(50.5, cpu=2)
    assert second.ended() == []
    second.node(80.0, cpu=3)  # the kubelet was restarted
    [ep] = second.ended()
    assert ep.id == kept.id and ep.outcome is Outcome.CONVERGED
    assert ep.resync_seconds == 80.0 - 1.0
    assert second.stats.resync_duration[UP].total == 79.0

    # Resuming an ended episode does nothing.
    third = Stream(kubernetes=True)
    third.resume([ep])
    assert third.open_episodes() == [] and third.stats.resync_requests == {}


def test_resumed_episode_past_its_deadline_times_out_at_the_deadline():
    first = Stream(kubernetes=True, resync_deadline=60.0)
    first.snapshot(0, cpus=2)
    first.node(0, cpu=2)
    first.transition(1.0, CPU, 1, OFF)
    first.snapshot(1.0625, cpus=1)
    first.tick(4.0)
    [kept] = first.open_episodes()
    second = Stream(kubernetes=True, resync_deadline=60.0)
    second.at(500.0)
    second.resume([kept])
    second.snapshot(500.0, cpus=1)
    second.node(500.0, cpu=2)  # first Node seen after the restart: still the stale value
    [ep] = second.ended()
    assert ep.outcome is Outcome.RESYNC_TIMEOUT and ep.ended == T0 + 61.0
    assert second.stats.unplug_errors == {(CPU, "resync_timeout"): 1}


def test_replay_gives_the_same_episodes():
    def run() -> list:
        s = Stream(kubernetes=True)
        s.snapshot(0, cpus=2)
        s.node(0, cpu=2)
        plug_eight_cpus(s)
        s.tick(5.0)
        s.transition(6.0, CPU, 9, OFF)
        s.tick(700.0)
        return [(u.kind, u.episode.id, u.episode.outcome, u.time) for u in s.updates]

    assert run() == run()


def test_updates_carry_copies():
    s = Stream(kubernetes=True)
    s.snapshot(0, cpus=2)
    [opened] = s.transition(1.0, CPU, 2, ON)
    s.transition(1.25, CPU, 3, ON)
    assert len(opened.episode.transitions) == 1
    assert len(s.open_episodes()[0].transitions) == 2
    s.open_episodes()[0].transitions.clear()
    assert len(s.open_episodes()[0].transitions) == 2


def test_other_events_are_ignored_and_bad_timestamps_counted():
    from exporter.events import SourceStatus, Transition
    s = Stream(kubernetes=True)
    assert s.feed(0, SourceStatus(source="bpf", up=True, time=T0)) == []
    assert s.feed(0, Transition(source="bpf", resource=CPU, unit=1, direction=OFF,
                                result=Result.SUCCESS, end=float("nan"))) == []
    assert s.correlator.malformed_events == 1
    assert s.correlator.episodes_open() == 0


def test_a_flap_within_one_microsecond_gets_distinct_ids():
    s = Stream(kubernetes=False, coalesce_window=0.0)  # no window: no flap joins, supersedes
    for direction in (ON, OFF, ON):
        s.transition(1.0, CPU, 2, direction, duration=0.0)
    ids = [u.episode.id for u in s.updates if u.kind is UpdateKind.OPENED]
    assert len(ids) == 3 and len(set(ids)) == 3
    assert ids[2] == ids[0] + "-2"



def test_a_refused_opposite_transition_does_not_supersede():
    st = Stream(kubernetes=True)
    st.snapshot(0, cpus=2)
    st.node(0.25, cpu=2)
    st.transition(1, Resource.CPU, 1, Direction.OFFLINE)
    st.snapshot(1.125, cpus=1)
    st.transition(4, Resource.CPU, 1, Direction.ONLINE, Result.FAILED, error="EAGAIN")
    st.tick(8)
    assert {ep.change.value: ep.outcome for ep in st.ended()} == {
        "increase": Outcome.KERNEL_FAILED}  # the unplug is not superseded: still waiting
    assert [ep.change.value for ep in st.open_episodes()] == ["decrease"]
