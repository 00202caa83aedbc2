"""A classic BPF socket filter that keeps the kernel from waking the uevent source for devices
it does not watch.

Every CPU online sends two uevents on x86: `add@/devices/virtual/cpuid/cpu1` and
`online@/devices/system/cpu/cpu1` (msr, machinecheck and cache devices add more on some
machines), and each one woke the source's thread. On a VM, a thread that runs while a CPU is
coming online pays for every page it touches (bench/README.md, "the online window"), so a
wake-up for a device we then ignore is the dearest work the source does. udev filters the same
way (libudev's `udev_monitor_filter_update`); its filter only reads libudev's own message
header, not the kernel's, so this one reads the kernel's: `action@devpath\\0KEY=VALUE...`.

What passes: every datagram whose header names a path under /devices/system/cpu/ or
/devices/system/memory/, and every datagram that does not look like a kernel uevent at all
(too short, no `@` where an action ends), so that user-space garbage still reaches the source
and is counted as malformed. What is dropped: well-formed headers for any other device.

With `cpu_transitions=False` (the BPF source's cpuhp programs are attached and report every
CPU transition, with its duration and refusals) `online@` and `offline@` of
/devices/system/cpu/ are dropped too: each one woke the source in the online window only to
deliver a second copy of what BPF had delivered (bench/README.md, "Per-transition CPU"). CPU
add/remove and every memory-block uevent still pass. A filter cannot see the sender, so a
forged CPU online/offline from user space is then dropped rather than counted as malformed;
it never counted as a transition either way.
"""
from __future__ import annotations

import ctypes
import socket
import struct
from typing import Any

SO_ATTACH_FILTER = getattr(socket, "SO_ATTACH_FILTER", 26)

# linux/filter.h opcodes
_LD_W_ABS = 0x20  # A = 32-bit big-endian word at offset k
_LD_B_ABS = 0x30  # A = byte at offset k
_LD_W_LEN = 0x80  # A = datagram length
_JEQ_K = 0x15
_JGE_K = 0x35
_RET_K = 0x06
ACCEPT, DROP = 0xFFFFFFFF, 0

# The kernel's actions (lib/kobject_uevent.c kobject_actions[]) end at these offsets:
# add; bind, move; change, online, remove, unbind; offline.
_ACTION_ENDS = (3, 4, 6, 7)
_PREFIX = b"/devices/system/"  # 16 bytes: four words
_WATCHED = (b"cpu/", b"memo")  # the word after the prefix
_SHORTEST = max(_ACTION_ENDS) + 1 + len(_PREFIX) + 4  # every load below stays in bounds


Insn = tuple[int, int, int, int]  # struct sock_filter: code, jt, jf, k


def _word(b: bytes) -> int:
    return int(struct.unpack(">I", b)[0])


# The CPU transitions' actions, by where they end: the first word of the action tells them
# apart from the other actions of the same length (remove, change, unbind end at 6 too).
_CPU_TRANSITIONS = {6: b"onli", 7: b"offl"}


def program(cpu_transitions: bool = True) -> list[Insn]:
    """The filter as struct sock_filter tuples. cBPF jumps are forward offsets, so the program
    is written with labels and resolved at the end. `cpu_transitions` False: CPU online and
    offline uevents are dropped as well."""
    lines: list[tuple[int, str | int, str | int, int] | str] = [
        (_LD_W_LEN, 0, 0, 0),
        (_JGE_K, 0, "accept", _SHORTEST),  # too short for a kernel header: let it be counted
    ]
    for n, end in enumerate(_ACTION_ENDS):
        not_here = f"end{n + 1}" if n + 1 < len(_ACTION_ENDS) else "accept"
        lines += [f"end{n}", (_LD_B_ABS, 0, 0, end), (_JEQ_K, 0, not_here, ord("@"))]
        for i in range(0, len(_PREFIX), 4):
            lines += [(_LD_W_ABS, 0, 0, end + 1 + i), (_JEQ_K, 0, "drop", _word(_PREFIX[i:i + 4]))]
        cpu = "accept"
        if not cpu_transitions and end in _CPU_TRANSITIONS:
            cpu = f"cpu{n}"
        lines += [(_LD_W_ABS, 0, 0, end + 1 + len(_PREFIX)),
                  (_JEQ_K, cpu, 0, _word(_WATCHED[0])),
                  (_JEQ_K, "accept", "drop", _word(_WATCHED[1]))]
        if cpu != "accept":  # a CPU's uevent: dropped when it is online@ or offline@
            lines += [cpu, (_LD_W_ABS, 0, 0, 0),
                      (_JEQ_K, "drop", "accept", _word(_CPU_TRANSITIONS[end]))]
    lines += ["accept", (_RET_K, 0, 0, ACCEPT), "drop", (_RET_K, 0, 0, DROP)]
    return _resolve(lines)


def _resolve(lines: list[Any]) -> list[Insn]:
    labels: dict[str, int] = {}
    insns: list[Insn] = []
    for line in lines:
        if isinstance(line, str):
            labels[line] = len(insns)
        else:
            insns.append(line)

    def offset(at: int, target: str | int) -> int:
        if isinstance(target, int):
            return target
        distance = labels[target] - at - 1
        assert 0 <= distance < 256, "cBPF jumps forward by at most 255"
        return distance

    return [(code, offset(i, jt), offset(i, jf), k) for i, (code, jt, jf, k) in enumerate(insns)]


def attach(sock: socket.socket, cpu_transitions: bool = True) -> None:
    """SO_ATTACH_FILTER on an uevent socket (replacing the one it has); raises OSError where the
    kernel refuses."""
    insns = program(cpu_transitions)
    array = (ctypes.c_ubyte * (8 * len(insns))).from_buffer_copy(
        b"".join(struct.pack("HBBI", *insn) for insn in insns))
    fprog = struct.pack("HL", len(insns), ctypes.addressof(array))  # struct sock_fprog
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)  # the kernel copies it
