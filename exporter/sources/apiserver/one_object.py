"""The base of a watch of one named object (this node's Node, its Lease): present -> delivered,
missing or deleted -> down with the reason, and a working watch on a missing object is still
not "up". Subclasses set `resource`, `plural`, `namespace`, and implement `describe()`,
`missing_reason()` and `deliver(obj, emit)`.

Only one object is watched (fieldSelector metadata.name): a DaemonSet of watches on every
object of a cluster-wide collection would cost the API server O(nodes^2).
"""
from __future__ import annotations

from typing import Any

from exporter.clock import Clock
from exporter.sources.apiserver.listwatch import ListWatchSource
from exporter.sources.base import Emit


class OneObjectSource(ListWatchSource):
    def __init__(self, clock: Clock, *, node_name: str, **kwargs: object) -> None:
        super().__init__(clock, **kwargs)  # type: ignore[arg-type]
        self.node_name = node_name
        self.found = False  # the object exists as far as the last list or event said

    # ------------------------------------------------------------ subclass API

    def describe(self) -> str:
        """The object, for reasons: "Node 'worker-3'"."""
        raise NotImplementedError

    def missing_reason(self) -> str:
        return f"{self.describe()} not found"

    def deliver(self, obj: dict[str, Any], emit: Emit) -> None:
        raise NotImplementedError

    def forget(self, emit: Emit) -> None:
        """The object is gone (deleted, or missing from a list): drop what was remembered of
        it, and say so downstream if what was delivered must not outlive it."""

    # ------------------------------------------------------------ ListWatchSource

    def field_selector(self) -> dict[str, str]:
        return {"metadata.name": self.node_name}

    def not_asked_for(self, obj: dict[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        return meta.get("name") != self.node_name or (
            self.namespace is not None and meta.get("namespace") != self.namespace)

    def on_list(self, items: list[dict[str, Any]], emit: Emit) -> None:
        # The base class dropped (and counted) any object that is not this one.
        self.found = bool(items)
        if not items:
            self.forget(emit)
            self._set_up(emit, False, self.missing_reason())
            return
        self.deliver(items[0], emit)

    def on_event(self, event_type: str, obj: dict[str, Any], emit: Emit) -> None:
        if event_type == "DELETED":
            self.found = False
            self.forget(emit)
            self._set_up(emit, False, f"{self.describe()} was deleted")
            return
        if event_type in ("ADDED", "MODIFIED"):
            self.found = True
            self._set_up(emit, True, f"{self.describe()} present")
            self.deliver(obj, emit)

    def _watch_response(self, status_code: int) -> None:
        if not self.found:
            return  # a working watch on a missing object is still not "up"
        super()._watch_response(status_code)
