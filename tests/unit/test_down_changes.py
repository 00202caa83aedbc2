"""What the kernel changed while no exporter ran: the journal's last state, by kernel time."""
from __future__ import annotations

from exporter.correlate.down_changes import changes_while_down, state_at_stop
from exporter.events import Direction, KernelSnapshot, Resource, Result, Transition

T0 = 1_795_000_000.0


def snap(t: float, cpus: set[int]) -> KernelSnapshot:
    return KernelSnapshot(t, frozenset(cpus), frozenset({0, 1} - cpus), frozenset({0, 1}),
                          frozenset({0, 1}), 128 << 20, frozenset({0}), frozenset(), 1 << 30, 0)


def cpu1(direction: Direction, end: float, source: str = "bpf") -> Transition:
    return Transition(source, Resource.CPU, 1, direction, Result.SUCCESS, end=end)


def test_a_late_duplicate_does_not_flip_the_replayed_state():
    """A flap storm's last cycle: cpu1 offline at +1, online at +2 (uevent first), then the
    BPF batch of the earlier offline arrives last. In arrival order cpu1 would end offline,
    and a restart finding it online would count an online that never happened while down."""
    arrived = [snap(T0, {0, 1}), cpu1(Direction.OFFLINE, T0 + 1, "uevent"),
               cpu1(Direction.ONLINE, T0 + 2, "uevent"), cpu1(Direction.OFFLINE, T0 + 1)]
    before = state_at_stop(arrived)
    assert before is not None and before.cpus_online == {0, 1}
    assert changes_while_down(before, snap(T0 + 10, {0, 1})) == {}


def test_a_snapshot_newer_than_a_transition_wins():
    """A transition that ended before the newest snapshot is already in it, whatever order
    they were journaled in; the newest snapshot counts even when journaled before an older."""
    events = [snap(T0 + 5, {0}), cpu1(Direction.ONLINE, T0 + 3), snap(T0 + 1, {0, 1})]
    before = state_at_stop(events)
    assert before is not None and before.cpus_online == {0}
    assert changes_while_down(before, snap(T0 + 10, {0, 1})) == {
        (Resource.CPU, Direction.ONLINE): 1}


def test_transitions_after_the_snapshot_apply_in_kernel_order():
    events = [snap(T0, {0, 1}), cpu1(Direction.ONLINE, T0 + 4), cpu1(Direction.OFFLINE, T0 + 3)]
    before = state_at_stop(events)
    assert before is not None and before.cpus_online == {0, 1}
    assert state_at_stop([cpu1(Direction.OFFLINE, T0)]) is None  # no snapshot: nothing known


def test_a_snapshot_naming_units_the_host_lacks_is_bounded_by_the_host():
    """L8 (issue 36): a journal whose snapshot names 8,192 CPUs and 65,536 memory blocks, on a
    host with 2 CPUs and 1 block: only the host's units are compared (before, 8,190 CPU and
    65,535 memory down-changes were counted): blocks gone from sysfs count as many as the
    host has at most. A real change on the host still counts."""
    forged = KernelSnapshot(T0, frozenset(range(8192)), frozenset(), frozenset(range(8192)),
                            frozenset(range(8192)), 128 << 20, frozenset(range(65536)),
                            frozenset(), 1 << 30, 0)
    before = state_at_stop([forged])
    assert changes_while_down(before, snap(T0 + 10, {0, 1})) == {
        (Resource.MEMORY, Direction.OFFLINE): 1}
    assert changes_while_down(before, snap(T0 + 10, {0})) == {
        (Resource.CPU, Direction.OFFLINE): 1, (Resource.MEMORY, Direction.OFFLINE): 1}
