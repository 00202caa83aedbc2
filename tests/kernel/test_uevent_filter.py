"""The uevent source's socket filter. The kernel drops uevents for devices the source
ignores (cpuid, msr, nodes...) before they wake its thread; CPU and memory-block uevents, and
anything that is not a kernel header at all, still arrive."""
from __future__ import annotations

import select
import socket

import pytest

from exporter.clock import MonotonicWallClock
from exporter.events import MalformedInput, Transition
from exporter.sources.kernel import uevent_filter as _uevent_filter
from exporter.sources.kernel.uevent import KERNEL_GROUP, NETLINK_KOBJECT_UEVENT, UeventSource
from testkit.event_log import EventLog

WATCHED = (b"/devices/system/cpu/", b"/devices/system/memory/")


def listener(filtered: bool, cpu_transitions: bool = True) -> socket.socket:
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_KOBJECT_UEVENT)
    s.bind((0, KERNEL_GROUP))
    if filtered:
        _uevent_filter.attach(s, cpu_transitions)
    return s


def drain(s: socket.socket, quiet: float = 0.5, sent_by_us: bool = False) -> list[bytes]:
    """Every datagram until none came for `quiet` seconds (only user space's: sent_by_us)."""
    got = []
    while select.select([s], [], [], quiet)[0]:
        data, (port, _groups) = s.recvfrom(65536)
        if port != 0 or not sent_by_us:  # the kernel's own, from other work on the machine
            got.append(data)
    return got


def send(*datagrams: bytes) -> None:
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_KOBJECT_UEVENT) as u:
        u.bind((0, 0))
        for d in datagrams:
            u.sendto(d, (0, KERNEL_GROUP))


def header(datagram: bytes) -> bytes:
    return datagram.split(b"\0", 1)[0]


def watched(datagram: bytes) -> bool:
    return any(p in header(datagram) for p in WATCHED)


OTHERS = [b"add@/devices/virtual/cpuid/cpu1\0ACTION=add\0SEQNUM=1\0",
          b"remove@/devices/virtual/msr/msr1\0ACTION=remove\0",
          b"add@/devices/system/node/node1\0ACTION=add\0",
          b"change@/devices/virtual/net/lo\0ACTION=change\0",
          b"bind@/devices/pci0000:00/0000:00:01.0\0ACTION=bind\0"]
OURS = [b"offline@/devices/system/cpu/cpu1\0ACTION=offline\0",
        b"online@/devices/system/memory/memory7\0ACTION=online\0",
        b"add@/devices/system/memory/memory9\0ACTION=add\0",
        b"remove@/devices/system/cpu/cpu3\0ACTION=remove\0",
        b"move@/devices/system/cpu/cpu2\0ACTION=move\0",
        b"unbind@/devices/system/memory/memory1\0ACTION=unbind\0",
        b"change@/devices/system/cpu/cpu1\0ACTION=change\0"]
NOT_A_HEADER = [b"junk", b"x" * 200, b"no at sign anywhere in this long enough line\0A=b\0",
                b"toolongaction@/devices/virtual/cpuid/cpu1\0"]


def test_the_filter_drops_other_devices_and_passes_ours_and_garbage():
    with listener(True) as filtered, listener(False) as plain:
        send(*OTHERS, *OURS, *NOT_A_HEADER)
        everything = drain(plain, sent_by_us=True)
        passed = drain(filtered, sent_by_us=True)
    assert everything == OTHERS + OURS + NOT_A_HEADER  # all were sent and delivered unfiltered
    assert passed == OURS + NOT_A_HEADER


CPU_TRANSITIONS = [b"offline@/devices/system/cpu/cpu1\0ACTION=offline\0",
                   b"online@/devices/system/cpu/cpu12\0ACTION=online\0"]


def test_left_to_bpf_cpu_transitions_are_dropped_and_the_rest_still_passes():
    with listener(True, cpu_transitions=False) as filtered:
        send(*OTHERS, *CPU_TRANSITIONS, *OURS, *NOT_A_HEADER)
        passed = drain(filtered, sent_by_us=True)
    # OURS minus its CPU offline: CPU remove/move/change and every memory uevent still come.
    assert passed == [d for d in OURS if not d.startswith(b"offline@/devices/system/cpu/")] \
        + NOT_A_HEADER


@pytest.mark.kernel
def test_a_running_exporter_with_bpf_is_not_woken_by_cpu_uevents(cpu1):
    """With the cpuhp programs attached, a cpu1 flap is counted once, from BPF, and the uevent
    source delivers nothing for it (its socket filter drops the CPU's online and offline)."""
    from testkit.exporter_proc import RunningExporter
    with RunningExporter("--kubernetes", "off") as exp:
        first = exp.wait_for(lambda s: s.value("node_resize_exporter_bpf_program_attached",
                                               program="cpuhp_exit") == 1
                             and s.value("node_resize_exporter_source_up", source="uevent") == 1)
        uevents = first.value("node_resize_exporter_events_total", source="uevent")
        cpu1.set_online(False)
        cpu1.set_online(True)
        # A fence: netlink keeps order, so once the source counted this garbage, it had
        # read the kernel's uevents of the flap (written before each write returned).
        send(b"junk")
        s = exp.wait_for(lambda s: s.total("node_resize_kernel_transitions_total",
                                           resource="cpu") == 2
                         and s.value("node_resize_exporter_malformed_total", 0,
                                     source="uevent") == 1)
        assert s.value("node_resize_exporter_events_total", source="uevent") - uevents <= 1
        assert "CPU online/offline uevents left to the BPF source" in exp.logs()


@pytest.mark.kernel
def test_a_real_cpu1_flap_reaches_the_filtered_socket_without_the_other_devices(cpu1):
    with listener(True) as filtered, listener(False) as plain:
        cpu1.set_online(False)
        cpu1.set_online(True)
        everything = drain(plain)
        passed = drain(filtered)
    mine = [header(d) for d in everything if watched(d)]
    assert [header(d) for d in passed] == mine
    assert b"offline@/devices/system/cpu/cpu1" in mine
    assert b"online@/devices/system/cpu/cpu1" in mine


@pytest.mark.kernel
def test_the_source_still_counts_garbage_and_forged_cpu_uevents(cpu1):
    log = EventLog()
    src = UeventSource(MonotonicWallClock())
    src.open()
    src.start(log.emit)
    try:
        send(b"junk", *OTHERS, b"offline@/devices/system/cpu/cpu1\0ACTION=offline\0")
        log.wait_for(MalformedInput, count=2)
        cpu1.set_online(False)
        cpu1.set_online(True)
        log.wait_for(Transition, lambda t: t.direction.value == "online")
    finally:
        src.stop()
    details = [m.detail for m in log.of(MalformedInput)]
    assert len(details) == 2 and all("from user space" in d for d in details)
    assert [(t.unit, t.direction.value) for t in log.of(Transition)] == [(1, "offline"),
                                                                         (1, "online")]
