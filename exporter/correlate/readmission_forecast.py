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

Pure: events in, a Forecast out; no I/O, no clock (each Forecast is dated by its inputs).
Cheap: pods are kept with their requests as integers (milli-CPU, bytes), in readmission order
(insertion by bisection), with running totals; when everything fits (the common case) the
answer is O(1), otherwise one pass over the pods. Recomputed lazily, only after an input
changed.
"""
from __future__ import annotations

import bisect
from collections.abc import Mapping
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
LISTED_MAX = 20  # rejected pods named one by one (metrics, journal); the rest are counted

# The slots of _Pod.need, in fitsRequest's order after the pod count.
_CPU, _MEM, _HP2, _HP1 = 0, 1, 2, 3
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


@dataclass(frozen=True)
class _Pod:
    key: tuple[float, str, str, str]  # (creation time, namespace, name, uid): the order
    need: tuple[int, int, int, int]  # milli-CPU, memory, hugepages-2Mi, hugepages-1Gi bytes
    exclusive: int  # whole CPUs the static CPU manager pins


def _milli(cores: float) -> int:
    """Cores -> milli-CPU rounded up, as resource.Quantity.MilliValue (0.1 is 100, not 101)."""
    return ceil(round(cores * 1000.0, 3))


def _bytes(value: float) -> int:
    return ceil(round(value, 3))


def _need(requests: Mapping[Resource, float]) -> tuple[int, int, int, int] | None:
    """The pod's requests as integers; None when one is not a finite, non-negative number."""
    values = []
    for resource, _ in _ORDERED:
        value = requests.get(resource, 0.0)
        if not isinstance(value, (int, float)) or not isfinite(value) or value < 0:
            return None
        values.append(value)
    return (_milli(values[0]), _bytes(values[1]), _bytes(values[2]), _bytes(values[3]))


class ReadmissionForecast:
    """Fed by the Correlator (snapshots, the Node, pods, relists, the CPU manager
    checkpoint); `result()` is the Forecast for the inputs so far, or None before both a
    kernel snapshot and a Node status have been seen."""

    def __init__(self) -> None:
        self._pods: dict[str, _Pod] = {}
        self._order: list[tuple[float, str, str, str]] = []  # sorted keys of _pods
        self._sums = [0, 0, 0, 0]
        self._exclusive = 0
        self._skipped: set[str] = set()  # uids of pods whose requests are unusable
        self._kernel: tuple[int, int, Mapping[Resource, int]] | None = None
        self._node: NodeStatus | None = None
        self._static = False  # the CPU manager's policy is static
        self._time = 0.0
        self._cached: Forecast | None = None
        self._dirty = True
        self.recomputed = 0  # how often result() did the work (tests, bench)

    # ------------------------------------------------------------ inputs

    def on_snapshot(self, snap: KernelSnapshot) -> None:
        kernel = (len(snap.cpus_online), snap.mem_total_bytes, snap.hugepages_bytes)
        if kernel != self._kernel:
            self._kernel = kernel
            self._changed(snap.time)

    def on_node(self, node: NodeStatus) -> None:
        old = self._node
        self._node = node
        if (old is None or old.capacity != node.capacity or old.allocatable != node.allocatable
                or old.max_pods != node.max_pods):
            self._changed(node.time)

    def on_cpu_manager(self, checkpoint: CpuManagerCheckpoint) -> None:
        static = checkpoint.present and not checkpoint.error and checkpoint.policy == "static"
        if static != self._static:
            self._static = static
            self._changed(checkpoint.time)

    def on_pod(self, pod: PodStatus) -> None:
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
        entry = _Pod((created, pod.namespace, pod.name, uid), need, pod.exclusive_cpus)
        old = self._pods.get(uid)
        if old == entry and uid not in self._skipped:
            return
        self._skipped.discard(uid)
        self._remove(uid)
        self._pods[uid] = entry
        bisect.insort(self._order, entry.key)
        sums = self._sums
        for i, value in enumerate(need):
            sums[i] += value
        self._exclusive += entry.exclusive
        self._changed(pod.time)

    def on_relist(self, uids: frozenset[str], when: float) -> None:
        """A relist: pods not in `uids` are gone."""
        gone = [uid for uid in self._pods if uid not in uids]
        gone_skipped = [uid for uid in self._skipped if uid not in uids]
        for uid in gone:
            self._remove(uid)
        self._skipped.difference_update(gone_skipped)
        if gone or gone_skipped:
            self._changed(when)

    # ------------------------------------------------------------ output

    def result(self) -> Forecast | None:
        if self._dirty:
            self._cached = self._compute()
            self._dirty = False
            self.recomputed += 1
        return self._cached

    # ------------------------------------------------------------ internals

    def _changed(self, when: float) -> None:
        self._dirty = True
        if isfinite(when) and when > self._time:
            self._time = when

    def _remove(self, uid: str) -> bool:
        old = self._pods.pop(uid, None)
        if old is None:
            return False
        order = self._order
        i = bisect.bisect_left(order, old.key)
        del order[i]
        sums = self._sums
        for j, value in enumerate(old.need):
            sums[j] -= value
        self._exclusive -= old.exclusive
        return True

    def allocatable(self) -> tuple[tuple[int, int, int, int], int | None, int] | None:
        """What a restarted kubelet would offer: (milli-CPU, memory, hugepages-2Mi and -1Gi
        bytes), maxPods (None: unbounded), and whole CPUs its static CPU manager could pin."""
        kernel, node = self._kernel, self._node
        if kernel is None or node is None:
            return None
        cpus, memory, hugepages = kernel
        capacity = {Resource.CPU: float(cpus), Resource.MEMORY: float(memory)}
        for size in (Resource.HUGEPAGES_2MI, Resource.HUGEPAGES_1GI):
            if size in hugepages:
                capacity[size] = float(hugepages[size])
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
        pool = max(0, cpus - ceil(round(reserved_cpu, 3)))  # numReservedCPUs, rounded up
        return (out[0], out[1], out[2], out[3]), node.max_pods, pool

    def possible_reasons(self) -> tuple[str, ...]:
        """The reasons a restart could give on this node, for gauges initialised at 0: pods,
        cpu and memory always; a hugepage size the kernel or the Node has; the CPU manager's
        when its policy is static."""
        out = [OUT_OF_PODS, OUT_OF_CPU, OUT_OF_MEMORY]
        kernel, node = self._kernel, self._node
        for resource, reason in _ORDERED[2:]:
            if (kernel is not None and kernel[2].get(resource, 0) > 0) or \
                    (node is not None and float(node.capacity.get(resource, 0.0)) > 0):
                out.append(reason)
        if self._static:
            out.append(CPU_MANAGER)
        return tuple(out)

    def _compute(self) -> Forecast | None:
        offered = self.allocatable()
        if offered is None:
            return None
        (a_cpu, a_mem, a_hp2, a_hp1), max_pods, pool = offered
        by_reason = dict.fromkeys(self.possible_reasons(), 0)
        pods = len(self._pods)
        sums = self._sums
        static = self._static
        if ((max_pods is None or pods <= max_pods) and sums[_CPU] <= a_cpu
                and sums[_MEM] <= a_mem and sums[_HP2] <= a_hp2 and sums[_HP1] <= a_hp1
                and (not static or self._exclusive <= pool)):
            # Everything fits together, so each pod fits at its turn: nobody is rejected.
            return Forecast(self._time, pods, 0, by_reason, (), len(self._skipped))
        limit = pods + 1 if max_pods is None else max_pods
        admitted = used_cpu = used_mem = used_hp2 = used_hp1 = used_x = 0
        rejected: list[ForecastRejection] = []
        total = 0
        entries = self._pods
        for key in self._order:
            entry = entries[key[3]]
            cpu, mem, hp2, hp1 = entry.need
            exclusive = entry.exclusive
            if static and exclusive and exclusive > pool - used_x:
                reason = CPU_MANAGER
            elif admitted + 1 > limit:
                reason = OUT_OF_PODS
            elif cpu > 0 and cpu > a_cpu - used_cpu:
                reason = OUT_OF_CPU
            elif mem > 0 and mem > a_mem - used_mem:
                reason = OUT_OF_MEMORY
            elif hp2 > 0 and hp2 > a_hp2 - used_hp2:
                reason = OUT_OF_HUGEPAGES_2MI
            elif hp1 > 0 and hp1 > a_hp1 - used_hp1:
                reason = OUT_OF_HUGEPAGES_1GI
            else:
                admitted += 1
                used_cpu += cpu
                used_mem += mem
                used_hp2 += hp2
                used_hp1 += hp1
                if static:
                    used_x += exclusive
                continue
            total += 1
            by_reason[reason] = by_reason.get(reason, 0) + 1
            if len(rejected) < LISTED_MAX:
                rejected.append(ForecastRejection(key[1], key[2], key[3], reason))
        return Forecast(self._time, pods, total, by_reason, tuple(rejected),
                        len(self._skipped))
