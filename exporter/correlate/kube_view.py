"""The Kubernetes side's building blocks: the Node's capacity, the pods, balloon resizes.

Pure state fed by events. NodeView (node_view.py) holds a NodeCapacity and a PodView and
computes the gauges; the episode tracker reads them to judge resync and readmission; the
metrics sink counts balloon resizes with BalloonResizes.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from exporter.events import ContainerResize, NodeStatus, PodStatus, Resource

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

# Whose accounting a balloon's requests are read in. KEP-1287's scheduler counts
# max(spec, allocated, actual) (no spec while a resize is Infeasible); the kubelet what it
# allocated. They differ while a resize is pending or in progress.
VIEWS = ("scheduler", "kubelet")
# Why a balloon resize did not happen, read from the condition's message: a closed set, so the
# label stays bounded whatever a kubelet writes.
RESIZE_REASONS = ("none", "cpu_manager_static", "capacity", "other")


def is_active(pod: PodStatus) -> bool:
    """A pod that holds (or will hold) node resources: not finished, not deleted."""
    return not pod.deleted and pod.phase not in TERMINAL_PHASES


def rejection(prev: PodStatus | None, pod: PodStatus, reasons: frozenset[str]) -> str | None:
    """The admission rejection this pod event newly shows (its reason), or None.

    Failed with a rejection reason (or any "OutOf..."), or an active pod losing readiness.
    A pod already Failed before this event is old news: relists re-deliver it.
    """
    if pod.deleted:
        return None
    if pod.phase == "Failed" and (pod.reason in reasons or pod.reason.startswith("OutOf")):
        return pod.reason if prev is None or prev.phase != "Failed" else None
    if prev is not None and prev.ready and not pod.ready and is_active(pod):
        return "NotReady"
    return None


def reason_concerns(reason: str, resource: Resource) -> bool:
    """OutOfcpu says which resource ran out; other reasons may concern any of them."""
    if not reason.startswith("OutOf"):
        return True
    named = reason[len("OutOf"):].lower()
    return named not in {r.value.lower() for r in Resource} or named == resource.value.lower()


class NodeCapacity:
    """The latest Node status, and since when each capacity value has been what it is."""

    def __init__(self) -> None:
        self.status: NodeStatus | None = None
        # First delivery of the current capacity value per resource: a heartbeat that repeats
        # the same value must not move a resync timestamp.
        self.since: dict[Resource, float] = {}

    def update(self, node: NodeStatus) -> None:
        old = self.status.capacity if self.status is not None else {}
        for resource, value in node.capacity.items():
            if resource not in old or old[resource] != value or resource not in self.since:
                self.since[resource] = node.time
        for resource in list(self.since):
            if resource not in node.capacity:
                del self.since[resource]
        self.status = node

    def capacity(self, resource: Resource) -> float | None:
        if self.status is None:
            return None
        value = self.status.capacity.get(resource)
        return None if value is None else float(value)


class PodView:
    """Pods on this node keyed by uid: watch events upsert, deletions and relists remove."""

    def __init__(self) -> None:
        self.pods: dict[str, PodStatus] = {}

    def get(self, uid: str) -> PodStatus | None:
        return self.pods.get(uid)

    def apply(self, pod: PodStatus) -> None:
        if pod.deleted:
            self.pods.pop(pod.uid, None)
        else:
            self.pods[pod.uid] = pod

    def relist(self, uids: frozenset[str]) -> list[str]:
        """Drop every pod the relist did not list; returns the uids dropped."""
        gone = [uid for uid in self.pods if uid not in uids]
        for uid in gone:
            del self.pods[uid]
        return gone

    def active(self) -> Iterator[PodStatus]:
        return (pod for pod in self.pods.values() if is_active(pod))

    def balloons(self) -> list[PodStatus]:
        return [pod for pod in self.active() if pod.balloon]

    def balloon_requests(self, view: str = "scheduler") -> dict[Resource, float]:
        """Requests balloon pods hold in `view` (VIEWS): scheduler or kubelet."""
        total: dict[Resource, float] = {}
        for pod in self.balloons():
            held = pod.scheduler_requests if view == "scheduler" else pod.kubelet_requests
            for resource, value in (pod.requests if held is None else held).items():
                total[resource] = total.get(resource, 0.0) + float(value)
        return total


def resize_reason(message: str) -> str:
    """The bounded reason (RESIZE_REASONS) of a pending or failed resize, from its message.

    The kubelet's words (v1.36): 'Resize is infeasible for Guaranteed Pods alongside CPU
    Manager policy "static"' (every Guaranteed pod, whole CPUs or not: recorded on a real
    kubelet), "Node didn't have enough capacity: cpu, ..." (Infeasible) and "Node didn't have
    enough resource: cpu, ..." (Deferred)."""
    text = message.lower()
    if "cpu manager policy" in text and "static" in text:
        return "cpu_manager_static"
    if "didn't have enough capacity" in text or "didn't have enough resource" in text:
        return "capacity"
    return "other"


@dataclass
class _ResizeAttempt:
    desired: dict[Resource, float]
    started: float  # the first event that showed desired != applied
    deferred: bool = False  # "deferred" counted already (once per attempt)
    errored: bool = False  # "error" counted already
    closed: bool = False  # ended Infeasible: nothing more to count for this target


def _applied(resize: ContainerResize) -> bool:
    return all(resource in resize.applied and float(resize.applied[resource]) == float(value)
               for resource, value in resize.desired.items())


class BalloonResizes:
    """In-place resizes of balloon pods, one attempt per (pod, desired requests).

    Events repeat (watch re-deliveries, relists), so every result is counted once per attempt.
    """

    def __init__(self) -> None:
        self.attempts: dict[str, _ResizeAttempt] = {}

    def observe(self, pod: PodStatus) -> list[tuple[str, str, float | None]]:
        """Results this event decides: [(applied|deferred|infeasible|error, reason
        (RESIZE_REASONS; none for applied), duration or None)]."""
        if pod.deleted or not pod.balloon:
            self.forget(pod.uid)
            return []
        resize = pod.resize
        if resize is None or not resize.desired:
            return []
        if not resize.applied:
            # Not started: the kubelet reports no resources yet, so its spec is no resize
            # (recorded: a balloon's start was counted as an applied resize).
            self.attempts.pop(pod.uid, None)
            return []
        attempt = self.attempts.get(pod.uid)
        if _applied(resize):
            self.attempts.pop(pod.uid, None)
            if attempt is None or attempt.closed:
                return []
            return [("applied", "none", max(0.0, pod.time - attempt.started))]
        desired = {resource: float(value) for resource, value in resize.desired.items()}
        if attempt is None or attempt.desired != desired:
            # A new target replaces an unfinished one: the old attempt is abandoned, not failed.
            attempt = self.attempts[pod.uid] = _ResizeAttempt(desired, pod.time)
        if attempt.closed:
            return []
        results: list[tuple[str, str, float | None]] = []
        why = resize_reason(resize.message)
        if resize.pending_reason == "Infeasible":
            attempt.closed = True
            return [("infeasible", why, None)]
        if resize.pending_reason == "Deferred" and not attempt.deferred:
            attempt.deferred = True
            results.append(("deferred", why, None))
        if resize.in_progress_error and not attempt.errored:
            attempt.errored = True
            results.append(("error", why, None))
        return results

    def forget(self, uid: str) -> None:
        self.attempts.pop(uid, None)


def subtract(minuend: Mapping[Resource, float], subtrahend: Mapping[Resource, float]
             ) -> dict[Resource, float]:
    return {resource: float(value) - float(subtrahend.get(resource, 0.0))
            for resource, value in minuend.items()}
