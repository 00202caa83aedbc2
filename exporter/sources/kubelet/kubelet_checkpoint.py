"""The kubelet's CPU and memory manager checkpoints: what a kubelet restart would re-validate.

A kubelet with the static CPU manager policy refuses to start when the CPUs in
`<root>/cpu_manager_state` (default set plus exclusive assignments) are not exactly the CPUs
online ("current set of available CPUs "0" doesn't match with CPUs in state "0-1""), and the
Static memory manager policy likewise when the memory it recorded is not the machine's. Both
files are read at start, when they change (inotify on the root directory: the kubelet writes
a temporary file and renames it) and after every kernel event (the agent's kubelet sink pokes
this source), with a slow timer behind that in case a notification is missed.

Formats, from the kubelet's source (pkg/kubelet/cm/cpumanager/state/checkpoint.go and
.../memorymanager/state/checkpoint.go): JSON {"policyName", "defaultCpuSet", "entries":
{podUID: {container: cpuset}}, "checksum"} and {"policyName", "machineState": {numa:
{"memoryMap": {resource: {"total", ...}}}}, "entries", "podEntries", "checksum"}.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from inotify_simple import INotify, flags  # type: ignore[import-untyped]

from exporter.clock import Clock
from exporter.config.options import Opt
from exporter.config.types import RootDir
from exporter.events import (
    CpuManagerCheckpoint,
    MalformedInput,
    MemoryManagerCheckpoint,
    Resource,
    SourceStatus,
)
from exporter.sources.base import Emit
from exporter.sources.kernel.sysfs import parse_cpu_list
from exporter.sources.registry import KUBERNETES, SourceContext, SourceSpec, register
from exporter.sources.wake import STATE_INTERVAL, PokedSource
from exporter.untrusted import NotRegularFile, TooLarge, read_bytes

CPU_STATE = "cpu_manager_state"
MEMORY_STATE = "memory_manager_state"
# A real checkpoint is tens of bytes per pinned container (tests/fixtures/kubelet-v1.36: 67 and
# 130 bytes); 128 KiB holds well over a thousand. A bigger file is not one, and parsing it with
# its checksum cost ~2 s of CPU per MiB: it is refused unread.
MAX_BYTES = 128 * 1024
# At most one read per this many seconds however often the files are rewritten (inotify) or the
# agent pokes: a writer renaming 720 times a second costs one read a second, not 720.
READ_GAP = 1.0
# Exclusive CPUs are each in one container: the sum over assignments is at most the CPUs of the
# largest machine (8192), with room to spare; "0-65535" repeated would otherwise cost minutes.
MAX_ASSIGNED = 1 << 16


# ------------------------------------------------------------------ parsers (pure)


def _fnv1a32(data: bytes) -> int:
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def cpu_manager_checksum(policy: str, default_cpu_set: str,
                         entries: Mapping[str, Mapping[str, str]]) -> int:
    """The checksum the kubelet writes: FNV-1a 32 of the checkpoint with checksum 0, printed
    by go-spew as k8s.io/utils/dump.ForHash does ("%#v", keys sorted, map members untyped).
    Checked against checkpoints a real kubelet v1.36 wrote (tests/fixtures/kubelet-v1.36)."""
    pods = " ".join(
        f"{pod}:map[" + " ".join(f"{name}:{cpus}" for name, cpus in sorted(containers.items()))
        + "]" for pod, containers in sorted(entries.items()))
    text = ("(*state.CPUManagerCheckpoint){PolicyName:(string)" + policy
            + " DefaultCPUSet:(string)" + default_cpu_set
            + " Entries:(map[string]map[string]string)map[" + pods + "]"
            + " Checksum:(checksum.Checksum)0}")
    return _fnv1a32(text.encode())


def _json_object(data: bytes) -> dict[str, Any]:
    if len(data) > MAX_BYTES:
        raise ValueError(f"larger than {MAX_BYTES} bytes")
    try:
        obj = json.loads(data)
    except RecursionError:  # "[[[[..." nested deeper than the parser's stack
        raise ValueError("nested too deeply") from None
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    return obj


def _string(obj: Mapping[str, Any], key: str) -> str:
    value = obj.get(key, "")
    if not isinstance(value, str):
        raise ValueError(f"{key} is not a string")
    return value


def parse_cpu_manager_state(data: bytes, path: str, now: float) -> CpuManagerCheckpoint:
    """The checkpoint's bytes -> the event; a file the kubelet itself would reject (not its
    JSON, a bad cpuset, a wrong checksum) becomes an event with `error` set."""
    try:
        obj = _json_object(data)
        policy = _string(obj, "policyName")
        default_set = _string(obj, "defaultCpuSet")
        raw_entries = obj.get("entries") or {}
        if not isinstance(raw_entries, dict):
            raise ValueError("entries is not an object")
        entries: dict[str, dict[str, str]] = {}
        assigned: set[int] = set()
        listed = 0  # CPUs named over all assignments: bounds the work a hostile file costs
        for pod, containers in raw_entries.items():
            if not isinstance(containers, dict):
                raise ValueError(f"entries[{pod!r}]: v1 checkpoints are not read by v1.36")
            entries[pod] = {}
            for name, cpus in containers.items():
                if not isinstance(cpus, str):
                    raise ValueError(f"entries[{pod!r}][{name!r}] is not a cpuset string")
                entries[pod][name] = cpus
                cpu_set = parse_cpu_list(cpus)
                listed += len(cpu_set)
                if listed > MAX_ASSIGNED:
                    raise ValueError(f"assignments name more than {MAX_ASSIGNED} CPUs")
                assigned |= cpu_set
        default_cpus = parse_cpu_list(default_set)
        checksum = obj.get("checksum", 0)
        if not isinstance(checksum, int) or isinstance(checksum, bool):
            raise ValueError("checksum is not a number")
    except (ValueError, UnicodeDecodeError) as e:
        return CpuManagerCheckpoint(now, path, True, error=f"not a CPU manager checkpoint: {e}")
    # 0 is accepted by the kubelet (an old file backend wrote none).
    if checksum and checksum != cpu_manager_checksum(policy, default_set, entries):
        return CpuManagerCheckpoint(now, path, True, policy, default_cpus, frozenset(assigned),
                                    error="checksum mismatch: the kubelet would call the "
                                          "checkpoint corrupted")
    return CpuManagerCheckpoint(now, path, True, policy, default_cpus, frozenset(assigned))


def parse_memory_manager_state(data: bytes, path: str, now: float) -> MemoryManagerCheckpoint:
    """The memory manager checkpoint -> policy and total bytes per resource over NUMA nodes.
    (Its checksum is not re-computed: the JSON shape is checked instead.)"""
    try:
        obj = _json_object(data)
        policy = _string(obj, "policyName")
        machine = obj.get("machineState") or {}
        if not isinstance(machine, dict):
            raise ValueError("machineState is not an object")
        totals: dict[str, int] = {}
        for numa, state in machine.items():
            memory_map = state.get("memoryMap") if isinstance(state, dict) else None
            if not isinstance(memory_map, dict):
                raise ValueError(f"machineState[{numa!r}] has no memoryMap")
            for resource, table in memory_map.items():
                total = table.get("total") if isinstance(table, dict) else None
                if not isinstance(total, int) or isinstance(total, bool) or total < 0:
                    raise ValueError(f"machineState[{numa!r}][{resource!r}].total is not a size")
                totals[resource] = totals.get(resource, 0) + total
    except (ValueError, UnicodeDecodeError) as e:
        return MemoryManagerCheckpoint(now, path, True,
                                       error=f"not a memory manager checkpoint: {e}")
    return MemoryManagerCheckpoint(now, path, True, policy, totals)


def read_file(path: Path) -> bytes | None:
    """`path`'s bytes (MAX_BYTES + 1 of them when it is larger: refused by the parser); None
    when there is no such file (nor root). OSError (or NotRegularFile: a FIFO never blocks the
    read) when it cannot be read: that says nothing about what the kubelet would find."""
    try:
        return read_bytes(path, MAX_BYTES)
    except TooLarge:
        return b" " * (MAX_BYTES + 1)  # what _json_object refuses, without reading it
    except (FileNotFoundError, NotADirectoryError):
        return None


def read_cpu_manager_state(root: str | Path, now: float) -> CpuManagerCheckpoint:
    """Raises OSError when the file is there but cannot be read (permissions, I/O)."""
    path = Path(root) / CPU_STATE
    data = read_file(path)
    if data is None:
        return CpuManagerCheckpoint(now, str(path), False)
    return parse_cpu_manager_state(data, str(path), now)


def read_memory_manager_state(root: str | Path, now: float) -> MemoryManagerCheckpoint:
    """Raises OSError when the file is there but cannot be read (permissions, I/O)."""
    path = Path(root) / MEMORY_STATE
    data = read_file(path)
    if data is None:
        return MemoryManagerCheckpoint(now, str(path), False)
    return parse_memory_manager_state(data, str(path), now)


# The files and folders every kubelet keeps in its --root-dir (pkg/kubelet/kubelet.go
# setupDataDirs: pods, plugins, plugin-containers, pod-resources; the managers' checkpoints).
# A root holding none of them but pod-resources (the socket's own mount) is not the
# kubelet's: its checkpoints were not mounted, which says nothing of what the kubelet has.
KUBELET_MARKS = ("pods", "plugins", "plugin-containers", CPU_STATE, MEMORY_STATE)
CONFIG_FILE = "config.yaml"  # kubeadm's --config: <root>/config.yaml
ROOT_EMPTY = "--kubelet-root-dir is empty: not read"
CONFIG_MAX_BYTES = 256 * 1024


def not_mounted(root: str | Path) -> str:
    """Why `root` does not show the kubelet's files ("" when it does): the DaemonSet mounted
    only the pod-resources socket, or nothing, or a wrong --kubelet-root-dir."""
    path = Path(root)
    try:
        names = {entry.name for entry in os.scandir(path)}
    except FileNotFoundError:
        return (f"not mounted: {path} does not exist: mount the kubelet's root dir read-only "
                "(deploy/components/kubelet-state) or pass --kubelet-root-dir")
    except OSError as e:
        return f"cannot read {path}: {e.strerror} (fix: run the exporter as root)"
    if not names & set(KUBELET_MARKS):
        return (f"not mounted: {path} holds none of the kubelet's files ("
                + ", ".join(KUBELET_MARKS[:3]) + ", its checkpoints): mount the kubelet's "
                "root dir read-only (deploy/components/kubelet-state) or pass "
                "--kubelet-root-dir")
    return ""


def read_reserved_cpus(root: str | Path) -> tuple[frozenset[int] | None, str]:
    """The kubelet's reservedSystemCPUs from <root>/config.yaml: (CPUs, "") when read (none
    set: empty), (None, why) when not."""
    path = Path(root) / CONFIG_FILE
    try:
        data = read_bytes(path, CONFIG_MAX_BYTES)
    except (FileNotFoundError, NotADirectoryError):
        return None, (f"no {path} (the kubelet's --config lives elsewhere: its "
                      "reservedSystemCPUs were not read)")
    except (OSError, ValueError) as e:
        return None, f"cannot read {path}: {e}"
    try:
        doc = yaml.safe_load(data)
        value = doc.get("reservedSystemCPUs", "") if isinstance(doc, dict) else None
        if value is None or not isinstance(value, str):
            raise ValueError("reservedSystemCPUs is not a CPU list")
        return parse_cpu_list(value), ""
    except (yaml.YAMLError, ValueError, RecursionError) as e:
        return None, f"{path} is not the kubelet's configuration ({str(e)[:120]})"


# ------------------------------------------------------------------ the source


def _same(a: Any, b: Any) -> bool:
    """Equal but for the read time: only changes are emitted (and journaled)."""
    return a is not None and b is not None and {**vars(a), "time": 0} == {**vars(b), "time": 0}


class KubeletCheckpointSource(PokedSource):
    name = "kubelet_checkpoint"

    def __init__(self, clock: Clock, root: str, interval: float = STATE_INTERVAL,
                 read_gap: float = READ_GAP):
        super().__init__(clock)
        self.root = Path(root)
        self.interval = interval
        self.read_gap = read_gap
        self._inotify: Any = None
        self._last_cpu: CpuManagerCheckpoint | None = None
        self._last_memory: MemoryManagerCheckpoint | None = None
        self._up: bool | None = None
        self._last_read = -read_gap  # time.monotonic() of the last read
        self._digests: dict[str, bytes] = {}  # file -> sha256 of the bytes last parsed

    def open(self) -> None:
        # Before the privilege drop: the watch is kept. A missing root (no kubelet yet) is not
        # an error; the timer and the pokes still read it once it exists.
        self._watch()

    def _watch(self) -> None:
        if self._inotify is not None or not self.root.is_dir():
            return
        try:
            inotify = INotify(nonblocking=True)
        except OSError as e:
            self.log.warning("inotify unavailable (%s): re-reading on kernel events and "
                             "every %.0f s only", e, self.interval)
            return
        mask = (flags.CLOSE_WRITE | flags.MOVED_TO | flags.MOVED_FROM | flags.CREATE
                | flags.DELETE | flags.DELETE_SELF | flags.MOVE_SELF)
        try:
            inotify.add_watch(str(self.root), mask)
        except OSError:
            inotify.close()
            return
        self._inotify = inotify
        self.waker.watch(inotify.fileno())

    def close(self) -> None:
        if self._inotify is not None:
            self.waker.unwatch()
            self._inotify.close()
            self._inotify = None
        super().close()

    def _set_up(self, emit: Emit, up: bool, reason: str) -> None:
        if self._up is not up:  # each change once, not every read
            self._up = up  # the agent logs the change
            emit(SourceStatus(self.name, up, self.clock.now(), reason))

    def loop(self, emit: Emit) -> None:
        self.read(emit)
        while not self.stopping.is_set():
            poked, changed = self.waker.wait(self.interval)
            if self.stopping.is_set():
                return
            # Always drain the inotify queue (a readable fd would wake the next wait at once).
            relevant = changed and self._inotify is not None and self._relevant()
            if changed and not (poked or relevant):
                continue  # another file of the kubelet's root changed
            self.read(emit)

    def _relevant(self) -> bool:
        """Drain the inotify queue: did one of the checkpoints (or the root itself) change?"""
        events = list(self._inotify.read(timeout=0))
        if any(e.mask & (flags.IGNORED | flags.Q_OVERFLOW) for e in events):
            # The root was removed or moved (the watch is gone), or events were dropped:
            # watch again at the next read, and read now.
            self.waker.unwatch()
            self._inotify.close()
            self._inotify = None
            return True
        return any(e.name in (CPU_STATE, MEMORY_STATE, "") for e in events)

    def read(self, emit: Emit) -> None:
        # Rate bound: rewrites in between are coalesced into the read after the gap.
        wait = self._last_read + self.read_gap - time.monotonic()
        if wait > 0 and self.stopping.wait(wait):
            return
        self._last_read = time.monotonic()
        self._watch()  # the root may have appeared since
        now = self.clock.now()
        why = not_mounted(self.root)
        if why:
            # Not "no checkpoint": nothing of the kubelet's is visible here. No verdict (the
            # series are absent), the source is down, and `check` says why.
            self._last_cpu = self._last_memory = None
            self._set_up(emit, False, why)
            return
        try:
            cpu = self._read(CPU_STATE, self._last_cpu, now)
            memory = self._read(MEMORY_STATE, self._last_memory, now)
        except NotRegularFile as e:
            self._set_up(emit, False, f"{e} (fix: the kubelet writes a regular file there; "
                         "remove what is in its place)")
            return
        except OSError as e:
            # Unreadable is not corrupted: no verdict (no series), the source is down, say why.
            self._set_up(emit, False, f"cannot read {e.filename}: {e.strerror} (fix: mount the "
                         "kubelet's root dir read-only and run the exporter as root)")
            return
        self._set_up(emit, True, f"reading {self.root}")
        for event, last in ((cpu, self._last_cpu), (memory, self._last_memory)):
            if _same(event, last):
                continue
            if event.error:  # counted, and the gauge says a restart would fail on it
                emit(MalformedInput(self.name, f"{event.path}: {event.error}", now))
            emit(event)
        self._last_cpu, self._last_memory = cpu, memory

    def _read(self, name: str, last: Any, now: float) -> Any:
        """One checkpoint, parsed only when its bytes changed since the last parse (a rewrite
        of the same content costs a hash, not a parse and its checksum)."""
        path = self.root / name
        data = read_file(path)
        cpu = name == CPU_STATE
        if data is None:
            self._digests.pop(name, None)
            return (CpuManagerCheckpoint if cpu else MemoryManagerCheckpoint)(now, str(path),
                                                                              False)
        digest = hashlib.sha256(data).digest()
        if last is not None and last.present and self._digests.get(name) == digest:
            return last
        self._digests[name] = digest
        return (parse_cpu_manager_state if cpu else parse_memory_manager_state)(
            data, str(path), now)


def _factory(ctx: SourceContext) -> KubeletCheckpointSource:
    return KubeletCheckpointSource(ctx.clock, KUBELET_ROOT_DIR.of(ctx.options))


KUBELET_ROOT_DIR: Opt[str] = Opt(
    "kubelet_root_dir", ("--kubelet-root-dir",), "/var/lib/kubelet",
    "The kubelet's --root-dir: where cpu_manager_state and memory_manager_state are (empty: do "
    "not read them).", RootDir())


# A Kubernetes source: it matters where a kubelet runs, and is turned off with an empty
# --kubelet-root-dir. It needs no API server: it reads the node's own files.
register(SourceSpec("kubelet_checkpoint", KUBERNETES,
                    "the kubelet's cpu_manager_state and memory_manager_state (inotify)",
                    _factory, wanted=lambda options: bool(KUBELET_ROOT_DIR.of(options)),
                    order=60, options=(KUBELET_ROOT_DIR,),
                    # the CPU and memory managers' checkpoints, judged against the kernel
                    poked_by=frozenset({Resource.CPU, Resource.MEMORY})))
