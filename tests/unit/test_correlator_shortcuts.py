"""The correlator's shortcuts for events that change little (for replay speed) keep
every value a full recomputation gives: a kernel-phase episode's kernel_after read when it goes
out rather than rewritten on every snapshot, an ended episode handed out uncopied, drift
bookkeeping skipped when neither side's capacity moved, resync bookkeeping skipped while no
episode waits for one."""
from __future__ import annotations

import copy

from exporter.correlate.model import Outcome, Phase, UpdateKind
from exporter.events import Direction, KernelSnapshot, NodeStatus, Resource
from testkit.correlator_stream import BLOCK, T0, GiB, Stream

CPU, MEM, SWAP = Resource.CPU, Resource.MEMORY, Resource.SWAP
ON, OFF = Direction.ONLINE, Direction.OFFLINE


def test_a_kernel_phase_episode_shows_the_latest_snapshot_whenever_it_goes_out():
    s = Stream(kubernetes=True, coalesce_window=2.0)
    s.node(0, cpu=4)
    s.snapshot(0.5, cpus=4)
    [opened] = s.transition(1.0, CPU, 3, OFF)
    assert opened.episode.kernel_before == 4 and opened.episode.kernel_after == 4
    s.snapshot(1.125, cpus=3)
    assert s.open_episodes()[0].kernel_after == 3
    [joined] = s.transition(1.25, CPU, 2, OFF)
    assert joined.kind is UpdateKind.TRANSITION and joined.episode.kernel_after == 3
    s.snapshot(1.375, cpus=2)
    s.snapshot(1.5, cpus=2)
    # A pod rejected while the kernel phase is still open: its update shows the latest value.
    [pod] = s.pod(1.625, "a", phase="Failed", reason="OutOfcpu", ready=False)
    assert pod.kind is UpdateKind.POD and pod.episode.kernel_after == 2
    s.snapshot(1.75, cpus=1)  # (a third CPU went, say, by another path)
    assert s.open_episodes()[0].kernel_after == 1
    s.snapshot(1.875, cpus=2)  # and came back; nothing looks at the episode in between
    # An opposite change in its kernel phase joins it (a flap): the update has the snapshot
    # of that moment.
    [flapped] = s.transition(2.0, CPU, 2, ON)
    assert flapped.kind is UpdateKind.TRANSITION and flapped.episode.flapping
    assert flapped.episode.kernel_after == 2
    # The updates handed out before keep the values of their own moments.
    assert [opened.episode.kernel_after, joined.episode.kernel_after,
            pod.episode.kernel_after] == [4, 3, 2]


def test_the_kernel_phase_closes_on_the_snapshot_it_ends_with_then_waits_for_a_later_one():
    s = Stream(kubernetes=True, coalesce_window=0.5)
    s.node(0, cpu=2)
    s.snapshot(0.25, cpus=2)
    s.transition(1.0, CPU, 2, ON)
    s.snapshot(1.125, cpus=3)
    s.snapshot(1.25, cpus=3)
    # The window closes at 1.5: kernel_done 1.0, and the latest snapshot (1.25) was taken after
    # it, so kernel_after is final.
    kernel_done = [u for u in s.tick(1.75) if u.kind is UpdateKind.KERNEL_DONE]
    assert kernel_done and kernel_done[0].episode.kernel_after == 3
    s.snapshot(2.0, cpus=5)  # later snapshots no longer move it
    assert s.open_episodes()[0].kernel_after == 3


def test_a_snapshot_taken_before_the_kernel_was_done_does_not_date_a_waiting_episode():
    s = Stream(kubernetes=True, coalesce_window=0.5)
    s.node(0, cpu=2)
    s.transition(1.0, CPU, 2, ON)  # no snapshot yet: kernel_after unknown
    s.tick(1.75)
    [ep] = s.open_episodes()
    assert ep.phase is Phase.RESYNC and ep.kernel_after is None
    # Delivered now, stamped before kernel_done (a slow reader): not the result.
    late = frozenset(range(2))
    s.push(KernelSnapshot(time=T0 + 0.75, cpus_online=late, cpus_offline=frozenset(),
                          cpus_present=late, cpus_possible=late, memory_block_size=BLOCK,
                          memory_blocks_online=frozenset(range(192)),
                          memory_blocks_offline=frozenset(), mem_total_bytes=24 * GiB,
                          swap_total_bytes=0))
    assert s.open_episodes()[0].kernel_after is None
    s.snapshot(2.0, cpus=3)
    assert s.open_episodes()[0].kernel_after == 3


def test_an_ended_episode_is_not_touched_after_it_goes_out():
    s = Stream(kubernetes=True, coalesce_window=0.5, resync_deadline=5.0)
    s.node(0, cpu=2)
    s.snapshot(0.25, cpus=2)
    s.transition(1.0, CPU, 2, ON)
    s.snapshot(1.25, cpus=3)
    [ended] = [u for u in s.tick(10.0) if u.kind is UpdateKind.ENDED]
    assert ended.episode.outcome is Outcome.RESYNC_TIMEOUT
    kept = copy.deepcopy(ended.episode)
    # Everything else that can happen next: new episodes of the same kind and the opposite
    # one, snapshots, a resync, pods, deadlines.
    s.transition(10.25, CPU, 2, OFF)
    s.transition(10.5, CPU, 2, ON)
    s.snapshot(10.75, cpus=3)
    s.node(11.0, cpu=3)
    s.pod(11.25, "a", phase="Failed", reason="OutOfcpu", ready=False)
    s.tick(100.0)
    assert ended.episode == kept


def drift_since(s: Stream) -> dict[Resource, float]:
    return {r: round(s.clock.now() - T0 - seconds, 6)
            for r, seconds in s.view.drift_seconds().items() if seconds}


def test_drift_is_dated_from_when_the_sides_came_apart_however_often_they_repeat_it():
    s = Stream(kubernetes=True)
    s.node(1.0, cpu=2)
    s.snapshot(1.0, cpus=2)
    assert drift_since(s) == {}
    s.snapshot(2.0, cpus=3)  # the kernel moved
    for offset in (3.0, 4.0, 5.0):
        s.snapshot(offset, cpus=3)  # the same values again
        s.node(offset, cpu=2)  # a heartbeat: a new object, the same capacity
    s.at(6.0)
    assert drift_since(s) == {CPU: 2.0}
    s.node(7.0, cpu=3)  # the Node caught up
    s.at(8.0)
    assert drift_since(s) == {}
    s.snapshot(9.0, cpus=2)  # apart again: dated anew
    s.snapshot(10.0, cpus=2)
    s.at(11.0)
    assert drift_since(s) == {CPU: 9.0}


def test_drift_follows_swap_and_hugepages_when_only_they_change():
    s = Stream(kubernetes=True)
    capacity = {CPU: 2.0, MEM: 24.0 * GiB, SWAP: 2.0 * GiB, Resource.HUGEPAGES_2MI: 1.0 * GiB}

    def snap(offset: float, swap: int, huge: int) -> None:
        cpus = frozenset(range(2))
        s.feed(offset, KernelSnapshot(
            time=T0 + offset, cpus_online=cpus, cpus_offline=frozenset(), cpus_present=cpus,
            cpus_possible=cpus, memory_block_size=BLOCK,
            memory_blocks_online=frozenset(range(192)), memory_blocks_offline=frozenset(),
            mem_total_bytes=24 * GiB, swap_total_bytes=swap,
            hugepages_bytes={Resource.HUGEPAGES_2MI: huge}))

    s.feed(1.0, NodeStatus(T0 + 1.0, "n1", capacity, capacity))
    snap(1.0, 2 * GiB, 1 * GiB)
    assert drift_since(s) == {}
    snap(2.0, 0, 1 * GiB)  # swapoff: only the swap total moved
    s.at(3.0)
    assert drift_since(s) == {SWAP: 2.0}
    snap(4.0, 0, 0)  # hugepages released
    s.at(5.0)
    assert drift_since(s) == {SWAP: 2.0, Resource.HUGEPAGES_2MI: 4.0}
    snap(6.0, 2 * GiB, 1 * GiB)
    assert drift_since(s) == {}


def test_a_resync_after_a_stretch_with_nothing_waiting_is_still_seen():
    # While no episode waits, snapshots and Node updates skip the resync bookkeeping; the
    # first episode to wait afterwards must still resync on the very next agreeing update.
    s = Stream(kubernetes=True, coalesce_window=0.5)
    s.node(0, cpu=2)
    s.snapshot(0.25, cpus=2)
    for offset in (1.0, 2.0, 3.0):
        s.snapshot(offset, cpus=2)
        s.node(offset, cpu=2)
    s.transition(4.0, CPU, 2, ON)
    s.snapshot(4.25, cpus=3)
    s.tick(5.0)  # kernel phase closed: waiting
    s.node(5.25, cpu=2)  # the same old value: no resync
    assert s.correlator.episodes_open() == 1
    [resynced, ended] = s.node(5.5, cpu=3)
    assert resynced.kind is UpdateKind.RESYNCED and resynced.episode.resynced == T0 + 5.5
    assert ended.episode.outcome is Outcome.CONVERGED
