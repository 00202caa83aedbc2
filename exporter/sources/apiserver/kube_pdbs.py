"""The cluster's PodDisruptionBudgets (policy/v1), from a watch: whether an eviction the plan
asks for would be refused (exporter/plan/eviction.py).

A budget of any namespace may select a pod on this node, and RBAC cannot narrow a list to the
namespaces of this node's pods, so the list is cluster-wide, bounded like every list
(LIST_MAX_OBJECTS; past it the source is down with the bound named and the plan says the
budgets were not read). Emits a PdbStatus when what the eviction subresource reads of a budget
changes (its selector, status.disruptionsAllowed, currentHealthy, desiredHealthy,
observedGeneration against metadata.generation, unhealthyPodEvictionPolicy),
PdbStatus(deleted=True) on DELETED, and PdbsRelisted after every list, so a relist after a gap
drops the budgets deleted meanwhile (DiffingListWatchSource).
"""
from __future__ import annotations

from typing import Any

from exporter.config.options import KUBECONFIG
from exporter.events import PdbsRelisted, PdbStatus
from exporter.kube.client import ALL_NAMESPACES, RawPdb
from exporter.kube.convert import pdb_status
from exporter.sources.apiserver.listwatch import DiffingListWatchSource
from exporter.sources.registry import KUBERNETES, SourceSpec, Watch, register


class KubePdbsSource(DiffingListWatchSource):
    name = "kube_pdbs"
    resource = RawPdb
    plural = "poddisruptionbudgets"
    namespace = ALL_NAMESPACES

    def field_selector(self) -> dict[str, str]:
        return {}

    def convert(self, obj: dict[str, Any], now: float,
                deleted: bool) -> tuple[PdbStatus | None, list[str]]:
        converted = pdb_status(obj, now, deleted=deleted)
        event = converted.event
        return (event if isinstance(event, PdbStatus) else None), converted.problems

    def key_of(self, event: PdbStatus) -> str:
        return event.key

    def relisted(self, now: float, keys: frozenset[str]) -> PdbsRelisted:
        return PdbsRelisted(now, keys)


register(SourceSpec(
    "kube_pdbs", KUBERNETES, "the cluster's PodDisruptionBudgets (list/watch), for the plan",
    lambda ctx: KubePdbsSource(ctx.clock, kubeconfig=KUBECONFIG.of(ctx.options)),
    order=62,
    watches=(Watch("policy", "poddisruptionbudgets"),)))
