"""KEP-3953's proposed Node API, as a Node watch delivers it.

The KEP proposes that a kubelet which resyncs capacity says so on its Node: a condition
`CapacityConfigured` (reasons Accepted, InProgress, Infeasible, EmergencyReduced) and the
capacity it configured in `spec.configuredCapacity` (a ResourceList). No released kubelet
writes either, so an absent condition is the normal case and yields nothing. Pure: Node JSON in,
NodeCapacityConfigured out; the kube_node source calls `CapacityConfiguredFilter.feed` with
every Node it delivers and emits what comes back (only changes, not every heartbeat).
"""
from __future__ import annotations

from typing import Any

from exporter.events import NodeCapacityConfigured
from exporter.kube.convert import resources

CONDITION = "CapacityConfigured"
MAX_REASON = 64  # a condition reason is a CamelCase word; anything longer is not one


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def capacity_configured(obj: Any, now: float,
                        problems: list[str]) -> NodeCapacityConfigured | None:
    """The Node's CapacityConfigured condition and spec.configuredCapacity, or None when it
    has neither (every kubelet released so far). Malformed quantities go to `problems`."""
    if not isinstance(obj, dict):
        return None
    meta, spec, status = (_dict(obj.get(k)) for k in ("metadata", "spec", "status"))
    condition: dict[str, Any] = {}
    conditions = status.get("conditions")
    for c in conditions if isinstance(conditions, list) else []:
        if isinstance(c, dict) and c.get("type") == CONDITION:
            condition = c
    configured_raw = spec.get("configuredCapacity")
    if not condition and configured_raw is None:
        return None
    configured = resources(configured_raw, "spec.configuredCapacity", problems)
    state = condition.get("status")
    reason = condition.get("reason")
    return NodeCapacityConfigured(
        now, str(meta.get("name") or ""),
        state if state in ("True", "False", "Unknown") else "",
        reason[:MAX_REASON] if isinstance(reason, str) else "", configured)


class CapacityConfiguredFilter:
    """Emits a NodeCapacityConfigured when what the Node says changes, not on every update."""

    def __init__(self) -> None:
        self._last: tuple[str, str, tuple[tuple[str, float], ...]] | None = None

    def feed(self, obj: Any, now: float, problems: list[str]) -> NodeCapacityConfigured | None:
        event = capacity_configured(obj, now, problems)
        if event is None:
            if self._last is None:
                return None
            # The condition went away (a downgrade): say so once.
            self._last = None
            name = obj.get("metadata", {}).get("name", "") if isinstance(obj, dict) else ""
            return NodeCapacityConfigured(now, str(name), "")
        key = (event.status, event.reason,
               tuple(sorted((r.value, v) for r, v in event.configured.items())))
        if key == self._last:
            return None
        self._last = key
        return event
