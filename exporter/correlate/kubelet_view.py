"""What the kubelet would find if it restarted now: its checkpoints, cgroups and process
joined with the kernel's truth. Pure: events in, gauge values out; no I/O, no clock needed
(every value is a function of the latest events, not of time).

The rules are the kubelet's own start-up checks (pkg/kubelet/cm/cpumanager/policy_static.go
validateState, .../memorymanager/policy_static.go validateState), so `restart_blocked` is 1
exactly when a restart now would end in "Failed to start ContainerManager".
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from exporter.events import (
    CpuManagerCheckpoint,
    Event,
    KernelSnapshot,
    KubeletFeatures,
    KubeletProcess,
    KubepodsCpuset,
    MemoryAutoOnline,
    MemoryManagerCheckpoint,
    NodeCapacityConfigured,
    NodeWarningEvents,
    Resource,
    SourceStatus,
)

CPU_MANAGER = "cpu_manager_state"
MEMORY_MANAGER = "memory_manager_state"
# The gates the kubelet metrics source reads (its GATES; not imported: the correlator stays
# free of the HTTP client; tests/unit/test_kubelet_kep3953.py checks they agree)
GATES = ("InPlaceNodeResourceResize", "NodeResourceHotPlug", "NodeResourceHotUnPlug",
         "BalloonPod")
# Start times of one process read two ways (/proc, the kubelet's process_start_time_seconds)
# differ by rounding; a restart differs by the seconds a kubelet needs to start at least.
SAME_START = 1.0
AUTO_ONLINE_POLICIES = ("offline", "online", "online_kernel", "online_movable")
# KEP-3953's reasons of the Node condition CapacityConfigured
CAPACITY_REASONS = ("Accepted", "InProgress", "Infeasible", "EmergencyReduced")
# The checkpoint's memory resources the kernel snapshot also knows
_MEMORY_RESOURCES = {"memory": Resource.MEMORY, "hugepages-2Mi": Resource.HUGEPAGES_2MI,
                     "hugepages-1Gi": Resource.HUGEPAGES_1GI}


def cpu_list(cpus: frozenset[int]) -> str:
    """0,1,2,5 -> "cpu0-2, cpu5" (for messages)."""
    out: list[str] = []
    ordered = sorted(cpus)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(f"cpu{ordered[i]}" if i == j else f"cpu{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ", ".join(out)


def cpu_manager_problem(cp: CpuManagerCheckpoint, online: frozenset[int]) -> str | None:
    """Why a kubelet restart now would fail on this CPU manager checkpoint, or None."""
    if not cp.present:
        return None
    if cp.error:
        return f"the CPU manager checkpoint is unusable ({cp.error})"
    if cp.policy != "static":
        return None  # the none policy checks nothing at start
    known = cp.default_cpus | cp.assigned_cpus
    if not cp.default_cpus:
        # Empty: the kubelet initialises it, unless containers hold CPUs.
        return "the CPU manager checkpoint has assignments but no default cpuset" \
            if cp.assigned_cpus else None
    if cp.default_cpus & cp.assigned_cpus:
        return (f"the CPU manager checkpoint gives {cpu_list(cp.default_cpus & cp.assigned_cpus)} "
                "both to the default cpuset and to a container")
    if known == online:
        return None
    parts = []
    if known - online:
        parts.append(f"names {cpu_list(known - online)}, which "
                     f"{'is' if len(known - online) == 1 else 'are'} offline")
    if online - known:
        parts.append(f"lacks {cpu_list(online - known)}, which "
                     f"{'is' if len(online - known) == 1 else 'are'} online")
    return "the CPU manager checkpoint " + " and ".join(parts)


def memory_manager_problem(mp: MemoryManagerCheckpoint, snap: KernelSnapshot) -> str | None:
    """Why a restart would fail on this memory manager checkpoint (Static policy), or None."""
    if not mp.present:
        return None
    if mp.error:
        return f"the memory manager checkpoint is unusable ({mp.error})"
    if mp.policy != "Static":
        return None
    for name, total in sorted(mp.total_bytes.items()):
        resource = _MEMORY_RESOURCES.get(name)
        if resource is None:
            continue
        now = snap.mem_total_bytes if resource is Resource.MEMORY else \
            snap.hugepages_bytes.get(resource, 0)
        if total != now:
            return (f"the memory manager checkpoint records {total} bytes of {name}, the "
                    f"kernel has {now}")
    return None


@dataclass
class KubeletView:
    snapshot: KernelSnapshot | None = None
    cpu_checkpoint: CpuManagerCheckpoint | None = None
    memory_checkpoint: MemoryManagerCheckpoint | None = None
    kubepods: KubepodsCpuset | None = None
    auto_online: str = ""
    kubelet_start: float | None = None  # the kubelet process's start time last seen
    restarts: int = 0
    gates: Mapping[str, bool] = field(default_factory=dict)
    capacity_condition: NodeCapacityConfigured | None = None
    warnings: dict[str, NodeWarningEvents] = field(default_factory=dict)  # by reason

    def handle(self, event: Event) -> None:
        if isinstance(event, KernelSnapshot):
            self.snapshot = event
        elif isinstance(event, CpuManagerCheckpoint):
            self.cpu_checkpoint = event
        elif isinstance(event, MemoryManagerCheckpoint):
            self.memory_checkpoint = event
        elif isinstance(event, KubepodsCpuset):
            self.kubepods = event
        elif isinstance(event, MemoryAutoOnline):
            self.auto_online = event.policy
        elif isinstance(event, KubeletProcess):
            self._process(event)
        elif isinstance(event, KubeletFeatures):
            self.gates = {g: v for g, v in event.gates.items() if g in GATES}
        elif isinstance(event, NodeCapacityConfigured):
            self.capacity_condition = event
        elif isinstance(event, NodeWarningEvents):
            self.warnings[event.reason] = event
        elif isinstance(event, SourceStatus) and event.source == "kubelet_checkpoint" \
                and not event.up:
            # Unreadable or not mounted: what was read before says nothing now (no verdict,
            # no series) until the source reads the files again.
            self.cpu_checkpoint = self.memory_checkpoint = None

    def _process(self, event: KubeletProcess) -> None:
        # A restart is a new start time; a kubelet that vanished and came back is one too,
        # so the last start seen is kept while none runs.
        if event.start_time is None:
            return
        if (self.kubelet_start is not None
                and abs(event.start_time - self.kubelet_start) > SAME_START):
            self.restarts += 1
        self.kubelet_start = event.start_time

    # ------------------------------------------------------------ values

    def cpu_manager_cpus(self) -> dict[tuple[str, str], int]:
        """(set, state) -> CPU count; empty without a readable checkpoint and a snapshot."""
        cp, snap = self.cpu_checkpoint, self.snapshot
        if cp is None or snap is None or not cp.present or cp.error:
            return {}
        online = snap.cpus_online
        out = {}
        for name, cpus in (("default", cp.default_cpus), ("assigned", cp.assigned_cpus)):
            out[(name, "online")] = len(cpus & online)
            out[(name, "offline")] = len(cpus - online)
        return out

    def restart_problems(self) -> dict[str, str | None]:
        """reason -> why a restart now would fail (None: it would not), for each checkpoint
        read so far (absent counts as read); nothing before the first kernel snapshot."""
        snap = self.snapshot
        if snap is None:
            return {}
        out: dict[str, str | None] = {}
        if self.cpu_checkpoint is not None:
            out[CPU_MANAGER] = cpu_manager_problem(self.cpu_checkpoint, snap.cpus_online)
        if self.memory_checkpoint is not None:
            out[MEMORY_MANAGER] = memory_manager_problem(self.memory_checkpoint, snap)
        return out

    def restart_blocked(self) -> dict[str, int]:
        return {reason: int(problem is not None)
                for reason, problem in self.restart_problems().items()}

    def cgroup_cpuset(self) -> dict[str, int]:
        pods, snap = self.kubepods, self.snapshot
        if pods is None or snap is None or not pods.path:
            return {}
        online = snap.cpus_online
        return {"online": len(pods.cpus & online), "offline": len(pods.cpus - online),
                "missing": len(online - pods.cpus)}

    def memory_auto_online(self) -> dict[str, int]:
        if not self.auto_online:
            return {}
        return {p: int(p == self.auto_online) for p in AUTO_ONLINE_POLICIES}

    def features(self) -> dict[str, int]:
        return {gate: int(on) for gate, on in sorted(self.gates.items())}

    def capacity_configured(self) -> dict[str, int]:
        """reason -> 1 for the reason of a True CapacityConfigured condition (Accepted,
        EmergencyReduced) or of a False/Unknown one (InProgress, Infeasible); empty while
        the Node has no such condition (every released kubelet)."""
        cond = self.capacity_condition
        if cond is None or not cond.status:
            return {}
        # A reason the KEP does not name is "Other": the label set stays bounded.
        reason = cond.reason if cond.reason in CAPACITY_REASONS else "Other"
        return {r: int(r == reason) for r in CAPACITY_REASONS + ("Other",)}

    def warning_events(self) -> dict[str, tuple[int, float | None]]:
        """reason -> (occurrences in the Events the API holds now, newest one's time)."""
        return {r: (w.occurrences, w.last_seen) for r, w in sorted(self.warnings.items())}
