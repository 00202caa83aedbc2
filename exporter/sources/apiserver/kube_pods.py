"""Pods bound to this node (fieldSelector spec.nodeName=NODE), from a watch.

Emits a PodStatus when a pod's converted state changes (phase, reason, readiness, requests,
balloon resize state), PodStatus(deleted=True) on DELETED, and PodsRelisted after every list:
after a relist (410, error) the correlator learns which pods vanished during the gap, and pods
that did not change produce no second event, so nothing is counted twice.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from exporter.clock import Clock
from exporter.config.options import KUBECONFIG, Opt
from exporter.config.types import KubeName, LabelSelectorText
from exporter.events import MalformedInput, PodsRelisted, PodStatus
from exporter.kube.client import ALL_NAMESPACES, RawPod
from exporter.kube.convert import LabelSelector, pod_status
from exporter.sources.apiserver.listwatch import ListWatchSource
from exporter.sources.base import Emit
from exporter.sources.registry import KUBERNETES, SourceSpec, Watch, register


class KubePodsSource(ListWatchSource):
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
        self._known: dict[str, PodStatus] = {}  # uid -> last emitted state, time/RV zeroed

    def field_selector(self) -> dict[str, str]:
        return {"spec.nodeName": self.node_name}

    def not_asked_for(self, obj: dict[str, Any]) -> bool:
        spec = obj.get("spec")
        return not isinstance(spec, dict) or spec.get("nodeName") != self.node_name

    def on_list(self, items: list[dict[str, Any]], emit: Emit) -> None:
        now = self.clock.now()
        known: dict[str, PodStatus] = {}
        for obj in items:
            event = self._convert(obj, now, emit, deleted=False)
            if event is None:
                continue
            key = _key(event)
            if self._known.get(event.uid) != key:
                emit(event)
            known[event.uid] = key
        self._known = known
        emit(PodsRelisted(now, frozenset(known)))

    def on_event(self, event_type: str, obj: dict[str, Any], emit: Emit) -> None:
        if event_type not in ("ADDED", "MODIFIED", "DELETED"):
            return
        now = self.clock.now()
        deleted = event_type == "DELETED"
        event = self._convert(obj, now, emit, deleted=deleted)
        if event is None:
            return
        if deleted:
            self._known.pop(event.uid, None)
            emit(event)
            return
        key = _key(event)
        if self._known.get(event.uid) == key:
            return
        self._known[event.uid] = key
        emit(event)

    def _convert(self, obj: dict[str, Any], now: float, emit: Emit,
                 deleted: bool) -> PodStatus | None:
        converted = pod_status(obj, now, self.selector, deleted=deleted,
                               priority_classes=self.priority_classes)
        event = converted.event
        if not isinstance(event, PodStatus):
            emit(MalformedInput(self.name, "; ".join(converted.problems), now))
            return None
        # Report a malformed quantity once per change of the pod, not once per relist.
        if converted.problems and self._known.get(event.uid) != _key(event):
            for problem in converted.problems:
                emit(MalformedInput(self.name, problem, now))
        return event


def _key(event: PodStatus) -> PodStatus:
    return dataclasses.replace(event, time=0.0, resource_version="")


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
