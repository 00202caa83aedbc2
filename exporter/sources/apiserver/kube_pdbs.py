"""The cluster's PodDisruptionBudgets (policy/v1), from a watch: whether an eviction the plan
asks for would be refused (exporter/plan/eviction.py).

A budget of any namespace may select a pod on this node, and RBAC cannot narrow a list to the
namespaces of this node's pods, so the list is cluster-wide, bounded like every list
(LIST_MAX_OBJECTS; past it the source is down with the bound named and the plan says the
budgets were not read). Emits a PdbStatus when what the eviction subresource reads of a budget
changes (its selector, status.disruptionsAllowed, currentHealthy, desiredHealthy,
observedGeneration against metadata.generation, unhealthyPodEvictionPolicy),
PdbStatus(deleted=True) on DELETED, and PdbsRelisted after every list, so a relist after a gap
drops the budgets deleted meanwhile.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from exporter.clock import Clock
from exporter.config.options import KUBECONFIG
from exporter.events import MalformedInput, PdbsRelisted, PdbStatus
from exporter.kube.client import ALL_NAMESPACES, RawPdb
from exporter.kube.convert import pdb_status
from exporter.sources.apiserver.listwatch import ListWatchSource
from exporter.sources.base import Emit
from exporter.sources.registry import KUBERNETES, SourceSpec, Watch, register


class KubePdbsSource(ListWatchSource):
    name = "kube_pdbs"
    resource = RawPdb
    plural = "poddisruptionbudgets"
    namespace = ALL_NAMESPACES

    def __init__(self, clock: Clock, **kwargs: Any) -> None:
        super().__init__(clock, **kwargs)
        self._known: dict[str, PdbStatus] = {}  # namespace/name -> last emitted, time/RV zeroed

    def field_selector(self) -> dict[str, str]:
        return {}

    def on_list(self, items: list[dict[str, Any]], emit: Emit) -> None:
        now = self.clock.now()
        known: dict[str, PdbStatus] = {}
        for obj in items:
            event = self._convert(obj, now, emit, deleted=False)
            if event is None:
                continue
            key = _key(event)
            if self._known.get(event.key) != key:
                emit(event)
            known[event.key] = key
        self._known = known
        emit(PdbsRelisted(now, frozenset(known)))

    def on_event(self, event_type: str, obj: dict[str, Any], emit: Emit) -> None:
        if event_type not in ("ADDED", "MODIFIED", "DELETED"):
            return
        deleted = event_type == "DELETED"
        event = self._convert(obj, self.clock.now(), emit, deleted=deleted)
        if event is None:
            return
        if deleted:
            self._known.pop(event.key, None)
            emit(event)
            return
        key = _key(event)
        if self._known.get(event.key) == key:
            return
        self._known[event.key] = key
        emit(event)

    def _convert(self, obj: dict[str, Any], now: float, emit: Emit,
                 deleted: bool) -> PdbStatus | None:
        converted = pdb_status(obj, now, deleted=deleted)
        event = converted.event
        if not isinstance(event, PdbStatus):
            emit(MalformedInput(self.name, "; ".join(converted.problems)[:300], now))
            return None
        # A malformed field is reported once per change of the budget, not once per relist.
        if converted.problems and self._known.get(event.key) != _key(event):
            for problem in converted.problems:
                emit(MalformedInput(self.name, problem[:300], now))
        return event


def _key(event: PdbStatus) -> PdbStatus:
    return dataclasses.replace(event, time=0.0, resource_version="")


register(SourceSpec(
    "kube_pdbs", KUBERNETES, "the cluster's PodDisruptionBudgets (list/watch), for the plan",
    lambda ctx: KubePdbsSource(ctx.clock, kubeconfig=KUBECONFIG.of(ctx.options)),
    order=62,
    watches=(Watch("policy", "poddisruptionbudgets"),)))
