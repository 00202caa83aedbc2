"""Kernel uevents (NETLINK_KOBJECT_UEVENT): online/offline/add/remove of CPUs and memory blocks.

The kernel broadcasts `offline@/devices/system/cpu/cpu1` and friends to multicast group 1 after
a transition completed. Works on every kernel and needs no BPF, but knows nothing of durations
or refusals (a refused offline sends no uevent at all).

Anyone with CAP_NET_ADMIN can send to that group too, and root can make the kernel itself send
a synthetic uevent by writing to a device's `uevent` file. So, as udev does, a datagram counts
only when its sender is the kernel (netlink port id 0), and not when it is synthetic (the kernel
marks those with SYNTH_UUID); both are MalformedInput. A CPU or memory-block transition is also
checked against sysfs before it counts. One the kernel's state contradicts (cpu1 "offline"
while cpu1/online reads 1) is held: if the kernel's next uevent for that unit is the opposite
one, with a later SEQNUM (the kernel's own global counter), the pair was a flap faster than our
read and both count; otherwise the held one is skipped (`unconfirmed`, logged at debug). The
sysfs reconciler puts the gauges right either way.
"""
from __future__ import annotations

import errno
import os
import re
import socket
from dataclasses import dataclass

from exporter.clock import Clock
from exporter.config.options import SYSFS_ROOT
from exporter.events import (
    DeviceChange,
    Direction,
    EventsLost,
    MalformedInput,
    Resource,
    Result,
    SourceStatus,
    Transition,
)
from exporter.sources.base import Emit, Source, SourceUnavailable
from exporter.sources.kernel import uevent_filter as _uevent_filter
from exporter.sources.registry import KERNEL, SourceSpec, register
from exporter.sources.wake import Waker
from exporter.untrusted import read_text

NETLINK_KOBJECT_UEVENT = 15
KERNEL_GROUP = 1  # group 2 is udev's re-broadcast; the kernel's own is the truth
RCVBUF = 4 * 1024 * 1024
IDLE_WAIT_SECONDS = 3600.0  # no timer is needed: a uevent or stop() wakes the loop
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)  # Linux; Python does not export it

MAX_HELD = 4096  # contradicted transitions waiting for their explanation, one per unit at most
_DEVPATH = re.compile(r"^/devices/system/(cpu|memory)/(cpu|memory)(\d+)$", re.ASCII)


@dataclass(frozen=True)
class Uevent:
    action: str
    devpath: str
    env: dict[str, str]


# Why not pyudev: tried on this host, pyudev 0.24.5's
# Monitor.from_netlink(Context(), source="kernel") works without udevd (no /run/udev) and takes
# kernel-group messages only; libudev even drops one sent from user space (sender port id not 0).
# It is not used because libudev drops every message it rejects (forged, malformed, wrong
# credentials) inside its C receive path with no count or reason we can see, while this
# project's rule is that hostile input is counted (`_malformed_total`) and the uevent source's
# hardening must report what it refused; and the bytes -> event step must stay
# a pure function the unit and fuzz tests feed datagrams to (tests/unit/test_fuzz_parsers.py). It
# would also add libudev1, a C library loaded through ctypes, to the image, for a wire format
# (lib/kobject_uevent.c: a header, then NUL-separated KEY=VALUE) that takes 20 lines here.
def parse_uevent(datagram: bytes) -> Uevent:
    """`action@devpath\\0KEY=VALUE\\0...` -> Uevent. Raises ValueError when malformed."""
    parts = datagram.split(b"\0")
    header = parts[0].decode("utf-8", "strict")
    if "@" not in header:
        raise ValueError(f"no action@devpath header: {header[:80]!r}")
    action, devpath = header.split("@", 1)
    env = {}
    for raw in parts[1:]:
        if not raw:
            continue
        key, sep, value = raw.decode("utf-8", "replace").partition("=")
        if sep:
            env[key] = value
    action = env.get("ACTION", action)
    devpath = env.get("DEVPATH", devpath)
    if not action or not devpath:
        raise ValueError("empty ACTION or DEVPATH")
    return Uevent(action, devpath, env)


def to_event(ev: Uevent, now: float) -> Transition | DeviceChange | None:
    """A CPU or memory-block uevent as a typed event; None for every other device."""
    m = _DEVPATH.match(ev.devpath)
    if not m or m.group(1) != m.group(2):
        return None
    resource = Resource.CPU if m.group(1) == "cpu" else Resource.MEMORY
    unit = int(m.group(3))
    if ev.action in ("online", "offline"):
        return Transition("uevent", resource, unit, Direction(ev.action), Result.SUCCESS, end=now)
    if ev.action in ("add", "remove"):
        return DeviceChange("uevent", resource, unit, ev.action, now)
    return None


class UeventSource(Source):
    name = "uevent"

    def __init__(self, clock: Clock, sysfs_root: str = "/sys"):
        super().__init__(clock)
        self.sock: socket.socket | None = None
        self.sysfs_root = sysfs_root
        self.unconfirmed = 0  # kernel transitions sysfs contradicted (skipped)
        # (resource, unit) -> (SEQNUM, transition) that sysfs contradicted when it arrived
        self._held: dict[tuple[Resource, int], tuple[int, Transition]] = {}
        self._waker: Waker | None = None  # Sleep until a uevent or stop(), no timer

    def leave_cpu_transitions(self) -> bool:
        """Stop being woken for CPU online/offline uevents: another source (BPF, its cpuhp
        programs attached) reports every CPU transition, so each of these would be a second copy
        that the ledger then drops, delivered in the online window where a wake-up costs most
        (bench/README.md, "Per-transition CPU"). CPU add/remove and memory blocks still come.
        False when the kernel refuses the filter (every uevent still comes)."""
        if self.sock is None:
            return False
        try:
            _uevent_filter.attach(self.sock, cpu_transitions=False)
        except OSError as e:
            self.log.info("uevent socket filter refused (%s): CPU uevents still wake it", e)
            return False
        self.log.info("CPU online/offline uevents left to the BPF source")
        return True

    def open(self) -> None:
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_KOBJECT_UEVENT)
        except OSError as e:
            raise SourceUnavailable(f"cannot open a NETLINK_KOBJECT_UEVENT socket: {e}",
                                    "run on Linux with netlink available (not in a gVisor "
                                    "sandbox); use --source sysfs otherwise") from e
        try:
            try:  # root may exceed rmem_max; a hotplug burst of 200 blocks must fit
                sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF)
            except OSError:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
            sock.bind((0, KERNEL_GROUP))
        except OSError as e:
            sock.close()
            raise SourceUnavailable(f"cannot join the kernel uevent group: {e}",
                                    "run in the host network namespace (hostNetwork: true); "
                                    "uevents are not delivered into other namespaces") from e
        try:  # Not woken for devices we ignore (cpuid, msr: in the online window)
            _uevent_filter.attach(sock)
        except OSError as e:  # a sandbox without socket filters: we still see every uevent
            self.log.info("uevent socket filter refused (%s): waking for every device", e)
        self.sock = sock
        self._waker = Waker()

    def loop(self, emit: Emit) -> None:
        assert self.sock is not None and self._waker is not None
        emit(SourceStatus(self.name, True, self.clock.now()))
        self._waker.watch(self.sock.fileno())
        while not self.stopping.is_set():
            _poked, ready = self._waker.wait(IDLE_WAIT_SECONDS)
            if not ready:
                continue
            try:
                data, (port, _groups) = self.sock.recvfrom(65536)
            except OSError as e:
                if e.errno == errno.ENOBUFS:  # the kernel dropped datagrams: we lost events
                    emit(EventsLost(self.name, 1, self.clock.now()))
                    continue
                raise
            self.handle(data, emit, sender=port)

    def handle(self, data: bytes, emit: Emit, sender: int = 0) -> None:
        now = self.clock.now()
        if sender != 0:
            emit(MalformedInput(self.name, f"uevent from user space (netlink port {sender}), "
                                           "not the kernel: ignored", now))
            return
        try:
            ev = parse_uevent(data)
        except (ValueError, UnicodeDecodeError) as e:
            emit(MalformedInput(self.name, str(e), now))
            return
        event = to_event(ev, now)
        if event is None:
            return
        if "SYNTH_UUID" in ev.env:
            emit(MalformedInput(self.name, f"synthetic uevent {ev.action}@{ev.devpath[:80]} "
                                           "(written to a uevent file): not a transition", now))
            return
        if isinstance(event, Transition):
            self._transition(event, _seqnum(ev), emit)
            return
        emit(event)

    def _transition(self, t: Transition, seqnum: int | None, emit: Emit) -> None:
        key = (t.resource, t.unit)
        held = self._held.pop(key, None)
        if held is not None:
            held_seq, held_t = held
            if (seqnum is not None and seqnum > held_seq
                    and held_t.direction is not t.direction):
                emit(held_t)  # the flap that explains why sysfs disagreed: both are real
            else:
                self._skip(held_t)
        if self._confirmed(t):
            emit(t)
        elif seqnum is not None and len(self._held) < MAX_HELD:
            self._held[key] = (seqnum, t)
        else:
            self._skip(t)

    def _skip(self, t: Transition) -> None:
        self.unconfirmed += 1
        self.log.debug("uevent %s of %s %d contradicted by sysfs: skipped", t.direction.value,
                       t.resource.value, t.unit)

    @property
    def held(self) -> int:
        return len(self._held)

    def _confirmed(self, t: Transition) -> bool:
        """Does sysfs agree with the transition now? Unreadable state cannot contradict."""
        if t.resource is Resource.CPU:
            path, want = f"devices/system/cpu/cpu{t.unit}/online", (
                "1" if t.direction is Direction.ONLINE else "0")
        else:
            path, want = f"devices/system/memory/memory{t.unit}/state", t.direction.value
        try:
            state = read_text(os.path.join(self.sysfs_root, path), 64).strip()
        except (OSError, ValueError):
            return True  # cpu0 has no online file; a removed block has no state
        return state == want

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        if self._waker is not None:
            self._waker.poke()  # wake the wait now
        super().stop(timeout)

    def close(self) -> None:
        if self._waker is not None:
            self._waker.unwatch()
            self._waker.close()
            self._waker = None
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def _seqnum(ev: Uevent) -> int | None:
    text = ev.env.get("SEQNUM", "")
    return int(text) if text.isdigit() and len(text) < 20 else None


register(SourceSpec("uevent", KERNEL, "kernel uevents (netlink) for CPUs and memory blocks",
                    lambda ctx: UeventSource(ctx.clock, SYSFS_ROOT.of(ctx.options)), order=30,
                    lossy=True,  # netlink ENOBUFS
                    defers_cpu_transitions=True))
