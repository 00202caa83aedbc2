"""Drop Linux capabilities once the BPF programs are attached and every socket is open.

What needs privilege is start-up: loading BPF programs and creating maps (CAP_BPF, or
CAP_SYS_ADMIN before 5.8), attaching them to tracepoints through perf_event_open
(CAP_PERFMON), binding a port below 1024. After that the agent only reads world-readable
sysfs/procfs files, polls the ring buffer through descriptors it already holds, talks to the
API server and the kubelet socket (owned by uid 0, which it still is), and writes its own
journal (also uid 0's, mode 0600). So all capabilities go, with one exception:

- before Linux 6.5 every bpf() command (map lookups too: the lost-records counter) is refused
  without CAP_BPF when kernel.unprivileged_bpf_disabled is set, so CAP_BPF stays there while
  the BPF source runs. Since 6.5 the check applies only to creating maps and loading programs.

Capabilities are per thread: call this before the source threads start (threads started later
inherit the dropped set). Threads that already exist (gRPC or HTTP client pools) are reported,
not silently left privileged. no_new_privs is set too, so no exec can regain anything.
"""
from __future__ import annotations

import ctypes
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

CAPS = {"CAP_DAC_OVERRIDE": 1, "CAP_SETPCAP": 8, "CAP_NET_BIND_SERVICE": 10,
        "CAP_SYS_ADMIN": 21, "CAP_PERFMON": 38, "CAP_BPF": 39}
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


_libc = ctypes.CDLL(None, use_errno=True)


@dataclass
class DropResult:
    kept: set[str]
    effective_before: int
    effective_after: int
    privileged_threads: list[int] = field(default_factory=list)  # tids still holding more


def kernel_version(release: str | None = None) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", release or os.uname().release)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def bpf_capabilities_after_start(release: str | None = None) -> frozenset[str]:
    """What a running BPF source still needs: reading its maps (the lost-records counter)
    before Linux 6.5 (the BPF source declares this as its `capabilities_after_start`)."""
    if kernel_version(release) < (6, 5):
        return frozenset({"CAP_BPF"} if kernel_version(release) >= (5, 8) else {"CAP_SYS_ADMIN"})
    return frozenset()


def needed_after_start(bpf_running: bool, release: str | None = None) -> set[str]:
    """Capabilities the running agent still needs once everything is open and bound."""
    return set(bpf_capabilities_after_start(release)) if bpf_running else set()


def capabilities(tid: int | str = "self", which: str = "CapEff") -> int:
    """A capability set of a thread of this process, from /proc."""
    path = Path("/proc/self/status") if tid == "self" else Path(f"/proc/self/task/{tid}/status")
    for line in path.read_text().splitlines():
        if line.startswith(which + ":"):
            return int(line.split()[1], 16)
    raise ValueError(f"{which} not in {path}")


def _mask(names: set[str]) -> int:
    unknown = names - CAPS.keys()
    if unknown:
        raise ValueError(f"unknown capability {', '.join(sorted(unknown))}")
    return sum(1 << CAPS[n] for n in names)


def drop_capabilities(keep: frozenset[str] | set[str] = frozenset()) -> DropResult:
    """Keep only `keep` (and only what the thread already had); OSError if the kernel refuses."""
    before = capabilities()
    keep_mask = _mask(set(keep)) & capabilities("self", "CapPrm")
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _raise("prctl(PR_SET_NO_NEW_PRIVS)")
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # EINVAL before 4.3: fine
    if before & (1 << CAPS["CAP_SETPCAP"]):
        # Also shrink the bounding set, so not even a file capability could bring one back.
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
        for cap in range(last + 1):
            if not keep_mask & (1 << cap) and _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                _raise(f"prctl(PR_CAPBSET_DROP, {cap})")
    header = _Header(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_Data * 2)()
    for i in (0, 1):
        word = (keep_mask >> (32 * i)) & 0xFFFFFFFF
        data[i].effective = data[i].permitted = word
        data[i].inheritable = 0
    if _libc.capset(ctypes.byref(header), data) != 0:
        _raise("capset")
    after = capabilities()
    others = [int(t) for t in os.listdir("/proc/self/task")
              if int(t) != threading_native_id() and capabilities(t) & ~keep_mask]
    names = sorted(keep) or ["none"]
    log.info("capabilities dropped after start-up: kept %s", ", ".join(names))
    if others:
        log.warning("threads started before the drop keep their capabilities: %s", others)
    return DropResult(set(keep), before, after, others)


def threading_native_id() -> int:
    import threading
    return threading.get_native_id()


def _raise(what: str) -> None:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")
