"""The base of a watch of one named object (this node's Node, its Lease): present -> delivered,
missing or deleted -> down with the reason, and a working watch on a missing object is still
not "up". Subclasses set `resource`, `plural`, `namespace`, and implement `describe()`,
`missing_reason()` and `deliver(obj, emit)`.

Only one object is watched (fieldSelector metadata.name): a DaemonSet of watches on every
object of a cluster-wide collection would cost the API server O(nodes^2).
"""
from __future__ import annotations

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

    def deliver(self, obj: dict, emit: Emit) -> None:
        raise NotImplementedError

    def forget(self) -> None:
        """The object is gone: drop what was remembered of it."""

    # ------------------------------------------------------------ ListWatchSource

    def field_selector(self) -> dict[str, str]:
        return {"metadata.name": self.node_name}

    def on_list(self, items: list[dict], emit: Emit) -> None:
        mine = [i for i in items if (i.get("metadata") or {}).get("name") == self.node_name]
        self.found = bool(mine)
        if not mine:
            self.forget()
            self._set_up(emit, False, self.missing_reason())
            return
        self.deliver(mine[0], emit)

    def on_event(self, event_type: str, obj: dict, emit: Emit) -> None:
        if (obj.get("metadata") or {}).get("name") != self.node_name:
            return  # the field selector should make this impossible; do not trust it blindly
        if event_type == "DELETED":
            self.found = False
            self.forget()
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
