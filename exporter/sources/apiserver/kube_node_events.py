"""KEP-3953's Warning Events on this Node (reason EmergencyCapacityReduced: the kubelet cut the
Node's capacity in an emergency), from a list/watch of core/v1 Events.

The API server filters (fieldSelector involvedObject.kind=Node, involvedObject.name=NODE,
reason=...): an agent sees only its own Node's few Events, never the cluster's stream. Events
are aggregated by the API (one object, `count` occurrences) and expire (an hour by default), so
what is reported is what the API holds now: occurrences summed, and the newest time.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any

from lightkube.generic_resource import GenericNamespacedResource, create_api_info

from exporter.clock import Clock
from exporter.config.options import KUBECONFIG
from exporter.events import NodeWarningEvents
from exporter.sources.apiserver.listwatch import ListWatchSource
from exporter.sources.base import Emit
from exporter.sources.registry import KUBERNETES, SourceSpec, Watch, register

REASON = "EmergencyCapacityReduced"
# Where the kubelet records its Node's events (a cluster-scoped object's go to "default"):
# the one namespace read, so RBAC grants a Role there (deploy/events-role.yaml), not a
# ClusterRole over every namespace's Events.
NODE_EVENTS_NAMESPACE = "default"
MAX_EVENTS = 1000  # kept per source: the API aggregates repeats into one object


class RawEvent(GenericNamespacedResource):
    _api_info = create_api_info("", "v1", "Event", "events",
                                verbs=["list", "watch"])


def _time(obj: dict[str, Any]) -> float | None:
    """The Event's newest timestamp (lastTimestamp, else eventTime, else firstTimestamp)."""
    series = obj.get("series")
    series = series if isinstance(series, dict) else {}
    for value in (obj.get("lastTimestamp"), series.get("lastObservedTime"),
                  obj.get("eventTime"), obj.get("firstTimestamp")):
        if isinstance(value, str) and value:
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


def _count(obj: dict[str, Any]) -> int:
    count = obj.get("count")
    series = obj.get("series")
    series = series if isinstance(series, dict) else {}
    if not isinstance(count, int) or isinstance(count, bool):
        count = series.get("count", 1)
    return count if isinstance(count, int) and 0 < count < 1 << 31 else 1


class KubeNodeEventsSource(ListWatchSource):
    name = "kube_node_events"
    resource = RawEvent
    plural = "events"
    namespace = NODE_EVENTS_NAMESPACE

    def __init__(self, clock: Clock, *, node_name: str, **kwargs: object) -> None:
        super().__init__(clock, **kwargs)  # type: ignore[arg-type]
        self.node_name = node_name
        self._events: dict[str, tuple[int, float | None]] = {}  # uid -> (count, time)
        self._last: tuple[int, float | None] | None = None

    def field_selector(self) -> dict[str, str]:
        return {"involvedObject.kind": "Node", "involvedObject.name": self.node_name,
                "reason": REASON}

    def not_asked_for(self, obj: dict[str, Any]) -> bool:
        involved = obj.get("involvedObject")
        return (not isinstance(involved, dict) or obj.get("reason") != REASON
                or involved.get("name") != self.node_name or involved.get("kind") != "Node")

    def on_list(self, items: list[dict[str, Any]], emit: Emit) -> None:
        self._events = {}
        for obj in items:
            self._keep(obj)
        self._report(emit)

    def on_event(self, event_type: str, obj: dict[str, Any], emit: Emit) -> None:
        uid = (obj.get("metadata") or {}).get("uid")
        if not isinstance(uid, str):
            return
        if event_type == "DELETED":
            self._events.pop(uid, None)
        elif event_type in ("ADDED", "MODIFIED"):
            self._keep(obj)
        self._report(emit)

    def _keep(self, obj: dict[str, Any]) -> None:
        uid = (obj.get("metadata") or {}).get("uid")
        involved = obj.get("involvedObject") or {}
        # The field selector should make the others impossible; do not trust it blindly.
        if (not isinstance(uid, str) or obj.get("reason") != REASON
                or involved.get("name") != self.node_name or involved.get("kind") != "Node"):
            return
        if uid in self._events or len(self._events) < MAX_EVENTS:
            self._events[uid] = (_count(obj), _time(obj))

    def _report(self, emit: Emit) -> None:
        times = [t for _, t in self._events.values() if t is not None]
        now = (sum(c for c, _ in self._events.values()), max(times) if times else None)
        if now != self._last:
            self._last = now
            emit(NodeWarningEvents(self.clock.now(), self.node_name, REASON, *now))


register(SourceSpec(
    "kube_node_events", KUBERNETES, "KEP-3953's Warning Events on this Node (list/watch)",
    lambda ctx: KubeNodeEventsSource(ctx.clock, node_name=ctx.node_name,
                                     kubeconfig=KUBECONFIG.of(ctx.options)), order=63,
    watches=(Watch("", "events", NODE_EVENTS_NAMESPACE, "deploy/events-role.yaml"),)))
