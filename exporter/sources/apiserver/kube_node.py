"""This node's Node object (status.capacity / status.allocatable), from a watch.

Only this node is watched (fieldSelector metadata.name=NODE): a DaemonSet of watches on every
node object would cost the API server O(nodes^2). A NodeStatus is emitted when capacity or
allocatable actually change (the first delivery always), not on every heartbeat update, and
not again after a relist that finds the same values; a heartbeat that moved without them is a
NodeHeartbeat (A dead kubelet is told by its heartbeat's age).

A Node deleted (a DELETED event, or missing from a relist) is a NodeStatus with no capacity and
no allocatable: downstream there is then no kubelet capacity to show or to judge drift against,
rather than the last one the vanished Node had. The Node coming back is a first delivery again.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from exporter.checks import FAIL, OK, Check, quoted
from exporter.clock import Clock
from exporter.config.options import KUBECONFIG
from exporter.events import MalformedInput, NodeHeartbeat, NodeStatus
from exporter.kube.capacity_configured import CapacityConfiguredFilter
from exporter.kube.client import RawNode, load_config, make_client
from exporter.kube.convert import node_status
from exporter.sources.apiserver.one_object import OneObjectSource
from exporter.sources.base import Emit, Source
from exporter.sources.registry import KUBERNETES, SourceSpec, Watch, register


class KubeNodeSource(OneObjectSource):
    name = "kube_node"
    resource = RawNode
    plural = "nodes"

    def __init__(self, clock: Clock, *, node_name: str, **kwargs: Any) -> None:
        super().__init__(clock, node_name=node_name, **kwargs)
        # (NodeStatus without time/RV, problems) last emitted
        self._last: tuple[Any, ...] | None = None
        self._beat: float | None = None  # the Ready heartbeat last emitted
        self._configured = CapacityConfiguredFilter()  # KEP-3953's condition

    def describe(self) -> str:
        return f"Node {self.node_name!r}"

    def missing_reason(self) -> str:
        return (f"Node {self.node_name!r} not found in the API: check --node-name / NODE_NAME "
                "(spec.nodeName via the downward API)")

    def forget(self, emit: Emit) -> None:
        if self._last is not None:
            emit(NodeStatus(self.clock.now(), self.node_name, {}, {}))
        self._last = None

    def deliver(self, obj: dict[str, Any], emit: Emit) -> None:
        now = self.clock.now()
        problems: list[str] = []  # KEP-3953's CapacityConfigured, when it changes
        configured = self._configured.feed(obj, now, problems)
        if configured is not None:
            for problem in problems:
                emit(MalformedInput(self.name, problem, now))
            emit(configured)
        converted = node_status(obj, now)
        event = converted.event
        if not isinstance(event, NodeStatus):
            emit(MalformedInput(self.name, "; ".join(converted.problems), now))
            return
        key = (dataclasses.replace(event, time=0.0, resource_version="", heartbeat=None),
               tuple(converted.problems))
        beat, self._beat = self._beat, event.heartbeat
        if key == self._last:
            if event.heartbeat is not None and event.heartbeat != beat:
                emit(NodeHeartbeat(now, event.node, event.heartbeat))
            return
        self._last = key
        for problem in converted.problems:
            emit(MalformedInput(self.name, problem, now))
        emit(event)



NODES_NAMED = 10  # Nodes a FAIL lists when this node's name is not one of them


def _check(source: Source) -> list[Check]:
    """Does the API server know this node's name? A wrong --node-name (or a hostname that is not
    the Node's name) watches nothing: every Kubernetes series would stay empty."""
    assert isinstance(source, KubeNodeSource)
    name = source.node_name
    client, transport = make_client(load_config(source.kubeconfig), request_timeout=5.0)
    try:
        if list(client.list(RawNode, fields={"metadata.name": name}, chunk_size=1)):
            return [Check("kubernetes node", OK, f"Node {name} found")]
        seen = [n.metadata.name for n in itertools.islice(
            client.list(RawNode, chunk_size=NODES_NAMED), NODES_NAMED) if n.metadata]
    except Exception as e:  # noqa: BLE001 - unreachable, 401, 403: say so
        return [Check("kubernetes node", FAIL, f"cannot list Nodes: {quoted(e)}",
                      "check the API server address, the credentials and list on nodes")]
    finally:
        transport.close()
    listed = ", ".join(str(s) for s in seen) or "none"
    more = " (first ten)" if len(seen) == NODES_NAMED else ""
    return [Check("kubernetes node", FAIL, f"the API server has no Node {name!r}; it has: "
                  f"{listed}{more}", "pass --node-name (or NODE_NAME, the DaemonSet sets it "
                  "from spec.nodeName) with this node's Node name")]


register(SourceSpec(
    "kube_node", KUBERNETES, "this node's Node object (list/watch)",
    lambda ctx: KubeNodeSource(ctx.clock, node_name=ctx.node_name,
                               kubeconfig=KUBECONFIG.of(ctx.options)), order=60,
    watches=(Watch("", "nodes"),), check=_check))
