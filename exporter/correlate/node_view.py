"""The node as both sides see it now: the kernel's snapshot beside the Node, its pods, and the
kubelet's podresources. The gauges /metrics shows are read from here at scrape time.

Pure: the Correlator feeds it events in order (no I/O); the clock, injected, only dates the
drift. The episode tracker reads it to judge resync and readmission, never writes it.
"""
from __future__ import annotations

from collections.abc import Iterator

from exporter.clock import Clock
from exporter.correlate.config import CorrelatorConfig
from exporter.correlate.kube_view import NodeCapacity, PodView, subtract
from exporter.events import (
    HEARTBEAT_VIA,
    KernelSnapshot,
    NodeHeartbeat,
    NodeStatus,
    PodResourcesAllocatable,
    PodsRelisted,
    PodStatus,
    Resource,
)

# Resources /proc and sysfs always report (hugepage sizes only when the kernel has them).
_ALWAYS_REPORTED = frozenset({Resource.CPU, Resource.MEMORY, Resource.SWAP})


class NodeView:
    def __init__(self, config: CorrelatorConfig, clock: Clock) -> None:
        self._config = config
        self._clock = clock
        self.snapshot: KernelSnapshot | None = None
        self.node = NodeCapacity()
        self.pods = PodView()
        self._podresources: frozenset[int] | None = None
        self._drift_since: dict[Resource, float] = {}
        self._drift_inputs: tuple[object, object] | None = None  # see _note_drift
        # The kubelet's last heartbeat by where it was read (HEARTBEAT_VIA)
        self._heartbeat: dict[str, float] = {}

    # ------------------------------------------------------------ fed by the Correlator

    def on_snapshot(self, snap: KernelSnapshot) -> None:
        self.snapshot = snap
        self._note_drift(snap.time)

    def on_node(self, node: NodeStatus) -> None:
        self.node.update(node)
        self._note_drift(node.time)
        if node.heartbeat is not None:
            self._heartbeat["node_status"] = node.heartbeat

    def on_heartbeat(self, beat: NodeHeartbeat) -> None:
        if beat.via in HEARTBEAT_VIA:  # a closed set: the label stays bounded
            self._heartbeat[beat.via] = beat.heartbeat

    def on_pod(self, pod: PodStatus) -> PodStatus | None:
        """Apply the pod; returns what the view held for it before (None: first sight)."""
        prev = self.pods.get(pod.uid)
        self.pods.apply(pod)
        return prev

    def on_relist(self, relist: PodsRelisted) -> None:
        self.pods.relist(relist.uids)

    def on_podresources(self, alloc: PodResourcesAllocatable) -> None:
        # An empty list is what a kubelet without the static CPU manager returns: not reported.
        self._podresources = alloc.cpu_ids or None

    # ------------------------------------------------------------ read by the episode tracker

    def kubelet(self, resource: Resource) -> float | None:
        """The Node's status.capacity for `resource` (None: no Node seen, or not reported)."""
        return self.node.capacity(resource)

    def kubelet_since(self, resource: Resource) -> float:
        """First delivery of the Node's current capacity value (only when kubelet() is known)."""
        return self.node.since[resource]

    def active_pods(self) -> Iterator[PodStatus]:
        return self.pods.active()

    # ------------------------------------------------------------ gauges

    def kubelet_capacity(self) -> dict[Resource, float]:
        status = self.node.status
        return {} if status is None else {r: float(v) for r, v in status.capacity.items()}

    def kubelet_allocatable(self) -> dict[Resource, float]:
        status = self.node.status
        return {} if status is None else {r: float(v) for r, v in status.allocatable.items()}

    def drift(self) -> dict[Resource, float]:
        snap = self.snapshot
        if snap is None:
            return {}
        return {r: snap.capacity(r) - kubelet for r, kubelet in self.kubelet_capacity().items()
                if r in _ALWAYS_REPORTED or r in snap.hugepages_bytes}

    def drift_seconds(self) -> dict[Resource, float]:
        now = self._clock.now()
        return {r: (max(0.0, now - self._drift_since[r]) if r in self._drift_since else 0.0)
                for r in self.drift()}

    def balloon_pods(self) -> int:
        return len(self.pods.balloons())

    def balloon_requests(self, view: str = "scheduler") -> dict[Resource, float]:
        """What balloon pods hold as the scheduler or the kubelet counts it (kube_view.VIEWS)."""
        return self.pods.balloon_requests(view)

    def effective(self) -> dict[Resource, float]:
        """Allocatable minus balloons in the scheduler's view: what it will place pods on."""
        return subtract(self.kubelet_allocatable(), self.balloon_requests("scheduler"))

    def heartbeat(self, via: str = "node_status") -> float | None:
        """The kubelet's last heartbeat (wall seconds) read via the Node's Ready condition or
        its Lease; None before one is seen."""
        return self._heartbeat.get(via)

    def heartbeat_age(self, via: str = "node_status") -> float | None:
        """Seconds since that heartbeat by the injected clock (0 if it is in our future)."""
        beat = self.heartbeat(via)
        return None if beat is None else max(0.0, self._clock.now() - beat)

    def podresources_allocatable_cpus(self) -> int | None:
        return None if self._podresources is None else len(self._podresources)

    def podresources_offline_cpus(self) -> int | None:
        if self._podresources is None or self.snapshot is None:
            return None
        return len(self._podresources - self.snapshot.cpus_online)

    # ------------------------------------------------------------ helpers

    def _note_drift(self, when: float) -> None:
        """Keep, per resource, since when the kernel and the Node disagree (drift() != 0).
        Runs on every snapshot and Node update: written out rather than through drift()."""
        since = self._drift_since
        snap, status = self.snapshot, self.node.status
        # What it is a function of: the kernel's capacities (the fields KernelSnapshot.capacity
        # reads) and the Node's. Most snapshots and Node updates repeat the last values, and
        # then nothing here can change.
        inputs = (None if snap is None else (len(snap.cpus_online), snap.mem_total_bytes,
                                             snap.swap_total_bytes, snap.hugepages_bytes),
                  None if status is None else status.capacity)
        if inputs == self._drift_inputs:
            return
        self._drift_inputs = inputs
        if snap is None or status is None:
            since.clear()
            return
        within = self._config.within
        capacity = status.capacity
        for resource in list(since):
            if resource not in capacity:
                del since[resource]
        for resource, kubelet in capacity.items():
            if resource not in _ALWAYS_REPORTED and resource not in snap.hugepages_bytes:
                since.pop(resource, None)
            elif within(resource, snap.capacity(resource) - float(kubelet), 0.0):
                since.pop(resource, None)
            else:
                since.setdefault(resource, when)
