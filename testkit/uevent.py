"""Forged uevents sent to the kernel's uevent multicast group."""
from __future__ import annotations

import socket

from exporter.sources.kernel.uevent import KERNEL_GROUP, NETLINK_KOBJECT_UEVENT


def forged_offline(seqnum: int) -> bytes:
    return b"\0".join([b"offline@/devices/system/cpu/cpu1", b"ACTION=offline",
                       b"DEVPATH=/devices/system/cpu/cpu1", b"SUBSYSTEM=cpu",
                       b"SEQNUM=%d" % seqnum, b""])



def send_forged(count: int) -> None:
    """From user space, to the group the kernel broadcasts uevents on."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_KOBJECT_UEVENT) as s:
        s.bind((0, 0))
        for i in range(count):
            s.sendto(forged_offline(900_000 + i), (0, KERNEL_GROUP))
