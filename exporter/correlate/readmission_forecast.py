"""Before acting: which pods the next kubelet restart would reject, and why.

A kubelet caches the machine's capacity when it starts, so after a hot-unplug the Node still
shows the old capacity and nothing is rejected, until the kubelet restarts: then it readmits
every pod bound to the node against the capacity it finds, and rejects what no longer fits
(measured on kubelet v1.36 with cpu1 offlined: both 500m pods Failed, OutOfcpu). This module
computes that verdict beforehand, from what the exporter already sees: the kernel's capacity
now (KernelSnapshot), the kubelet's reservations (the Node's status.capacity minus
status.allocatable, which a restart keeps), maxPods (status.allocatable.pods), the CPU manager
policy (its checkpoint) and the pods with what they would be admitted against
(PodStatus.admission_requests, exporter/kube/convert.py).

It follows Kubernetes v1.36:
- pkg/kubelet/kubelet.go HandlePodAdditions: pods sorted by creation time
  (sliceutils.PodsByCreationTime; equal timestamps, one-second resolution, in an order Go's
  sort does not define: here by namespace and name), each admitted against the pods admitted
  before it; a rejected pod is terminal and holds nothing (filterOutInactivePods).
- the admit handlers in the order NewMainKubelet adds them: the container manager's resource
  allocator first (the static CPU manager needs whole CPUs from the online CPUs minus the
  reserved ones for a Guaranteed pod's integer CPU requests; "not enough cpus available"
  becomes UnexpectedAdmissionError, pkg/kubelet/cm/admission GetPodAdmitResult), then
  pkg/kubelet/lifecycle/predicate.go predicateAdmitHandler.Admit -> generalFilter ->
  scheduler AdmissionCheck -> pkg/scheduler/framework/plugins/noderesources fitsRequest:
  pods first (len(pods)+1 > allowedPodNumber), then cpu, memory, then scalar resources
  (hugepages); only requests above 0 are checked; the first failure names the reason
  (OutOfpods, OutOfcpu, OutOfmemory, OutOfhugepages-2Mi, OutOfhugepages-1Gi).
- k8s.io/component-helpers/resource PodRequests for a pod's requests (convert.py).
- the kubelet's allocatable: capacity minus reservations, never below 0
  (pkg/kubelet/cm/node_container_manager_linux.go GetNodeAllocatableAbsolute).

Where it can be wrong (docs/runbooks.md "Before you restart the kubelet" says the same):
critical pods (priority >= 2000000000, static and mirror pods) that do not fit make the
kubelet evict lower-priority pods to admit them (preemption.CriticalPodAdmissionHandler), which
this does not model; device plugins, extended resources and DRA are not counted; the topology
manager and the memory manager may refuse what fits here (NUMA alignment); the static CPU
manager is judged by CPU counts, not topology (full-pcpus-only, SMT alignment); static pods
the API server does not know of are not seen; pods deleted or created meanwhile change the
answer; pods created in the same second are ordered here by name; the kubelet's
configuration may change with the restart (the reservations are the old ones).

A store and a pure judge. `judge(pods, kernel, node, static)` is the verdict, pure: today's,
the one an episode keeps and a plan's on a hypothetical kernel are three calls with three
kernels, nothing saved or restored. ReadmissionForecast is the store the Correlator feeds:
on its per-event path an input is only noted (a reference); when a result or a view is asked
for (a scrape, an episode's resync) the pods noted since are applied, kept with their
requests as integers (milli-CPU, bytes) in readmission order (insertion by bisection, one
sort after a list) with running totals; `view()` hands them out as one immutable value in
O(1) (the list is copied when it next changes), so a scrape or a plan judges with no lock
held. When everything fits (the common case) the answer is O(1), otherwise one pass over the
pods; nothing is judged again while no input changed (bench/forecast.py).
"""
from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from math import ceil, isfinite

from exporter.events import CpuManagerCheckpoint, KernelSnapshot, NodeStatus, PodStatus, Resource

TERMINAL = frozenset({"Succeeded", "Failed"})

# The kubelet's reasons, and the resource label each is shown with (a closed set).
OUT_OF_PODS, OUT_OF_CPU, OUT_OF_MEMORY = "OutOfpods", "OutOfcpu", "OutOfmemory"
OUT_OF_HUGEPAGES_2MI, OUT_OF_HUGEPAGES_1GI = "OutOfhugepages-2Mi", "OutOfhugepages-1Gi"
CPU_MANAGER = "UnexpectedAdmissionError"  # the static CPU manager's "not enough cpus"
REASON_RESOURCE: Mapping[str, str] = {
    OUT_OF_PODS: "pods", OUT_OF_CPU: "cpu", OUT_OF_MEMORY: "memory",
    OUT_OF_HUGEPAGES_2MI: "hugepages-2Mi", OUT_OF_HUGEPAGES_1GI: "hugepages-1Gi",
    CPU_MANAGER: "cpu",
}
_PENDING_MAX = 4096  # pod events noted before they are applied without being asked
_RESORT_AT = 64  # pods changed at once past which the order is sorted again, not bisected
LISTED_MAX = 20  # rejected pods named one by one (metrics, journal); the rest are counted

_ORDERED = ((Resource.CPU, OUT_OF_CPU), (Resource.MEMORY, OUT_OF_MEMORY),
            (Resource.HUGEPAGES_2MI, OUT_OF_HUGEPAGES_2MI),
            (Resource.HUGEPAGES_1GI, OUT_OF_HUGEPAGES_1GI))


@dataclass(frozen=True)
class ForecastRejection:
    namespace: str
    name: str
    uid: str
    reason: str  # one of REASON_RESOURCE


@dataclass(frozen=True)
class Forecast:
    """What a kubelet restart now would do with the pods bound to this node."""

    time: float  # the newest input it was computed from (wall seconds)
    pods: int  # pods the kubelet would readmit or reject (not terminal, requests readable)
    rejected_total: int
    by_reason: Mapping[str, int] = field(default_factory=dict)  # every reason possible: 0 too
    rejected: tuple[ForecastRejection, ...] = ()  # the first LISTED_MAX, in readmission order
    skipped: int = 0  # pods left out: requests not finite or negative

    @property
    def unlisted(self) -> int:
        return self.rejected_total - len(self.rejected)


# One pod as the forecast keeps it: (creation time, namespace, name, uid) -- its readmission
# order, uid unique so a comparison never goes further -- then its requests (milli-CPU,
# memory, hugepages-2Mi, hugepages-1Gi bytes) and the whole CPUs the static CPU manager pins.
# A plain tuple, kept sorted in one list: the pass over 10,000 pods unpacks it in place.
_Pod = tuple[float, str, str, str, int, int, int, int, int]


_R_CPU, _R_MEM, _R_HP2, _R_HP1 = (Resource.CPU, Resource.MEMORY, Resource.HUGEPAGES_2MI,
                                  Resource.HUGEPAGES_1GI)
_INF = float("inf")


def _milli(cores: float) -> int:
    """Cores -> milli-CPU rounded up, as resource.Quantity.MilliValue; the float error of
    a decimal quantity (0.1 * 1000 = 100.00000000000001) is not a milli-CPU more."""
    return ceil(cores * 1000.0 - 1e-6)


def _bytes(value: float) -> int:
    return ceil(value - 1e-6)


def _need(requests: Mapping[Resource, float]) -> tuple[int, int, int, int] | None:
    """The pod's requests as integers; None when one is not a finite, non-negative number.
    On every pod event: written out, one comparison chain for all four."""
    get = requests.get
    try:
        cpu, mem, hp2, hp1 = get(_R_CPU, 0.0), get(_R_MEM, 0.0), get(_R_HP2, 0.0), \
            get(_R_HP1, 0.0)
        if not (0.0 <= cpu < _INF and 0.0 <= mem < _INF and 0.0 <= hp2 < _INF
                and 0.0 <= hp1 < _INF):  # NaN fails every comparison
            return None
        return _milli(cpu), _bytes(mem), _bytes(hp2), _bytes(hp1)
    except TypeError:  # not a number at all (a hand-made event)
        return None


# ---------------------------------------------------------------- the pure judge


@dataclass(frozen=True)
class Pods:
    """The pods a forecast keeps, as one immutable value: in readmission order, their requests
    summed, how many were left out, and the newest input the store took (wall seconds)."""

    order: Sequence[_Pod] = ()
    sums: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)
    skipped: int = 0
    time: float = 0.0


@dataclass(frozen=True)
class Kernel:
    """What the kubelet would find at a restart: online CPUs, MemTotal, hugepages by size."""

    cpus: int
    memory: int
    hugepages: Mapping[Resource, int]

    @classmethod
    def of(cls, snap: KernelSnapshot) -> "Kernel":
        return cls(len(snap.cpus_online), snap.mem_total_bytes, snap.hugepages_bytes)


Offered = tuple[tuple[int, int, int, int], int | None, int]


def offered(kernel: Kernel | None, node: NodeStatus | None) -> Offered | None:
    """What a restarted kubelet would offer: (milli-CPU, memory, hugepages-2Mi and -1Gi
    bytes), maxPods (None: unbounded), and whole CPUs its static CPU manager could pin; None
    without a kernel or a Node."""
    if kernel is None or node is None:
        return None
    capacity = {Resource.CPU: float(kernel.cpus), Resource.MEMORY: float(kernel.memory)}
    for size in (Resource.HUGEPAGES_2MI, Resource.HUGEPAGES_1GI):
        if size in kernel.hugepages:
            capacity[size] = float(kernel.hugepages[size])
        elif size in node.capacity:  # the kernel did not say: the Node's own figure
            capacity[size] = float(node.capacity[size])
    out = []
    reserved_cpu = 0.0
    for resource, _ in _ORDERED:
        reserved = float(node.capacity.get(resource, 0.0)) - \
            float(node.allocatable.get(resource, node.capacity.get(resource, 0.0)))
        reserved = max(0.0, reserved) if isfinite(reserved) else 0.0
        if resource is Resource.CPU:
            reserved_cpu = reserved
        value = max(0.0, capacity.get(resource, 0.0) - reserved)
        out.append(_milli(value) if resource is Resource.CPU else _bytes(value))
    pool = max(0, kernel.cpus - ceil(round(reserved_cpu, 3)))  # numReservedCPUs, rounded up
    return (out[0], out[1], out[2], out[3]), node.max_pods, pool


def possible_reasons(kernel: Kernel | None, node: NodeStatus | None,
                     static: bool) -> tuple[str, ...]:
    """The reasons a restart could give on this node, for gauges initialised at 0: pods,
    cpu and memory always; a hugepage size the kernel or the Node has; the CPU manager's
    when its policy is static."""
    out = [OUT_OF_PODS, OUT_OF_CPU, OUT_OF_MEMORY]
    for resource, reason in _ORDERED[2:]:
        if (kernel is not None and kernel.hugepages.get(resource, 0) > 0) or \
                (node is not None and float(node.capacity.get(resource, 0.0)) > 0):
            out.append(reason)
    if static:
        out.append(CPU_MANAGER)
    return tuple(out)


def judge(pods: Pods, kernel: Kernel | None, node: NodeStatus | None,
          static: bool) -> Forecast | None:
    """What a kubelet restart would do with `pods` on `kernel`, given the Node's reservations
    and maxPods and whether the CPU manager's policy is static. Pure: the same inputs, the same
    Forecast; None without a kernel or a Node."""
    offer = offered(kernel, node)
    if offer is None:
        return None
    (a_cpu, a_mem, a_hp2, a_hp1), max_pods, pool = offer
    by_reason = dict.fromkeys(possible_reasons(kernel, node, static), 0)
    count = len(pods.order)
    cpu, mem, hp2, hp1, exclusive = pods.sums
    if ((max_pods is None or count <= max_pods) and cpu <= a_cpu and mem <= a_mem
            and hp2 <= a_hp2 and hp1 <= a_hp1 and (not static or exclusive <= pool)):
        # Everything fits together, so each pod fits at its turn: nobody is rejected.
        return Forecast(pods.time, count, 0, by_reason, (), pods.skipped)
    # One pass in readmission order, what is left of each resource kept as a number
    # (never below 0, so a request of 0 always fits, as in fitsRequest).
    room = count if max_pods is None else max_pods
    free_cpu, free_mem, free_hp2, free_hp1, free_x = a_cpu, a_mem, a_hp2, a_hp1, pool
    rejected: list[ForecastRejection] = []
    total = 0
    for _, namespace, name, uid, cpu, mem, hp2, hp1, exclusive in pods.order:
        if exclusive and static and exclusive > free_x:
            reason = CPU_MANAGER
        elif room <= 0:
            reason = OUT_OF_PODS
        elif cpu > free_cpu:
            reason = OUT_OF_CPU
        elif mem > free_mem:
            reason = OUT_OF_MEMORY
        elif hp2 > free_hp2:
            reason = OUT_OF_HUGEPAGES_2MI
        elif hp1 > free_hp1:
            reason = OUT_OF_HUGEPAGES_1GI
        else:
            room -= 1
            free_cpu -= cpu
            free_mem -= mem
            free_hp2 -= hp2
            free_hp1 -= hp1
            if static:
                free_x -= exclusive
            continue
        total += 1
        by_reason[reason] = by_reason.get(reason, 0) + 1
        if len(rejected) < LISTED_MAX:
            rejected.append(ForecastRejection(namespace, name, uid, reason))
    return Forecast(pods.time, count, total, by_reason, tuple(rejected), pods.skipped)


@dataclass(frozen=True, eq=False)
class ForecastView:
    """The forecast's inputs at one moment, immutable: taken under the lock the store is
    written under (ReadmissionForecast.view, O(1)), judged anywhere after with no lock. The
    store hands out the same view until its inputs change, so its result is judged once
    (whoever asks first: a scrape, a plan, an episode) and read by every other."""

    pods: Pods
    kernel: Kernel | None
    node: NodeStatus | None
    static: bool
    generation: int = 0  # the store's, when taken
    # The judge's verdict on these inputs, once asked (a one-slot cache: judging twice at once
    # gives the same Forecast, so no lock is needed).
    _result: list[Forecast | None] = field(default_factory=list, repr=False, compare=False)

    @property
    def node_seen(self) -> bool:
        return self.node is not None

    @property
    def judged(self) -> bool:
        return bool(self._result)

    def result(self) -> Forecast | None:
        """The Forecast on these inputs."""
        if not self._result:
            self._result.append(judge(self.pods, self.kernel, self.node, self.static))
        return self._result[0]

    def allocatable(self) -> Offered | None:
        return offered(self.kernel, self.node)

    def what_if(self, snap: KernelSnapshot) -> tuple[Forecast | None, Offered | None]:
        """The Forecast and what a restarted kubelet would offer on the kernel `snap` (a
        plan's hypothetical one) with these pods and this Node."""
        kernel = Kernel.of(snap)
        result = self.result() if kernel == self.kernel else \
            judge(self.pods, kernel, self.node, self.static)
        return result, offered(kernel, self.node)


# ---------------------------------------------------------------- the store


class ReadmissionForecast:
    """The pods, Node, kernel and CPU manager policy the Correlator feeds it (snapshots, the
    Node, pods, relists, the CPU manager checkpoint); `result()` is the Forecast for the inputs
    so far (judge), or None before both a kernel snapshot and a Node status have been seen.
    `view()` hands the inputs out as one immutable value, for a judge with no lock held."""

    def __init__(self) -> None:
        self._pods: dict[str, _Pod] = {}
        self._order: list[_Pod] = []  # the values of _pods, in readmission order
        self._order_shared = False  # handed out in a view: copied before the next change
        self._sums = (0, 0, 0, 0, 0)  # the requests of every pod kept, summed (as in _Pod)
        self._skipped: set[str] = set()  # uids of pods whose requests are unusable
        self._kernel: Kernel | None = None
        self._node: NodeStatus | None = None
        self._static = False  # the CPU manager's policy is static
        # Inputs arrive on the correlator's per-event path and are only noted there (a
        # reference each); they are applied when a result or a view is asked for.
        self._snap_in: KernelSnapshot | None = None
        self._node_in: NodeStatus | None = None
        self._pods_in: dict[str, PodStatus] = {}  # the latest event of each pod, not applied
        self._time = 0.0
        self._generation = 0  # bumped by every change of the inputs applied
        self._view: ForecastView | None = None  # the last handed out
        self.recomputed = 0  # how often result() did the work (tests, bench)

    # ------------------------------------------------------------ inputs (noted, not applied)

    def on_snapshot(self, snap: KernelSnapshot) -> None:
        self._snap_in = snap

    def on_node(self, node: NodeStatus) -> None:
        self._node_in = node

    def on_pod(self, pod: PodStatus) -> None:
        pending = self._pods_in
        pending[pod.uid] = pod
        if len(pending) > _PENDING_MAX:  # nobody asked for a while (no scrape): apply now,
            self._apply_pods()  # so pods deleted meanwhile are not held

    def on_cpu_manager(self, checkpoint: CpuManagerCheckpoint) -> None:
        static = checkpoint.static
        if static != self._static:
            self._static = static
            self._changed(checkpoint.time)

    def on_relist(self, uids: frozenset[str], when: float) -> None:
        """A relist: pods not in `uids` are gone."""
        self._apply_pods()
        gone = [uid for uid in self._pods if uid not in uids]
        gone_skipped = [uid for uid in self._skipped if uid not in uids]
        if len(gone) > _RESORT_AT:
            self._pods = {uid: p for uid, p in self._pods.items() if uid in uids}
            self._resort()
        else:
            for uid in gone:
                self._remove(uid)
        self._skipped.difference_update(gone_skipped)
        if gone or gone_skipped:
            self._changed(when)

    # ------------------------------------------------------------ output

    def view(self) -> ForecastView:
        """The inputs as they stand, immutable (the pods' list is copied only when it next
        changes), under the writer's lock: the same view as last time while nothing changed."""
        self._apply()
        view = self._view
        if view is None or view.generation != self._generation:
            view = ForecastView(Pods(self._order, self._sums, len(self._skipped), self._time),
                                self._kernel, self._node, self._static, self._generation)
            self._view = view
            self._order_shared = True  # the view holds the list
        return view

    def current(self) -> ForecastView | None:
        """The last view, when nothing was noted or changed since; else None (take view()
        under the writer's lock). Safe without the lock: a reader that finds it still current
        reads the inputs as they were just before an event the writer is noting now."""
        view = self._view
        if view is not None and view.generation == self._generation and \
                self._snap_in is None and self._node_in is None and not self._pods_in:
            return view
        return None

    def result(self) -> Forecast | None:
        view = self.current() or self.view()
        if not view.judged:
            self.recomputed += 1
        return view.result()

    def what_if(self, snap: KernelSnapshot) -> tuple[Forecast | None, Offered | None]:
        """result() and allocatable() on the kernel `snap` instead of the one noted; nothing
        of it is kept (a plan's hypothetical kernel)."""
        return self.view().what_if(snap)

    def allocatable(self) -> Offered | None:
        """What a restarted kubelet would offer (`offered`) on the inputs so far."""
        self._apply()
        return offered(self._kernel, self._node)

    def possible_reasons(self) -> tuple[str, ...]:
        self._apply()
        return possible_reasons(self._kernel, self._node, self._static)

    # ------------------------------------------------------------ applying the inputs

    def _apply(self) -> None:
        snap, node = self._snap_in, self._node_in
        if snap is not None:
            self._snap_in = None
            kernel = Kernel.of(snap)
            if kernel != self._kernel:
                self._kernel = kernel
                self._changed(snap.time)
        if node is not None:
            self._node_in = None
            old = self._node
            if node is not old:
                self._node = node
                if (old is None or old.capacity != node.capacity
                        or old.allocatable != node.allocatable or old.max_pods != node.max_pods):
                    self._changed(node.time)
        if self._pods_in:
            self._apply_pods()

    def _apply_pods(self) -> None:
        pending, self._pods_in = self._pods_in, {}
        if len(pending) > _RESORT_AT:  # many (a list): one sort, not an insertion each
            self._bulk = True
            for pod in pending.values():
                self._apply_pod(pod)
            self._bulk = False
            self._resort()
            return
        for pod in pending.values():
            self._apply_pod(pod)

    _bulk = False  # applying many pods: _order is rebuilt once after them (_resort)

    def _apply_pod(self, pod: PodStatus) -> None:
        uid = pod.uid
        if pod.deleted or pod.phase in TERMINAL:  # holds nothing at a restart
            removed = self._remove(uid)
            if uid in self._skipped:
                self._skipped.discard(uid)
                removed = True
            if removed:
                self._changed(pod.time)
            return
        held = pod.admission_requests
        if held is None:  # an event from before the forecast: what the kubelet allocated
            held = pod.kubelet_requests if pod.kubelet_requests is not None else pod.requests
        need = _need(held)
        if need is None or pod.exclusive_cpus < 0:  # counted and left out
            removed = self._remove(uid)
            if uid not in self._skipped:
                self._skipped.add(uid)
                removed = True
            if removed:
                self._changed(pod.time)
            return
        created = pod.created if pod.created is not None and isfinite(pod.created) \
            else pod.time
        entry: _Pod = (created, pod.namespace, pod.name, uid, *need, pod.exclusive_cpus)
        old = self._pods.get(uid)
        if old == entry and uid not in self._skipped:
            return
        self._skipped.discard(uid)
        self._remove(uid)
        self._pods[uid] = entry
        if not self._bulk:
            bisect.insort(self._writable_order(), entry)
        self._sum(entry, 1)
        self._changed(pod.time)

    # ------------------------------------------------------------ internals

    def _changed(self, when: float) -> None:
        self._generation += 1
        if isfinite(when) and when > self._time:
            self._time = when

    def _writable_order(self) -> list[_Pod]:
        if self._order_shared:  # a view holds this list: leave it as it was
            self._order = list(self._order)
            self._order_shared = False
        return self._order

    def _resort(self) -> None:
        self._order = sorted(self._pods.values())
        self._order_shared = False
        cpu = mem = hp2 = hp1 = exclusive = 0
        for entry in self._order:
            cpu += entry[4]
            mem += entry[5]
            hp2 += entry[6]
            hp1 += entry[7]
            exclusive += entry[8]
        self._sums = (cpu, mem, hp2, hp1, exclusive)

    def _remove(self, uid: str) -> bool:
        old = self._pods.pop(uid, None)
        if old is None:
            return False
        if not self._bulk:
            order = self._writable_order()
            del order[bisect.bisect_left(order, old)]
        self._sum(old, -1)
        return True

    def _sum(self, entry: _Pod, sign: int) -> None:
        cpu, mem, hp2, hp1, exclusive = self._sums
        self._sums = (cpu + sign * entry[4], mem + sign * entry[5], hp2 + sign * entry[6],
                      hp1 + sign * entry[7], exclusive + sign * entry[8])
