"""The kubelet's podresources API (gRPC on a unix socket): which CPUs it offers to pods.

GetAllocatableResources is polled every `interval` seconds. Its `cpu_ids` is empty unless the
CPU manager runs the `static` policy: we emit cpu_ids=None ("not reported") then, never an
empty set (that would read as "zero CPUs"). The socket may be missing (no kubelet yet, the host
path not mounted): that is SourceStatus down with the reason, and we keep polling, so the
source comes up by itself when the socket appears. An answer that does not parse as the proto
is MalformedInput. An event is emitted when the answer changes (and again after an outage).

A hostile or broken kubelet must not be amplified: an answer is at most
MAX_ANSWER_BYTES (gRPC refuses more), CPU ids are kept only when the kernel can have them
(/sys/devices/system/cpu/possible), memory entries are bounded, and what was dropped is one
MalformedInput per distinct bad answer, never one per id.

The call itself is made by a short-lived child process (podresources_child.py, one per poll,
killed when it overruns the timeout), so gRPC never stays in the long-running exporter.
"""
from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

from exporter.checks import FAIL, OK, WARN, Check
from exporter.clock import Clock
from exporter.config.options import SYSFS_ROOT, Opt
from exporter.config.types import Seconds
from exporter.events import MalformedInput, PodResourcesAllocatable, SourceStatus
from exporter.sources.base import Emit, Source
from exporter.sources.kernel.sysfs import MAX_CPUS, parse_cpu_list
from exporter.sources.registry import KUBERNETES, SourceSpec, register
from exporter.untrusted import read_text

# gRPC and the generated stubs (~15 MiB of RSS and seven threads in the exporter: its C core,
# protobuf) are used only by podresources_child.py, run once per poll as a child process.
CHILD = "exporter.sources.kubelet.podresources_child"
# Seconds over the gRPC timeout for the child to start: ~0.2 s on an idle node, up to 31 s
# measured with 40 runnable threads per CPU (its 0.1 s of CPU then comes slowly).
CHILD_GRACE = 55.0
MAX_REPLY_BYTES = 1 << 20  # the child's reply: at most MAX_CPUS ids and 64 memory entries
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
# A real answer is a CPU list (<= 8192 ids, ~2 bytes each) and a few memory entries: KiB.
MAX_ANSWER_BYTES = 1 << 20
MAX_MEMORY_ENTRIES = 64  # memory types (memory, hugepages-*) per NUMA node: a few dozen at most


class PodResourcesSource(Source):
    name = "podresources"

    def __init__(self, clock: Clock, *, socket_path: str = DEFAULT_SOCKET,
                 interval: float = 30.0, timeout: float = 5.0, sysfs_root: str = "/sys") -> None:
        super().__init__(clock)
        self.socket_path = socket_path
        self.sysfs_root = sysfs_root
        self._possible: frozenset[int] | None = None  # read once: fixed at boot
        self._last_problem = ""  # the last bad answer reported: each is counted once
        self.interval = interval
        self.timeout = timeout
        self._up: bool | None = None
        self._last: PodResourcesAllocatable | None = None
        self.polls = 0

    def loop(self, emit: Emit) -> None:
        while not self.stopping.is_set():
            self.poll(emit)
            self.stopping.wait(self.interval)

    def poll(self, emit: Emit) -> None:
        """One GetAllocatableResources round trip (public so `check` can run one)."""
        self.polls += 1
        problem = self._socket_problem()
        if problem:
            self._down(emit, problem)
            return
        reply = self._call_child(emit)
        if reply is None:
            return
        if "error" in reply:
            self._rpc_failed(str(reply["error"]["code"]), str(reply["error"]["details"]), emit)
            return
        now = self.clock.now()
        self._set_up(emit, True, f"GetAllocatableResources on {self.socket_path}")
        event = self._convert(reply["answer"], now, emit)
        if self._last is None or _key(event) != _key(self._last):
            self._last = event
            emit(event)

    def _call_child(self, emit: Emit) -> dict[str, Any] | None:
        """The child's reply (podresources_child.py), or None after saying why there is none
        (the source is down)."""
        request = json.dumps({"socket": self.socket_path, "timeout": self.timeout,
                              "max_bytes": MAX_ANSWER_BYTES, "max_memory": MAX_MEMORY_ENTRIES,
                              "possible": sorted(self._possible_cpus())}).encode()
        try:
            done = subprocess.run([sys.executable, "-m", CHILD], input=request,
                                  capture_output=True, timeout=self.timeout + CHILD_GRACE,
                                  check=False)
        except subprocess.TimeoutExpired:  # killed by subprocess.run
            self._down(emit,
                       f"podresources call on {self.socket_path} did not finish in "
                       f"{self.timeout + CHILD_GRACE:g} s (child process killed)")
            return None
        except OSError as e:
            self._down(emit, f"cannot start the podresources child process: {e}")
            return None
        try:
            reply = json.loads(done.stdout[:MAX_REPLY_BYTES])
        except ValueError:
            reply = None
        if done.returncode != 0 or not isinstance(reply, dict):
            why = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
            self._down(emit, f"podresources child process failed (exit "
                                           f"{done.returncode}): {why[0][:300]}")
            return None
        return reply

    def _convert(self, answer: dict[str, Any], now: float, emit: Emit) -> PodResourcesAllocatable:
        possible = self._possible_cpus()
        cpus = frozenset(int(c) for c in answer["cpu_ids"]) & possible
        problems = []
        bad = int(answer["bad_count"])
        if bad:
            first = [int(c) for c in answer["bad_first"]]
            shown = ", ".join(str(c) for c in first[:5]) + (", ..." if bad > 5 else "")
            problems.append(f"{bad} CPU id(s) the kernel cannot have (possible: "
                            f"{_cpu_range(possible)}) dropped: {shown}")
        memory: dict[str, int] = {}
        entries = int(answer["memory_entries"])
        if entries > MAX_MEMORY_ENTRIES:
            problems.append(f"{entries} memory entries, only the first "
                            f"{MAX_MEMORY_ENTRIES} kept")
        for kind, size in answer["memory"][:MAX_MEMORY_ENTRIES]:
            kind = str(kind)[:64]
            memory[kind] = memory.get(kind, 0) + int(size)
        problem = "; ".join(problems)
        if problem and problem != self._last_problem:
            emit(MalformedInput(self.name, f"GetAllocatableResources: {problem}", now))
        self._last_problem = problem
        return PodResourcesAllocatable(now, cpus or None, memory)

    def _possible_cpus(self) -> frozenset[int]:
        """The CPU ids this kernel can ever have; without sysfs, any id below MAX_CPUS."""
        if self._possible is None:
            path = Path(self.sysfs_root, "devices/system/cpu/possible")
            try:
                self._possible = parse_cpu_list(read_text(path))
            except (OSError, ValueError) as e:
                self.log.warning("cannot read %s (%s): CPU ids checked against 0-%d only",
                                 path, e, MAX_CPUS - 1)
                self._possible = frozenset(range(MAX_CPUS))
        return self._possible

    def _socket_problem(self) -> str:
        try:
            mode = os.stat(self.socket_path).st_mode
        except FileNotFoundError:
            return (f"podresources socket {self.socket_path} missing: no kubelet on this host, "
                    f"or /var/lib/kubelet/pod-resources is not mounted into the exporter")
        except OSError as e:
            return f"cannot stat podresources socket {self.socket_path}: {e}"
        if not stat.S_ISSOCK(mode):
            return f"{self.socket_path} exists but is not a unix socket"
        return ""

    def _rpc_failed(self, code: str, details: str, emit: Emit) -> None:
        """The gRPC status the child got (StatusCode's name) and its details."""
        now = self.clock.now()
        if code == "INTERNAL" and "deserializ" in details.lower():
            # The kubelet answered, but not with AllocatableResourcesResponse.
            emit(MalformedInput(self.name, f"GetAllocatableResources answer is not the "
                                           f"podresources v1 proto: {details}", now))
            return
        if code == "RESOURCE_EXHAUSTED":
            reason = (f"GetAllocatableResources answer larger than {MAX_ANSWER_BYTES} bytes: "
                      f"refused (a kubelet's is a few KiB): {details}")
        elif code == "UNIMPLEMENTED":
            reason = ("kubelet does not serve podresources GetAllocatableResources (needs "
                      "v1.23+, or gate KubeletPodResourcesGetAllocatable before that)")
        elif code == "UNAVAILABLE":
            reason = f"cannot reach the kubelet on {self.socket_path}: {details}"
        else:
            reason = f"GetAllocatableResources failed ({code or 'error'}): {details}"
        self._down(emit, reason)

    def _down(self, emit: Emit, reason: str) -> None:
        self._last = None  # re-emit the answer once we are back
        self._set_up(emit, False, reason)

    def _set_up(self, emit: Emit, up: bool, reason: str) -> None:
        if self._up is up:
            return
        self._up = up  # the agent logs the change
        emit(SourceStatus(self.name, up, self.clock.now(), reason))


def _cpu_range(cpus: frozenset[int]) -> str:
    if not cpus:
        return "none"
    lo, hi = min(cpus), max(cpus)
    return f"{lo}-{hi}" if len(cpus) == hi - lo + 1 else f"{len(cpus)} ids in {lo}-{hi}"


def _key(event: PodResourcesAllocatable) -> tuple[Any, ...]:
    return event.cpu_ids, tuple(sorted(event.memory_bytes.items()))


def _check(source: Source) -> list[Check]:
    """Is the kubelet's socket there, and does anyone listen on it?"""
    assert isinstance(source, PodResourcesSource)
    path = source.socket_path
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return [Check("podresources socket", WARN, f"{path}: {e.strerror}",
                      "mount /var/lib/kubelet/pod-resources from the host (the DaemonSet does)")]
    if not stat.S_ISSOCK(mode):
        return [Check("podresources socket", FAIL, f"{path} is not a unix socket",
                      "point --podresources-socket at the kubelet's kubelet.sock")]
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(2)
        try:
            s.connect(path)
        except OSError as e:
            return [Check("podresources socket", FAIL, f"{path}: connect: {e.strerror or e}",
                          "is the kubelet running? (the socket exists but nobody listens)")]
    return [Check("podresources socket", OK, f"{path} accepts connections")]


PODRESOURCES_SOCKET: Opt[str] = Opt(
    "podresources_socket", ("--podresources-socket",),
    "/var/lib/kubelet/pod-resources/kubelet.sock",
    "The kubelet's podresources gRPC socket (empty: do not poll).")
PODRESOURCES_INTERVAL: Opt[float] = Opt(
    "podresources_interval", ("--podresources-interval",), 30.0,
    "Seconds between podresources GetAllocatableResources polls.", Seconds())

register(SourceSpec(
    "podresources", KUBERNETES, "the kubelet's podresources gRPC API",
    lambda ctx: PodResourcesSource(ctx.clock, socket_path=PODRESOURCES_SOCKET.of(ctx.options),
                                   interval=PODRESOURCES_INTERVAL.of(ctx.options),
                                   sysfs_root=SYSFS_ROOT.of(ctx.options)),
    wanted=lambda options: bool(PODRESOURCES_SOCKET.of(options)), order=70,
    options=(PODRESOURCES_SOCKET, PODRESOURCES_INTERVAL),
    check=_check))
