"""This node's Lease (coordination.k8s.io/v1, namespace kube-node-lease, named after the node),
from a list/watch: the kubelet's heartbeat.

A kubelet renews its Lease every 10 s (a quarter of leaseDurationSeconds, 40 s), while it posts
the Node's status only on a change and at least every 5 minutes (nodeStatusReportFrequency). A
kubelet that died after a failed restart stops both, and the Node stays Ready until the node
lifecycle controller notices; the Lease's renewTime tells it within seconds. Only this node's
Lease is watched (fieldSelector metadata.name=NODE); a NodeHeartbeat (via "lease") is emitted
when renewTime moves. `--no-node-lease` turns this off (the Ready condition's heartbeat stays).
"""
from __future__ import annotations

from datetime import datetime
from typing import Any

from lightkube.generic_resource import GenericNamespacedResource, create_api_info

from exporter.clock import Clock
from exporter.config.options import KUBECONFIG, Opt
from exporter.events import MalformedInput, NodeHeartbeat
from exporter.sources.apiserver.one_object import OneObjectSource
from exporter.sources.base import Emit
from exporter.sources.registry import KUBERNETES, SourceSpec, Watch, register

NODE_LEASE_NAMESPACE = "kube-node-lease"


class RawLease(GenericNamespacedResource):
    """coordination.k8s.io/v1 Lease as a plain dict (see RawNode in exporter/kube/client.py)."""

    _api_info = create_api_info("coordination.k8s.io", "v1", "Lease", "leases",
                                verbs=["list", "watch"])


def renew_time(obj: dict[str, Any]) -> tuple[float | None, str]:
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


class KubeLeaseSource(OneObjectSource):
    name = "kube_lease"
    resource = RawLease
    plural = "leases"
    namespace = NODE_LEASE_NAMESPACE

    def __init__(self, clock: Clock, *, node_name: str, **kwargs: Any) -> None:
        super().__init__(clock, node_name=node_name, **kwargs)
        self._renewed: float | None = None  # the renewTime last emitted
        self._problem = ""  # the malformed renewTime last reported (once, not every renewal)

    def describe(self) -> str:
        return f"Lease {NODE_LEASE_NAMESPACE}/{self.node_name}"

    def missing_reason(self) -> str:
        return f"{self.describe()} not found (a kubelet creates it when it registers the node)"

    def deliver(self, obj: dict[str, Any], emit: Emit) -> None:
        now = self.clock.now()
        when, problem = renew_time(obj)
        if problem and problem != self._problem:
            emit(MalformedInput(self.name, problem, now))
        self._problem = problem
        if when is None or when == self._renewed:
            return
        self._renewed = when
        emit(NodeHeartbeat(now, self.node_name, when, via="lease"))



NODE_LEASE: Opt[bool] = Opt(
    "node_lease", ("--node-lease/--no-node-lease",), True,
    "Watch this node's Lease in kube-node-lease: the kubelet renews it every 10 s, so a dead "
    "kubelet shows in node_resize_kubelet_heartbeat_age_seconds{via=\"lease\"} within seconds "
    "(needs list/watch on leases).", is_flag=True)

register(SourceSpec(
    "kube_lease", KUBERNETES, "this node's Lease in kube-node-lease (list/watch): the kubelet's "
    "heartbeat", lambda ctx: KubeLeaseSource(ctx.clock, node_name=ctx.node_name,
                                             kubeconfig=KUBECONFIG.of(ctx.options)),
    wanted=lambda options: NODE_LEASE.of(options), order=62,
    options=(NODE_LEASE,),
    watches=(Watch("coordination.k8s.io", "leases", NODE_LEASE_NAMESPACE,
                   "deploy/node-lease-role.yaml"),)))
