"""Pods bound to this node (fieldSelector spec.nodeName=NODE), from a watch.

Emits a PodStatus when a pod's converted state changes (phase, reason, readiness, requests,
balloon resize state), PodStatus(deleted=True) on DELETED, and PodsRelisted after every list:
after a relist (410, error) the correlator learns which pods vanished during the gap, and pods
that did not change produce no second event, so nothing is counted twice
(DiffingListWatchSource).
"""
from __future__ import annotations

from typing import Any

from exporter.clock import Clock
from exporter.config.options import KUBECONFIG, Opt
from exporter.config.types import KubeName, LabelSelectorText
from exporter.events import PodsRelisted, PodStatus
from exporter.kube.client import ALL_NAMESPACES, RawPod
from exporter.kube.convert import LabelSelector, pod_status
from exporter.sources.apiserver.listwatch import DiffingListWatchSource
from exporter.sources.registry import KUBERNETES, SourceSpec, Watch, register


class KubePodsSource(DiffingListWatchSource):
    name = "kube_pods"
    resource = RawPod
    plural = "pods"
    namespace = ALL_NAMESPACES

    def __init__(self, clock: Clock, *, node_name: str,
                 balloon_selector: str | LabelSelector | None = None,
                 balloon_priority_classes: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(clock, **kwargs)
        self.node_name = node_name
        self.selector = (LabelSelector(balloon_selector) if isinstance(balloon_selector, str)
                         else balloon_selector)
        self.priority_classes = frozenset(balloon_priority_classes)

    def field_selector(self) -> dict[str, str]:
        return {"spec.nodeName": self.node_name}

    def not_asked_for(self, obj: dict[str, Any]) -> bool:
        spec = obj.get("spec")
        return not isinstance(spec, dict) or spec.get("nodeName") != self.node_name

    def convert(self, obj: dict[str, Any], now: float,
                deleted: bool) -> tuple[PodStatus | None, list[str]]:
        converted = pod_status(obj, now, self.selector, deleted=deleted,
                               priority_classes=self.priority_classes)
        event = converted.event
        return (event if isinstance(event, PodStatus) else None), converted.problems

    def key_of(self, event: PodStatus) -> str:
        return event.uid

    def relisted(self, now: float, keys: frozenset[str]) -> PodsRelisted:
        return PodsRelisted(now, keys)


BALLOON_SELECTOR: Opt[str] = Opt(
    "balloon_selector", ("--balloon-selector",), "node-resize-exporter.io/balloon=true",
    "Label selector of balloon pods.", LabelSelectorText())
BALLOON_PRIORITY_CLASSES: Opt[tuple[str, ...]] = Opt(
    "balloon_priority_classes", ("--balloon-priority-class",), (),
    "Pods of this PriorityClass are balloon pods too, whatever their labels (repeatable; for "
    "example the cluster-autoscaler's overprovisioning class).",
    KubeName("PriorityClass name", "class"), show_default=False, multiple=True)

register(SourceSpec(
    "kube_pods", KUBERNETES, "the pods bound to this node (list/watch)",
    lambda ctx: KubePodsSource(ctx.clock, node_name=ctx.node_name,
                               kubeconfig=KUBECONFIG.of(ctx.options),
                               balloon_selector=BALLOON_SELECTOR.of(ctx.options),
                               balloon_priority_classes=BALLOON_PRIORITY_CLASSES.of(ctx.options)),
    order=61,
    options=(BALLOON_SELECTOR, BALLOON_PRIORITY_CLASSES),
    watches=(Watch("", "pods"),)))
