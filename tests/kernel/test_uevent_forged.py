"""Forged uevents. A process with CAP_NET_ADMIN (root here) can send to the
kernel's uevent multicast group, and root can make the kernel send a synthetic uevent by writing
to a device's `uevent` file. Neither is a transition; a real cpu1 flap still is."""
from __future__ import annotations

from pathlib import Path

import pytest

from exporter.clock import MonotonicWallClock
from exporter.events import MalformedInput, Transition
from exporter.sources.kernel.uevent import UeventSource
from testkit.event_log import EventLog
from testkit.uevent import send_forged

CPU1 = Path("/sys/devices/system/cpu/cpu1")


def forged_offline(seqnum: int) -> bytes:
    return b"\0".join([b"offline@/devices/system/cpu/cpu1", b"ACTION=offline",
                       b"DEVPATH=/devices/system/cpu/cpu1", b"SUBSYSTEM=cpu",
                       b"SEQNUM=%d" % seqnum, b""])




@pytest.fixture
def source():
    log = EventLog()
    src = UeventSource(MonotonicWallClock())
    src.open()
    src.start(log.emit)
    yield src, log
    src.stop()


@pytest.mark.kernel
def test_forged_offline_from_user_space_is_not_counted(cpu1, source):
    src, log = source
    send_forged(100)
    log.wait_for(MalformedInput, count=100)
    assert all("from user space (netlink port" in m.detail for m in log.of(MalformedInput))
    assert log.of(Transition) == []
    assert (CPU1 / "online").read_text().strip() == "1"  # it never went offline
    cpu1.set_online(False)  # a real one still counts, confirmed by sysfs
    cpu1.set_online(True)
    log.wait_for(Transition, lambda t: t.unit == 1 and t.direction.value == "online")
    assert [(t.unit, t.direction.value) for t in log.of(Transition)] == [(1, "offline"),
                                                                         (1, "online")]


@pytest.mark.kernel
def test_synthetic_uevent_from_the_kernel_is_not_a_transition(cpu1, source):
    """`echo offline > /sys/devices/system/cpu/cpu1/uevent`: the kernel itself sends it (port
    0), marked SYNTH_UUID; cpu1 stays online."""
    src, log = source
    (CPU1 / "uevent").write_text("offline")
    bad = log.wait_for(MalformedInput)
    assert "synthetic uevent offline@/devices/system/cpu/cpu1" in bad.detail
    assert log.of(Transition) == []
    assert (CPU1 / "online").read_text().strip() == "1"


def _online(seqnum: int) -> bytes:
    return forged_offline(seqnum).replace(b"offline", b"online")


def test_a_kernel_transition_sysfs_contradicts_counts_only_as_half_of_a_flap(tmp_path):
    """The cross-check, on a sysfs tree where cpu1 is online. An "offline" from the kernel is
    held; the kernel's next uevent for cpu1 decides: the opposite one with a later SEQNUM means
    a flap faster than our read (both count), anything else means it was stale (skipped)."""
    cpu = tmp_path / "devices/system/cpu/cpu1"
    cpu.mkdir(parents=True)
    (cpu / "online").write_text("1\n")
    log = EventLog()
    src = UeventSource(MonotonicWallClock(), sysfs_root=str(tmp_path))

    src.handle(forged_offline(10), log.emit, sender=0)
    assert log.events == [] and src.held == 1 and src.unconfirmed == 0
    src.handle(_online(11), log.emit, sender=0)  # the flap completes: both are real
    assert [t.direction.value for t in log.of(Transition)] == ["offline", "online"]
    assert src.held == 0 and src.unconfirmed == 0

    log = EventLog()
    src.handle(forged_offline(20), log.emit, sender=0)
    src.handle(forged_offline(21), log.emit, sender=0)  # no explanation: the first was stale
    assert log.events == [] and src.unconfirmed == 1 and src.held == 1
    src.handle(_online(5), log.emit, sender=0)  # an older SEQNUM explains nothing
    assert [t.direction.value for t in log.of(Transition)] == ["online"]
    assert src.unconfirmed == 2 and src.held == 0
