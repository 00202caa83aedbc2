"""This node's Lease (coordination.k8s.io/v1, namespace kube-node-lease, named after the node),
from a list/watch: the kubelet's heartbeat (issue 17).

A kubelet renews its Lease every 10 s (a quarter of leaseDurationSeconds, 40 s), while it posts
the Node's status only on a change and at least every 5 minutes (nodeStatusReportFrequency). A
kubelet that died after a failed restart stops both, and the Node stays Ready until the node
lifecycle controller notices; the Lease's renewTime tells it within seconds. Only this node's
Lease is watched (fieldSelector metadata.name=NODE); a NodeHeartbeat (via "lease") is emitted
when renewTime moves. `--no-node-lease` turns this off (the Ready condition's heartbeat stays).
"""
from __future__ import annotations

from datetime import datetime

from lightkube.generic_resource import GenericNamespacedResource, create_api_info

from exporter.clock import Clock
from exporter.events import MalformedInput, NodeHeartbeat
from exporter.sources.base import Emit
from exporter.sources.listwatch import ListWatchSource
from exporter.sources.registry import KUBERNETES, SourceSpec, register

NODE_LEASE_NAMESPACE = "kube-node-lease"


class RawLease(GenericNamespacedResource):
    """coordination.k8s.io/v1 Lease as a plain dict (see RawNode in exporter/kube/client.py)."""

    _api_info = create_api_info("coordination.k8s.io", "v1", "Lease", "leases",
                                verbs=["list", "watch"])


def renew_time(obj: dict) -> tuple[float | None, str]:
    """spec.renewTime (a MicroTime, 2026-11-23T08:21:44.123456Z) -> (epoch seconds, problem).
    A Lease not renewed yet has none: (None, "")."""
    spec = obj.get("spec")
    raw = spec.get("renewTime") if isinstance(spec, dict) else None
    if raw is None:
        return None, ""
    text = raw if isinstance(raw, str) else repr(raw)
    try:
        when = datetime.fromisoformat(text[:64])
        if when.tzinfo is None:
            raise ValueError("no time zone")
        return when.timestamp(), ""
    except (ValueError, OverflowError):
        return None, f"lease spec.renewTime: not an RFC 3339 time: {text[:40]!r}"


class KubeLeaseSource(ListWatchSource):
    name = "kube_lease"
    resource = RawLease
    plural = "leases"
    namespace = NODE_LEASE_NAMESPACE

    def __init__(self, clock: Clock, *, node_name: str, **kwargs) -> None:
        super().__init__(clock, **kwargs)
        self.node_name = node_name
        self._renewed: float | None = None  # the renewTime last emitted
        self._problem = ""  # the malformed renewTime last reported (once, not every renewal)
        self._found = False

    def field_selector(self) -> dict[str, str]:
        return {"metadata.name": self.node_name}

    def on_list(self, items: list[dict], emit: Emit) -> None:
        mine = [i for i in items if (i.get("metadata") or {}).get("name") == self.node_name]
        self._found = bool(mine)
        if not mine:
            self._set_up(emit, False, f"Lease {NODE_LEASE_NAMESPACE}/{self.node_name} not found "
                                      "(a kubelet creates it when it registers the node)")
            return
        self._deliver(mine[0], emit)

    def on_event(self, event_type: str, obj: dict, emit: Emit) -> None:
        if (obj.get("metadata") or {}).get("name") != self.node_name:
            return  # the field selector should make this impossible; do not trust it blindly
        if event_type == "DELETED":
            self._found = False
            self._set_up(emit, False, f"Lease {NODE_LEASE_NAMESPACE}/{self.node_name} deleted")
            return
        if event_type in ("ADDED", "MODIFIED"):
            self._found = True
            self._set_up(emit, True, f"Lease {NODE_LEASE_NAMESPACE}/{self.node_name} present")
            self._deliver(obj, emit)

    def _deliver(self, obj: dict, emit: Emit) -> None:
        now = self.clock.now()
        when, problem = renew_time(obj)
        if problem and problem != self._problem:
            emit(MalformedInput(self.name, problem, now))
        self._problem = problem
        if when is None or when == self._renewed:
            return
        self._renewed = when
        emit(NodeHeartbeat(now, self.node_name, when, via="lease"))

    def _watch_response(self, status_code: int) -> None:
        if not self._found:
            return  # a working watch on a missing Lease is still not "up"
        super()._watch_response(status_code)


register(SourceSpec(
    "kube_lease", KUBERNETES, "this node's Lease in kube-node-lease (list/watch): the kubelet's "
    "heartbeat", lambda ctx: KubeLeaseSource(ctx.clock, node_name=ctx.node_name,
                                             kubeconfig=ctx.options.kubeconfig),
    wanted=lambda options: options.node_lease, order=62))
