"""What a resize did to the pods that keep running: containers left in a state the kubelet
would not create today. Pure: events in, findings out; no I/O, no clock.

The kubelet sizes a container once, when it creates it, from the machine it saw at start-up,
and does not revisit it when CPUs or memory come and go (KEP-5578 lists what it would have to
recompute; KEP-3953 leaves OOM score adjustments "allowed to drift" even once it resyncs). So
only an observer sees these, each judged against the kubelet's own rules on today's kernel:

- `oom_score_adj`: a Burstable container's OOM score adjustment is
  1000 - 1000 * memoryRequest / memoryCapacity (pkg/kubelet/qos/policy.go
  GetContainerOOMScoreAdjust; capacity is MemTotal), so it is stale once MemTotal moves.
  Counted only when the score is the one the kubelet computes for ANOTHER capacity the node
  had (a MemTotal this view saw before, or today's with offline memory blocks back), never
  merely because it differs: a process may raise its own score (998 -> 999) and no resize
  made it so. A score that changed while no capacity change was seen is the process's own.
  Guaranteed (-997), BestEffort (1000) and node-critical pods do not depend on capacity;
- `cpuset_offline`, `cpuset_missing`: a cpuset naming CPUs that are offline, or lacking online
  CPUs of the shared pool (on cgroup v1 the kernel never puts an offlined CPU back); the pool
  is the online CPUs less the CPU manager's exclusive ones (its checkpoint, else inferred);
- `cpu_limit_above_online`, `memory_limit_above_capacity`: a CFS quota worth more CPUs than are
  online, a memory limit above MemTotal;
- `swap_limit`: under LimitedSwap a Burstable container may swap
  memoryRequest / MemTotal * SwapTotal (pkg/kubelet/kuberuntime calcSwapForBurstablePods).

Not judged: pods with pod-level resources (KEP-2837 spreads the pod's request over its
containers; PodStatus does not carry it) and DRA memory claims: both are rare, and would need
more of the Pod than the watch converts.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from exporter.events import (
    ContainerCgroup,
    ContainerSizing,
    CpuManagerCheckpoint,
    Event,
    KernelSnapshot,
    PodsRelisted,
    PodStatus,
    RunningContainers,
)

KINDS = ("oom_score_adj", "cpuset_offline", "cpuset_missing", "cpu_limit_above_online",
         "memory_limit_above_capacity", "swap_limit")

# pkg/kubelet/qos/policy.go
GUARANTEED_OOM_SCORE_ADJ = -997
BESTEFFORT_OOM_SCORE_ADJ = 1000
TIE_BREAK_FLOOR = 64 * 1024 * 1024  # oomScoreAdjTieBreakFloor (gate KubeletOOMScoreAdjTieBreak)

PAGE = 4096  # the kernel rounds memory.swap.max down to pages
CAPACITIES_KEPT = 8  # earlier MemTotal values remembered as capacities the kubelet may have used
TIE_BREAK_SPAN = 16  # the tie-break lowers a score by at most log2(capacity / 64 GiB) + 1 points
CPU_SLACK = 0.001  # a quota is microseconds over a period: no float noise makes a finding


def _log2_floor(x: int) -> int:
    return x.bit_length() - 1 if x >= 1 else 0


def _linear(memory_request: int, capacity: int) -> int:
    # Go's integer division truncates toward zero; both operands are >= 0 here.
    return 1000 - (1000 * memory_request) // capacity


def _tie_break(linear: int, memory_request: int, memory_limit: int, capacity: int) -> int:
    """tieBreakOOMScoreAdjust: at most a few points below the linear value, so requests
    smaller than one adj point (capacity/1000) still rank."""
    max_nudge = _log2_floor(capacity // 1000 // TIE_BREAK_FLOOR)
    adj = linear - min(_log2_floor(memory_request // TIE_BREAK_FLOOR), max_nudge)
    if 0 < memory_limit <= memory_request:
        adj -= max_nudge + 1
    return adj


def _clamp(adj: int) -> int:
    if adj < 1000 + GUARANTEED_OOM_SCORE_ADJ:
        return 1000 + GUARANTEED_OOM_SCORE_ADJ
    if adj == BESTEFFORT_OOM_SCORE_ADJ:  # Burstable survives before BestEffort
        return adj - 1
    return adj


@functools.lru_cache(maxsize=8192)
def container_oom_score_adj(qos_class: str, memory_request: float, capacity: int, *,
                            node_critical: bool = False, memory_limit: float = 0,
                            sidecar_min_request: float | None = None,
                            tie_break: bool = False) -> int:
    """The oom_score_adj the kubelet gives a container it creates on a node of `capacity`
    bytes (MemTotal). `sidecar_min_request`: for a sidecar, the smallest memory request of the
    pod's app containers (its score may not be above theirs)."""
    if node_critical or qos_class == "Guaranteed":
        return GUARANTEED_OOM_SCORE_ADJ
    if qos_class == "BestEffort":
        return BESTEFFORT_OOM_SCORE_ADJ
    if capacity <= 0:
        raise ValueError("memory capacity must be positive")
    request, limit = max(0, int(memory_request)), max(0, int(memory_limit))
    adj = _linear(request, capacity)
    if tie_break:
        adj = _tie_break(adj, request, limit, capacity)
    if sidecar_min_request is not None:
        # The tie-break compares with every app container's tie-broken score; without their
        # limits the smallest request's linear score is the bound used here.
        adj = min(adj, _linear(max(0, int(sidecar_min_request)), capacity))
    return _clamp(adj)


def possible_oom_score_adjs(qos_class: str, memory_request: float, capacity: int, *,
                            node_critical: bool = False, memory_limit: float = 0,
                            sidecar_min_request: float | None = None) -> frozenset[int]:
    """What the kubelet would set today with the KubeletOOMScoreAdjTieBreak gate off and on
    (the exporter cannot see the kubelet's gates; either value is one it could create)."""
    return frozenset(container_oom_score_adj(
        qos_class, memory_request, capacity, node_critical=node_critical,
        memory_limit=memory_limit, sidecar_min_request=sidecar_min_request, tie_break=tb)
        for tb in (False, True))


def limited_swap(qos_class: str, memory_request: float, memory_limit: float, capacity: int,
                 swap_total: int, *, node_critical: bool = False) -> int:
    """The swap limit in bytes LimitedSwap gives a container on a node of `capacity` bytes of
    memory and `swap_total` of swap: a share of swap in proportion to its memory request for
    Burstable containers that request memory below their limit, else none."""
    request = max(0, int(memory_request))
    if (qos_class != "Burstable" or node_critical or request == 0 or capacity <= 0
            or request == int(memory_limit) or request > capacity):
        return 0
    return int(request / capacity * swap_total)


@dataclass(frozen=True)
class Finding:
    kind: str
    namespace: str
    pod: str
    container: str  # the container's name, or its id's first 12 digits when the pod is unknown
    detail: str

    def line(self) -> str:
        return f"{self.namespace}/{self.pod} {self.container}: {self.detail}"


def _cpus(cpus: Iterable[int]) -> str:
    ordered = sorted(cpus)
    return ",".join(str(c) for c in ordered[:16]) + (",..." if len(ordered) > 16 else "")


@dataclass
class RunningPodsView:
    """The latest scan, the pods the watch delivered and the kernel's truth, joined."""

    snapshot: KernelSnapshot | None = None
    scan: RunningContainers | None = None
    assigned_cpus: frozenset[int] = frozenset()  # the CPU manager's exclusive CPUs
    checkpoint: bool = False  # a CPU manager checkpoint was read (else they are inferred)
    pods: dict[str, PodStatus] = field(default_factory=dict)  # by uid
    # MemTotal values seen before today's, newest last (capacities the kubelet may have used),
    # and how many times it changed (an epoch: "no resize since" is "same epoch").
    capacities: list[int] = field(default_factory=list)
    capacity_changes: int = 0
    # container id -> (the score first seen, the epoch then): the kubelet writes a score once,
    # when it creates the container; a later change without a resize is the process's own.
    _first_scores: dict[str, tuple[int, int]] = field(default_factory=dict, repr=False)
    # The findings of the state above, kept until an event changes it: a scrape every few
    # seconds re-judges nothing (4096 containers take ~0.1 s to judge on a loaded machine).
    _findings: list[Finding] | None = field(default=None, repr=False)

    # Bumped by every event that changes the findings: a copy is current while it matches.
    version: int = 0

    def handle(self, event: Event) -> None:
        if isinstance(event, (KernelSnapshot, RunningContainers, PodStatus, PodsRelisted,
                              CpuManagerCheckpoint)):
            self._findings = None
            self.version += 1
        if isinstance(event, KernelSnapshot):
            last = self.snapshot
            if last is not None and last.mem_total_bytes != event.mem_total_bytes:
                self.capacity_changes += 1
                if last.mem_total_bytes in self.capacities:
                    self.capacities.remove(last.mem_total_bytes)
                self.capacities = [*self.capacities, last.mem_total_bytes][-CAPACITIES_KEPT:]
            self.snapshot = event
        elif isinstance(event, RunningContainers):
            self.scan = event
            self._remember_scores(event)
        elif isinstance(event, PodStatus):
            if event.deleted:
                self.pods.pop(event.uid, None)
            else:
                self.pods[event.uid] = event
        elif isinstance(event, PodsRelisted):
            self.pods = {uid: p for uid, p in self.pods.items() if uid in event.uids}
        elif isinstance(event, CpuManagerCheckpoint):
            self.assigned_cpus = event.assigned_cpus if event.static else frozenset()
            self.checkpoint = event.present and not event.error

    def _remember_scores(self, scan: RunningContainers) -> None:
        first = {}
        for cg in scan.containers:
            if cg.oom_score_adj is not None:
                first[cg.container_id] = self._first_scores.get(
                    cg.container_id, (cg.oom_score_adj, self.capacity_changes))
        self._first_scores = first  # only the containers running now: bounded by the scan

    def _changed_by_itself(self, cg: ContainerCgroup) -> bool:
        """The score moved since this view first saw the container, with no capacity change
        in between: the process's (or a tenant's) doing; the kubelet never rewrites it."""
        seen = self._first_scores.get(cg.container_id)
        return seen is not None and seen[0] != cg.oom_score_adj \
            and seen[1] == self.capacity_changes

    # ------------------------------------------------------------ copies

    def copy(self) -> "RunningPodsView":
        """A copy the view's later events do not change (taken under the keeper's lock, read
        with none): the pods' map copied, the scan and the kernel shared (immutable)."""
        return dataclasses.replace(self, pods=dict(self.pods), capacities=list(self.capacities))

    def what_if(self, snapshot: KernelSnapshot,
                scan: RunningContainers | None = None) -> "RunningPodsView":
        """This view on another kernel (and, given, another scan): a new view to ask for
        findings; this one is left as it was."""
        return dataclasses.replace(self, snapshot=snapshot,
                                   scan=self.scan if scan is None else scan, _findings=None)

    # ------------------------------------------------------------ values

    def findings(self) -> list[Finding]:
        """Every container in a state the kubelet would not create today, by kind, in scan
        order; nothing before the first scan and kernel snapshot."""
        if self._findings is None:
            self._findings = self._judge_all()
        return self._findings

    def _judge_all(self) -> list[Finding]:
        scan, snap = self.scan, self.snapshot
        if scan is None or snap is None:
            return []
        out: list[Finding] = []
        assigned = self.assigned_cpus if self.checkpoint else _inferred_exclusive(scan)
        for cg in scan.containers:
            pod = self.pods.get(cg.pod_uid)
            sizing = _sizing(pod, cg.container_id)
            ns, name = (pod.namespace, pod.name) if pod is not None else ("?", cg.pod_uid[:36])
            cname = sizing.name if sizing is not None else cg.container_id[:12]
            # None: the score moved by itself, no resize can have left it so
            older = None if self._changed_by_itself(cg) else self.capacities
            for kind, detail in _judge(cg, pod, sizing, snap, assigned, older):
                out.append(Finding(kind, ns, name, cname, detail))
        return out

    def counts(self) -> dict[str, int]:
        """kind -> containers (every kind, 0 included); empty before the first scan."""
        if self.scan is None or self.snapshot is None:
            return {}
        counts = dict.fromkeys(KINDS, 0)
        for finding in self.findings():
            counts[finding.kind] += 1
        return counts

    def containers(self) -> int | None:
        return None if self.scan is None else len(self.scan.containers)


def _inferred_exclusive(scan: RunningContainers) -> frozenset[int]:
    """Without the CPU manager's checkpoint: CPUs only guaranteed containers hold. Under the
    static policy those are its exclusive CPUs (shared-pool containers all have the default
    set); under the none policy every container has every CPU, and this is empty."""
    guaranteed: set[int] = set()
    shared: set[int] = set()
    for cg in scan.containers:
        if cg.cpus:
            (guaranteed if cg.qos == "guaranteed" else shared).update(cg.cpus)
    return frozenset(guaranteed - shared)


def _sizing(pod: PodStatus | None, container_id: str) -> ContainerSizing | None:
    if pod is None or not container_id:
        return None
    return next((c for c in pod.containers if c.container_id == container_id), None)


_QOS = {"guaranteed": "Guaranteed", "burstable": "Burstable", "besteffort": "BestEffort"}


def _another_capacity(score: int, today: int, snap: KernelSnapshot, older: Iterable[int],
                      scores_at: Callable[[int], frozenset[int]]) -> int | None:
    """A capacity other than `today` the node had, for which the kubelet computes `score`
    (`scores_at(capacity)`): one of the `older` MemTotal values, or today's with k of the
    offline memory blocks back online. None: no such capacity; the score is not a resize's."""
    for capacity in older:
        if capacity != today and capacity > 0 and score in scores_at(capacity):
            return capacity
    block, offline = snap.memory_block_size, len(snap.memory_blocks_offline)
    if block <= 0 or not offline:
        return None
    # The linear score q = 1000 - floor(1000 * request / C) is monotone in C, so the k giving
    # a score near `score` lie in a few intervals: solve for them, then check those k exactly
    # (the tie-break lowers the linear score by a few points, TIE_BREAK_SPAN at most).
    for k in _blocks_near(score, today, block, offline, scores_at):
        capacity = today + k * block
        if score in scores_at(capacity):
            return capacity
    return None


def _blocks_near(score: int, today: int, block: int, offline: int,
                 scores_at: Callable[[int], frozenset[int]]) -> list[int]:
    """Candidate numbers of blocks (1..offline) by bisection on the capacity: the k where
    the kubelet's highest score at today + k blocks first reaches `score`, and its
    neighbours."""
    def top(k: int) -> int:
        return max(scores_at(today + k * block))

    out: list[int] = []
    for target in range(score, min(score + TIE_BREAK_SPAN, 1000) + 1):
        lo, hi = 1, offline
        if top(hi) < target:  # the score rises with capacity: out of reach
            continue
        while lo < hi:
            mid = (lo + hi) // 2
            if top(mid) >= target:
                hi = mid
            else:
                lo = mid + 1
        out.extend(k for k in (lo - 1, lo, lo + 1) if 1 <= k <= offline and k not in out)
    return out


def _judge(cg: ContainerCgroup, pod: PodStatus | None, sizing: ContainerSizing | None,
           snap: KernelSnapshot, assigned: frozenset[int],
           older: Iterable[int] | None = ()) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    capacity, online = snap.mem_total_bytes, snap.cpus_online
    qos = (pod.qos_class if pod is not None and pod.qos_class else _QOS.get(cg.qos, ""))
    critical = pod is not None and pod.node_critical
    # (a) Only a Burstable score depends on capacity; it needs the container's request.
    if (cg.oom_score_adj is not None and sizing is not None and pod is not None
            and qos == "Burstable" and not critical and capacity > 0 and older is not None):
        apps = [c.memory_request for c in pod.containers if not c.sidecar]
        request, limit = sizing.memory_request, sizing.memory_limit
        sidecar_min = min(apps) if sizing.sidecar and apps else None

        def scores_at(c: int) -> frozenset[int]:
            return possible_oom_score_adjs(qos, request, c, memory_limit=limit,
                                           sidecar_min_request=sidecar_min)

        want = scores_at(capacity)
        if cg.oom_score_adj not in want:
            if _another_capacity(cg.oom_score_adj, capacity, snap, older,
                                 scores_at) is not None:
                out.append(("oom_score_adj", f"oom_score_adj {cg.oom_score_adj}, the kubelet "
                            f"would set {min(want)} on today's {capacity} bytes"))
    # (b) The shared pool is every online CPU no container holds exclusively; a container
    # whose cpuset lies within the CPU manager's exclusive CPUs is not in the pool.
    if cg.cpus is not None and cg.cpus:
        offline = cg.cpus - online
        if offline:
            out.append(("cpuset_offline", f"cpuset names offline CPU(s) {_cpus(offline)}"))
        exclusive = bool(assigned) and cg.cpus <= assigned
        missing = online - cg.cpus - assigned
        if missing and not exclusive:
            out.append(("cpuset_missing", f"cpuset lacks online CPU(s) {_cpus(missing)}"))
    # (c)
    if cg.cpu_limit is not None and online and cg.cpu_limit > len(online) + CPU_SLACK:
        out.append(("cpu_limit_above_online", f"CPU limit {cg.cpu_limit:g} cores, "
                    f"{len(online)} online"))
    if cg.memory_limit is not None and capacity > 0 and cg.memory_limit > capacity:
        out.append(("memory_limit_above_capacity", f"memory limit {cg.memory_limit} bytes, "
                    f"the kernel has {capacity}"))
    # (d) A container LimitedSwap gave swap (a limit above 0): its share of today's swap.
    if cg.swap_limit and sizing is not None and capacity > 0:
        want_swap = limited_swap(qos, sizing.memory_request, sizing.memory_limit, capacity,
                                 snap.swap_total_bytes, node_critical=critical)
        if abs(cg.swap_limit - want_swap) > PAGE:
            out.append(("swap_limit", f"swap limit {cg.swap_limit} bytes, LimitedSwap would "
                        f"give {want_swap} on today's memory and swap"))
    return out
